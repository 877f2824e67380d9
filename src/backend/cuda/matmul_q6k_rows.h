// The Q6_K decode product at M = 1 or 2 on int8 activations (matmul_q6k_rows.cu): y = x · Wᵀ
// for M rows of activations already quantized by quantize_activations_q8 (codes [M][K], and
// per block of 32 the pair (scale, scale * sum of codes)). Internal to the CUDA backend.
//
// Launched with programmatic dependent launch on a stream of the caller's: its weight loads
// may start while the kernel before it on the stream still runs; it reads the activations
// and writes y only after that kernel has finished.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor_view.h"

namespace hablar::cuda {

// Q6_K, K a multiple of 256 and at most 49152 (a warp stages whole rows in shared memory,
// within the 48 KB a block gets without opting in), rows of exactly 210 * K / 256 bytes,
// W 16-byte aligned, at most 2^30 rows.
bool q6k_rows_supported(const WeightView& w);
// Lanes per row this kernel gives w (a row's sum depends on it: persistent_step.h takes the
// same).
int q6k_rows_team(const WeightView& w);
// The most activation rows one call takes. From 3 rows the f32 product is as fast or faster
// (the lanes' instructions per activation row, not the weight bytes, bound this kernel):
// decode steps of 2 / 3 / 4 sequences on an H100, S_TG against the f32 product +9.7% / even /
// +3% on the 1.5B shape, +5.7% / even / -3% on the 8B shape (-7% at 8 on the 1.5B).
inline constexpr int kQ6kRowsMaxM = 2;
// y[m][n] = W[n][K] · x[m] for m < M, x given as int8 codes xq[M][K] and per block of 32
// activations the pair xs[M][K/32] = (d, d * sum of the block's 32 codes) (value_i ≈ d *
// code_i). xq and xs 16-byte aligned (as q8_layout places them). Each row's result is the
// bits a one-row call gives for it.
void matmul_q6k_rows(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                     cudaStream_t stream, int m = 1);

}  // namespace hablar::cuda
