// The Q4_K decode product at M = 1 to 4 on int8 activations (matmul_q4k_rows.cu): y = x · Wᵀ
// for M rows of activations already quantized by quantize_activations_q8 (codes [M][K], and
// per block of 32 the pair (scale, scale * sum of codes)); y [M][N]. Internal to the CUDA
// backend: matmul_prequantized() and matmul_fused() call it for M <= kQ4kRowsMaxM. Each row's
// result is the bits a one-row call gives for it.
//
// Launched with programmatic dependent launch: its weight loads may start while the kernel
// before it on the stream still runs; it reads the activations and writes y only after
// that kernel has finished.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/layer_spec.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

// Q4_K, K a multiple of 256 and at most 65536, W 16-byte aligned.
bool q4k_rows_supported(const WeightView& w);
// Threads per row (16 .. 128) these kernels give a product of `rows` rows of K = cols, for
// one matrix or the gated pair (matrices 2): a row's sum depends on it (persistent_step.h
// takes the same teams, so its rows equal these).
int q4k_rows_team(int64_t cols, int64_t rows, int matrices);
// The most activation rows one call takes (a decode step of up to four sequences).
inline constexpr int kQ4kRowsMaxM = 4;
// Whether the decode products take these kernels for m activation rows of w: one or two
// always (q4k_rows_supported), three or four only for matrices of at most
// kQ4kRowsFewBytesPerSm a multiprocessor. A small matrix leaves the bandwidth unfilled at one
// row (latency-bound), so more rows per weight read come nearly free; a large one is near the
// bandwidth already and more rows make it instruction-bound. Measured on an H100 (132
// multiprocessors), steps of 3 / 4 sequences against the dp4a / tensor-core kernels: the
// 1.5B shape (matrices up to 7.7 MB) +8% / +8%, the 8B shape (9.4 MB and up) -3% / -3%.
inline constexpr int64_t kQ4kRowsFewBytesPerSm = 64 * 1024;
bool q4k_rows_take(const WeightView& w, int64_t m);
void matmul_q4k_rows(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                     cudaStream_t stream, int m = 1);

// Up to three products of one input in one launch (Q, K and V of a layer): ys[i] = x · ws[i]ᵀ,
// every matrix q4k_rows_supported and of one K. Blocks of the grid are split between the
// matrices in order; the same kernel and rounding as matmul_q4k_rows.
void matmul_q4k_rows_multi(std::span<const WeightView* const> ws, std::span<float* const> ys,
                           const int8_t* xq, const float2* xs, cudaStream_t stream, int m = 1);

// The gated feed-forward's first half in one launch: out[r] = act(x · gate[r]) * (x · up[r]);
// each team holds a gate row and its up row, so both products and the activation take one
// pass (the element function of glu_activation.cuh, as ops.cu's swiglu / geglu).
bool q4k_rows_glu_supported(const WeightView& gate, const WeightView& up);
void matmul_q4k_rows_glu(const WeightView& gate, const WeightView& up, const int8_t* xq,
                         const float2* xs, float* out, GluActivation act, cudaStream_t stream,
                         int m = 1);

}  // namespace hablar::cuda
