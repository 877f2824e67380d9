// Asynchronous global -> shared copies (cp.async, sm_80 and later), shared by the kernels
// that stage tiles in shared memory (matmul_q4k_mma.cu, embed_attention.cu, the Q6_K rows
// of matmul_q6k_rows.cu), and the 16-byte pieces of a matrix's byte span
// (persistent_products.cuh stages them by bulk copies).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hablar::cuda {

// 16 bytes from global src to shared dst without passing through registers.
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src)
               : "memory");
#endif
}

// As copy16_async, or 16 zero bytes when !valid (src is then not read, but must still be an
// address of the global space).
__device__ __forceinline__ void copy16_async_or_zero(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#endif
}

__device__ __forceinline__ void commit_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most kPending committed groups of this thread's copies are in flight.
template <int kPending>
__device__ __forceinline__ void wait_async_but() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// Waits for every copy this thread issued.
__device__ __forceinline__ void wait_async_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Bytes [begin, end) of a matrix W (16-byte aligned, ending at w_end) as 16-byte pieces:
// from begin rounded down to 16 (`first`; begin lands `lead` bytes in), `whole` pieces that
// lie inside W, `bytes` in all from first to end. What lies past the whole pieces (the
// matrix's last bytes, never reading past w_end) is copied by copy_span_tail.
struct SpanPieces {
  const uint8_t* first;
  int lead, bytes, whole;
};
__device__ __forceinline__ SpanPieces span_pieces(const uint8_t* begin, const uint8_t* end,
                                                  const uint8_t* w_end) {
  const int lead = (int)(reinterpret_cast<uintptr_t>(begin) & 15);
  const uint8_t* first = begin - lead;  // not before W
  const int bytes = (int)(end - first), pieces = (bytes + 15) / 16;
  return {first, lead, bytes, first + 16 * pieces <= w_end ? pieces : pieces - 1};
}
// The span's bytes past its whole pieces into dst, by 2-byte loads (bytes is even).
__device__ __forceinline__ void copy_span_tail(const SpanPieces& s, uint8_t* dst) {
  for (int b = 16 * s.whole; b < s.bytes; b += 2)
    *reinterpret_cast<uint16_t*>(dst + b) =
        __ldg(reinterpret_cast<const unsigned short*>(s.first + b));
}

// Starts copying the span [begin, end) of W to slot, lane i taking pieces i, i + 32, ...
// (span_pieces; lane 0 copies the tail). Returns where begin lands in the slot (0..14).
__device__ __forceinline__ int stage_span(const uint8_t* begin, const uint8_t* end,
                                          const uint8_t* w_end, uint8_t* slot, int lane) {
  const SpanPieces s = span_pieces(begin, end, w_end);
  for (int i = lane; i < s.whole; i += 32) copy16_async(slot + 16 * i, s.first + 16 * i);
  if (lane == 0) copy_span_tail(s, slot);
  return s.lead;
}

}  // namespace hablar::cuda
