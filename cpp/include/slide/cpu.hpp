// Run-time CPU feature detection: the distributable build picks its kernels here.
#pragma once

#include <string>

namespace slide {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bf16 = false;
};

// Features of the CPU this process runs on (detected once).
const CpuFeatures& cpu_features() noexcept;
// Name of the widest kernel set in use: "avx512", "avx2" or "generic".
std::string kernel_isa() noexcept;

}  // namespace slide
