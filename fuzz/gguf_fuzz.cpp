// libFuzzer target for the GGUF reader: parses arbitrary bytes, and when they parse, reads
// every metadata value through every typed accessor, summarises the model, touches the first
// and last byte of every tensor's data, then writes it all again with GgufWriter and checks
// that the rewritten file parses to the same contents. Any crash, sanitizer report, trap or
// exception other than hablar::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_info.h"

namespace {

using hablar::gguf::GgufFile;

template <typename Fn>
void expect_value_or_error(Fn&& fn) {
  try {
    fn();
  } catch (const hablar::Error&) {
  }
}

void touch_metadata(const GgufFile& f) {
  volatile uint64_t sink = 0;
  for (const auto& entry : f.metadata()) {
    const std::string& key = entry.first;  // a named reference: lambdas cannot capture bindings
    const hablar::gguf::Value& value = entry.second;
    expect_value_or_error([&] { sink = sink + f.get_uint(key); });
    expect_value_or_error([&] { sink = sink + (uint64_t)f.get_int(key); });
    expect_value_or_error([&] { sink = sink + (f.get_float(key) > 0 ? 1 : 0); });
    expect_value_or_error([&] { sink = sink + f.get_bool(key); });
    expect_value_or_error([&] { sink = sink + f.get_string(key).size(); });
    expect_value_or_error([&] { sink = sink + f.get_array(key).size(); });
    expect_value_or_error([&] { sink = sink + f.get_string_array(key).size(); });
    expect_value_or_error([&] { sink = sink + f.get_f32_array(key).size(); });
    expect_value_or_error([&] { sink = sink + f.get_i32_array(key).size(); });
    sink = sink + hablar::gguf::value_preview(value).size();
    sink = sink + (f.find(key) == &value ? 1 : 0);
  }
  sink = sink + f.get_uint_or("general.alignment", 0) + f.has("general.architecture");
}

void touch_tensors(const GgufFile& f) {
  volatile uint64_t sink = 0;
  for (const hablar::gguf::TensorInfo& t : f.tensors()) {
    sink = sink + t.data[0] + t.data[t.nbytes - 1];
    sink = sink + (uint64_t)t.rows() + t.shape_string().size();
    sink = sink + (f.find_tensor(t.name) == &t ? 1 : 0) + f.tensor(t.name).nbytes;
  }
}

bool same_value(const hablar::gguf::Value& a, const hablar::gguf::Value& b) {
  using hablar::gguf::Array;
  if (a.type != b.type || a.data.index() != b.data.index()) return false;
  if (const auto* x = std::get_if<double>(&a.data)) {
    const double y = std::get<double>(b.data);
    return std::memcmp(x, &y, sizeof y) == 0;  // NaNs compare by their bits
  }
  if (const auto* u = std::get_if<uint64_t>(&a.data)) return *u == std::get<uint64_t>(b.data);
  if (const auto* i = std::get_if<int64_t>(&a.data)) return *i == std::get<int64_t>(b.data);
  if (const auto* t = std::get_if<bool>(&a.data)) return *t == std::get<bool>(b.data);
  if (const auto* s = std::get_if<std::string>(&a.data)) return *s == std::get<std::string>(b.data);
  const Array* x = std::get_if<Array>(&a.data);
  const Array& y = std::get<Array>(b.data);
  if (x->elem_type != y.elem_type || x->size() != y.size()) return false;
  for (size_t i = 0; i < x->size(); ++i)
    if (!same_value(x->at(i), y.at(i))) return false;
  return true;
}

// Differential check: what was parsed, written again by GgufWriter, parses to the same
// metadata and tensors (general.alignment is rewritten as u32).
void check_rewrite_round_trip(const GgufFile& f) {
  hablar::gguf::GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  if (f.has("general.alignment")) w.set_alignment((uint32_t)f.alignment());
  for (const hablar::gguf::TensorInfo& t : f.tensors())
    w.add_tensor_bytes(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  const std::vector<uint8_t> bytes = w.to_bytes();
  const GgufFile g = GgufFile::parse(bytes, "rewritten.gguf");
  if (g.metadata().size() != f.metadata().size() || g.tensors().size() != f.tensors().size())
    __builtin_trap();
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    const auto& [key, value] = f.metadata()[i];
    if (g.metadata()[i].first != key) __builtin_trap();
    if (key != "general.alignment" && !same_value(g.metadata()[i].second, value)) __builtin_trap();
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& a = f.tensors()[i];
    const auto& b = g.tensors()[i];
    if (a.name != b.name || a.dims != b.dims || a.type != b.type || a.nbytes != b.nbytes ||
        std::memcmp(a.data, b.data, a.nbytes) != 0)
      __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const GgufFile f = GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
    touch_metadata(f);
    touch_tensors(f);
    check_rewrite_round_trip(f);
    const hablar::gguf::ModelInfo info = hablar::gguf::summarize_model(f);
    volatile double bpw = info.bits_per_weight();
    (void)bpw;
  } catch (const hablar::Error&) {
    // A clear error is the expected outcome for malformed input.
  }
  return 0;
}
