// Split GGUF models: one model stored as n shards. Each shard is a complete GGUF file whose
// metadata carries split.no (0-based), split.count (n) and split.tensors.count (tensors of
// the whole model); the first shard also carries the model's metadata, and every shard
// holds its own tensors in its own data section. Shard k of n (k from 1) is named
// "<prefix>-%05d-of-%05d.gguf", so the path of any shard locates the others.
#include <cstdio>
#include <memory>
#include <set>

#include "core/error.h"
#include "formats/gguf.h"

namespace hablar::gguf {
namespace {

constexpr std::string_view kSplitNo = "split.no";
constexpr std::string_view kSplitCount = "split.count";
constexpr std::string_view kSplitTensors = "split.tensors.count";
constexpr uint64_t kMaxShards = 99999;  // five digits in the name

std::string shard_suffix(uint64_t index, uint64_t count) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "-%05llu-of-%05llu.gguf", (unsigned long long)(index + 1),
                (unsigned long long)count);
  return buf;
}

bool is_split_key(std::string_view key) {
  return key == kSplitNo || key == kSplitCount || key == kSplitTensors;
}

[[noreturn]] void fail_split(const std::string& path, const std::string& why) {
  throw_error(ErrorKind::kFormat, path + ": split model: " + why);
}

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
  GgufFile file = open_one(path);
  const std::optional<uint64_t> count = file.uint_or_none(kSplitCount);
  if (!count || *count <= 1) return file;
  return join_shards(std::move(file), *count);
}

GgufFile GgufFile::join_shards(GgufFile given, uint64_t count) {
  const std::string path = given.path();
  if (count > kMaxShards)
    fail_split(path,
               "split.count " + std::to_string(count) + " exceeds " + std::to_string(kMaxShards));
  const uint64_t index = given.get_uint_or(kSplitNo, 0);
  if (index >= count)
    fail_split(path, "split.no " + std::to_string(index) + " is not below split.count " +
                         std::to_string(count));
  const std::string suffix = shard_suffix(index, count);
  if (path.size() <= suffix.size() ||
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
    fail_split(path, "it is shard " + std::to_string(index + 1) + " of " + std::to_string(count) +
                         " but its name does not end in '" + suffix +
                         "', so the other shards cannot be found");
  const std::string prefix = path.substr(0, path.size() - suffix.size());

  std::vector<GgufFile> shards(count);
  shards[index] = std::move(given);
  for (uint64_t i = 0; i < count; ++i) {
    if (i == index) continue;
    const std::string shard_path = prefix + shard_suffix(i, count);
    try {
      shards[i] = open_one(shard_path);
    } catch (const Error& e) {
      throw_error(e.kind(), "split model " + path + ": shard " + std::to_string(i + 1) + " of " +
                                std::to_string(count) + ": " + e.what());
    }
    if (shards[i].get_uint_or(kSplitNo, count) != i ||
        shards[i].get_uint_or(kSplitCount, 0) != count)
      fail_split(shard_path, "its split.no / split.count do not say shard " +
                                 std::to_string(i + 1) + " of " + std::to_string(count));
  }

  std::vector<std::pair<std::string, Value>> metadata;
  for (const auto& kv : shards[0].kv_)
    if (!is_split_key(kv.first)) metadata.push_back(kv);
  std::vector<TensorInfo> tensors;
  std::set<std::string, std::less<>> names;
  auto maps = std::make_shared<std::vector<std::shared_ptr<MappedFile>>>();
  for (GgufFile& shard : shards) {
    for (const TensorInfo& t : shard.tensors_) {
      if (!names.insert(t.name).second)
        fail_split(shard.path(), "tensor " + t.name + " is also in an earlier shard");
      tensors.push_back(t);
    }
    maps->push_back(shard.map_);
  }
  if (const auto total = shards[0].uint_or_none(kSplitTensors); total && *total != tensors.size())
    fail_split(shards[0].path(), "split.tensors.count says " + std::to_string(*total) +
                                     " tensors, the shards hold " + std::to_string(tensors.size()));
  GgufFile whole = assemble(shards[0].path(), std::move(metadata), std::move(tensors), maps);
  whole.version_ = shards[0].version_;
  whole.alignment_ = shards[0].alignment_;
  return whole;
}

}  // namespace hablar::gguf
