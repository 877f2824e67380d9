// cuda::ForwardOps, its products: the dispatch between the product paths (kept bf16 copies
// through cuBLAS, f16 tensor cores, int8 rows, the f32 and WMMA kernels, dequantize + cuBLAS),
// the buffers they reserve, and which of them the writers of product inputs (the norms, the
// gated activation) prepare rows for.
#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <tuple>

#include "backend/cuda/cpu_rounding_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/forward_ops.h"
#include "backend/cuda/forward_ops_buffers.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul_f16.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/ops.h"
#include "core/error.h"

namespace hablar::cuda {

void ForwardOps::reserve_product_workspace(std::span<const WeightView* const> matrices) {
  if (limits_.deterministic) {
    size_t bytes = 0;
    for (const WeightView* w : matrices)
      bytes = std::max(bytes, cpu_rounding_ops::activation_bytes(*w, limits_.max_tokens));
    buf_->cpu_rounding_workspace = DeviceMemory(std::max<size_t>(bytes, 256));
    return;
  }
  size_t bytes = 0;
  const int rows = std::min(limits_.max_tokens, kFusedMatmulMaxRows);
  for (const WeightView* w : matrices)
    for (int m = 1; m <= rows; ++m) bytes = std::max(bytes, matmul_fused_workspace_bytes(*w, m));
  buf_->int8_workspace = DeviceMemory(bytes);
  reserve_f16_products(matrices);
}

// The rows and split-K scratch of the f16 tensor-core products, for every shape among the
// matrices that takes them at some step size up to max_tokens; the norms write f16 rows from
// the step size at which the most common f16-capable weight type starts taking the f16 path
// (their products are mostly of that type).
void ForwardOps::reserve_f16_products(std::span<const WeightView* const> matrices) {
  const int64_t hi = std::min<int64_t>(limits_.max_tokens, f16_product_max_rows());
  std::set<std::tuple<DType, int64_t, int64_t>> shapes;
  std::map<DType, int> matrices_of_type;
  for (const WeightView* w : matrices)
    if (f16_product_supported(*w)) {
      shapes.insert({w->type, w->rows, w->cols});
      ++matrices_of_type[w->type];
    }
  size_t rows_bytes = 0, scratch_bytes = 0;
  for (const auto& [type, n, k] : shapes) {
    rows_bytes = std::max(rows_bytes, f16_rows_bytes((int)hi, k));
    WeightView shape;
    shape.type = type, shape.rows = n, shape.cols = k;
    shape.row_bytes = dtype_row_bytes(type, k);
    for (int64_t m = f16_product_min_rows(type); m <= hi; ++m)
      scratch_bytes = std::max(scratch_bytes, f16_product_scratch_bytes(shape, (int)m));
  }
  if (rows_bytes == 0) return;  // no f16-capable matrix, or none at these step sizes
  buf_->f16_rows = DeviceMemory(rows_bytes);
  buf_->f16_scratch = DeviceMemory(std::max<size_t>(scratch_bytes, 256));
  const auto most_common =
      std::max_element(matrices_of_type.begin(), matrices_of_type.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  writers_f16_from_ = f16_product_min_rows(most_common->first);
}

void ForwardOps::keep_bf16_weights(std::span<const WeightView* const> matrices,
                                   std::span<const std::array<const WeightView*, 3>> qkv) {
  int64_t widest = 0, widest_stack = 0;
  for (const WeightView* w : matrices) {
    buf_->prefill.keep_bf16(*w, stream_);
    widest = std::max(widest, w->cols);
  }
  for (const auto& triple : qkv) {
    buf_->prefill.keep_bf16_stacked(triple, stream_);
    widest = std::max(widest, triple[0]->cols);
    if (buf_->prefill.stacked_copies(triple) != nullptr)
      widest_stack = std::max(widest_stack, triple[0]->rows + triple[1]->rows + triple[2]->rows);
  }
  if (!limits_.deterministic && widest > 0)
    buf_->bf16_rows = DeviceMemory((size_t)limits_.max_tokens * (size_t)widest * sizeof(uint16_t));
  if (!limits_.deterministic && widest_stack > 0)
    buf_->qkv_rows =
        DeviceMemory((size_t)limits_.max_tokens * (size_t)widest_stack * sizeof(float));
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

size_t ForwardOps::kept_bf16_bytes() const {
  return buf_->prefill.kept_bytes();
}

// Whether a product of m rows runs on f16 tensor cores (Q4_K or Q6_K, many rows, outside
// deterministic mode); it is chosen before the int8 path.
bool ForwardOps::takes_f16_path(const WeightView& w, int64_t m) const {
  return !limits_.deterministic && buf_->f16_rows.get() != nullptr && f16_product_preferred(w, m) &&
         f16_rows_bytes((int)m, w.cols) <= buf_->f16_rows.bytes() &&
         f16_product_scratch_bytes(w, (int)m) <= buf_->f16_scratch.bytes();
}

// Whether steps of m rows multiply the kept bf16 copies (cuBLAS at full tensor-core rate on
// 2-byte weights): from kept_bf16_min_rows(), where that beats dequantizing in the product.
bool ForwardOps::kept_bf16_at(int64_t m) const {
  return !limits_.deterministic && buf_->bf16_rows.get() != nullptr && m >= kept_bf16_min_rows() &&
         m <= limits_.max_tokens;
}

bool ForwardOps::takes_kept_bf16_path(const WeightView& w, int64_t m) const {
  return kept_bf16_at(m) && buf_->prefill.keeps(w);
}

bool ForwardOps::all_take_kept_copies(std::span<const WeightView* const> ws) const {
  return std::all_of(ws.begin(), ws.end(),
                     [&](const WeightView* w) { return takes_kept_bf16_path(*w, n_tokens_); });
}

void ForwardOps::kept_bf16_product(const WeightView& w, const float* in, int64_t m, float* out,
                                   bool* converted) {
  auto* rows = static_cast<uint16_t*>(buf_->bf16_rows.get());
  if (!*converted) convert_f32_to_bf16(in, rows, m * w.cols, stream_);
  *converted = true;
  buf_->prefill.multiply_kept(w, rows, (int)m, out, stream_);
}

void ForwardOps::kept_bf16_pair(const WeightView& wa, const WeightView& wb, const float* in,
                                int64_t m, float* out_a, float* out_b, bool* converted) {
  auto* rows = static_cast<uint16_t*>(buf_->bf16_rows.get());
  if (!*converted) convert_f32_to_bf16(in, rows, m * wa.cols, stream_);
  *converted = true;
  buf_->prefill.multiply_kept_pair(wa, wb, rows, (int)m, out_a, out_b, stream_);
}

// Q, K and V over their stacked kept copies as one GEMM into rows of [q | k | v]
// (qkv_rows), each queued as a row-work entry that reads its part of those rows
// (RowWorkEntry::src): the bias and RoPE that follow join the entries, and the pass that runs
// them (before any other op) writes q, k and v to their own buffers, so the split costs no
// pass of its own. Where the three do not all take stacked kept copies at m rows, or a
// matrix is not whole heads: false, nothing queued. Only copies kept as a stack take it (the
// executor stacks them unless the lab knob HABLAR_QKV_STACKED=0 is set).
bool ForwardOps::stacked_qkv(const float* in, int64_t m, std::span<const WeightView* const> ws,
                             std::span<float* const> outs, bool* converted) {
  if (ws.size() != 3 || buf_->qkv_rows.get() == nullptr || !all_take_kept_copies(ws)) return false;
  const uint16_t* stack = buf_->prefill.stacked_copies(ws);
  const int64_t n = ws[0]->rows + ws[1]->rows + ws[2]->rows, k = ws[0]->cols;
  if (stack == nullptr || (size_t)(m * n) * sizeof(float) > buf_->qkv_rows.bytes()) return false;
  for (const WeightView* w : ws)
    if (w->rows % dims_.head_dim != 0) return false;
  auto* rows = static_cast<uint16_t*>(buf_->bf16_rows.get());
  if (!*converted) convert_f32_to_bf16(in, rows, m * k, stream_);
  *converted = true;
  auto* fused = static_cast<float*>(buf_->qkv_rows.get());
  buf_->prefill.gemm_bf16(stack, rows, n, k, (int)m, fused, stream_);
  RowWorkBatch& batch = buf_->pending_rows;  // (empty: the caller flushed)
  int64_t offset = 0;
  for (size_t i = 0; i < 3; ++i) {
    RowWorkEntry& e = batch.e[batch.n++];
    e = {outs[i], nullptr, (int)(ws[i]->rows / dims_.head_dim)};
    e.src = fused + offset, e.src_stride = n;
    offset += ws[i]->rows;
  }
  return true;
}

// Whether a product of m rows runs on int8 activations (Q4_K outside deterministic mode).
bool ForwardOps::takes_int8_path(const WeightView& w, int64_t m) const {
  return !limits_.deterministic && buf_->int8_workspace.get() != nullptr &&
         m <= kFusedMatmulMaxRows && matmul_fused_workspace_bytes(w, (int)m) > 0 &&
         !takes_f16_path(w, m);
}

void ForwardOps::f16_product(const WeightView& w, const float* in, int64_t m, float* out,
                             bool* converted) {
  if (!*converted)
    convert_rows_to_f16(in, (int)m, w.cols, buf_->f16_rows.get(), buf_->f16_rows.bytes(), stream_);
  *converted = true;
  matmul_f16(w, buf_->f16_rows.get(), (int)m, out, buf_->f16_scratch.get(), stream_);
}

void ForwardOps::product(const WeightView& w, const float* in, int64_t m, float* out,
                         const uint8_t* roles) {
  HABLAR_CHECK(buf_->bf16_only != in || in == nullptr,
               "ForwardOps: rows held only as bf16 reach an f32 product");
  buf_->forget_held_rows();  // the int8 path below quantizes into the workspace
  if (limits_.deterministic) {
    const auto* inputs = static_cast<const int32_t*>(buf_->inputs.get());
    if (roles == nullptr) roles = reinterpret_cast<const uint8_t*>(inputs + buf_->roles);
    HABLAR_CHECK(cpu_rounding_ops::activation_bytes(w, m) <= buf_->cpu_rounding_workspace.bytes(),
                 "deterministic product beyond its reserved workspace");
    cpu_rounding_ops::matmul(w, in, m, roles, out, buf_->cpu_rounding_workspace.get(), stream_);
    return;
  }
  void* int8_ws = buf_->int8_workspace.get();
  const size_t int8_bytes = buf_->int8_workspace.bytes();
  bool converted = false;
  if (takes_kept_bf16_path(w, m)) {
    kept_bf16_product(w, in, m, out, &converted);
  } else if (takes_f16_path(w, m)) {
    f16_product(w, in, m, out, &converted);
  } else if (takes_int8_path(w, m)) {
    matmul_fused(w, in, (int)m, out, stream_, int8_ws, int8_bytes);
  } else if (m <= kGemvMaxRows) {
    for (int64_t r = 0; r < m; r += kGemvMaxRows)
      matmul_fused(w, in + r * w.cols, (int)std::min<int64_t>(kGemvMaxRows, m - r),
                   out + r * w.rows, stream_);
  } else if (m <= kFusedMatmulMaxRows) {
    matmul_fused(w, in, (int)m, out, stream_);
  } else {
    buf_->prefill.run(w, in, (int)m, out, stream_);
  }
}

// Whether the op that writes m rows of `width` values (a norm, the attention's reduction) also
// quantizes them for the int8 products (outside deterministic mode, when they fit the
// workspace).
bool ForwardOps::writer_quantizes(int64_t m, int64_t width) const {
  return !limits_.deterministic && buf_->int8_workspace.get() != nullptr && !writers_f16_at(m) &&
         !kept_bf16_at(m) && m <= kFusedMatmulMaxRows && width % 32 == 0 &&
         q8_activation_bytes((int)m, width) <= buf_->int8_workspace.bytes();
}

// Whether the op that writes m rows of `width` values (a norm) also converts them into the
// f16 rows of the f16 tensor-core products (at the step sizes that take them).
bool ForwardOps::writer_converts(int64_t m, int64_t width) const {
  return !limits_.deterministic && writers_f16_at(m) && width % 4 == 0 &&
         f16_rows_bytes((int)m, width) <= buf_->f16_rows.bytes();
}

// Whether the op that writes m rows of `width` values (a norm, the gated activation) also
// writes them as the bf16 rows of the products over kept bf16 copies (at the step sizes that
// take them).
bool ForwardOps::writer_writes_bf16(int64_t m, int64_t width) const {
  return kept_bf16_at(m) && (size_t)m * (size_t)width * sizeof(uint16_t) <= buf_->bf16_rows.bytes();
}

// Whether steps of m rows are in the range where the writers of product inputs produce f16
// rows rather than int8 ones.
bool ForwardOps::writers_f16_at(int64_t m) const {
  return buf_->f16_rows.get() != nullptr && m >= writers_f16_from_ && m <= f16_product_max_rows() &&
         !kept_bf16_at(m);
}

void ForwardOps::matmul(const WeightView& w, const float* in, float* out) {
  const WeightView* ws[] = {&w};
  float* outs[] = {out};
  products_of_one_input(in, n_tokens_, ws, outs);
}

void ForwardOps::matmul_add(const WeightView& w, const float* in, float* tmp, float* x, float s) {
  const int64_t width = w.rows;
  if (!takes_kept_bf16_path(w, n_tokens_) || lab_knob("HABLAR_GEMM_ADD", 1) == 0) {
    matmul(w, in, tmp);
    if (s != 0.0f) scale(tmp, s, width);
    return add(x, tmp, width);
  }
  bool converted = buf_->bf16_holds == in;
  flush();  // an add queued on x lands first
  auto* rows = static_cast<uint16_t*>(buf_->bf16_rows.get());
  if (!converted) convert_f32_to_bf16(in, rows, n_tokens_ * w.cols, stream_);
  buf_->prefill.multiply_kept_add(w, rows, (int)n_tokens_, x, s != 0.0f ? s : 1.0f, stream_);
  buf_->forget_held_rows();
}

// The int8 rows of `in` (m x k) in the workspace: quantized now, unless *quantized says (or
// q8_holds said, before the caller's flush) the op that wrote them already did.
Q8Activations ForwardOps::int8_rows(const float* in, int64_t m, int64_t k, bool* quantized) {
  void* ws = buf_->int8_workspace.get();
  if (!*quantized)
    quantize_activations_q8(in, (int)m, k, ws, buf_->int8_workspace.bytes(), stream_);
  *quantized = true;
  return q8_layout(ws, (int)m, k);
}

// Products of one input of m rows: on the int8 path the input is quantized once for all of
// them (or not at all when the norm that wrote it did); the Q4_K matrices among them that the
// rows kernels take at m rows (q4k_rows_take) run in one launch (matmul_q4k_rows_multi: Q, K
// and V).
void ForwardOps::products_of_one_input(const float* in, int64_t m,
                                       std::span<const WeightView* const> ws,
                                       std::span<float* const> outs) {
  bool quantized = buf_->q8_holds == in;
  bool converted = buf_->f16_holds == in;        // to f16 rows, once for all of them
  bool bf16_converted = buf_->bf16_holds == in;  // to bf16 rows, likewise
  const bool bf16_only = buf_->bf16_only == in;  // no f32 values: only the kept path may read
  flush();
  if (bf16_only)
    for (const WeightView* w : ws)
      HABLAR_CHECK(takes_kept_bf16_path(*w, m),
                   "ForwardOps: rows held only as bf16 reach a product without a kept copy");
  if (stacked_qkv(in, m, ws, outs, &bf16_converted)) return buf_->forget_held_rows();
  void* int8_ws = buf_->int8_workspace.get();
  const WeightView* together[3] = {};
  float* together_out[3] = {};
  size_t n_together = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const WeightView& w = *ws[i];
    if (takes_kept_bf16_path(w, m)) {
      const WeightView* next = i + 1 < ws.size() ? ws[i + 1] : nullptr;
      if (next != nullptr && next->rows == w.rows && next->cols == w.cols &&
          takes_kept_bf16_path(*next, m)) {  // K and V: one launch
        kept_bf16_pair(w, *next, in, m, outs[i], outs[i + 1], &bf16_converted);
        ++i;
        continue;
      }
      kept_bf16_product(w, in, m, outs[i], &bf16_converted);
      continue;
    }
    if (takes_f16_path(w, m)) {
      f16_product(w, in, m, outs[i], &converted);
      continue;
    }
    if (!takes_int8_path(w, m)) {
      product(w, in, m, outs[i]);
      continue;
    }
    int8_rows(in, m, w.cols, &quantized);  // once for all of them
    if (n_together < 3 && q4k_rows_take(w, m) && (n_together == 0 || together[0]->cols == w.cols)) {
      together[n_together] = &w, together_out[n_together++] = outs[i];
      continue;
    }
    matmul_prequantized(w, (int)m, outs[i], int8_ws, stream_);
  }
  if (n_together > 0) {
    const Q8Activations xa = int8_rows(in, m, together[0]->cols, &quantized);
    matmul_q4k_rows_multi({together, n_together}, {together_out, n_together}, xa.codes, xa.scales,
                          stream_, (int)m);
  }
  buf_->forget_held_rows();
}

void ForwardOps::matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv,
                            const float* in, float* q, float* k, float* v) {
  const WeightView* ws[] = {&wq, &wk, &wv};
  float* outs[] = {q, k, v};
  products_of_one_input(in, n_tokens_, ws, outs);
}

// Whether the gated products of this step run on kept bf16 copies with bf16 outputs
// (glu_over_kept_copies).
bool ForwardOps::glu_in_bf16(const WeightView& gate, const WeightView& up) const {
  return takes_kept_bf16_path(gate, n_tokens_) && takes_kept_bf16_path(up, n_tokens_) &&
         writer_writes_bf16(n_tokens_, gate.rows) && lab_knob("HABLAR_GLU_BF16", 1) != 0;
}

// Gate and up over their kept copies writing bf16 (half the bytes of f32 outputs, in the
// first halves of out and up_scratch), then the activation from those into the down
// product's bf16 rows only: of [n_tokens][ffn] the step moves 3 x 2 bytes a value where the
// f32 form moved 2 x 4 written + 2 x 4 read + 4 + 2 written. `out` receives no f32 values;
// the down product over its kept copy reads the bf16 rows (products_of_one_input checks it).
void ForwardOps::glu_over_kept_copies(const WeightView& gate, const WeightView& up, const float* in,
                                      float* out, float* up_scratch, GluActivation act) {
  const bool converted = buf_->bf16_holds == in;
  flush();
  auto* rows = static_cast<uint16_t*>(buf_->bf16_rows.get());
  if (!converted) convert_f32_to_bf16(in, rows, n_tokens_ * gate.cols, stream_);
  auto* gate_bf16 = reinterpret_cast<uint16_t*>(out);
  auto* up_bf16 = reinterpret_cast<uint16_t*>(up_scratch);
  buf_->prefill.multiply_kept_to_bf16(gate, rows, (int)n_tokens_, gate_bf16, stream_);
  buf_->prefill.multiply_kept_to_bf16(up, rows, (int)n_tokens_, up_bf16, stream_);
  glu_bf16_rows(gate_bf16, up_bf16, act, rows, n_tokens_ * gate.rows, stream_);
  buf_->forget_held_rows();
  buf_->bf16_holds = out;
  buf_->bf16_only = out;
}

void ForwardOps::matmul_glu(const WeightView& gate, const WeightView& up, const float* in,
                            float* out, float* up_scratch, GluActivation act) {
  // Few tokens (q4k_rows_take), Q4_K: both products and the activation in one launch.
  if (q4k_rows_take(gate, n_tokens_) && q4k_rows_take(up, n_tokens_) &&
      takes_int8_path(gate, n_tokens_) && takes_int8_path(up, n_tokens_) &&
      q4k_rows_glu_supported(gate, up)) {
    bool quantized = buf_->q8_holds == in;
    flush();
    const Q8Activations xa = int8_rows(in, n_tokens_, gate.cols, &quantized);
    buf_->forget_held_rows();
    return matmul_q4k_rows_glu(gate, up, xa.codes, xa.scales, out, act, stream_, (int)n_tokens_);
  }
  if (glu_in_bf16(gate, up)) return glu_over_kept_copies(gate, up, in, out, up_scratch, act);
  const WeightView* ws[] = {&gate, &up};
  float* outs[] = {out, up_scratch};
  products_of_one_input(in, n_tokens_, ws, outs);
  if (act == GluActivation::kGeluTanh && limits_.deterministic) {
    cpu_rounding_ops::geglu(out, up_scratch, out, n_tokens_ * gate.rows,
                            static_cast<const float*>(buf_->gelu_table.get()), stream_);
  } else if (writer_writes_bf16(n_tokens_, gate.rows)) {  // the down product's bf16 rows too
    glu_to_bf16(out, up_scratch, act, out, static_cast<uint16_t*>(buf_->bf16_rows.get()),
                n_tokens_ * gate.rows, stream_);
    buf_->bf16_holds = out;
  } else if (writer_converts(n_tokens_, gate.rows)) {  // the down product's f16 rows too
    glu_rows_to_f16(out, up_scratch, act, out, (int)n_tokens_, gate.rows, buf_->f16_rows.get(),
                    buf_->f16_rows.bytes(), stream_);
    buf_->f16_holds = out;
  } else if (act == GluActivation::kGeluTanh) {
    geglu(out, up_scratch, out, n_tokens_ * gate.rows, stream_);
  } else if (limits_.deterministic) {
    cpu_rounding_ops::swiglu(out, up_scratch, out, n_tokens_ * gate.rows, stream_);
  } else {
    swiglu(out, up_scratch, out, n_tokens_ * gate.rows, stream_);
  }
}

}  // namespace hablar::cuda
