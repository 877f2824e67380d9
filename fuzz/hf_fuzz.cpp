// libFuzzer target for the Hugging Face and APR readers. The first byte picks the parser, the rest
// is its input:
//   0  a safetensors file: parsed; every tensor's first and last byte touched
//   1  config.json: mapped to GGUF metadata and read as a model configuration
//   2  tokenizer.json: loaded as a tokenizer, then a few texts encoded and decoded
//   3  an APR v2 file, its two CRC-32s recomputed first (so that mutations reach the index
//      and metadata checks; tests/unit/model/apr_test.cpp checks the CRCs themselves):
//      parsed, every tensor's first and last byte touched
// Any crash, sanitizer report, trap or exception other than hablar::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "formats/apr.h"
#include "formats/gguf.h"
#include "formats/hf_model.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace hablar;

void fuzz_safetensors(std::span<const uint8_t> bytes) {
  const safetensors::File f = safetensors::File::parse(bytes, "fuzz.safetensors");
  volatile uint8_t sink = 0;
  for (const safetensors::Tensor& t : f.tensors())
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
}

void fuzz_config(std::string_view text) {
  auto meta = formats::hf_config_metadata(text, "fuzz/config.json");
  const gguf::GgufFile f = gguf::GgufFile::assemble("fuzz", std::move(meta), {}, nullptr);
  (void)model::config_from_gguf(f);  // no tensors: ends in an Error naming token_embd
}

void fuzz_tokenizer(std::string_view text) {
  std::vector<std::pair<std::string, gguf::Value>> meta{
      {"tokenizer.huggingface.json", gguf::Value::string(std::string(text))}};
  const gguf::GgufFile f = gguf::GgufFile::assemble("fuzz", std::move(meta), {}, nullptr);
  const auto tok = tokenizer::Tokenizer::from_gguf(f);
  for (std::string_view s :
       {"Hello world, it's 2024!", " \t\n ünïcödé 日本語 🦙", "\xff\xfe<s>[CLS]", ""}) {
    const std::vector<int32_t> ids = tok->encode(s, true, true);
    (void)tok->decode(ids, true);
  }
  const int32_t n = std::min<int32_t>(tok->n_vocab(), 4096);
  for (int32_t id = 0; id < n; ++id) (void)tok->token_text(id, true, id == 0);
}

void fuzz_apr(std::span<const uint8_t> input) {
  std::vector<uint8_t> bytes(input.begin(), input.end());
  if (bytes.size() >= 68) {
    std::vector<uint8_t> h(bytes.begin(), bytes.begin() + 40);
    h.insert(h.end(), bytes.begin() + 44, bytes.begin() + 64);
    const uint32_t hc = apr::crc32(h);
    std::memcpy(bytes.data() + 40, &hc, 4);
    const uint32_t fc = apr::crc32(std::span<const uint8_t>(bytes.data(), bytes.size() - 4));
    std::memcpy(bytes.data() + bytes.size() - 4, &fc, 4);
  }
  const gguf::GgufFile f = apr::parse(bytes, "fuzz.apr");
  volatile uint8_t sink = 0;
  for (const gguf::TensorInfo& t : f.tensors())
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  const std::string_view text(reinterpret_cast<const char*>(rest.data()), rest.size());
  try {
    switch (data[0] % 4) {
      case 0:
        fuzz_safetensors(rest);
        break;
      case 1:
        fuzz_config(text);
        break;
      case 2:
        fuzz_tokenizer(text);
        break;
      default:
        fuzz_apr(rest);
        break;
    }
  } catch (const hablar::Error&) {
  }
  return 0;
}
