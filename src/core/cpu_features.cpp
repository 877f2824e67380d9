#include "core/cpu_features.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace hablar {

namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1;
  const bool fma = (ecx >> 12) & 1;
  const bool f16c = (ecx >> 29) & 1;
  if (!osxsave) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;       // XMM and YMM state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;  // plus opmask and ZMM state
  if (!os_avx) return f;
  f.fma = fma;
  f.f16c = f16c;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = (ebx >> 5) & 1;
  if (os_avx512) {
    f.avx512f = (ebx >> 16) & 1;
    f.avx512dq = (ebx >> 17) & 1;
    f.avx512bw = (ebx >> 30) & 1;
    f.avx512vl = (ebx >> 31) & 1;
    f.avx512vnni = (ecx >> 11) & 1;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    f.avx512bf16 = (a1 >> 5) & 1;
  }
  return f;
}
#else
CpuFeatures detect() {
  return {};
}
#endif

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  return s.empty() ? "none" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace hablar
