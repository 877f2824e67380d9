// Split GGUF models (formats/gguf_split.cpp): any shard's path opens the whole model, and
// each way a set of shards can be inconsistent is an error naming the file.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "support/test_support.h"

namespace hablar::gguf {
namespace {

std::vector<uint8_t> tensor_bytes(int seed, size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = (uint8_t)(seed * 31 + i * 7);
  return b;
}

// Five tensors of the model, in order; shard s of the split takes those of `assignment`.
const char* const kTensorNames[] = {"token_embd.weight", "blk.0.attn_q.weight",
                                    "blk.0.ffn_up.weight", "blk.1.attn_q.weight",
                                    "output_norm.weight"};

void add_model_tensor(GgufWriter& w, int i) {
  w.add_tensor_bytes(kTensorNames[i], DType::F32, {8, 2 + i}, tensor_bytes(i, 32 * (2 + i)));
}

// Shard `shard` of `count`: the first carries the model's metadata; every shard carries the
// split keys (as gguf-split writes them) and the tensors assigned to it.
GgufWriter shard_writer(int shard, int count, const std::vector<int>& assignment,
                        int tensors_total = 5) {
  GgufWriter w;
  if (shard == 0) {
    w.set("general.architecture", Value::string("llama"));
    w.set("llama.block_count", Value::u32(2));
  }
  w.set("split.no", Value{ValueType::U16, uint64_t(shard)});
  w.set("split.count", Value{ValueType::U16, uint64_t(count)});
  w.set("split.tensors.count", Value{ValueType::I32, int64_t(tensors_total)});
  for (int i = 0; i < 5; ++i)
    if (assignment[i] == shard) add_model_tensor(w, i);
  return w;
}

std::string shard_path(const std::string& dir, int shard, int count) {
  char name[64];
  std::snprintf(name, sizeof name, "/model-%05d-of-%05d.gguf", shard + 1, count);
  return dir + name;
}

const std::vector<int> kThreeShards = {0, 0, 1, 1, 2};

std::string write_three_shards(const std::string& dir) {
  for (int s = 0; s < 3; ++s) shard_writer(s, 3, kThreeShards).write(shard_path(dir, s, 3));
  return shard_path(dir, 0, 3);
}

std::string error_of(const std::string& path) {
  try {
    GgufFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GgufSplit, AnyShardOpensTheWholeModel) {
  const std::string dir = hablar::test::make_temp_dir("gguf-split");
  write_three_shards(dir);
  for (int s = 0; s < 3; ++s) {
    const GgufFile f = GgufFile::open(shard_path(dir, s, 3));
    EXPECT_EQ(f.path(), shard_path(dir, 0, 3));
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
    EXPECT_FALSE(f.has("split.count"));
    EXPECT_FALSE(f.has("split.no"));
    ASSERT_EQ(f.tensors().size(), 5u);
    for (int i = 0; i < 5; ++i) {
      const TensorInfo& t = f.tensors()[i];
      EXPECT_EQ(t.name, kTensorNames[i]);
      const std::vector<uint8_t> want = tensor_bytes(i, 32 * (2 + i));
      ASSERT_EQ(t.nbytes, want.size());
      EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), want) << t.name;
    }
  }
  // One shard on its own stays one file.
  const GgufFile middle = GgufFile::open_one(shard_path(dir, 1, 3));
  EXPECT_EQ(middle.tensors().size(), 2u);
  EXPECT_EQ(middle.get_uint("split.no"), 1u);
  std::filesystem::remove_all(dir);
}

TEST(GgufSplit, TheModelOutlivesItsShardObjects) {
  const std::string dir = hablar::test::make_temp_dir("gguf-split-life");
  GgufFile f = GgufFile::open(write_three_shards(dir));
  GgufFile moved = std::move(f);
  const TensorInfo& last = moved.tensor("output_norm.weight");
  EXPECT_EQ(std::vector<uint8_t>(last.data, last.data + last.nbytes), tensor_bytes(4, 32 * 6));
  std::filesystem::remove_all(dir);
}

TEST(GgufSplit, AMissingShardIsAnIoErrorNamingIt) {
  const std::string dir = hablar::test::make_temp_dir("gguf-split-missing");
  write_three_shards(dir);
  std::filesystem::remove(shard_path(dir, 2, 3));
  try {
    GgufFile::open(shard_path(dir, 0, 3));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("shard 3 of 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(shard_path(dir, 2, 3)), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(GgufSplit, ARenamedShardCannotFindItsSiblings) {
  const std::string dir = hablar::test::make_temp_dir("gguf-split-name");
  write_three_shards(dir);
  std::filesystem::rename(shard_path(dir, 0, 3), dir + "/model.gguf");
  EXPECT_NE(error_of(dir + "/model.gguf").find("does not end in '-00001-of-00003.gguf'"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(GgufSplit, InconsistentShardsAreFormatErrors) {
  const std::string dir = hablar::test::make_temp_dir("gguf-split-bad");
  // A shard that says it is another one.
  write_three_shards(dir);
  shard_writer(2, 3, {0, 0, 1, 1, 1}).write(shard_path(dir, 1, 3));
  shard_writer(1, 3, {0, 0, 1, 1, 2}).write(shard_path(dir, 2, 3));
  EXPECT_NE(error_of(shard_path(dir, 0, 3)).find("do not say shard 2 of 3"), std::string::npos);
  // A tensor in two shards.
  write_three_shards(dir);
  GgufWriter dup = shard_writer(2, 3, kThreeShards);
  add_model_tensor(dup, 0);
  dup.write(shard_path(dir, 2, 3));
  EXPECT_NE(error_of(shard_path(dir, 0, 3)).find("token_embd.weight is also in an earlier shard"),
            std::string::npos);
  // A shard missing from the count the first one states.
  for (int s = 0; s < 3; ++s) shard_writer(s, 3, kThreeShards, 6).write(shard_path(dir, s, 3));
  EXPECT_NE(error_of(shard_path(dir, 1, 3)).find("says 6 tensors, the shards hold 5"),
            std::string::npos);
  // split.no beyond split.count.
  GgufWriter beyond = shard_writer(0, 3, kThreeShards);
  beyond.set("split.no", Value{ValueType::U16, uint64_t(7)});
  beyond.write(dir + "/beyond-00008-of-00003.gguf");
  EXPECT_NE(error_of(dir + "/beyond-00008-of-00003.gguf").find("is not below split.count"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(GgufSplit, ASingleShardCountIsAnOrdinaryFile) {
  const std::string dir = hablar::test::make_temp_dir("gguf-split-one");
  shard_writer(0, 1, {0, 0, 0, 0, 0}).write(dir + "/whole.gguf");
  const GgufFile f = GgufFile::open(dir + "/whole.gguf");
  EXPECT_EQ(f.tensors().size(), 5u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hablar::gguf
