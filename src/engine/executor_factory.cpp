#include "engine/executor_factory.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "engine/cpu_executor.h"

namespace hablar::engine {

DeviceKind device_kind_from_name(const std::string& name) {
  if (name == "auto") return DeviceKind::kAuto;
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda" || name == "gpu") return DeviceKind::kCuda;
  throw_error(ErrorKind::kInvalidArgument,
              "unknown device '" + name + "' (expected auto, cpu or cuda)");
}

KvDType kv_dtype_from_name(const std::string& name) {
  if (name == "f16") return KvDType::F16;
  if (name == "bf16") return KvDType::BF16;
  if (name == "q8_0") return KvDType::Q8_0;
  if (name == "q4_0") return KvDType::Q4_0;
  throw_error(ErrorKind::kInvalidArgument,
              "unknown KV cache type '" + name + "' (expected f16, bf16, q8_0 or q4_0)");
}

namespace {

// The CUDA executor's options: the shared ones (KV positions, cache types) filled in.
CudaExecutorOptions cuda_options(const ExecutorOptions& o) {
  CudaExecutorOptions c = o.cuda;
  if (o.kv_tokens > 0) c.kv_tokens = o.kv_tokens;
  c.cache_type_k = o.cache_type_k, c.cache_type_v = o.cache_type_v;
  return c;
}

}  // namespace

DeviceKind resolve_device(const model::Model& model, const ExecutorOptions& o) {
  const int n_layers = model.config().n_layers;
  DeviceKind want = o.device;
  std::string reason;
  // -ngl N on a machine (or build) without a GPU, --device left on auto: ignored with a
  // warning, as llama.cpp does, so that habitual command lines still run.
  if (o.n_gpu_layers > 0 && want == DeviceKind::kAuto && !cuda_available(&reason)) {
    log::warn("-ngl {} ignored: {}; running on the CPU", o.n_gpu_layers, reason);
    return DeviceKind::kCpu;
  }
  if (o.n_gpu_layers == 0) {
    if (want == DeviceKind::kCuda)
      throw_error(ErrorKind::kInvalidArgument, "--device cuda contradicts -ngl 0");
    want = DeviceKind::kCpu;
  } else if (o.n_gpu_layers > 0 && o.n_gpu_layers < n_layers) {
    throw_error(ErrorKind::kUnsupported,
                fmt::format("-ngl {} would put part of the model's {} layers on the GPU: partial "
                            "offload is not supported yet; use -ngl {} (or more) for all of it, "
                            "or -ngl 0 for the CPU",
                            o.n_gpu_layers, n_layers, n_layers));
  } else if (o.n_gpu_layers >= n_layers && want == DeviceKind::kAuto) {
    want = DeviceKind::kCuda;
  }
  if (want == DeviceKind::kCpu) return DeviceKind::kCpu;
  bool have = cuda_available(&reason);
  const bool device_present = have;
  if (have && !cuda_can_run(model, &reason)) have = false;  // no kernels for this model
  if (have && !cuda_takes_cache(cuda_options(o), &reason)) have = false;  // nor for the cache
  if (want == DeviceKind::kCuda && !have)
    throw_error(ErrorKind::kUnsupported, "--device cuda: " + reason);
  if (device_present && !have) log::info("running on the CPU: {}", reason);
  return have ? DeviceKind::kCuda : DeviceKind::kCpu;
}

std::unique_ptr<StepExecutor> make_executor(const model::Model& model, const ExecutorOptions& o) {
  if (resolve_device(model, o) == DeviceKind::kCuda)
    return make_cuda_executor(model, cuda_options(o));
  const int32_t tokens = o.kv_tokens > 0 ? o.kv_tokens : 8192;
  const int32_t n_blocks = (tokens + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize;
  return std::make_unique<CpuExecutor>(model, n_blocks, kDefaultKvBlockSize, o.n_threads,
                                       o.cache_type_k, o.cache_type_v);
}

#if !defined(HABLAR_HAVE_CUDA)
bool cuda_can_run(const model::Model&, std::string* reason) {
  if (reason) *reason = "this build has no CUDA backend";
  return false;
}

bool cuda_takes_cache(const CudaExecutorOptions&, std::string* reason) {
  if (reason) *reason = "this build has no CUDA backend";
  return false;
}

bool cuda_available(std::string* reason) {
  if (reason) *reason = "this build has no CUDA backend (nvcc was not found when it was built)";
  return false;
}

std::unique_ptr<StepExecutor> make_cuda_executor(const model::Model&, const CudaExecutorOptions&) {
  throw_error(ErrorKind::kUnsupported, "this build has no CUDA backend");
}
#endif

}  // namespace hablar::engine
