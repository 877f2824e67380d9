// The CUDA executor's K/V snapshots (engine/kv_snapshot.h): blocks of the device's paged
// cache copied to and from host bytes, region by region (for_each_kv_copy), through a pinned
// staging buffer on the executor's stream. Called between steps only: nothing launched, so
// the copies see every step's writes and no step sees a half-written block.
#include "engine/cuda_executor_impl.h"
#include "engine/kv_snapshot.h"

namespace hablar::engine::cuda_executor_detail {

namespace {
// The most bytes staged at once (whole blocks, at least one).
constexpr size_t kKvStagingBytes = size_t{64} << 20;
}  // namespace

bool CudaExecutor::kv_snapshot_layout(KvCacheLayout* layout, std::string* why) const {
  if (model_.config().embedding_only || !kv_.get()) {
    if (why) *why = "this model embeds only: it keeps no KV cache to save or restore";
    return false;
  }
  if (layout) *layout = layout_;
  return true;
}

void CudaExecutor::read_kv_blocks(std::span<const int32_t> blocks, std::span<uint8_t> out) {
  copy_kv_blocks(blocks, out.data(), out.size(), /*to_host=*/true);
}

void CudaExecutor::write_kv_blocks(std::span<const int32_t> blocks, std::span<const uint8_t> in) {
  // (the host side is only read when copying to the device)
  copy_kv_blocks(blocks, const_cast<uint8_t*>(in.data()), in.size(), /*to_host=*/false);
}

// Rounds of whole blocks: staged (host -> pinned), copied region by region on the stream,
// waited for, unstaged (pinned -> host).
void CudaExecutor::copy_kv_blocks(std::span<const int32_t> blocks, uint8_t* host, size_t host_bytes,
                                  bool to_host) {
  HABLAR_CHECK(launched_.empty(), "K/V blocks copied while a step is in flight");
  const size_t block_bytes = layout_.block_bytes();
  HABLAR_CHECK(host_bytes == blocks.size() * block_bytes, "K/V block copy of the wrong size");
  if (blocks.empty()) return;
  stream_.synchronize();  // every step's writes are in the cache
  const size_t per_round = std::max<size_t>(1, kKvStagingBytes / block_bytes);
  cuda::PinnedMemory staging(std::min(blocks.size(), per_round) * block_bytes);
  auto* pinned = static_cast<uint8_t*>(staging.get());
  auto* cache = static_cast<uint8_t*>(kv_.get());
  for (size_t first = 0; first < blocks.size(); first += per_round) {
    const std::span<const int32_t> round =
        blocks.subspan(first, std::min(per_round, blocks.size() - first));
    uint8_t* host_round = host + first * block_bytes;
    const size_t round_bytes = round.size() * block_bytes;
    if (!to_host) std::memcpy(pinned, host_round, round_bytes);
    for_each_kv_copy(layout_, round, round_bytes, [&](size_t units, size_t at, size_t bytes) {
      uint8_t* device = cache + units * 2;  // (units are 2 bytes)
      HABLAR_CUDA_CHECK(
          to_host
              ? cudaMemcpyAsync(pinned + at, device, bytes, cudaMemcpyDeviceToHost, stream_.get())
              : cudaMemcpyAsync(device, pinned + at, bytes, cudaMemcpyHostToDevice, stream_.get()));
    });
    stream_.synchronize();
    if (to_host) std::memcpy(host_round, pinned, round_bytes);
  }
}

}  // namespace hablar::engine::cuda_executor_detail
