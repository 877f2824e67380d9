// quantize_row against llama.cpp's quantizers (the ones llama-quantize runs without an
// importance matrix) for the formats gguf-py cannot quantize: K-quants, IQ4_NL, IQ4_XS and
// the Q8_1 / Q8_K activation blocks. The inputs and llama.cpp's blocks are in
// golden/quant_llama_cpp.bin, written by tests/tools/make_quant_golden.py.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "support/test_support.h"

namespace hablar {
namespace {

struct Golden {
  uint32_t row_length = 0;
  uint32_t n_rows = 0;
  std::vector<float> inputs;
  std::map<std::string, std::vector<uint8_t>> blocks;  // by GGUF type name
};

// Reads the little-endian layout documented in make_quant_golden.py.
Golden load_golden() {
  const std::string path = test::source_dir() + "/tests/unit/core/golden/quant_llama_cpp.bin";
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) {
    if (pos + n > bytes.size()) throw std::runtime_error(path + " is truncated");
    std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
  };
  char magic[4];
  take(magic, 4);
  if (std::memcmp(magic, "HQG1", 4) != 0) throw std::runtime_error(path + ": bad magic");
  Golden g;
  take(&g.row_length, 4);
  take(&g.n_rows, 4);
  g.inputs.resize((size_t)g.row_length * g.n_rows);
  take(g.inputs.data(), g.inputs.size() * sizeof(float));
  while (pos < bytes.size()) {
    uint8_t name_length;
    take(&name_length, 1);
    std::string name(name_length, '\0');
    take(name.data(), name_length);
    uint32_t n_bytes;
    take(&n_bytes, 4);
    std::vector<uint8_t> data(n_bytes);
    take(data.data(), n_bytes);
    g.blocks[name] = std::move(data);
  }
  return g;
}

TEST(QuantGolden, MatchesLlamaCppByteForByte) {
  const Golden g = load_golden();
  ASSERT_GT(g.n_rows, 0u);
  const char* expected_formats[] = {"q2_K", "q3_K",   "q4_K",   "q5_K", "q6_K",
                                    "q8_K", "iq4_nl", "iq4_xs", "q8_1"};
  for (const char* name : expected_formats) ASSERT_TRUE(g.blocks.count(name)) << name;
  for (const auto& [name, want] : g.blocks) {
    const DType type = *dtype_from_name(name);
    const size_t row_bytes = dtype_row_bytes(type, g.row_length);
    ASSERT_EQ(want.size(), row_bytes * g.n_rows) << name;
    const size_t block_bytes = dtype_traits(type).block_bytes;
    std::vector<uint8_t> got(row_bytes);
    int differing_blocks = 0;
    for (uint32_t r = 0; r < g.n_rows; ++r) {
      quantize_row(type, g.inputs.data() + (size_t)r * g.row_length, got.data(), g.row_length);
      for (size_t b = 0; b < row_bytes; b += block_bytes)
        if (std::memcmp(got.data() + b, want.data() + r * row_bytes + b, block_bytes) != 0)
          ++differing_blocks;
    }
    std::printf("%-7s %zu blocks, %d differ from llama.cpp\n", name.c_str(),
                want.size() / block_bytes, differing_blocks);
    EXPECT_EQ(differing_blocks, 0) << name;
  }
}

}  // namespace
}  // namespace hablar
