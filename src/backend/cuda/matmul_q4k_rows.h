// The Q4_K decode product at M = 1 on int8 activations (matmul_q4k_rows.cu): y = x · Wᵀ for
// one row of activations already quantized by quantize_activations_q8 (codes [K], and per
// block of 32 the pair (scale, scale * sum of codes)). Internal to the CUDA backend:
// matmul_q4k_prequantized() and matmul_fused() call it for M = 1.
//
// Launched with programmatic dependent launch: its weight loads may start while the kernel
// before it on the stream still runs; it reads the activations and writes y only after
// that kernel has finished.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor_view.h"

namespace hablar::cuda {

// Q4_K, K a multiple of 256 and at most 65536, W 16-byte aligned.
bool q4k_rows_supported(const WeightView& w);
void matmul_q4k_rows(const WeightView& w, const int8_t* xq, const float2* xs, float* y,
                     cudaStream_t stream);

}  // namespace hablar::cuda
