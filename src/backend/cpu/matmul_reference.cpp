// Scalar reference of matmul: the activations are quantized exactly as the SIMD path does
// (act_quant.h) and every block's dot product is an integer sum, scaled in float in a fixed
// order (for Q4_K, Q5_K and Q6_K, the order of the token's role: KOrder, matmul_internal.h).
// Written for clarity; the SIMD kernels are tested against it.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace hablar::cpu {
namespace {

float h2f(uint16_t h) {
  return fp16_to_f32(h);
}

// --- 32-value formats: codes[j] is the integer weight value (offset removed) ---------------

void codes_q4_0(const BlockQ4_0& b, int* c) {
  for (int j = 0; j < kQK / 2; ++j) {
    c[j] = (b.qs[j] & 0xF) - 8;
    c[j + kQK / 2] = (b.qs[j] >> 4) - 8;
  }
}
void codes_q4_1(const BlockQ4_1& b, int* c) {
  for (int j = 0; j < kQK / 2; ++j) {
    c[j] = b.qs[j] & 0xF;
    c[j + kQK / 2] = b.qs[j] >> 4;
  }
}
uint32_t high_bits(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return h;
}
void codes_q5(const uint8_t* qs, const uint8_t* qh_bytes, int offset, int* c) {
  const uint32_t qh = high_bits(qh_bytes);
  for (int j = 0; j < kQK / 2; ++j) {
    c[j] = ((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - offset;
    c[j + kQK / 2] = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset;
  }
}
void codes_iq4_nl(const uint8_t* qs, int* c) {
  for (int j = 0; j < kQK / 2; ++j) {
    c[j] = kIQ4NLValues[qs[j] & 0xF];
    c[j + kQK / 2] = kIQ4NLValues[qs[j] >> 4];
  }
}

int dot32(const int* c, const int8_t* a) {
  int sum = 0;
  for (int j = 0; j < kQK; ++j) sum += c[j] * a[j];
  return sum;
}

// Eight float lanes per row, lane k holding elements 4k..4k+3 of every 32 values, summed
// pairwise at the end: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
float sum_lanes(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Q4_1, Q5_0, Q5_1 and Q8_0 in lane order: per block, lane k = fma(d_w * d_x, float(dot of
// its 4 values), lane k); Q4_1's and Q5_1's minimum term fma(m_w, s_x, summs) beside, added
// after the lanes' sum.
float dot_act32_lanes(DType type, const uint8_t* w, const Act32Row& a, int64_t nb) {
  float lanes[8] = {};
  float summs = 0.0f;
  int c[kQK];
  for (int64_t b = 0; b < nb; ++b) {
    float d;
    if (type == DType::Q4_1) {
      const auto& blk = reinterpret_cast<const BlockQ4_1*>(w)[b];
      codes_q4_1(blk, c);
      d = h2f(blk.d) * a.d[b];
      summs = std::fma(h2f(blk.m), a.s[b], summs);
    } else if (type == DType::Q5_0) {
      const auto& blk = reinterpret_cast<const BlockQ5_0*>(w)[b];
      codes_q5(blk.qs, blk.qh, 16, c);
      d = h2f(blk.d) * a.d[b];
    } else if (type == DType::Q5_1) {
      const auto& blk = reinterpret_cast<const BlockQ5_1*>(w)[b];
      codes_q5(blk.qs, blk.qh, 0, c);
      d = h2f(blk.d) * a.d[b];
      summs = std::fma(h2f(blk.m), a.s[b], summs);
    } else {
      const auto& blk = reinterpret_cast<const BlockQ8_0*>(w)[b];
      for (int j = 0; j < kQK; ++j) c[j] = blk.qs[j];
      d = h2f(blk.d) * a.d[b];
    }
    const int8_t* qa = a.qs + b * kQK;
    for (int k = 0; k < 8; ++k) {
      int part = 0;
      for (int j = 4 * k; j < 4 * k + 4; ++j) part += c[j] * qa[j];
      lanes[k] = std::fma(d, (float)part, lanes[k]);
    }
  }
  return sum_lanes(lanes) + summs;
}

// Q4_0 and IQ4_NL: per block acc = fma(float(dot), d_w * d_x, acc), as the SIMD kernels.
float dot_act32(DType type, const uint8_t* w, const Act32Row& a, int64_t nb) {
  if (type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 || type == DType::Q8_0)
    return dot_act32_lanes(type, w, a, nb);
  float acc = 0.0f;
  int c[kQK];
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* qa = a.qs + b * kQK;
    switch (type) {
      case DType::Q4_0: {
        const auto& blk = reinterpret_cast<const BlockQ4_0*>(w)[b];
        codes_q4_0(blk, c);
        acc = std::fma((float)dot32(c, qa), h2f(blk.d) * a.d[b], acc);
        break;
      }
      case DType::IQ4_NL: {
        const auto& blk = reinterpret_cast<const BlockIQ4_NL*>(w)[b];
        codes_iq4_nl(blk.qs, c);
        acc = std::fma((float)dot32(c, qa), h2f(blk.d) * a.d[b], acc);
        break;
      }
      default:
        throw_error(ErrorKind::kInternal, "dot_act32: not a 32-value format");
    }
  }
  return acc;
}

// --- K formats: per super-block, codes[256] and per-16 integer scales/mins -----------------

// Integer content of one super-block: x[v] = d * scale[v/16] * code[v] - dmin * min[v/16].
struct SuperBlock {
  int code[kQK_K];
  int scale[16];
  int min[16];
  float d;
  float dmin;
};

void k4_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void decode_q2_k(const BlockQ2_K& b, SuperBlock& o) {
  for (int v = 0; v < kQK_K; ++v) {
    const int h = v / 128, j = (v % 128) / 32, l = v % 32;
    o.code[v] = (b.qs[32 * h + l] >> (2 * j)) & 3;
  }
  for (int i = 0; i < 16; ++i) {
    o.scale[i] = b.scales[i] & 0xF;
    o.min[i] = b.scales[i] >> 4;
  }
  o.d = h2f(b.d);
  o.dmin = h2f(b.dmin);
}
void decode_q3_k(const BlockQ3_K& b, SuperBlock& o) {
  for (int v = 0; v < kQK_K; ++v) {
    const int h = v / 128, j = (v % 128) / 32, l = v % 32;
    const int low = (b.qs[32 * h + l] >> (2 * j)) & 3;
    const bool high = (b.hmask[l] >> (4 * h + j)) & 1;
    o.code[v] = low - (high ? 0 : 4);
  }
  for (int k = 0; k < 16; ++k) {
    const int low = k < 8 ? (b.scales[k] & 0xF) : (b.scales[k - 8] >> 4);
    const int high = (b.scales[8 + k % 4] >> (2 * (k / 4))) & 3;
    o.scale[k] = (low | (high << 4)) - 32;
    o.min[k] = 0;
  }
  o.d = h2f(b.d);
  o.dmin = 0.0f;
}
// The eight packed 6-bit (scale, min) pairs of Q4_K / Q5_K, one per 32 values, spread over
// the sixteen 16-value sub-blocks of a SuperBlock, and the two block factors.
void unpack_k4_scales(const uint8_t* scales, uint16_t d, uint16_t dmin, SuperBlock& o) {
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(scales, j, &sc, &m);
    o.scale[2 * j] = o.scale[2 * j + 1] = sc;
    o.min[2 * j] = o.min[2 * j + 1] = m;
  }
  o.d = h2f(d);
  o.dmin = h2f(dmin);
}
void decode_q4_k(const BlockQ4_K& b, SuperBlock& o) {
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      o.code[64 * g + l] = b.qs[32 * g + l] & 0xF;
      o.code[64 * g + 32 + l] = b.qs[32 * g + l] >> 4;
    }
  }
  unpack_k4_scales(b.scales, b.d, b.dmin, o);
}
void decode_q5_k(const BlockQ5_K& b, SuperBlock& o) {
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      o.code[64 * g + l] = (b.qs[32 * g + l] & 0xF) | (((b.qh[l] >> (2 * g)) & 1) << 4);
      o.code[64 * g + 32 + l] = (b.qs[32 * g + l] >> 4) | (((b.qh[l] >> (2 * g + 1)) & 1) << 4);
    }
  }
  unpack_k4_scales(b.scales, b.d, b.dmin, o);
}
void decode_q6_k(const BlockQ6_K& b, SuperBlock& o) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int* c = o.code + 128 * h;
    for (int l = 0; l < 32; ++l) {
      c[l] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      c[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      c[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      c[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    }
  }
  for (int i = 0; i < 16; ++i) {
    o.scale[i] = b.scales[i];
    o.min[i] = 0;
  }
  o.d = h2f(b.d);
  o.dmin = 0.0f;
}
void decode_iq4_xs(const BlockIQ4_XS& b, SuperBlock& o) {
  for (int j = 0; j < 8; ++j) {
    const int ls =
        ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
    o.scale[2 * j] = o.scale[2 * j + 1] = ls - 32;
    o.min[2 * j] = o.min[2 * j + 1] = 0;
    codes_iq4_nl(b.qs + 16 * j, o.code + 32 * j);
  }
  o.d = h2f(b.d);
  o.dmin = 0.0f;
}

void decode_super_block(DType type, const uint8_t* w, int64_t b, SuperBlock& o) {
  switch (type) {
    case DType::Q2_K:
      return decode_q2_k(reinterpret_cast<const BlockQ2_K*>(w)[b], o);
    case DType::Q3_K:
      return decode_q3_k(reinterpret_cast<const BlockQ3_K*>(w)[b], o);
    case DType::Q4_K:
      return decode_q4_k(reinterpret_cast<const BlockQ4_K*>(w)[b], o);
    case DType::Q5_K:
      return decode_q5_k(reinterpret_cast<const BlockQ5_K*>(w)[b], o);
    case DType::Q6_K:
      return decode_q6_k(reinterpret_cast<const BlockQ6_K*>(w)[b], o);
    case DType::IQ4_XS:
      return decode_iq4_xs(reinterpret_cast<const BlockIQ4_XS*>(w)[b], o);
    default:
      throw_error(ErrorKind::kInternal, "decode_super_block: not a K format");
  }
}

// Q5_K and Q6_K in lane order: value v of a super-block goes to lane (v % 32) / 4, whose exact
// integer partial sum_v scale[v / 16] * u[v] * x[v] (u the unsigned code) enters
// lane = fma(d_x * d, float(partial), lane) per super-block. Q6_K's offset (u = code + 32) is
// taken per lane k as 32 * (bsum[2k] * scale[2k] + bsum[2k + 1] * scale[2k + 1]); Q5_K's mins
// go to summs = fma(-d_x * dmin, float(sum_k min_k * bsum_k), summs), added after the lanes.
float dot_q8k_lanes(DType type, const uint8_t* w, const BlockQ8_K* a, int64_t nb) {
  const int offset = type == DType::Q6_K ? 32 : 0;
  float lanes[8] = {};
  float summs = 0.0f;
  SuperBlock sb;
  for (int64_t b = 0; b < nb; ++b) {
    decode_super_block(type, w, b, sb);
    int32_t part[8] = {};
    for (int v = 0; v < kQK_K; ++v)
      part[(v % 32) / 4] += sb.scale[v / 16] * (sb.code[v] + offset) * a[b].qs[v];
    for (int k = 0; k < 8; ++k) {
      part[k] -= offset * (a[b].bsums[2 * k] * sb.scale[2 * k] +
                           a[b].bsums[2 * k + 1] * sb.scale[2 * k + 1]);
      lanes[k] = std::fma(a[b].d * sb.d, (float)part[k], lanes[k]);
    }
    int32_t msum = 0;
    for (int i = 0; i < 16; ++i) msum += sb.min[i] * a[b].bsums[i];
    if (type == DType::Q5_K) summs = std::fma(-a[b].d * sb.dmin, (float)msum, summs);
  }
  return type == DType::Q5_K ? sum_lanes(lanes) + summs : sum_lanes(lanes);
}

// The exact integer sums of a 16-value sub-block range [k0, k1) of a super-block:
// isum = sum_k scale_k * (dot of codes and activations), msum = sum_k min_k * bsum_k.
void sub_block_sums(const SuperBlock& sb, const BlockQ8_K& a, int k0, int k1, int32_t* isum,
                    int32_t* msum) {
  *isum = 0, *msum = 0;
  for (int k = k0; k < k1; ++k) {
    int32_t part = 0;
    for (int j = 0; j < 16; ++j) part += sb.code[16 * k + j] * a.qs[16 * k + j];
    *isum += sb.scale[k] * part;
    *msum += sb.min[k] * a.bsums[k];
  }
}

// Q4_K as llama.cpp's repacked kernels sum it: the scaled codes and the mins terms in two
// float sums, acc = fma(float(isum), d * d_x, acc) and accm = fma(float(msum), dmin * d_x,
// accm), one step per `step` sub-blocks of 16 (16: the one-token gemv, 4: the 4-token gemm),
// then acc - accm.
float dot_q8k_mins_apart(DType type, const uint8_t* w, const BlockQ8_K* a, int64_t nb, int step) {
  float acc = 0.0f, accm = 0.0f;
  SuperBlock sb;
  for (int64_t b = 0; b < nb; ++b) {
    decode_super_block(type, w, b, sb);
    for (int k0 = 0; k0 < 16; k0 += step) {
      int32_t isum, msum;
      sub_block_sums(sb, a[b], k0, k0 + step, &isum, &msum);
      acc = std::fma((float)isum, sb.d * a[b].d, acc);
      accm = std::fma((float)msum, sb.dmin * a[b].d, accm);
    }
  }
  return acc - accm;
}

// Q5_K and Q6_K as llama.cpp's tiled kernel sums them: per super-block
// r = fma(-dmin, float(msum), d * float(isum)) (Q6_K: d * float(isum), codes signed), then
// acc = fma(r, d_x, acc).
float dot_q8k_tiled(DType type, const uint8_t* w, const BlockQ8_K* a, int64_t nb) {
  float acc = 0.0f;
  SuperBlock sb;
  for (int64_t b = 0; b < nb; ++b) {
    decode_super_block(type, w, b, sb);
    int32_t isum, msum;
    sub_block_sums(sb, a[b], 0, 16, &isum, &msum);
    float r = (float)isum * sb.d;
    if (type == DType::Q5_K) r = std::fma(-sb.dmin, (float)msum, r);
    acc = std::fma(r, a[b].d, acc);
  }
  return acc;
}

// Per super-block: d * dx * sum_i scale_i * dot_i - dmin * dx * sum_i min_i * bsum_i, in the
// order of the type and the token's role.
float dot_q8k(DType type, const uint8_t* w, const BlockQ8_K* a, int64_t nb, KOrder order) {
  if (type == DType::Q4_K)
    return dot_q8k_mins_apart(type, w, a, nb, order == KOrder::kGroupOf4 ? 4 : 16);
  if (order == KOrder::kTiled) return dot_q8k_tiled(type, w, a, nb);
  if (type == DType::Q5_K || type == DType::Q6_K) return dot_q8k_lanes(type, w, a, nb);
  float acc = 0.0f;
  SuperBlock sb;
  for (int64_t b = 0; b < nb; ++b) {
    decode_super_block(type, w, b, sb);
    int32_t isum = 0, msum = 0;
    for (int i = 0; i < 16; ++i) {
      int32_t part = 0;
      for (int j = 0; j < 16; ++j) part += sb.code[16 * i + j] * a[b].qs[16 * i + j];
      isum += sb.scale[i] * part;
      msum += sb.min[i] * a[b].bsums[i];
    }
    acc += sb.d * a[b].d * (float)isum - sb.dmin * a[b].d * (float)msum;
  }
  return acc;
}

float weight_value(DType type, const uint8_t* row, int64_t c) {
  if (type == DType::F32) return reinterpret_cast<const float*>(row)[c];
  if (type == DType::F16) return fp16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
}

float reference_dot(DType type, const uint8_t* w_row, const uint8_t* act, int64_t n, KOrder order) {
  switch (act_kind_for(type)) {
    case ActKind::kAct32:
      return dot_act32(type, w_row, act32_row(act, n), n / kQK);
    case ActKind::kQ8K:
      return dot_q8k(type, w_row, reinterpret_cast<const BlockQ8_K*>(act), n / kQK_K, order);
    case ActKind::kF32:
      break;
  }
  // F16 weights multiply the activations rounded to F16 (as llama.cpp does).
  const auto* x = reinterpret_cast<const float*>(act);
  float v = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    const float xc = type == DType::F16 ? fp16_to_f32(f32_to_fp16(x[c])) : x[c];
    v += weight_value(type, w_row, c) * xc;
  }
  return v;
}

template <KOrder kOrder>
void gemm_scalar(const WeightView& w, int64_t row_begin, int64_t row_end, const uint8_t* act,
                 size_t act_stride, int64_t n_tokens, float* y) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = row_begin; r < row_end; ++r)
      y[t * w.rows + r] = reference_dot(w.type, w.row(r), act + t * act_stride, w.cols, kOrder);
}

GemmFn scalar_gemm_ordered_for(DType type, KOrder order) {
  if (order == KOrder::kGroupOf4 && type == DType::Q4_K) return &gemm_scalar<KOrder::kGroupOf4>;
  if (order == KOrder::kTiled && (type == DType::Q5_K || type == DType::Q6_K))
    return &gemm_scalar<KOrder::kTiled>;
  return nullptr;
}

GemmFn scalar_gemm_for(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::IQ4_NL:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return &gemm_scalar<KOrder::kOneToken>;
    default:
      return nullptr;
  }
}

}  // namespace

const IsaKernels& scalar_kernels() {
  static const IsaKernels kernels{&quantize_act32_scalar, &quantize_q8k_scalar, &scalar_gemm_for,
                                  &scalar_gemm_ordered_for};
  return kernels;
}

void matmul_reference(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                      TokenRoles roles) {
  check_matmul_args(w, x, n_tokens, y);
  if (!roles.empty() && (int64_t)roles.size() != n_tokens)
    throw_error(ErrorKind::kInvalidArgument, "matmul_reference: " + std::to_string(roles.size()) +
                                                 " token roles for " + std::to_string(n_tokens) +
                                                 " tokens");
  const ActKind kind = act_kind_for(w.type);
  std::vector<uint8_t> act(act_row_bytes(kind, w.cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * w.cols;
    const uint8_t* row = reinterpret_cast<const uint8_t*>(xt);
    if (kind == ActKind::kAct32) {
      quantize_act32_scalar(xt, w.cols, act.data());
      row = act.data();
    } else if (kind == ActKind::kQ8K) {
      quantize_q8k_scalar(xt, w.cols, reinterpret_cast<BlockQ8_K*>(act.data()));
      row = act.data();
    }
    const KOrder order = k_order_for(w.type, roles.empty() ? 0 : roles[(size_t)t]);
    for (int64_t r = 0; r < w.rows; ++r)
      y[t * w.rows + r] = reference_dot(w.type, w.row(r), row, w.cols, order);
  }
}

}  // namespace hablar::cpu
