// The Q4_K and Q6_K products for many activation rows (batched decode steps) on f16 tensor
// cores (matmul_f16.cu): the weights are dequantized to f16 in registers, scales (and Q4_K's
// mins) included, and the tensor cores accumulate in f32, so no per-sub-block arithmetic is
// left for the CUDA cores (the int8 kernel of matmul_q4k_mma.cu spends most of its time on
// it). The activations are rows of f16 with a power-of-two scale per row (no overflow
// whatever the activations' range; the scale is exact). Internal to the CUDA backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/layer_spec.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

// The workspace of f16 rows: values [M][K] (each group of four stored in the order 0, 2, 1,
// 3: q4k_f16_fragments.cuh), then a float per row at a 256-byte aligned offset: the power of
// two the row's products are multiplied by.
size_t f16_rows_bytes(int m, int64_t k);
struct F16Rows {
  uint16_t* values;
  float* out_scales;
};
F16Rows f16_rows_layout(void* workspace, int m, int64_t k);
// x [M][K] f32 (K a multiple of 4) into the workspace: row r is scaled by 2^e_r so that its
// largest magnitude lies in [2^14, 2^15) (1 for rows of zeros or with non-finite values).
void convert_rows_to_f16(const float* x, int m, int64_t k, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);

// The gated feed-forward's activation out [M][K] = act(gate) * up, the same values as ops.h's
// swiglu / geglu, also written into the workspace as convert_rows_to_f16 would convert it:
// one launch instead of two.
void glu_rows_to_f16(const float* gate, const float* up, GluActivation act, float* out, int m,
                     int64_t k, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Q4_K (rows 16-byte aligned) or Q6_K (rows 2-byte aligned), K a multiple of 256, W 16-byte
// aligned.
bool f16_product_supported(const WeightView& w);
// Scratch for partial sums when K is split over several blocks (0 when it is not).
// `parts`: how the two warps of a column share a block (1: different activation rows, 2:
// the same rows and different halves of each super-block, so each weight is dequantized once
// per block, 5-12% faster from 16 rows on the H200; 0: the default, 2 unless the lab knob
// HABLAR_F16_PARTS says 1).
size_t f16_product_scratch_bytes(const WeightView& w, int m, int parts = 0);
// Whether the forward runs a product of m rows of W here: a supported format and m within
// the measured range, f16_product_min_rows(type) .. f16_product_max_rows(). Q4_K from 16 rows
// (below, its int8 kernels read fewer bytes per activation row and win), Q6_K from 9 (up to 2
// rows its int8 rows kernel, matmul_q6k_rows.h, then the f32 product read the weights once); up to
// 256, beyond which prompt chunks go to dequant + cuBLAS. Lab knobs: HABLAR_Q4K_F16_FROM and
// HABLAR_Q6K_F16_FROM (0: never), HABLAR_F16_PRODUCT_UPTO.
int64_t f16_product_min_rows(DType type);
int64_t f16_product_max_rows();
bool f16_product_preferred(const WeightView& w, int64_t m);
// y [M][N] = x [M][K] · Wᵀ for any M >= 1, x converted into `rows` by convert_rows_to_f16.
void matmul_f16(const WeightView& w, const void* rows, int m, float* y, void* scratch,
                cudaStream_t stream, int parts = 0);

}  // namespace hablar::cuda
