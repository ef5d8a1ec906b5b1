// The kernel sets this CPU runs (generic always; avx2 and avx512 where the CPU has them), for
// tests that check every set.
#pragma once

#include <exception>
#include <utility>
#include <vector>

#include "slide/cpu.hpp"
#include "slide/simd.hpp"

namespace slide {

inline std::vector<std::pair<const char*, const Kernels*>> runnable_kernel_sets() {
  std::vector<std::pair<const char*, const Kernels*>> out;
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    try {
      out.emplace_back(isa, &kernels_for(cap_features(cpu_features(), isa, true)));
    } catch (const std::exception&) {
      // this CPU lacks the set
    }
  }
  return out;
}

}  // namespace slide
