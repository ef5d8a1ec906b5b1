// The bf16 kernels of Kernels (simd.hpp): an exact generic fallback, an AVX2 version computing
// the same values, and AVX512_BF16 (VDPBF16PS, VCVTNE(2)PS2BF16), chosen in simd.cpp.
#include <algorithm>
#include <cmath>

#include "simd_internal.hpp"
#include "slide/bf16.hpp"

namespace slide {
namespace bf16_kernels {

// ---------------------------------------------------------------- bf16, generic (exact fallback)
float dot_bf16_generic(const uint16_t* w, const uint16_t* x, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += bf16_to_float(w[i]) * bf16_to_float(x[i]);
    s1 += bf16_to_float(w[i + 1]) * bf16_to_float(x[i + 1]);
    s2 += bf16_to_float(w[i + 2]) * bf16_to_float(x[i + 2]);
    s3 += bf16_to_float(w[i + 3]) * bf16_to_float(x[i + 3]);
  }
  for (; i < n; ++i) s0 += bf16_to_float(w[i]) * bf16_to_float(x[i]);
  return (s0 + s1) + (s2 + s3);
}

void axpy_bf16_generic(float alpha, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * bf16_to_float(x[i]);
}

// key: the noise of column 0 (the vector kernels pass key + 2 x their offset for a tail).
void adam_bf16_generic(uint16_t* w, uint16_t* m, uint16_t* v, float* g, int64_t n, const AdamStep& s,
                       uint32_t key) {
  const float c1 = 1.0f - s.beta1, c2 = 1.0f - s.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = s.beta1 * bf16_to_float(m[i]) + c1 * gi;
    const float vi = s.beta2 * bf16_to_float(v[i]) + c2 * gi * gi;
    const float wi = bf16_to_float(w[i]);
    const uint32_t k = key + 2u * static_cast<uint32_t>(i);
    m[i] = float_to_bf16(mi);
    v[i] = float_to_bf16_stochastic(vi, bf16_mix(k + 1u));
    w[i] = float_to_bf16_stochastic(wi - (s.lr_t * mi / (std::sqrt(vi) + s.eps) + s.decay * wi), bf16_mix(k));
    g[i] = 0.0f;
  }
}

void to_bf16_generic(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(x[i]);
}

void from_bf16_generic(const uint16_t* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(x[i]);
}


#ifdef SLIDE_X86
// ---------------------------------------------------------------- bf16, AVX2 (exact fallback)
// Widening is a 16-bit shift; rounding emulates VCVTNEPS2BF16 bit for bit (float_to_bf16).
__attribute__((target("avx2,fma"))) inline __m256 widen8_bf16(const uint16_t* x) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))), 16));
}

// Stores v rounded: to nearest even (stochastic = false), or by adding the low 16 bits of
// `noise` before truncating (float_to_bf16_stochastic).
__attribute__((target("avx2,fma"))) inline void store8_bf16(uint16_t* out, __m256 v, bool stochastic = false,
                                                           __m256i noise = __m256i()) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  const __m256i exponent = _mm256_and_si256(u, exp_mask);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i add = stochastic ? _mm256_and_si256(noise, _mm256_set1_epi32(0xFFFF))
                                 : _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, add), 16);
  // infinities and NaNs: truncated, NaNs made quiet
  const __m256i special = _mm256_cmpeq_epi32(exponent, exp_mask);
  const __m256i nan = _mm256_andnot_si256(
      _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x007FFFFF)), _mm256_setzero_si256()), special);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_and_si256(nan, _mm256_set1_epi32(0x0040))), special);
  // zeros and denormals: a zero of the same sign
  const __m256i tiny = _mm256_cmpeq_epi32(exponent, _mm256_setzero_si256());
  r = _mm256_blendv_epi8(r, _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), tiny);
  // 8 x 32 bits -> 8 x 16 bits (values fit: no saturation), lanes put back in order
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

// bf16_mix on 8 counters.
__attribute__((target("avx2,fma"))) inline __m256i mix8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

__attribute__((target("avx2,fma"))) float dot_bf16_avx2(const uint16_t* w, const uint16_t* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(widen8_bf16(w + i), widen8_bf16(x + i), s0);
    s1 = _mm256_fmadd_ps(widen8_bf16(w + i + 8), widen8_bf16(x + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(widen8_bf16(w + i), widen8_bf16(x + i), s0);
    i += 8;
  }
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += bf16_to_float(w[i]) * bf16_to_float(x[i]);
  return s;
}

__attribute__((target("avx2,fma"))) void axpy_bf16_avx2(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, widen8_bf16(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * bf16_to_float(x[i]);
}

// The same operations, in the same order, as adam_bf16_avx512bf16: the stores agree bit for bit.
__attribute__((target("avx2,fma"))) void adam_bf16_avx2(uint16_t* w, uint16_t* m, uint16_t* v, float* g, int64_t n,
                                                        const AdamStep& s, uint32_t key) {
  const __m256i lanes = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256 b1 = _mm256_set1_ps(s.beta1), b2 = _mm256_set1_ps(s.beta2);
  const __m256 c1 = _mm256_set1_ps(1.0f - s.beta1), c2 = _mm256_set1_ps(1.0f - s.beta2);
  const __m256 lr = _mm256_set1_ps(s.lr_t), eps = _mm256_set1_ps(s.eps), dec = _mm256_set1_ps(s.decay);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 mi = _mm256_fmadd_ps(b1, widen8_bf16(m + i), _mm256_mul_ps(c1, gi));
    const __m256 vi = _mm256_fmadd_ps(b2, widen8_bf16(v + i), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
    const __m256i k = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(key + 2u * static_cast<uint32_t>(i))), lanes);
    store8_bf16(m + i, mi);
    store8_bf16(v + i, vi, true, mix8(_mm256_add_epi32(k, _mm256_set1_epi32(1))));
    __m256 wi = widen8_bf16(w + i);
    const __m256 upd = _mm256_div_ps(_mm256_mul_ps(lr, mi), _mm256_add_ps(_mm256_sqrt_ps(vi), eps));
    wi = _mm256_sub_ps(wi, _mm256_fmadd_ps(dec, wi, upd));
    store8_bf16(w + i, wi, true, mix8(k));
    _mm256_storeu_ps(g + i, zero);
  }
  if (i < n) adam_bf16_generic(w + i, m + i, v + i, g + i, n - i, s, key + 2u * static_cast<uint32_t>(i));
}

__attribute__((target("avx2,fma"))) void to_bf16_avx2(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8_bf16(out + i, _mm256_loadu_ps(x + i));
  for (; i < n; ++i) out[i] = float_to_bf16(x[i]);
}

__attribute__((target("avx2,fma"))) void from_bf16_avx2(const uint16_t* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, widen8_bf16(x + i));
  for (; i < n; ++i) out[i] = bf16_to_float(x[i]);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// ---------------------------------------------------------------- AVX512_BF16
// VDPBF16PS (dot products of bf16 pairs into float32 lanes) and VCVTNEPS2BF16 /
// VCVTNE2PS2BF16 (float32 to bf16, round to nearest even); widening is a 16-bit shift.
#define SLIDE_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

SLIDE_BF16_TARGET inline __m512 widen16_bf16(const uint16_t* x) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
}

SLIDE_BF16_TARGET inline void store16_bf16(uint16_t* out, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// bf16_mix on 16 counters.
SLIDE_BF16_TARGET inline __m512i mix16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

// Stores v with stochastic rounding (float_to_bf16_stochastic, 16 lanes): VCVTNEPS2BF16 has no
// such mode, so the noise is added to the float's bits and the result truncated; zeros,
// denormals, infinities and NaNs take the nearest-even conversion.
SLIDE_BF16_TARGET inline void store16_bf16_stochastic(uint16_t* out, __m512 v, __m512i noise) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i exponent = _mm512_and_si512(u, _mm512_set1_epi32(0x7F800000));
  const __mmask16 normal = _mm512_cmpneq_epi32_mask(exponent, _mm512_setzero_si512()) &
                           _mm512_cmpneq_epi32_mask(exponent, _mm512_set1_epi32(0x7F800000));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_and_si512(noise, _mm512_set1_epi32(0xFFFF))), 16);
  const __m512i nearest = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(normal, nearest, rounded)));
}

SLIDE_BF16_TARGET float dot_bf16_avx512bf16(const uint16_t* w, const uint16_t* x, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_dpbf16_ps(s0, reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + i)),
                          reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i)));
    s1 = _mm512_dpbf16_ps(s1, reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + i + 32)),
                          reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i + 32)));
  }
  if (i + 32 <= n) {
    s0 = _mm512_dpbf16_ps(s0, reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + i)),
                          reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + i)));
    i += 32;
  }
  float s = hsum512(_mm512_add_ps(s0, s1));
  for (; i < n; ++i) s += bf16_to_float(w[i]) * bf16_to_float(x[i]);
  return s;
}

SLIDE_BF16_TARGET void axpy_bf16_avx512bf16(float alpha, const uint16_t* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, widen16_bf16(x + i), _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * bf16_to_float(x[i]);
}

SLIDE_BF16_TARGET void adam_bf16_avx512bf16(uint16_t* w, uint16_t* m, uint16_t* v, float* g, int64_t n,
                                             const AdamStep& s, uint32_t key) {
  const __m512i lanes = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512 b1 = _mm512_set1_ps(s.beta1), b2 = _mm512_set1_ps(s.beta2);
  const __m512 c1 = _mm512_set1_ps(1.0f - s.beta1), c2 = _mm512_set1_ps(1.0f - s.beta2);
  const __m512 lr = _mm512_set1_ps(s.lr_t), eps = _mm512_set1_ps(s.eps), dec = _mm512_set1_ps(s.decay);
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i);
    const __m512 mi = _mm512_fmadd_ps(b1, widen16_bf16(m + i), _mm512_mul_ps(c1, gi));
    const __m512 vi = _mm512_fmadd_ps(b2, widen16_bf16(v + i), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    const __m512i k = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(key + 2u * static_cast<uint32_t>(i))), lanes);
    store16_bf16(m + i, mi);
    store16_bf16_stochastic(v + i, vi, mix16(_mm512_add_epi32(k, _mm512_set1_epi32(1))));
    __m512 wi = widen16_bf16(w + i);
    const __m512 upd = _mm512_div_ps(_mm512_mul_ps(lr, mi), _mm512_add_ps(_mm512_sqrt_ps(vi), eps));
    wi = _mm512_sub_ps(wi, _mm512_fmadd_ps(dec, wi, upd));
    store16_bf16_stochastic(w + i, wi, mix16(k));
    _mm512_storeu_ps(g + i, zero);
  }
  // The tail as the AVX2 fallback does it, so that the two store the same bits everywhere.
  if (i < n) adam_bf16_avx2(w + i, m + i, v + i, g + i, n - i, s, key + 2u * static_cast<uint32_t>(i));
}

SLIDE_BF16_TARGET void to_bf16_avx512bf16(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(
                                     _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i))));
  for (; i < n; ++i) out[i] = float_to_bf16(x[i]);
}

SLIDE_BF16_TARGET void from_bf16_avx512bf16(const uint16_t* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, widen16_bf16(x + i));
  for (; i < n; ++i) out[i] = bf16_to_float(x[i]);
}
#undef SLIDE_BF16_TARGET
#pragma GCC diagnostic pop
#endif

}  // namespace bf16_kernels
}  // namespace slide
