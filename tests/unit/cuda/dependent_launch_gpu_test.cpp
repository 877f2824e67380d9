// The kernels launched as dependents of the kernel before them (dependent_launch.cuh) read what
// that kernel wrote only after it has ended. A one-block writer lets the next kernel launch at
// once and copies the input into place only 200 us later; each reader must then give the bits
// it gives on that input written beforehand, and (that the check can fail) other bits on the
// input the writer overwrites. (ptxas had moved non-coherent loads of the activations above
// the looping Q4_K kernel's wait: greedy outputs varied from run to run.)
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "late_writer.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

constexpr unsigned kDelayUs = 200;

// `input` is what the readers read; `stale` and `fresh` two contents of its size. A reader
// queues its kernels on the stream (after `reset`, which restores what it modifies in place)
// and returns its outputs' bytes once the stream is done.
struct LateInput {
  DeviceBuffer<uint8_t>& input;
  const DeviceBuffer<uint8_t>& stale;
  const DeviceBuffer<uint8_t>& fresh;
};
using Reader = std::function<std::vector<uint8_t>(cudaStream_t)>;

void copy_now(DeviceBuffer<uint8_t>& to, const DeviceBuffer<uint8_t>& from) {
  HABLAR_CUDA_CHECK(cudaMemcpy(to.get(), from.get(), to.size(), cudaMemcpyDeviceToDevice));
}

// The reader's outputs after the late writer against those on the fresh input written before.
void expect_reads_after_writer(const LateInput& in, const Reader& read, const char* what) {
  cuda::Stream stream;
  copy_now(in.input, in.fresh);
  const std::vector<uint8_t> want = read(stream.get());
  copy_now(in.input, in.stale);
  const std::vector<uint8_t> on_stale = read(stream.get());
  ASSERT_NE(want, on_stale) << what << ": the stale input must change the outputs";
  for (int trial = 0; trial < 3; ++trial) {
    copy_now(in.input, in.stale);
    launch_late_copy(in.input.get(), in.fresh.get(), in.input.size(), kDelayUs, stream.get());
    EXPECT_EQ(read(stream.get()), want) << what << ", trial " << trial;
  }
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Quantized activations (quantize_activations_q8's workspace) of m random rows of k.
DeviceBuffer<uint8_t> quantized_rows(int m, int64_t k, uint32_t seed) {
  DeviceBuffer<float> x(random_floats((size_t)m * k, seed, -2.0f, 2.0f));
  DeviceBuffer<uint8_t> ws(cuda::q8_activation_bytes(m, k));
  cuda::quantize_activations_q8(x.get(), m, k, ws.get(), ws.size(), nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  return ws;
}

// The int8 products of m activation rows of k on weights w (a Q4_K or Q6_K matrix).
void expect_product_reads_after_writer(const WeightView& w, int m, const char* what) {
  const int64_t k = w.cols;
  DeviceBuffer<uint8_t> stale = quantized_rows(m, k, 11u), fresh = quantized_rows(m, k, 12u);
  DeviceBuffer<uint8_t> input(stale.size());
  DeviceBuffer<float> y((size_t)m * w.rows);
  const Reader read = [&](cudaStream_t stream) {
    const cuda::Q8Activations xa = cuda::q8_layout(input.get(), m, k);
    if (w.type == DType::Q4_K)
      cuda::matmul_q4k_rows(w, xa.codes, xa.scales, y.get(), stream, m);
    else
      cuda::matmul_q6k_rows(w, xa.codes, xa.scales, y.get(), stream, m);
    HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream));
    return bytes_of(y.download());
  };
  expect_reads_after_writer({input, stale, fresh}, read, what);
}

TEST(DependentLaunchGpu, Q4kRowsReadTheActivationsAfterTheWriter) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  // Tall and long (at least 16 rows a multiprocessor, K > 8192): the looping kernel.
  const int64_t tall = 16 * (int64_t)cuda::device_multiprocessors() + 40, k = 14336;
  DeviceWeights looping(DType::Q4_K, tall, k, random_weight_bytes(DType::Q4_K, tall, k, 21u));
  expect_product_reads_after_writer(looping.view, 1, "looping kernel");
  DeviceWeights wide(DType::Q4_K, 512, 4096, random_weight_bytes(DType::Q4_K, 512, 4096, 22u));
  for (int m : {1, 2, 4}) expect_product_reads_after_writer(wide.view, m, "rows kernel");
}

TEST(DependentLaunchGpu, Q4kGatedPairReadsTheActivationsAfterTheWriter) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 1024, k = 4096;
  DeviceWeights gate(DType::Q4_K, n, k, random_weight_bytes(DType::Q4_K, n, k, 31u));
  DeviceWeights up(DType::Q4_K, n, k, random_weight_bytes(DType::Q4_K, n, k, 32u));
  DeviceBuffer<uint8_t> stale = quantized_rows(2, k, 33u), fresh = quantized_rows(2, k, 34u);
  DeviceBuffer<uint8_t> input(stale.size());
  DeviceBuffer<float> y((size_t)2 * n);
  const Reader read = [&](cudaStream_t stream) {
    const cuda::Q8Activations xa = cuda::q8_layout(input.get(), 2, k);
    cuda::matmul_q4k_rows_glu(gate.view, up.view, xa.codes, xa.scales, y.get(),
                              GluActivation::kSilu, stream, 2);
    HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream));
    return bytes_of(y.download());
  };
  expect_reads_after_writer({input, stale, fresh}, read, "gated pair");
}

TEST(DependentLaunchGpu, Q6kRowsReadTheActivationsAfterTheWriter) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  // Long rows, few of them: one-row warps sharing x in shared memory; short rows: teams.
  DeviceWeights shared_x(DType::Q6_K, 4096, 14336,
                         random_weight_bytes(DType::Q6_K, 4096, 14336, 41u));
  expect_product_reads_after_writer(shared_x.view, 1, "Q6_K shared-x kernel");
  DeviceWeights teams(DType::Q6_K, 67, 2048, random_weight_bytes(DType::Q6_K, 67, 2048, 42u));
  for (int m : {1, 2}) expect_product_reads_after_writer(teams.view, m, "Q6_K rows kernel");
}

TEST(DependentLaunchGpu, NormsAndQuantizerReadTheirInputAfterTheWriter) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int rows = 2, dim = 4096;
  const size_t n = (size_t)rows * dim;
  DeviceBuffer<uint8_t> stale(bytes_of(random_floats(n, 51u))),
      fresh(bytes_of(random_floats(n, 52u)));
  DeviceBuffer<uint8_t> input(stale.size());
  const auto* y = reinterpret_cast<const float*>(input.get());
  const std::vector<float> x0 = random_floats(n, 53u);
  DeviceBuffer<float> x(x0), weight(random_floats((size_t)dim, 54u)), out(n);
  DeviceBuffer<uint8_t> ws(cuda::q8_activation_bytes(rows, dim));
  const auto outputs = [&](cudaStream_t stream) {
    HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> all = bytes_of(out.download()), codes = ws.download();
    all.insert(all.end(), codes.begin(), codes.end());
    return all;
  };
  const Reader add_norm_q8 = [&](cudaStream_t stream) {
    x.upload(x0);  // the sum is stored back into x
    cuda::add_rms_norm_q8(x.get(), y, weight.get(), out.get(), rows, dim, 1e-5f, ws.get(), stream);
    return outputs(stream);
  };
  expect_reads_after_writer({input, stale, fresh}, add_norm_q8, "add_rms_norm_q8");
  const Reader add_norm = [&](cudaStream_t stream) {
    x.upload(x0);
    cuda::add_rms_norm(x.get(), y, weight.get(), out.get(), rows, dim, 1e-5f, stream);
    return outputs(stream);
  };
  expect_reads_after_writer({input, stale, fresh}, add_norm, "add_rms_norm");
  const Reader norm = [&](cudaStream_t stream) {
    cuda::rms_norm(y, weight.get(), out.get(), rows, dim, 1e-5f, stream);
    return outputs(stream);
  };
  expect_reads_after_writer({input, stale, fresh}, norm, "rms_norm");
  const Reader quantize = [&](cudaStream_t stream) {
    cuda::quantize_activations_q8(y, rows, dim, ws.get(), ws.size(), stream);
    return outputs(stream);
  };
  expect_reads_after_writer({input, stale, fresh}, quantize, "quantize_activations_q8");
}

}  // namespace
}  // namespace hablar::test
