// Writes the GGUF reader's seed corpus: small valid files from GgufWriter and the synthetic
// model builder, covering every metadata type, nested arrays, a custom alignment, version 2,
// every plain tensor layout and the three architectures' tensor sets.
//   gguf_seed_corpus OUT_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/synthetic_model.h"

namespace {

using hablar::DType;
using hablar::gguf::GgufWriter;
using hablar::gguf::Value;
using hablar::gguf::ValueType;

void save(const std::filesystem::path& dir, const std::string& name, std::vector<uint8_t> bytes,
          bool as_version_2 = false) {
  if (as_version_2) bytes[4] = 2;
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
  std::printf("%s: %zu bytes\n", name.c_str(), bytes.size());
}

GgufWriter every_value_type() {
  GgufWriter w;
  w.set("general.architecture", Value::string("llama"));
  w.set("u8", Value::u8(200));
  w.set("i8", Value{ValueType::I8, int64_t{-100}});
  w.set("u16", Value{ValueType::U16, uint64_t{60000}});
  w.set("i16", Value{ValueType::I16, int64_t{-30000}});
  w.set("u32", Value::u32(4000000000u));
  w.set("i32", Value::i32(-2000000000));
  w.set("u64", Value::u64(1ull << 60));
  w.set("i64", Value::i64(-(1ll << 60)));
  w.set("f32", Value::f32(3.5f));
  w.set("f64", Value::f64(-2.25));
  w.set("bool", Value::boolean(true));
  w.set("string", Value::string("hello"));
  w.set("strings", Value::string_array({"a", "", "\xe2\x96\x81x"}));
  w.set("floats", Value::f32_array({1.0f, -1.0f}));
  w.set("ints", Value::i32_array({1, -1}));
  w.set("nested",
        Value::array(ValueType::ARRAY, {Value::i32_array({1}), Value::string_array({"s"})}));
  return w;
}

GgufWriter plain_tensors() {
  GgufWriter w;
  w.set_alignment(64);
  w.set("general.architecture", Value::string("qwen2"));
  w.add_tensor_bytes("a.f32", DType::F32, {4, 2}, std::vector<uint8_t>(32, 1));
  w.add_tensor_bytes("b.f16", DType::F16, {8}, std::vector<uint8_t>(16, 2));
  w.add_tensor_bytes("c.bf16", DType::BF16, {2, 2, 2}, std::vector<uint8_t>(16, 3));
  w.add_tensor_bytes("d.q4_0", DType::Q4_0, {32, 1, 1, 2}, std::vector<uint8_t>(36, 4));
  w.add_tensor_bytes("e.q4_k", DType::Q4_K, {256}, std::vector<uint8_t>(144, 5));
  return w;
}

std::vector<uint8_t> micro_model(hablar::synth::Arch arch, const char* type) {
  hablar::synth::SyntheticModelOptions o;
  o.arch = arch;
  o.shape = {"micro", 32,  1,   2,       1,    16,
             64,      260, 128, 10000.0, 1e-5, arch != hablar::synth::Arch::kLlama};
  o.type = type;
  o.n_threads = 1;
  return hablar::synth::build_synthetic_model(o).to_bytes();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    save(dir, "empty.gguf", GgufWriter().to_bytes());
    save(dir, "values.gguf", every_value_type().to_bytes());
    save(dir, "values-v2.gguf", every_value_type().to_bytes(), true);
    save(dir, "tensors.gguf", plain_tensors().to_bytes());
    save(dir, "micro-llama-q8_0.gguf", micro_model(hablar::synth::Arch::kLlama, "q8_0"));
    save(dir, "micro-qwen2-f16.gguf", micro_model(hablar::synth::Arch::kQwen2, "f16"));
    save(dir, "micro-qwen3-q4_0.gguf", micro_model(hablar::synth::Arch::kQwen3, "q4_0"));
  } catch (const hablar::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
