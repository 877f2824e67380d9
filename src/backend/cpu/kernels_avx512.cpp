// The matmul kernels built for AVX-512 F/BW/VL/DQ + VNNI (see kernels_x86.inc): 32 vector
// registers allow larger tiles, and vpdpbusd / vpdpwssd fuse the integer dot products.
#define HABLAR_ISA_NS avx512
#define HABLAR_TILE_TOKENS 4
#define HABLAR_TILE_ROWS 4
#define HABLAR_ROWS8_TILE_TOKENS 8
#include "backend/cpu/kernels_x86.inc"

namespace hablar::cpu {
const IsaKernels& avx512_kernels() {
  return avx512::kKernels;
}
}  // namespace hablar::cpu
