#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "formats/gguf.h"

namespace hablar::gguf {
namespace {

GgufWriter sample_writer() {
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.set("llama.block_count", Value::u32(30));
  w.set("llama.rope.freq_base", Value::f32(10000.0f));
  w.set("flag", Value::boolean(true));
  w.set("neg", Value::i64(-5));
  w.set("tokens", Value::string_array({"a", "", "\xe2\x96\x81hello"}));
  w.set("nested", Value::array(ValueType::ARRAY, {Value::i32_array({1, 2}), Value::i32_array({})}));
  std::vector<uint8_t> data(4 * 8);
  for (size_t i = 0; i < data.size(); ++i) data[i] = (uint8_t)i;
  w.add_tensor_bytes("t.f32", DType::F32, {4, 2}, data);
  w.add_tensor_bytes("t.q8", DType::Q8_0, {32}, std::vector<uint8_t>(34, 7));
  return w;
}

TEST(GgufRoundTrip, MetadataAndTensorsSurvive) {
  const std::vector<uint8_t> bytes = sample_writer().to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "mem.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count"), 30u);
  EXPECT_FLOAT_EQ((float)f.get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_TRUE(f.get_bool("flag"));
  EXPECT_EQ(f.get_int("neg"), -5);
  EXPECT_EQ(f.get_string_array("tokens"), (std::vector<std::string>{"a", "", "\xe2\x96\x81hello"}));
  const Array& nested = f.get_array("nested");
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(std::get<Array>(nested.items[0].data).items.size(), 2u);
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorInfo& t = f.tensor("t.f32");
  EXPECT_EQ(t.dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t.nbytes, 32u);
  EXPECT_EQ(t.data[5], 5);
  EXPECT_EQ(f.tensor("t.q8").nbytes, 34u);
  EXPECT_EQ((t.data - bytes.data()) % 32, 0);
}

TEST(GgufRoundTrip, TypedAccessorErrorsNameKeyAndTypes) {
  const std::vector<uint8_t> bytes = sample_writer().to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "mem.gguf");
  try {
    f.get_string("llama.block_count");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "mem.gguf: key llama.block_count is u32, expected string");
  }
  try {
    f.get_uint("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "mem.gguf: key nope missing");
  }
}

}  // namespace
}  // namespace hablar::gguf
