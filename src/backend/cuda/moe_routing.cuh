// The mixture-of-experts steps of backend/cpu/moe.cpp that are not products, as functions a
// CUDA kernel and a host test both compile (cpu_rounding.cuh's convention: every float
// operation written out, so nvcc contracts nothing the CPU does not):
//   - the C library's expf (the CPU's softmax takes it for the values past the last block of
//     16, and the shared expert's sigmoid), as glibc computes it on x86-64 with FMA;
//   - route_token: a token's softmax over the router's logits, its n_used likeliest experts
//     (descending, ties to the lower index, as std::stable_sort) and their weights;
//   - expert_slots: the (token, slot) entries routed to one expert, in slot order (a stable
//     counting sort, one expert per thread on the device); active_experts: the experts with
//     entries, which the grouped products walk;
//   - f16_expert_dot: the dot-product order the CPU takes for F16 experts;
//   - combine_value: one output value, the weighted expert rows added in slot order, plus the
//     shared expert scaled by its sigmoid gate.
// The CUDA backend runs them in both modes (they are cheap); tests/unit/cuda/
// moe_routing_host_test.cpp holds them equal to cpu::moe_ffn on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cuda/cpu_rounding.cuh"

namespace hablar::moe_routing {
namespace cr = hablar::cpu_rounding;

// 2^(i/32) for i in [0, 32), as doubles: the table of the exp below (libc_expf_table()).
struct ExpTable {
  double two_pow[32];
};

// The table, correctly rounded from long double (host only).
inline ExpTable libc_expf_table() {
  ExpTable t;
  for (int i = 0; i < 32; ++i) t.two_pow[i] = (double)std::exp2l((long double)i / 32.0L);
  return t;
}

HABLAR_RHD double d_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
HABLAR_RHD double d_sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

// expf as glibc computes it (double arithmetic over a 32-entry table of 2^(i/32) and a cubic;
// its x86-64 build with FMA fuses the polynomial's steps): x * 32 / ln 2 = k + r, then
// e^x = 2^(k/32) * p(r), rounded once to float.
HABLAR_RHD float libc_expf(float x, const ExpTable& t) {
  if (x != x) return x + x;
  if (x > 0x1.62e42ep6f) return INFINITY;
  if (x < -0x1.9fe368p6f) return 0.0f;
  const double inv_ln2_32 = 0x1.71547652b82fep+0 * 32.0;
  const double shift = 0x1.8p+52;
  const double c0 = 0x1.c6af84b912394p-5 / (32.0 * 32.0 * 32.0);
  const double c1 = 0x1.ebfce50fac4f3p-3 / (32.0 * 32.0);
  const double c2 = 0x1.62e42ff0c52d6p-1 / 32.0;
  const double z = d_mul(inv_ln2_32, (double)x);
  const double kd_shifted = cr::add_d(z, shift);  // z rounded to an integer, in the low bits
  uint64_t ki;
  std::memcpy(&ki, &kd_shifted, 8);
  const double kd = d_sub(kd_shifted, shift);
  const double r = d_sub(z, kd);
  // 2^(k/32): the table entry of k mod 32 with k div 32 added to its exponent.
  const int64_t k = (int64_t)kd;
  const int64_t q = (k >= 0 ? k : k - 31) / 32;  // floor(k / 32)
  const double s = t.two_pow[ki % 32];
  uint64_t sb;
  std::memcpy(&sb, &s, 8);
  sb += (uint64_t)q << 52;
  double scale;
  std::memcpy(&scale, &sb, 8);
  const double p1 = fma(c0, r, c1);
  const double r2 = d_mul(r, r);
  const double p2 = fma(c2, r, 1.0);
  const double y = fma(p1, r2, p2);
  return (float)d_mul(y, scale);
}

// Softmax of n router logits into probs (may be logits) as the CPU's softmax_row: blocks of
// 16 exps (exp_approx) reduced in float and summed in double, the tail with expf added one by
// one, then every value times (float)(1 / sum).
HABLAR_RHD void softmax_row(const float* logits, float* probs, int n, const ExpTable& t) {
  float max = -INFINITY;
  for (int i = 0; i < n; ++i) max = fmaxf(max, logits[i]);
  double sum = 0.0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    float block[16];
    for (int l = 0; l < 16; ++l)
      probs[i + l] = block[l] = cr::exp_approx(cr::sub(logits[i + l], max));
    sum = cr::add_d(sum, (double)cr::reduce16(block));
  }
  for (; i < n; ++i) {
    probs[i] = libc_expf(cr::sub(logits[i], max), t);
    sum = cr::add_d(sum, (double)probs[i]);
  }
#if defined(__CUDA_ARCH__)
  const float inv = (float)__ddiv_rn(1.0, sum);
#else
  const float inv = (float)(1.0 / sum);
#endif
  for (int k = 0; k < n; ++k) probs[k] = cr::mul(probs[k], inv);
}

// The most experts per token route_token handles.
inline constexpr int kMaxExpertsUsed = 16;

// Token routing: probs [n_experts] (softmax_row's output), the n_used likeliest in descending
// order (equal probabilities: the lower index first) into chosen[n_used], and their weights:
// renormalized over the chosen (their sum in double, clamped below at 2^-14, one float
// division each) when `normalize`, else the probabilities themselves.
HABLAR_RHD void route_token(const float* probs, int n_experts, int n_used, bool normalize,
                            int32_t* chosen, float* weights) {
  double sum = 0.0;
  for (int j = 0; j < n_used; ++j) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || chosen[i] == e;
      if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
    }
    chosen[j] = best;
    sum = cr::add_d(sum, (double)probs[best]);
  }
  const float total = fmaxf((float)sum, 6.103515625e-5f);
  for (int j = 0; j < n_used; ++j)
    weights[j] = normalize ? cr::div(probs[chosen[j]], total) : probs[chosen[j]];
}

// The entries i of chosen[n] (token i / n_used, slot i % n_used) routed to expert e, in
// order, written to out (when given); returns how many.
HABLAR_RHD int64_t expert_slots(const int32_t* chosen, int64_t n, int32_t e, int32_t* out) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (chosen[i] == e) {
      if (out) out[count] = (int32_t)i;
      ++count;
    }
  return count;
}

// The experts that have entries (offsets [E + 1], as grouped), in expert order, written to
// active[0 .. n_slots); -1 fills the slots past the last. The grouped products run a slice of
// blocks per slot (n_slots = min(entries, E) covers every case without the host).
HABLAR_RHD void active_experts(const int32_t* offsets, int n_experts, int32_t* active,
                               int n_slots) {
  int s = 0;
  for (int e = 0; e < n_experts && s < n_slots; ++e)
    if (offsets[e + 1] > offsets[e]) active[s++] = e;
  for (; s < n_slots; ++s) active[s] = -1;
}

// An F16 expert row against x [cols] in the CPU's order for experts (moe.cpp
// f16_expert_product): x rounded to half, 64 partial sums by index (products rounded, then
// added), folded to 16 and reduced, the tail past the last 64 added in double.
HABLAR_RHD float f16_expert_dot(const uint16_t* w, const float* x, int64_t cols) {
  const int64_t main = cols / 64 * 64;
  float part[64], lanes[16];
  for (int l = 0; l < 64; ++l) part[l] = 0.0f;
  for (int64_t c = 0; c < main; ++c)
    part[c % 64] = cr::add(part[c % 64], cr::mul(cr::half_round(x[c]), fp16_to_f32(w[c])));
  cr::fold64(part, lanes);
  double sum = (double)cr::reduce16(lanes);
  for (int64_t c = main; c < cols; ++c)
    sum = cr::add_d(sum, (double)cr::mul(cr::half_round(x[c]), fp16_to_f32(w[c])));
  return (float)sum;
}

// Output value d of a token: its experts' rows (rows[j], the expert of slot j, value d)
// weighted and added in slot order, then, with a shared expert, shared_d times
// sigmoid(gate_logit) taken as silu(g) / g.
HABLAR_RHD float combine_value(const float* const* rows, const float* weights, int n_used,
                               int64_t d, bool shared, float shared_d, float gate_logit,
                               const ExpTable& t) {
  float o = 0.0f;
  for (int j = 0; j < n_used; ++j) {
    const float v = cr::mul(rows[j][d], weights[j]);
    o = j == 0 ? v : cr::add(o, v);
  }
  if (shared) {
    const float g = gate_logit;
    const float gate = cr::div(cr::div(g, cr::add(1.0f, libc_expf(-g, t))), g);
    o = cr::add(o, cr::mul(shared_d, gate));
  }
  return o;
}

}  // namespace hablar::moe_routing
