#include <gtest/gtest.h>

#include <cstring>

#include <filesystem>
#include <limits>

#include "core/error.h"
#include "formats/gguf.h"
#include "gguf_test_util.h"
#include "support/test_support.h"

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
  EXPECT_EQ(std::get<Array>(nested.items[0].data).size(), 2u);
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

TEST(GgufRoundTrip, EveryScalarTypeKeepsItsTypeAndValue) {
  GgufWriter w;
  w.set("u8", Value::u8(255));
  w.set("i8", Value{ValueType::I8, int64_t{-128}});
  w.set("u16", Value{ValueType::U16, uint64_t{65535}});
  w.set("i16", Value{ValueType::I16, int64_t{-32768}});
  w.set("u32", Value::u32(std::numeric_limits<uint32_t>::max()));
  w.set("i32", Value::i32(std::numeric_limits<int32_t>::min()));
  w.set("u64", Value::u64(std::numeric_limits<uint64_t>::max()));
  w.set("i64", Value::i64(std::numeric_limits<int64_t>::min()));
  w.set("f32", Value::f32(-1.5f));
  w.set("f64", Value::f64(1e300));
  w.set("b", Value::boolean(false));
  w.set("s", Value::string(std::string("nul\0inside", 10)));
  const std::vector<uint8_t> bytes = w.to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "mem.gguf");
  const std::vector<std::pair<std::string, ValueType>> want = {
      {"u8", ValueType::U8},   {"i8", ValueType::I8},   {"u16", ValueType::U16},
      {"i16", ValueType::I16}, {"u32", ValueType::U32}, {"i32", ValueType::I32},
      {"u64", ValueType::U64}, {"i64", ValueType::I64}, {"f32", ValueType::F32},
      {"f64", ValueType::F64}, {"b", ValueType::BOOL},  {"s", ValueType::STRING}};
  ASSERT_EQ(f.metadata().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, want[i].first);  // file order is kept
    EXPECT_EQ(f.metadata()[i].second.type, want[i].second) << want[i].first;
  }
  EXPECT_EQ(f.get_uint("u8"), 255u);
  EXPECT_EQ(f.get_int("i8"), -128);
  EXPECT_EQ(f.get_uint("u16"), 65535u);
  EXPECT_EQ(f.get_int("i16"), -32768);
  EXPECT_EQ(f.get_uint("u32"), std::numeric_limits<uint32_t>::max());
  EXPECT_EQ(f.get_int("i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f.get_uint("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("f32"), -1.5);
  EXPECT_EQ(f.get_float("f64"), 1e300);
  EXPECT_FALSE(f.get_bool("b"));
  EXPECT_EQ(f.get_string("s"), std::string("nul\0inside", 10));
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufRoundTrip, NestedArraysOfMixedElementTypes) {
  GgufWriter w;
  w.set("n",
        Value::array(ValueType::ARRAY, {Value::string_array({"a", "bc"}), Value::f32_array({0.5f}),
                                        Value::array(ValueType::ARRAY, {Value::i32_array({7})})}));
  w.set("empty", Value::string_array({}));
  const std::vector<uint8_t> bytes = w.to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "mem.gguf");
  const Array& n = f.get_array("n");
  EXPECT_EQ(n.elem_type, ValueType::ARRAY);
  ASSERT_EQ(n.items.size(), 3u);
  const Array& strings = std::get<Array>(n.items[0].data);
  EXPECT_EQ(strings.elem_type, ValueType::STRING);
  EXPECT_EQ(std::get<std::string>(strings.items[1].data), "bc");
  EXPECT_EQ(std::get<double>(std::get<Array>(n.items[1].data).at(0).data), 0.5);
  const Array& inner = std::get<Array>(std::get<Array>(n.items[2].data).items[0].data);
  EXPECT_EQ(std::get<int64_t>(inner.at(0).data), 7);
  EXPECT_TRUE(f.get_string_array("empty").empty());
}

TEST(GgufRoundTrip, VersionTwoFilesReadTheSame) {
  std::vector<uint8_t> bytes = test::small_writer().to_bytes();
  test::patch<uint32_t>(bytes, 4, 2);
  const GgufFile f = GgufFile::parse(bytes, "v2.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
  EXPECT_EQ(f.tensors().size(), 3u);
}

TEST(GgufRoundTrip, CustomAlignmentPlacesEveryTensorOnIt) {
  GgufWriter w = test::small_writer();
  w.set_alignment(256);
  const std::vector<uint8_t> bytes = w.to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "mem.gguf");
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.data_offset() % 256, 0u);
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.offset % 256, 0u) << t.name;
    EXPECT_EQ((size_t)(t.data - bytes.data()), f.data_offset() + t.offset) << t.name;
  }
  EXPECT_EQ(f.tensor("w.f16").data[0], 0x3c);
}

TEST(GgufRoundTrip, TensorInfosAndDataSurvive) {
  const std::vector<uint8_t> bytes = test::small_writer().to_bytes();
  const GgufFile f = GgufFile::parse(bytes, "mem.gguf");
  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo& q8 = f.tensors()[0];
  EXPECT_EQ(q8.name, "w.q8");
  EXPECT_EQ(q8.type, DType::Q8_0);
  EXPECT_EQ(q8.rows(), 2);
  EXPECT_EQ(q8.nbytes, 68u);
  EXPECT_EQ(q8.shape_string(), "[32, 2]");
  const TensorInfo& f32 = f.tensor("w.f32");
  EXPECT_EQ(f32.n_elements(), 32);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(f32.data[i], (uint8_t)(i * 7)) << i;
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_THROW(f.tensor("nope"), Error);
}

TEST(GgufRoundTrip, WriteToDiskThenOpenMaps) {
  const std::string dir = hablar::test::make_temp_dir("gguf-rt");
  const std::string path = dir + "/small.gguf";
  test::small_writer().write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.file_size(), test::small_writer().to_bytes().size());
  EXPECT_EQ(f.tensor("w.f16").data[63], 0x3c);
  std::filesystem::remove_all(dir);
}

TEST(GgufRoundTrip, WriterRejectsBadInputsWithoutLeavingAFile) {
  const std::string dir = hablar::test::make_temp_dir("gguf-bad");
  GgufWriter w;
  EXPECT_THROW(w.add_tensor("x", DType::F32, {0, 2}, [](std::span<uint8_t>) {}), Error);
  EXPECT_THROW(w.add_tensor("x", DType::Q4_0, {33}, [](std::span<uint8_t>) {}), Error);
  EXPECT_THROW(w.set_alignment(24), Error);
  w.add_tensor("t", DType::F32, {4},
               [](std::span<uint8_t>) { throw Error(ErrorKind::kInternal, "fill failed"); });
  EXPECT_THROW(w.write(dir + "/x.gguf"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.gguf"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.gguf.partial"));
  GgufWriter mismatch;
  mismatch.set("k", Value{ValueType::U32, std::string("not a number")});
  EXPECT_THROW(mismatch.to_bytes(), Error);
  std::filesystem::remove_all(dir);
}

TEST(GgufRoundTrip, RowChunkedTensorsAreWrittenInBoundedChunks) {
  GgufWriter w;
  w.set_row_chunk_bytes(100);  // 3 rows of 32 bytes per call
  std::vector<std::pair<int64_t, int64_t>> calls;
  w.add_tensor_rows("rows", DType::F32, {8, 10},
                    [&](int64_t first, int64_t n, std::span<uint8_t> out) {
                      calls.emplace_back(first, n);
                      ASSERT_EQ(out.size(), (size_t)n * 32);
                      for (int64_t r = 0; r < n; ++r)
                        for (int c = 0; c < 8; ++c) {
                          const float v = (float)((first + r) * 100 + c);
                          std::memcpy(out.data() + r * 32 + c * 4, &v, 4);
                        }
                    });
  w.add_tensor_bytes("after", DType::F16, {4}, std::vector<uint8_t>(8, 9));
  const std::vector<uint8_t> bytes = w.to_bytes();
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
  const GgufFile f = GgufFile::parse(bytes, "rows.gguf");
  const TensorInfo& t = f.tensor("rows");
  for (int r = 0; r < 10; ++r)
    for (int c = 0; c < 8; ++c) {
      float v;
      std::memcpy(&v, t.data + r * 32 + c * 4, 4);
      ASSERT_EQ(v, (float)(r * 100 + c)) << r << "," << c;
    }
  EXPECT_EQ(f.tensor("after").data[7], 9);
}

TEST(GgufOpen, MissingFileNamesThePath) {
  try {
    GgufFile::open("/nonexistent/dir/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.gguf"), std::string::npos);
  }
}

TEST(GgufOpen, MalformedFileOnDiskNamesThePath) {
  const std::string dir = hablar::test::make_temp_dir("gguf-open");
  const std::string path = dir + "/cut.gguf";
  std::vector<uint8_t> bytes = test::small_writer().to_bytes();
  bytes.resize(bytes.size() / 2);
  FILE* fp = std::fopen(path.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), fp);
  std::fclose(fp);
  try {
    GgufFile::open(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Every prefix of a valid file (cut at every byte offset) must fail with an Error, never
// crash or read past the end: the small file ends exactly where its last tensor ends.
TEST(GgufTruncation, EveryByteOffsetGivesAnError) {
  const std::vector<uint8_t> bytes = test::small_writer().to_bytes();
  const GgufFile whole = GgufFile::parse(bytes, "whole.gguf");
  const TensorInfo& last = whole.tensors().back();
  ASSERT_EQ(whole.data_offset() + last.offset + last.nbytes, bytes.size());
  for (size_t n = 0; n < bytes.size(); ++n) {
    // A copy of exactly n bytes, so that a read past the end is caught by sanitizers.
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + (std::ptrdiff_t)n);
    try {
      GgufFile::parse(cut, "cut.gguf");
      ADD_FAILURE() << "a file cut at " << n << " of " << bytes.size() << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
    }
  }
}

}  // namespace
}  // namespace hablar::gguf
