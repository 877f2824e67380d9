// The Q4_K product for a batch of activation rows (M = 4 .. 256, batched decode) on integer
// tensor cores (matmul_q4k_mma.cu), from activations already quantized by
// quantize_activations_q8 (codes [M][K], per block of 32 the pair (scale, scale * sum of
// codes)). Internal to the CUDA backend: matmul_prequantized() and matmul_fused() call it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor_view.h"

namespace hablar::cuda {

// Q4_K, K a multiple of 256, W and its rows 16-byte aligned.
bool q4k_mma_supported(const WeightView& w);
// Scratch for partial sums when K is split over several blocks (0 when it is not).
size_t q4k_mma_scratch_bytes(const WeightView& w, int m);
// y [M][N] = x [M][K] · Wᵀ; scratch: q4k_mma_scratch_bytes(w, m) bytes of device memory.
void matmul_q4k_mma(const WeightView& w, const int8_t* codes, const float2* scales, int m, float* y,
                    void* scratch, cudaStream_t stream);

}  // namespace hablar::cuda
