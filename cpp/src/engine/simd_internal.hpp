// Kernel pieces shared by simd.cpp (float32 kernels, the dispatch tables) and simd_bf16.cpp
// (the bf16 kernels): the horizontal sums, and the bf16 kernels' declarations.
#pragma once

#include <cstdint>

#include "slide/simd.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLIDE_X86 1
#endif

namespace slide {

#ifdef SLIDE_X86
__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The low and high eight lanes of a 512-bit register (bit moves, AVX512F alone).
__attribute__((target("avx512f"))) inline __m256 lo256(__m512 v) { return _mm512_castps512_ps256(v); }
__attribute__((target("avx512f"))) inline __m256 hi256(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

__attribute__((target("avx512f"))) inline float hsum512(__m512 v) {
  const __m256 lo = lo256(v), hi = hi256(v);
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
  a = _mm_add_ps(a, b);
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
}
#pragma GCC diagnostic pop
#endif

// bf16 rows (bf16.hpp): each kernel set's version of Kernels::dot_bf16, axpy_bf16, adam_bf16,
// to_bf16 and from_bf16 (simd_bf16.cpp).
namespace bf16_kernels {
#define SLIDE_BF16_KERNELS(isa)                                                                         \
  float dot_bf16_##isa(const uint16_t* w, const uint16_t* x, int64_t n);                                \
  void axpy_bf16_##isa(float alpha, const uint16_t* x, float* y, int64_t n);                            \
  void adam_bf16_##isa(uint16_t* w, uint16_t* m, uint16_t* v, float* g, int64_t n, const AdamStep& s,   \
                       uint32_t key);                                                                   \
  void to_bf16_##isa(const float* x, uint16_t* out, int64_t n);                                         \
  void from_bf16_##isa(const uint16_t* x, float* out, int64_t n);
SLIDE_BF16_KERNELS(generic)
#ifdef SLIDE_X86
SLIDE_BF16_KERNELS(avx2)
SLIDE_BF16_KERNELS(avx512bf16)
#endif
#undef SLIDE_BF16_KERNELS
}  // namespace bf16_kernels

}  // namespace slide
