// Typed metadata accessors: conversions that fit succeed, everything else is an Error that
// names the file, the key and both types.
#include <gtest/gtest.h>

#include <limits>

#include "gguf_test_util.h"

namespace hablar::gguf {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

class GgufAccessors : public ::testing::Test {
 protected:
  void SetUp() override {
    GgufWriter w;
    w.set("u32", Value::u32(7));
    w.set("i32.neg", Value::i32(-7));
    w.set("u64.big", Value::u64(std::numeric_limits<uint64_t>::max()));
    w.set("f32", Value::f32(0.25f));
    w.set("str", Value::string("text"));
    w.set("flag", Value::boolean(true));
    w.set("strings", Value::string_array({"a", "b"}));
    w.set("floats", Value::f32_array({1.0f, -2.0f}));
    w.set("ints", Value::i32_array({3, -4}));
    w.set("i64s", Value::array(ValueType::I64, {Value::i64(int64_t{1} << 40)}));
    bytes_ = w.to_bytes();
    file_.emplace(GgufFile::parse(bytes_, "acc.gguf"));
  }
  const GgufFile& f() const { return *file_; }
  std::vector<uint8_t> bytes_;
  std::optional<GgufFile> file_;
};

TEST_F(GgufAccessors, MissingKey) {
  EXPECT_EQ(error_of([&] { f().get_uint("absent"); }), "acc.gguf: key absent missing");
  EXPECT_EQ(error_of([&] { f().get_string_array("absent"); }), "acc.gguf: key absent missing");
}

TEST_F(GgufAccessors, WrongScalarTypeNamesBothTypes) {
  EXPECT_EQ(error_of([&] { f().get_string("u32"); }), "acc.gguf: key u32 is u32, expected string");
  EXPECT_EQ(error_of([&] { f().get_float("str"); }), "acc.gguf: key str is string, expected f32");
  EXPECT_EQ(error_of([&] { f().get_bool("f32"); }), "acc.gguf: key f32 is f32, expected bool");
  EXPECT_EQ(error_of([&] { f().get_uint("strings"); }),
            "acc.gguf: key strings is array, expected an unsigned integer");
  EXPECT_EQ(error_of([&] { f().get_array("flag"); }), "acc.gguf: key flag is bool, expected array");
}

TEST_F(GgufAccessors, IntegerConversionsAreRangeChecked) {
  EXPECT_EQ(f().get_int("u32"), 7);
  EXPECT_EQ(f().get_uint("u32"), 7u);
  EXPECT_EQ(f().get_int("i32.neg"), -7);
  EXPECT_NE(error_of([&] { f().get_uint("i32.neg"); }).find("negative"), std::string::npos);
  EXPECT_NE(error_of([&] { f().get_int("u64.big"); }).find("out of range"), std::string::npos);
}

TEST_F(GgufAccessors, ArraysOfTheRightElementType) {
  EXPECT_EQ(f().get_string_array("strings"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f().get_f32_array("floats"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f().get_i32_array("ints"), (std::vector<int32_t>{3, -4}));
  EXPECT_EQ(error_of([&] { f().get_string_array("ints"); }),
            "acc.gguf: key ints is array of i32, expected array of string");
  EXPECT_NE(error_of([&] { f().get_i32_array("strings"); }).find("expected array of integers"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f().get_i32_array("i64s"); }).find("does not fit in i32"),
            std::string::npos);
}

TEST_F(GgufAccessors, FallbacksOnlyForMissingKeys) {
  EXPECT_EQ(f().get_uint_or("absent", 5), 5u);
  EXPECT_EQ(f().get_uint_or("u32", 5), 7u);
  EXPECT_EQ(f().get_float_or("absent", 1.5), 1.5);
  EXPECT_TRUE(f().get_bool_or("absent", true));
  EXPECT_EQ(f().get_string_or("absent", "x"), "x");
  EXPECT_EQ(f().uint_or_none("absent"), std::nullopt);
  EXPECT_EQ(f().uint_or_none("u32"), 7u);
  // A present key of the wrong type is an error, not the fallback.
  EXPECT_THROW(f().get_string_or("u32", "x"), Error);
}

}  // namespace
}  // namespace hablar::gguf
