// The decode-wiring test against the CUDA decode-step entry point (decode_attention), and
// the split-K long-context case; the host twin runs the same scenarios in CI.
#include <cstring>
#include <limits>

#include "backend/cuda/attention.h"
#include "backend/cuda/matmul.h"
#include "cuda_test_util.h"
#include "decode_split_case.h"
#include "decode_wiring_case.h"
#include "kv_q8_twins.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

class DecodeWiringGpu : public ::testing::TestWithParam<KvDType> {};

// A wiring case's buffers on the device (slots flagged by `active`) and its parameters over
// them; run() queues one decode_attention call, check() compares what it left.
struct DeviceWiringCase {
  DeviceWiringCase(const DecodeWiringCase& c, const std::vector<uint8_t>& active)
      : cache(c.cache),
        tables(c.block_tables),
        lens(c.seq_lens),
        act(active),
        q(c.q),
        k(c.k_new),
        v(c.v_new),
        out(c.out),
        params(c.params(cache.get(), tables.get(), lens.get(), act.get(), q.get(), k.get(), v.get(),
                        out.get())) {}
  void run(const cuda::Stream& stream) {
    workspace = DeviceBuffer<float>(cuda::decode_attention_workspace_bytes(params) / sizeof(float));
    cuda::decode_attention(params, workspace.get(), workspace.bytes(), stream.get());
  }
  std::string check(const DecodeWiringCase& c, int done) const {
    return c.check(out.download(), lens.download(), cache.download(), done);
  }
  DeviceBuffer<uint16_t> cache;
  DeviceBuffer<int32_t> tables, lens;
  DeviceBuffer<uint8_t> act;
  DeviceBuffer<float> q, k, v, out, workspace;
  cuda::DecodeAttentionParams params;
};

// Runs one decode step on the device over the case's buffers and checks it.
std::string run_wiring_step(DecodeWiringCase& c, const std::vector<uint8_t>& active, int done) {
  DeviceWiringCase d(c, active);
  cuda::Stream stream;
  d.run(stream);
  stream.synchronize();
  return d.check(c, done);
}

TEST_P(DecodeWiringGpu, ThreeLiveInEightSlots) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  DecodeWiringCase c(GetParam());
  EXPECT_EQ(run_wiring_step(c, c.active, -1), "");
}

TEST_P(DecodeWiringGpu, DoneSequenceIsNeitherAttendedNorAdvanced) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  DecodeWiringCase c(GetParam());
  std::vector<uint8_t> active = c.active;
  const int done = c.live_slots[1];
  active[done] = 0;
  EXPECT_EQ(run_wiring_step(c, active, done), "");
}

// With the output quantized in the reduction (for the output projection's int8 product): the
// outputs and the cache as without it, each live slot's int8 row equal to
// quantize_activations_q8 of its output row, byte for byte, and zeros for the other slots.
TEST_P(DecodeWiringGpu, QuantizedOutputRowsEqualQuantizingTheOutput) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  DecodeWiringCase c(GetParam());
  DeviceWiringCase d(c, c.active);
  const int slots = d.params.n_slots, width = d.params.n_heads * d.params.layout.head_dim;
  const size_t bytes = cuda::q8_activation_bytes(slots, width);
  DeviceBuffer<uint8_t> fused(std::vector<uint8_t>(bytes, 0x7F)), separate(bytes);
  const cuda::Q8Activations q8 = cuda::q8_layout(fused.get(), slots, width);
  d.params.out_codes = q8.codes, d.params.out_scales = q8.scales;
  cuda::Stream stream;
  d.run(stream);
  cuda::quantize_activations_q8(d.out.get(), slots, width, separate.get(), bytes, stream.get());
  stream.synchronize();
  EXPECT_EQ(d.check(c, -1), "");
  const auto got = fused.download(), want = separate.download();
  const size_t scales_at = (size_t)(reinterpret_cast<uint8_t*>(q8.scales) - fused.get());
  for (int s = 0; s < slots; ++s) {
    for (int i = 0; i < width; ++i) {
      const size_t at = (size_t)s * width + i;
      EXPECT_EQ(got[at], c.active[s] ? want[at] : 0) << "slot " << s << " code " << i;
    }
    for (int b = 0; b < width / 32; ++b)
      for (size_t j = 0; j < sizeof(float2); ++j) {
        const size_t at = scales_at + ((size_t)s * width / 32 + b) * sizeof(float2) + j;
        EXPECT_EQ(got[at], c.active[s] ? want[at] : 0) << "slot " << s << " block " << b;
      }
  }
}

// A call of one split per slot (few multiprocessors for its rows, contexts within a graph's
// 1,024-position bound) finishes each head in the attention kernel, with no reduce: the
// reduce's bits, which the same call with int8 output rows (those take the reduce) gives.
TEST_P(DecodeWiringGpu, OneSplitFinishedInTheKernelEqualsTheReduce) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  DecodeWiringCase c(GetParam());
  std::vector<float> outs[2];
  for (int with_codes : {0, 1}) {
    DeviceWiringCase d(c, c.active);
    d.params.multiprocessors = 1;
    d.params.max_context = 1024;
    ASSERT_EQ(cuda::decode_num_splits(d.params), 1);
    const int width = d.params.n_heads * d.params.layout.head_dim;
    DeviceBuffer<uint8_t> codes(cuda::q8_activation_bytes(d.params.n_slots, width));
    if (with_codes) {
      const cuda::Q8Activations q8 = cuda::q8_layout(codes.get(), d.params.n_slots, width);
      d.params.out_codes = q8.codes, d.params.out_scales = q8.scales;
    }
    cuda::Stream stream;
    d.run(stream);
    stream.synchronize();
    outs[with_codes] = d.out.download();
    EXPECT_EQ(d.check(c, -1), "") << "with int8 rows " << with_codes;
  }
  for (size_t i = 0; i < outs[0].size(); ++i)
    ASSERT_EQ(std::memcmp(&outs[0][i], &outs[1][i], sizeof(float)), 0) << "element " << i;
}

// The output as the output projection's bf16 rows alone (out_bf16, out null), both where the
// attention kernel finishes each head (one split) and where the reduce does (several): each
// live slot's values the f32 output rounded to nearest even.
TEST_P(DecodeWiringGpu, Bf16RowsAloneAreTheRoundedOutput) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  DecodeWiringCase c(GetParam());
  for (int multiprocessors : {1, 132}) {
    DeviceWiringCase wide(c, c.active), narrow(c, c.active);
    for (DeviceWiringCase* d : {&wide, &narrow}) {
      d->params.multiprocessors = multiprocessors;
      d->params.max_context = multiprocessors == 1 ? 1024 : 0;
    }
    if (multiprocessors == 1)
      ASSERT_EQ(cuda::decode_num_splits(wide.params), 1);
    else
      ASSERT_GT(cuda::decode_num_splits(wide.params), 1);
    const size_t width = (size_t)DecodeWiringCase::kHeads * DecodeWiringCase::kHeadDim;
    DeviceBuffer<uint16_t> rows(std::vector<uint16_t>(c.q.size(), 0xffff));
    narrow.params.out = nullptr, narrow.params.out_bf16 = rows.get();
    cuda::Stream stream;
    wide.run(stream);
    narrow.run(stream);
    stream.synchronize();
    const auto want = wide.out.download();
    const auto got = rows.download();
    size_t differ = 0, live = 0;
    for (size_t slot = 0; slot < c.active.size(); ++slot) {
      if (!c.active[slot]) continue;
      ++live;
      for (size_t i = slot * width; i < (slot + 1) * width; ++i)
        differ += got[i] != f32_to_bf16(want[i]);
    }
    EXPECT_GT(live, 0u);
    EXPECT_EQ(differ, 0u) << "multiprocessors " << multiprocessors;
    EXPECT_EQ(narrow.out.download(), c.out) << "the f32 rows stay untouched";
  }
}

// A split case's buffers on the device (the output NaN-filled), its parameters over them, and
// one decode_attention call.
struct DeviceSplitCase {
  explicit DeviceSplitCase(const DecodeSplitCase& c)
      : cache(c.cache),
        tables(c.tables),
        lens(c.lens),
        act(c.active),
        q(c.q),
        k(c.k_new),
        v(c.v_new),
        out(std::vector<float>(c.q.size(), std::numeric_limits<float>::quiet_NaN())),
        params(c.params(cache.get(), tables.get(), lens.get(), act.get(), q.get(), k.get(), v.get(),
                        out.get())) {}
  void run() {
    DeviceBuffer<float> workspace(cuda::decode_attention_workspace_bytes(params) / sizeof(float));
    cuda::Stream stream;
    cuda::decode_attention(params, workspace.get(), workspace.bytes(), stream.get());
    stream.synchronize();
  }
  DeviceBuffer<uint16_t> cache;
  DeviceBuffer<int32_t> tables, lens;
  DeviceBuffer<uint8_t> act;
  DeviceBuffer<float> q, k, v, out;
  cuda::DecodeAttentionParams params;
};

// The split-K case on the device; window > 0 adds a sliding window (splits wholly before it
// skipped, the one it begins in started mid-split), as in the host twin's test.
// split_len > 0: splits of that length over a 4,096-position capacity (128 splits: the
// reduce in runs).
void check_split_case(KvDType dtype, int window, float softcap = 0.0f, int split_len = 0) {
  for (int dim : {64, 96, 128, 256}) {
    DecodeSplitCase c(dtype, dim, 11u + (uint32_t)dim, split_len > 0 ? 256 : 96);
    c.window = window;
    c.fixed_split_len = split_len;
    c.softcap = softcap;
    DeviceSplitCase d(c);
    ASSERT_GT(cuda::decode_num_splits(d.params), 4);
    d.run();
    std::string fault;
    const double err = c.max_error(d.out.download(), &fault);
    EXPECT_EQ(fault, "");
    EXPECT_LT(err, 2e-3) << "head_dim " << dim << " window " << window;
    const auto got_lens = d.lens.download();
    for (int s = 0; s < c.slots; ++s) EXPECT_EQ(got_lens[s], c.lens[s] + (c.active[s] ? 1 : 0));
  }
}

TEST_P(DecodeWiringGpu, SplitKLongContextMatchesOracle) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  check_split_case(GetParam(), 0);
}

TEST_P(DecodeWiringGpu, SplitReduceInRunsMatchesOracle) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  check_split_case(GetParam(), 0, 0.0f, 32);
  check_split_case(GetParam(), 300, 0.0f, 32);
}

// A call sized for the capacity (a captured graph) and one sized for the step give every slot
// the same splits and merges: the same bits (the host twin's test of the same name).
TEST_P(DecodeWiringGpu, CapacitySizedCallEqualsStepSizedCall) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int sms : {132, 1000})
    for (int dim : {64, 128}) {
      DecodeSplitCase c(GetParam(), dim, 17u + (uint32_t)dim, 256);  // capacity 4,096
      std::vector<float> outs[3];
      // The call's max_context: 0 sizes it for the capacity; 1,501 for the step (its longest
      // slot has 1,500 positions); 2,048 for a bound between, as a captured graph's.
      const int32_t max_contexts[3] = {0, 1501, 2048};
      for (int sizing = 0; sizing < 3; ++sizing) {
        DeviceSplitCase d(c);
        d.params.multiprocessors = sms;
        d.params.max_context = max_contexts[sizing];
        d.run();
        outs[sizing] = d.out.download();
      }
      std::string fault;
      EXPECT_LT(c.max_error(outs[1], &fault), 2e-3) << "head_dim " << dim << " sms " << sms;
      EXPECT_EQ(fault, "");
      for (int other : {1, 2})
        for (size_t i = 0; i < outs[0].size(); ++i)
          ASSERT_EQ(std::memcmp(&outs[0][i], &outs[other][i], sizeof(float)), 0)
              << "head_dim " << dim << " sms " << sms << " sizing " << other << " element " << i;
    }
}

TEST_P(DecodeWiringGpu, SlidingWindowMatchesOracle) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  check_split_case(GetParam(), 300);
}

// Gemma 2's soft-capped scores (a cap of 2 bends most of these), with and without a window.
TEST_P(DecodeWiringGpu, SoftCappedScoresMatchOracle) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  check_split_case(GetParam(), 0, 2.0f);
  check_split_case(GetParam(), 300, 2.0f);
}

TEST(DecodeAttentionGpu, RejectsUnsupportedShapesWithAnError) {
  DecodeWiringCase c(KvDType::F16);
  auto p = c.params(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  p.layout.head_dim = 80;
  try {
    cuda::decode_attention(p, nullptr, 0, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("head_dim 80"), std::string::npos) << e.what();
  }
}

// Q8_0 rows (kv_q8_twins.h): the step over them equals the step over the F16 cache of the
// values the kernels read from them, bit for bit, for both kernels; the scatter writes the
// CPU backend's rows. The host twin runs the same scenario in CI.
TEST(DecodeAttentionGpu, Q8CacheEqualsF16CacheOfItsValues) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  expect_q8_decode_equals_f16_of_its_values(
      [](const DecodeSplitCase& c, cuda::DecodeAttentionParams p, std::vector<uint16_t>& cache) {
        DeviceBuffer<uint16_t> kv(cache);
        DeviceBuffer<int32_t> tables(c.tables), lens(c.lens);
        DeviceBuffer<uint8_t> act(c.active);
        DeviceBuffer<float> q(c.q), k(c.k_new), v(c.v_new);
        DeviceBuffer<float> out(std::vector<float>(p.out, p.out + c.q.size()));
        p.kv_cache = kv.get(), p.block_tables = tables.get(), p.seq_lens = lens.get();
        p.active = act.get(), p.q = q.get(), p.k_new = k.get(), p.v_new = v.get(),
        p.out = out.get();
        DeviceBuffer<float> workspace(cuda::decode_attention_workspace_bytes(p) / sizeof(float));
        cuda::Stream stream;
        cuda::decode_attention(p, workspace.get(), workspace.bytes(), stream.get());
        stream.synchronize();
        cache = kv.download();
        return out.download();
      });
}

TEST(DecodeAttentionGpu, RefusesCachesItCannotRead) {
  DecodeWiringCase c(KvDType::F16);
  auto p = c.params(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  for (int mixed = 0; mixed < 2; ++mixed) {
    p.layout.dtype = mixed ? KvDType::F16 : KvDType::Q4_0;
    p.layout.v_type = mixed ? (int8_t)KvDType::Q8_0 : -1;
    try {
      cuda::decode_attention(p, nullptr, 0, nullptr);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(mixed ? "different types" : "q4_0"), std::string::npos)
          << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, DecodeWiringGpu, ::testing::Values(KvDType::F16, KvDType::BF16),
                         [](const auto& info) {
                           return info.param == KvDType::F16 ? std::string("F16")
                                                             : std::string("BF16");
                         });

}  // namespace
}  // namespace hablar::test
