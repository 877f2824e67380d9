// The matmul kernels built for AVX2 + FMA + F16C (see kernels_x86.inc).
#define HABLAR_ISA_NS avx2
#define HABLAR_TILE_TOKENS 4
#define HABLAR_TILE_ROWS 2
#define HABLAR_ROWS8_TILE_TOKENS 4
#include "backend/cpu/kernels_x86.inc"

namespace hablar::cpu {
const IsaKernels& avx2_kernels() {
  return avx2::kKernels;
}
}  // namespace hablar::cpu
