// The small synthetic models the engine tests run on, and the executor parameter they share.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/executor_factory.h"
#include "formats/synthetic_model.h"
#include "model/model.h"
#include "support/test_support.h"

namespace hablar::engine::test_models {

// The "tiny" Llama shape (2 layers, 256 wide, llama-spm vocabulary) of the given weight type
// and seed, written to a fresh temporary directory (`dir_prefix`), with a sliding window when
// `window` > 0; returns the file's path.
inline std::string write_tiny_llama(const std::string& dir_prefix, uint64_t seed,
                                    const std::string& type = "f16", int32_t window = 0) {
  synth::SyntheticModelOptions o;
  o.arch = synth::Arch::kLlama;
  o.shape = *synth::shape_from_name("tiny");
  o.type = type;
  o.vocab_path = test::testdata_dir() + "/vocab/ggml-vocab-llama-spm.gguf";
  o.seed = seed;
  o.sliding_window = window;
  const std::string path = test::make_temp_dir(dir_prefix) + "/tiny.gguf";
  synth::write_synthetic_model(o, path);
  return path;
}

// Cases run over each real executor: the CPU's, and the CUDA one where a device is present
// (skipped, saying why, where not).
class OnEachExecutor : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    std::string reason;
    if (GetParam() == DeviceKind::kCuda && !cuda_available(&reason))
      GTEST_SKIP() << "no CUDA device: " << reason;
  }
};

inline std::string executor_name(const ::testing::TestParamInfo<DeviceKind>& info) {
  return info.param == DeviceKind::kCpu ? "Cpu" : "Cuda";
}

}  // namespace hablar::engine::test_models
