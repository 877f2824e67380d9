// libFuzzer target for the GGUF reader: parses arbitrary bytes, and when they parse, reads
// every metadata value through every typed accessor, summarises the model and touches the
// first and last byte of every tensor's data. Any crash, sanitizer report, or exception other
// than hablar::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

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
    expect_value_or_error([&] { sink = sink + f.get_array(key).items.size(); });
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const GgufFile f = GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
    touch_metadata(f);
    touch_tensors(f);
    const hablar::gguf::ModelInfo info = hablar::gguf::summarize_model(f);
    volatile double bpw = info.bits_per_weight();
    (void)bpw;
  } catch (const hablar::Error&) {
    // A clear error is the expected outcome for malformed input.
  }
  return 0;
}
