// hablar_quant_tool: file-to-file access to the reference (de)quantizers, for tests written
// in other languages (tests/python/test_quant_gguf.py compares it with gguf-py).
//
//   hablar_quant_tool dequantize <type> <blocks.bin> <values.f32>
//   hablar_quant_tool quantize   <type> <values.f32> <blocks.bin>
//
// <type> is a GGUF type name ("q4_K", "iq4_nl", "f16", ...); .f32 files are raw little-endian
// float32 arrays, block files the raw bytes of consecutive blocks (whole blocks only).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) hablar::throw_error(hablar::ErrorKind::kIo, "cannot open " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), (std::streamsize)size);
  if (!out) hablar::throw_error(hablar::ErrorKind::kIo, "cannot write " + path);
}

hablar::DType parse_type(const std::string& name) {
  const auto type = hablar::dtype_from_name(name);
  if (!type) hablar::throw_error(hablar::ErrorKind::kInvalidArgument, "unknown type " + name);
  return *type;
}

void dequantize_file(hablar::DType type, const std::string& in, const std::string& out) {
  const std::vector<char> blocks = read_file(in);
  const hablar::DTypeTraits& traits = hablar::dtype_traits(type);
  if (blocks.size() % traits.block_bytes != 0)
    hablar::throw_error(hablar::ErrorKind::kInvalidArgument,
                        in + " does not hold whole " + std::string(traits.name) + " blocks");
  const int64_t n = (int64_t)(blocks.size() / traits.block_bytes) * traits.block_elems;
  std::vector<float> values((size_t)n);
  hablar::dequantize_row(type, blocks.data(), values.data(), n);
  write_file(out, values.data(), values.size() * sizeof(float));
}

void quantize_file(hablar::DType type, const std::string& in, const std::string& out) {
  const std::vector<char> bytes = read_file(in);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::copy(bytes.begin(), bytes.begin() + (std::ptrdiff_t)(values.size() * sizeof(float)),
            reinterpret_cast<char*>(values.data()));
  const int64_t n = (int64_t)values.size();
  std::vector<char> blocks(hablar::dtype_row_bytes(type, n));
  hablar::quantize_row(type, values.data(), blocks.data(), n);
  write_file(out, blocks.data(), blocks.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s dequantize|quantize <type> <input> <output>\n", argv[0]);
    return 2;
  }
  try {
    const std::string verb = argv[1];
    const hablar::DType type = parse_type(argv[2]);
    if (verb == "dequantize") {
      dequantize_file(type, argv[3], argv[4]);
    } else if (verb == "quantize") {
      quantize_file(type, argv[3], argv[4]);
    } else {
      std::fprintf(stderr, "unknown command %s\n", verb.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
