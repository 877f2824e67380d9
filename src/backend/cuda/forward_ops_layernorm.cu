// phi2's ops of cuda::ForwardOps (model::LayerNormBackend; see forward_ops.h): LayerNorm with a
// bias, GELU-tanh, and the classifier with a bias. Default mode runs the embedding kernels'
// forms (embed_kernels.h: a warp per row, tanh GELU in f32); deterministic mode the CPU's
// roundings (cpu_rounding_ops: sequential sums, the CPU's GELU table).
#include "backend/cuda/cpu_rounding_ops.h"
#include "backend/cuda/embed_kernels.h"
#include "backend/cuda/forward_ops.h"
#include "backend/cuda/forward_ops_buffers.h"

namespace hablar::cuda {

void ForwardOps::layernorm(const float* x, const float* weight, const float* bias, float* out,
                           int64_t width) {
  flush();  // (a queued residual add lands in x first)
  if (limits_.deterministic)
    return cpu_rounding_ops::layernorm(x, weight, bias, out, n_tokens_, (int)width, eps_, stream_);
  embed::layernorm(embed::RowsIn{x, false}, nullptr, embed::RowsIn{}, weight, bias, out, nullptr,
                   (int)n_tokens_, (int)width, eps_, stream_);
}

void ForwardOps::gelu(float* x, int64_t width) {
  flush();  // (a queued bias lands in x first)
  if (limits_.deterministic)
    return cpu_rounding_ops::gelu(x, x, n_tokens_ * width,
                                  static_cast<const float*>(buf_->gelu_table.get()), stream_);
  embed::bias_act_f32(x, nullptr, n_tokens_, width, /*gelu=*/true, stream_);
}

// x holds normed rows already: the step's logit rows of it times the output matrix, plus the
// bias (one rounding each, as the CPU adds it).
void ForwardOps::classify(const float* x, const WeightView& output, const float* bias) {
  flush();
  if (n_logit_rows_ == 0) return;
  gather_logit_rows(x);
  const auto* inputs = static_cast<const int32_t*>(buf_->inputs.get());
  if (limits_.deterministic) {
    product(output, out_rows_, n_logit_rows_, logits_,
            reinterpret_cast<const uint8_t*>(inputs + buf_->logit_roles));
  } else {
    const WeightView* ws[] = {&output};
    float* outs[] = {logits_};
    products_of_one_input(out_rows_, n_logit_rows_, ws, outs);
  }
  embed::bias_act_f32(logits_, bias, n_logit_rows_, output.rows, /*gelu=*/false, stream_);
}

}  // namespace hablar::cuda
