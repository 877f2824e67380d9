// device_memory.h's host-to-device writes are complete for every stream when they return: a
// non-blocking stream reads them at once, round after round, and never sees the bytes of an
// earlier round. (cudaMemcpy from pageable memory returns once the bytes are staged, with the
// end of the DMA still in flight and ordered on the legacy default stream only, and cudaMemset
// is ordered there too: run beside other processes on the GPU, tests that read uploads on
// their own stream saw the old bytes.)
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "cuda_test_util.h"

namespace hablar::test {
namespace {

constexpr size_t kBytes = 64u << 20;  // staged in many pieces
constexpr size_t kTail = 1u << 16;    // what the stream reads: the last bytes written

// The last kTail bytes of `d`, read by a copy on `stream`.
std::vector<uint8_t> tail_seen_by(const cuda::Stream& stream, const cuda::DeviceBuffer<uint8_t>& d,
                                  cuda::DeviceBuffer<uint8_t>& tail) {
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(tail.get(), d.get() + kBytes - kTail, kTail,
                                    cudaMemcpyDeviceToDevice, stream.get()));
  stream.synchronize();
  return tail.download();
}

TEST(DeviceMemoryGpu, UploadsAreCompleteForANonBlockingStream) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  cuda::Stream stream;
  cuda::DeviceBuffer<uint8_t> d(kBytes), tail(kTail);
  std::vector<uint8_t> host(kBytes);
  for (int round = 1; round <= 16; ++round) {
    std::fill(host.begin(), host.end(), (uint8_t)round);
    d.upload(host);
    const auto seen = tail_seen_by(stream, d, tail);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), (uint8_t)round), (long)kTail)
        << "round " << round;
  }
}

TEST(DeviceMemoryGpu, FillsAreCompleteForANonBlockingStream) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  cuda::Stream stream;
  cuda::DeviceBuffer<uint8_t> d(kBytes), tail(kTail);
  for (int round = 1; round <= 16; ++round) {
    cuda::set_device_bytes(d.get(), round, kBytes);
    const auto seen = tail_seen_by(stream, d, tail);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), (uint8_t)round), (long)kTail)
        << "round " << round;
  }
}

}  // namespace
}  // namespace hablar::test
