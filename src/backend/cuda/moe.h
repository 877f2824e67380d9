// The mixture-of-experts kernels of the CUDA backend (forward_ops.h moe_ffn strings them
// together): routing, grouping the step's (token, slot) entries by expert, gathering their
// rows, the CPU's F16 expert product, and the weighted combination. Routing and combination
// follow the CPU's float order in both modes (moe_routing.cuh).
//
// Host C++ declarations (moe_routing.cuh brings the host-and-device routing functions).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/moe_routing.cuh"
#include "core/tensor_view.h"

namespace hablar::cuda::moe {

// The most experts the kernels route (route(): a warp per token keeps its E probabilities in
// shared memory, four warps a block within 48 KiB) and the most experts per token.
inline constexpr int kMaxExperts = 3072;
inline constexpr int kMaxExpertsUsed = moe_routing::kMaxExpertsUsed;

// logits [T x E] (router products; overwritten by the probabilities) -> chosen [T x K]
// (descending probability) and weights [T x K]; a thread per token.
void route(float* logits, int64_t T, int E, int K, bool normalize, int32_t* chosen, float* weights,
           cudaStream_t stream);

// chosen [N] (N = T * K entries) grouped by expert, stably: offsets [E + 1] (expert e's
// entries are order[offsets[e] .. offsets[e + 1])), order [N] the entry of each sorted row,
// position [N] the sorted row of each entry; when given, active [active_slots(N, E)] the
// experts with entries in expert order, then -1 (moe_routing.cuh active_experts).
void group(const int32_t* chosen, int64_t N, int E, int32_t* offsets, int32_t* order,
           int32_t* position, cudaStream_t stream, int32_t* active = nullptr);
inline int active_slots(int64_t N, int E) {
  return (int)(N < E ? N : E);
}

// The experts' products over the grouped rows, sized on the device (no host round trip, so
// a step that runs it can be a CUDA graph): expert e's matrix at first.data + e * stride
// (every expert of first's type and shape, as one 3-D tensor uploads), rows [N x first.cols]
// grouped as group() left them, y [N x first.rows] in the same row order. Per active slot a
// slice of blocks walks its expert's rows 8 at a time on the f32 CUDA-core product
// (gemv_rows.cuh), so each expert's weights are read once per 8 of its rows.
void grouped_product(const WeightView& first, size_t stride, int E, const float* rows, int64_t N,
                     const int32_t* offsets, const int32_t* active, float* y, cudaStream_t stream);

// Q4_K experts on int8 activations (moe_grouped_q4k.cu), the decode form: the step's rows
// quantized in grouped order into q8 (q8_activation_bytes(N, width) bytes, matmul.h; rows[r] =
// in[order[r] / K], or in[r] when order is null), then per active expert its weights read
// once and taken against each of its rows. grouped_q4k_glu writes silu(x · gateᵀ) *
// (x · upᵀ) [N x gate.rows]; grouped_q4k_product x · Wᵀ [N x first.rows]. Strides as
// grouped_product's; every matrix Q4_K, 16-byte aligned, K at most 32768
// (grouped_q4k_supported).
bool grouped_q4k_supported(const WeightView& first, size_t stride);
void quantize_rows(const float* in, const int32_t* order, int K, int64_t N, int64_t width, void* q8,
                   cudaStream_t stream);
void grouped_q4k_product(const WeightView& first, size_t stride, int E, const void* q8, int64_t N,
                         const int32_t* offsets, const int32_t* active, float* y,
                         cudaStream_t stream);
void grouped_q4k_glu(const WeightView& gate, size_t gate_stride, const WeightView& up,
                     size_t up_stride, int E, const void* q8, int64_t N, const int32_t* offsets,
                     const int32_t* active, float* y, cudaStream_t stream);

// rows[r] = in[order[r] / K], rows of `width` floats, r < N.
void gather(const float* in, const int32_t* order, int64_t N, int K, int64_t width, float* rows,
            cudaStream_t stream);

// y [m x w.rows] = x [m x w.cols] · Wᵀ for an F16 expert in the CPU's expert order
// (moe_routing.cuh f16_expert_dot); a thread per output value.
void f16_expert_matmul(const WeightView& w, const float* x, int64_t m, float* y,
                       cudaStream_t stream);

// out[t][d] = sum_j weights[t][j] * sorted[position[t * K + j]][d] (in slot order), plus
// shared[t][d] * sigmoid(gate_logits[t]) when shared is given; out [T x width].
void combine(const float* sorted, const int32_t* position, const float* weights, int64_t T, int K,
             int64_t width, const float* shared, const float* gate_logits, float* out,
             cudaStream_t stream);

}  // namespace hablar::cuda::moe
