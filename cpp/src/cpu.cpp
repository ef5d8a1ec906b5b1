#include "slide/cpu.hpp"

#include <cstdlib>

#include "slide/common.hpp"

namespace slide {

namespace {
CpuFeatures detect() noexcept {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
#endif
  // SLIDE_ISA=generic|avx2|avx512f caps the kernels (for testing the portable paths).
  if (const char* cap = std::getenv("SLIDE_ISA")) f = cap_features(f, cap, false);
  return f;
}
}  // namespace

CpuFeatures cap_features(CpuFeatures f, const std::string& isa, bool strict) {
  if (isa == "generic") return CpuFeatures{};
  if (isa == "avx2") {
    if (strict && !(f.avx2 && f.fma)) throw InvalidArgument("isa: this CPU has no AVX2+FMA");
    f.avx512f = false;
    f.avx512bf16 = false;
    return f;
  }
  if (isa == "avx512f") {
    if (strict && !f.avx512f) throw InvalidArgument("isa: this CPU has no AVX-512F");
    f.avx512bf16 = false;
    return f;
  }
  if (isa == "avx512") {
    if (strict && !f.avx512f) throw InvalidArgument("isa: this CPU has no AVX-512F");
    return f;
  }
  if (strict) throw InvalidArgument("isa: must be generic, avx2, avx512f or avx512, got '" + isa + "'");
  return f;
}

const CpuFeatures& cpu_features() noexcept {
  static const CpuFeatures features = detect();
  return features;
}

std::string kernel_isa() noexcept {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f) return "avx512";
  if (f.avx2 && f.fma) return "avx2";
  return "generic";
}

}  // namespace slide
