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

// `f` limited to the instruction set named `isa`: "generic" (none of the features),
// "avx2" (no AVX-512), "avx512f" (AVX-512 without the AVX512_BF16 instructions: bf16 layers
// use the exact fallback) or "avx512" (unchanged), so that kernels_for(result) is that set's.
// strict: an unknown name, or a set that f lacks, throws InvalidArgument ("isa: ...");
// otherwise an unknown name leaves f unchanged and a lacking set caps what f has.
CpuFeatures cap_features(CpuFeatures f, const std::string& isa, bool strict);

// Features of the CPU this process runs on (detected once; SLIDE_ISA=generic|avx2|avx512f in the
// environment caps them, non-strictly, for testing the portable paths).
const CpuFeatures& cpu_features() noexcept;
// Name of the widest kernel set in use: "avx512", "avx2" or "generic".
std::string kernel_isa() noexcept;

}  // namespace slide
