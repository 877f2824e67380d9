// What the x86-64 CPU we run on can do, read once from CPUID (and XGETBV for the OS's
// register-state support). Kernels pick their instruction set from this at start-up, so one
// binary runs on any AVX2 machine and uses AVX-512 where present.
#pragma once

#include <string>

namespace hablar {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;

  // Everything the AVX2 kernels use (AVX2 + FMA + F16C).
  bool has_avx2_kernels() const { return avx2 && fma && f16c; }
  // Everything the AVX-512 kernels use (F, BW, VL, DQ, VNNI, on top of the AVX2 set).
  bool has_avx512_kernels() const {
    return has_avx2_kernels() && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni;
  }
  std::string describe() const;  // "avx2 fma f16c avx512f ..."
};

// Detected once, on first use; thread-safe.
const CpuFeatures& cpu_features();

}  // namespace hablar
