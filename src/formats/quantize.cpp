// The quantize driver: metadata as llama.cpp's quantizer leaves it, then each tensor copied
// (same type) or converted row by row (to float, then the target type's reference
// quantizer), spread over a thread pool in chunks of rows.
#include <algorithm>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "formats/quantize.h"

namespace hablar::formats {
namespace {

constexpr uint32_t kQuantizationVersion = 2;  // GGML_QNT_VERSION

// Keys llama.cpp's quantizer sets again at the end of the list, or drops.
bool key_rewritten(const std::string& key) {
  return key == "general.quantization_version" || key == "general.file_type" || key == "split.no" ||
         key == "split.count" || key == "split.tensors.count";
}

void check_source(const QuantizedTensorPlan& p, const QuantizeOptions& o) {
  const DType from = p.source->type;
  if (from == p.type) return;
  if (!has_dequantizer(from))
    throw_error(ErrorKind::kUnsupported, "quantize: tensor " + p.source->name + " has type " +
                                             std::string(dtype_name(from)) +
                                             ", which cannot be converted");
  if (dtype_traits(from).quantized && !o.allow_requantize)
    throw_error(ErrorKind::kInvalidArgument,
                "quantize: tensor " + p.source->name + " is already " +
                    std::string(dtype_name(from)) +
                    "; requantizing loses accuracy (pass --allow-requantize to do it anyway)");
  if (!has_quantizer(p.type))
    throw_error(ErrorKind::kUnsupported,
                "quantize: no quantizer for " + std::string(dtype_name(p.type)));
}

// Rows [first, first + n) of the source converted into `out`, rows spread over the pool.
void convert_rows(const QuantizedTensorPlan& p, ThreadPool& pool, int64_t first, int64_t n,
                  std::span<uint8_t> out) {
  const int64_t cols = p.source->dims[0];
  const size_t in_row = dtype_row_bytes(p.source->type, cols);
  const size_t out_row = dtype_row_bytes(p.type, cols);
  pool.run([&](int ti, int nt) {
    // Contiguous runs of rows per thread: each thread streams through its own memory.
    const int64_t per = (n + nt - 1) / nt;
    const int64_t begin = std::min(n, per * ti), end = std::min(n, begin + per);
    std::vector<float> row((size_t)cols);
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* src = p.source->data + (size_t)(first + r) * in_row;
      uint8_t* dst = out.data() + (size_t)r * out_row;
      if (p.source->type == DType::F32) {
        quantize_row(p.type, reinterpret_cast<const float*>(src), dst, cols);
      } else {
        dequantize_row(p.source->type, src, row.data(), cols);
        quantize_row(p.type, row.data(), dst, cols);
      }
    }
  });
}

}  // namespace

gguf::GgufWriter quantize_model(const gguf::GgufFile& f, Ftype ftype, const QuantizeOptions& o) {
  gguf::GgufWriter w;
  for (const auto& [key, value] : f.metadata())
    if (!key_rewritten(key) && key != "general.source.format") w.set(key, value);
  w.set("general.quantization_version", gguf::Value::u32(kQuantizationVersion));
  w.set("general.file_type", gguf::Value::u32((uint32_t)ftype));
  if (f.alignment() != 32) w.set_alignment((uint32_t)f.alignment());

  auto plan = std::make_shared<std::vector<QuantizedTensorPlan>>(plan_quantization(f, ftype));
  for (const QuantizedTensorPlan& p : *plan) check_source(p, o);
  const int n_threads =
      o.n_threads > 0 ? o.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
  auto pool = std::make_shared<ThreadPool>(n_threads);
  const int count = (int)plan->size();
  for (int i = 0; i < count; ++i) {
    const QuantizedTensorPlan* p = &(*plan)[(size_t)i];
    auto progress = o.progress;
    auto announce = [progress, p, i, count](int64_t first) {
      if (progress && first == 0) progress(QuantizeProgress{i + 1, count, p});
    };
    if (p->type == p->source->type) {
      const size_t row_bytes = dtype_row_bytes(p->type, p->source->dims[0]);
      w.add_tensor_rows(
          p->source->name, p->type, p->dims,
          [p, plan, announce, row_bytes](int64_t first, int64_t n, std::span<uint8_t> out) {
            announce(first);
            const uint8_t* src = p->source->data + (size_t)first * row_bytes;
            std::copy(src, src + (size_t)n * row_bytes, out.begin());
          });
    } else {
      w.add_tensor_rows(
          p->source->name, p->type, p->dims,
          [p, plan, pool, announce](int64_t first, int64_t n, std::span<uint8_t> out) {
            announce(first);
            convert_rows(*p, *pool, first, n, out);
          });
    }
  }
  return w;
}

}  // namespace hablar::formats
