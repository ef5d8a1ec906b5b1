#include "slide/simd.hpp"

#include <algorithm>
#include <cmath>

#include "simd_internal.hpp"

namespace slide {

using namespace bf16_kernels;

namespace {

// ---------------------------------------------------------------- generic
float dot_generic(const float* a, const float* b, int64_t n) {
  // Four partial sums let the compiler overlap the additions (no -ffast-math needed).
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

void axpy_generic(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void backprop_generic(float d, const float* h, const float* w, float* g, float* dh, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    g[i] += d * h[i];
    dh[i] += d * w[i];
  }
}

void dot_multi_generic(const float* w, const float* H, int64_t ldh, int64_t ns, int64_t n, float* out) {
  for (int64_t s = 0; s < ns; ++s) out[s] = dot_generic(w, H + s * ldh, n);
}

void dot_multi2_generic(const float* w0, const float* w1, const float* H, int64_t ldh, int64_t ns, int64_t n,
                        float* out0, float* out1) {
  dot_multi_generic(w0, H, ldh, ns, n, out0);
  dot_multi_generic(w1, H, ldh, ns, n, out1);
}

double exp_sum_generic(const float* z, int64_t n, float m) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += std::exp(z[i] - m);
  return acc;
}

double exp_store_generic(const float* z, int64_t n, float m, float* out) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(z[i] - m);
    acc += out[i];
  }
  return acc;
}

void adam_generic(float* w, float* m, float* v, float* g, int64_t n, const AdamStep& s) {
  const float c1 = 1.0f - s.beta1, c2 = 1.0f - s.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = s.beta1 * m[i] + c1 * gi;
    const float vi = s.beta2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= s.lr_t * mi / (std::sqrt(vi) + s.eps) + s.decay * w[i];
    g[i] = 0.0f;
  }
}


void matmul_generic(const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb, float* C, int64_t ldc,
                    int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i) {
    float* c = C + i * ldc;
    for (int64_t j = 0; j < n; ++j) c[j] = 0.0f;
    for (int64_t p = 0; p < k; ++p) {
      const float a = A[i * a_rs + p * a_cs];
      const float* b = B + p * ldb;
      for (int64_t j = 0; j < n; ++j) c[j] += a * b[j];
    }
  }
}

void matmul_bt_generic(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t m,
                       int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) C[i * ldc + j] = dot_generic(A + i * lda, B + j * ldb, k);
}

#ifdef SLIDE_X86
// ---------------------------------------------------------------- AVX2 + FMA

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    i += 8;
  }
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float alpha, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

__attribute__((target("avx2,fma"))) void backprop_avx2(float d, const float* h, const float* w, float* g,
                                                       float* dh, int64_t n) {
  const __m256 vd = _mm256_set1_ps(d);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(g + i, _mm256_fmadd_ps(vd, _mm256_loadu_ps(h + i), _mm256_loadu_ps(g + i)));
    _mm256_storeu_ps(dh + i, _mm256_fmadd_ps(vd, _mm256_loadu_ps(w + i), _mm256_loadu_ps(dh + i)));
  }
  for (; i < n; ++i) {
    g[i] += d * h[i];
    dh[i] += d * w[i];
  }
}

// The four sums of four eight-lane accumulators, in one fixed order: two hadds leave them in one
// vector, whose halves are added. Every multi-dot kernel reduces through this (dot_multi2 and
// dot_multi2_pairs give dot_multi's bits because they do).
__attribute__((target("avx2,fma"))) inline void store_sums4_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3,
                                                                  float* out) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

// R rows against four vectors at a time: each load of a row serves four vectors and each load
// of a vector serves the R rows. Every (row, vector) pair has one accumulator of eight lanes,
// summed in the same order and reduced the same way whatever R is, so dot_multi2 gives the
// bits of dot_multi.
template <int R>
__attribute__((target("avx2,fma"))) inline void dot_multi_rows_avx2(const float* const* w, const float* H,
                                                                    int64_t ldh, int64_t ns, int64_t n,
                                                                    float* const* out) {
  int64_t s = 0;
  if (n % 8 == 0) {
    for (; s + 4 <= ns; s += 4) {
      const float* h = H + s * ldh;
      __m256 acc[R][4];
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
      for (int64_t i = 0; i < n; i += 8) {
        __m256 u[R];
        for (int r = 0; r < R; ++r) u[r] = _mm256_loadu_ps(w[r] + i);
        for (int j = 0; j < 4; ++j) {
          const __m256 v = _mm256_loadu_ps(h + j * ldh + i);
          for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(u[r], v, acc[r][j]);
        }
      }
      for (int r = 0; r < R; ++r) store_sums4_avx2(acc[r][0], acc[r][1], acc[r][2], acc[r][3], out[r] + s);
    }
  }
  for (; s < ns; ++s)
    for (int r = 0; r < R; ++r) out[r][s] = dot_avx2(w[r], H + s * ldh, n);
}

__attribute__((target("avx2,fma"))) void dot_multi_avx2(const float* w, const float* H, int64_t ldh, int64_t ns,
                                                        int64_t n, float* out) {
  const float* rows[1] = {w};
  float* outs[1] = {out};
  dot_multi_rows_avx2<1>(rows, H, ldh, ns, n, outs);
}

__attribute__((target("avx2,fma"))) void dot_multi2_avx2(const float* w0, const float* w1, const float* H,
                                                         int64_t ldh, int64_t ns, int64_t n, float* out0,
                                                         float* out1) {
  const float* rows[2] = {w0, w1};
  float* outs[2] = {out0, out1};
  dot_multi_rows_avx2<2>(rows, H, ldh, ns, n, outs);
}

// exp(x) for x <= 0: x = k ln2 + r with |r| <= ln2/2, e^r by a degree-6 Taylor polynomial,
// 2^k through the exponent bits. Inputs below -87 (results below FLT_MIN) are clamped.
__attribute__((target("avx2,fma"))) inline __m256 exp_nonpositive_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) double exp_sum_avx2(const float* z, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  double total = 0.0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_add_ps(acc, exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + i), vm)));
    // Hand the float partial sums to double now and then, so long rows keep full precision.
    if ((i & 1023) == 1016) {
      total += hsum256(acc);
      acc = _mm256_setzero_ps();
    }
  }
  total += hsum256(acc);
  for (; i < n; ++i) total += std::exp(z[i] - m);
  return total;
}

__attribute__((target("avx2,fma"))) double exp_store_avx2(const float* z, int64_t n, float m, float* out) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  double total = 0.0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + i), vm));
    _mm256_storeu_ps(out + i, e);
    acc = _mm256_add_ps(acc, e);
    if ((i & 1023) == 1016) {
      total += hsum256(acc);
      acc = _mm256_setzero_ps();
    }
  }
  total += hsum256(acc);
  for (; i < n; ++i) {
    out[i] = std::exp(z[i] - m);
    total += out[i];
  }
  return total;
}

__attribute__((target("avx2,fma"))) void adam_avx2(float* w, float* m, float* v, float* g, int64_t n,
                                                   const AdamStep& s) {
  const __m256 b1 = _mm256_set1_ps(s.beta1), b2 = _mm256_set1_ps(s.beta2);
  const __m256 c1 = _mm256_set1_ps(1.0f - s.beta1), c2 = _mm256_set1_ps(1.0f - s.beta2);
  const __m256 lr = _mm256_set1_ps(s.lr_t), eps = _mm256_set1_ps(s.eps), dec = _mm256_set1_ps(s.decay);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 gi = _mm256_loadu_ps(g + i);
    __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(c1, gi));
    __m256 vi = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    __m256 wi = _mm256_loadu_ps(w + i);
    __m256 upd = _mm256_div_ps(_mm256_mul_ps(lr, mi), _mm256_add_ps(_mm256_sqrt_ps(vi), eps));
    wi = _mm256_sub_ps(wi, _mm256_fmadd_ps(dec, wi, upd));
    _mm256_storeu_ps(w + i, wi);
    _mm256_storeu_ps(g + i, zero);
  }
  if (i < n) adam_generic(w + i, m + i, v + i, g + i, n - i, s);
}


// Batched matrix products. Register tiles: R rows of C by V vectors of 8 columns (matmul),
// R x S dot products over k (matmul_bt). Every C element is one accumulator lane fed in
// p order, so the result does not depend on how the caller splits C between threads.
template <int R, int V>
__attribute__((target("avx2,fma"), always_inline)) inline void matmul_tile_avx2(const float* A, int64_t a_rs,
                                                                                 int64_t a_cs, const float* B,
                                                                                 int64_t ldb, float* C, int64_t ldc,
                                                                                 int64_t k, bool accumulate) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = accumulate ? _mm256_loadu_ps(C + r * ldc + 8 * v) : _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const float* b = B + p * ldb;
    __m256 bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_set1_ps(A[r * a_rs + p * a_cs]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(a, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(C + r * ldc + 8 * v, acc[r][v]);
}

// Same blocking as the AVX-512 version (see kMatmulKc there).
constexpr int64_t kMatmulKcAvx2 = 64;

__attribute__((target("avx2,fma"))) void matmul_avx2(const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                                                     int64_t ldb, float* C, int64_t ldc, int64_t m, int64_t n,
                                                     int64_t k) {
  const int64_t nv = n & ~int64_t(7);  // columns done by vectors; the rest by the generic loop
  if (nv < n) matmul_generic(A, a_rs, a_cs, B + nv, ldb, C + nv, ldc, m, n - nv, k);
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < nv; ++j) C[i * ldc + j] = 0.0f;
    return;
  }
  for (int64_t p0 = 0; p0 < k; p0 += kMatmulKcAvx2) {
    const int64_t kb = std::min(kMatmulKcAvx2, k - p0);
    const bool acc = p0 > 0;
    const float* Ap = A + p0 * a_cs;
    const float* Bp = B + p0 * ldb;
    int64_t j = 0;
    for (; j + 16 <= nv; j += 16) {
      int64_t i = 0;
      for (; i + 4 <= m; i += 4)
        matmul_tile_avx2<4, 2>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, acc);
      for (; i < m; ++i) matmul_tile_avx2<1, 2>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, acc);
    }
    for (; j < nv; j += 8) {
      int64_t i = 0;
      for (; i + 4 <= m; i += 4)
        matmul_tile_avx2<4, 1>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, acc);
      for (; i < m; ++i) matmul_tile_avx2<1, 1>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, acc);
    }
  }
}

template <int R, int S>
__attribute__((target("avx2,fma"), always_inline)) inline void matmul_bt_tile_avx2(const float* A, int64_t lda,
                                                                                    const float* B, int64_t ldb,
                                                                                    float* C, int64_t ldc, int64_t k) {
  __m256 acc[R][S];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) acc[r][s] = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 bv[S];
    for (int s = 0; s < S; ++s) bv[s] = _mm256_loadu_ps(B + s * ldb + p);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_loadu_ps(A + r * lda + p);
      for (int s = 0; s < S; ++s) acc[r][s] = _mm256_fmadd_ps(a, bv[s], acc[r][s]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      float t = hsum256(acc[r][s]);
      for (int64_t q = p; q < k; ++q) t += A[r * lda + q] * B[s * ldb + q];
      C[r * ldc + s] = t;
    }
}

__attribute__((target("avx2,fma"))) void matmul_bt_avx2(const float* A, int64_t lda, const float* B, int64_t ldb,
                                                        float* C, int64_t ldc, int64_t m, int64_t n, int64_t k) {
  int64_t i = 0;  // rows of A outer (see matmul_bt_avx512)
  for (; i + 2 <= m; i += 2) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) matmul_bt_tile_avx2<2, 4>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
    for (; j < n; ++j) matmul_bt_tile_avx2<2, 1>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
  }
  for (; i < m; ++i) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) matmul_bt_tile_avx2<1, 4>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
    for (; j < n; ++j) matmul_bt_tile_avx2<1, 1>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
  }
}

// ---------------------------------------------------------------- AVX-512F
// GCC 12's AVX-512 headers trip its own uninitialised-variable warnings (the "undefined"
// pass-through operands of unmasked intrinsics); they are false positives.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i + 16 <= n) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    i += 16;
  }
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), s1);
  }
  return hsum512(_mm512_add_ps(s0, s1));
}

// Kernels::dot_multi2_pairs. Each 512-bit accumulator holds two vectors' eight-lane sums (the
// low half the first of the pair), summed in dot_multi_rows_avx2's order; the halves of two
// pairs are reduced by store_sums4_avx2 as its four accumulators are.
template <int P>  // pairs (of vectors) a step, even
__attribute__((target("avx512f,avx2,fma"))) inline void dot2_pairs_step_avx512(const float* w0, const float* w1,
                                                                              const float* H2, int64_t n,
                                                                              float* out0, float* out1) {
  __m512 a[P], b[P];
  for (int q = 0; q < P; ++q) a[q] = b[q] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    // eight floats of each row in both halves (a broadcast of four doubles moves the bits)
    const __m512 u = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(w0 + i))));
    const __m512 v = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(w1 + i))));
    for (int q = 0; q < P; ++q) {
      const __m512 h = _mm512_loadu_ps(H2 + 2 * (q * n + i));
      a[q] = _mm512_fmadd_ps(u, h, a[q]);
      b[q] = _mm512_fmadd_ps(v, h, b[q]);
    }
  }
  for (int q = 0; q < P; q += 2) {   // vectors 2q .. 2q + 3
    store_sums4_avx2(lo256(a[q]), hi256(a[q]), lo256(a[q + 1]), hi256(a[q + 1]), out0 + 2 * q);
    store_sums4_avx2(lo256(b[q]), hi256(b[q]), lo256(b[q + 1]), hi256(b[q + 1]), out1 + 2 * q);
  }
}

__attribute__((target("avx512f,avx2,fma"))) void dot_multi2_pairs_avx512(const float* w0, const float* w1,
                                                                        const float* H2, int64_t ns, int64_t n,
                                                                        float* out0, float* out1) {
  int64_t s = 0;
  for (; s + 8 <= ns; s += 8) dot2_pairs_step_avx512<4>(w0, w1, H2 + s * n, n, out0 + s, out1 + s);
  for (; s + 4 <= ns; s += 4) dot2_pairs_step_avx512<2>(w0, w1, H2 + s * n, n, out0 + s, out1 + s);
}

__attribute__((target("avx512f"))) void axpy_avx512(float alpha, const float* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, k, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(k, x + i),
                                                    _mm512_maskz_loadu_ps(k, y + i)));
  }
}

__attribute__((target("avx512f"))) void backprop_avx512(float d, const float* h, const float* w, float* g,
                                                         float* dh, int64_t n) {
  const __m512 vd = _mm512_set1_ps(d);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(g + i, _mm512_fmadd_ps(vd, _mm512_loadu_ps(h + i), _mm512_loadu_ps(g + i)));
    _mm512_storeu_ps(dh + i, _mm512_fmadd_ps(vd, _mm512_loadu_ps(w + i), _mm512_loadu_ps(dh + i)));
  }
  if (i < n) backprop_generic(d, h + i, w + i, g + i, dh + i, n - i);
}

__attribute__((target("avx512f"))) void adam_avx512(float* w, float* m, float* v, float* g, int64_t n,
                                                    const AdamStep& s) {
  const __m512 b1 = _mm512_set1_ps(s.beta1), b2 = _mm512_set1_ps(s.beta2);
  const __m512 c1 = _mm512_set1_ps(1.0f - s.beta1), c2 = _mm512_set1_ps(1.0f - s.beta2);
  const __m512 lr = _mm512_set1_ps(s.lr_t), eps = _mm512_set1_ps(s.eps), dec = _mm512_set1_ps(s.decay);
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 gi = _mm512_loadu_ps(g + i);
    __m512 mi = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(c1, gi));
    __m512 vi = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    __m512 wi = _mm512_loadu_ps(w + i);
    __m512 upd = _mm512_div_ps(_mm512_mul_ps(lr, mi), _mm512_add_ps(_mm512_sqrt_ps(vi), eps));
    wi = _mm512_sub_ps(wi, _mm512_fmadd_ps(dec, wi, upd));
    _mm512_storeu_ps(w + i, wi);
    _mm512_storeu_ps(g + i, zero);
  }
  if (i < n) adam_generic(w + i, m + i, v + i, g + i, n - i, s);
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u); }

// k is cut into blocks of kMatmulKc so that the block of B a tile row streams over stays in
// L1 across the row tiles; C carries the partial sums from one block to the next (exact: a
// float stored and reloaded is unchanged), so every element is still summed in p order.
constexpr int64_t kMatmulKc = 64;

template <int R, int V>
__attribute__((target("avx512f"), always_inline)) inline void matmul_tile_avx512(const float* A, int64_t a_rs,
                                                                                  int64_t a_cs, const float* B,
                                                                                  int64_t ldb, float* C, int64_t ldc,
                                                                                  int64_t k, __mmask16 last,
                                                                                  bool accumulate) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v + 1 < V; ++v) acc[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + 16 * v) : _mm512_setzero_ps();
    acc[r][V - 1] = accumulate ? _mm512_maskz_loadu_ps(last, C + r * ldc + 16 * (V - 1)) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    const float* b = B + p * ldb;
    __m512 bv[V];
    for (int v = 0; v + 1 < V; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
    bv[V - 1] = _mm512_maskz_loadu_ps(last, b + 16 * (V - 1));
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * a_rs + p * a_cs]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v + 1 < V; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
    _mm512_mask_storeu_ps(C + r * ldc + 16 * (V - 1), last, acc[r][V - 1]);
  }
}

__attribute__((target("avx512f"))) void matmul_avx512(const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                                                       int64_t ldb, float* C, int64_t ldc, int64_t m, int64_t n,
                                                       int64_t k) {
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) C[i * ldc + j] = 0.0f;
    return;
  }
  for (int64_t p0 = 0; p0 < k; p0 += kMatmulKc) {
    const int64_t kb = std::min(kMatmulKc, k - p0);
    const bool acc = p0 > 0;
    const float* Ap = A + p0 * a_cs;
    const float* Bp = B + p0 * ldb;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
      int64_t i = 0;
      for (; i + 4 <= m; i += 4)
        matmul_tile_avx512<4, 4>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, 0xFFFF, acc);
      for (; i < m; ++i)
        matmul_tile_avx512<1, 4>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, 0xFFFF, acc);
    }
    for (; j < n; j += 16) {
      const __mmask16 last = tail_mask(n - j);
      int64_t i = 0;
      for (; i + 4 <= m; i += 4)
        matmul_tile_avx512<4, 1>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, last, acc);
      for (; i < m; ++i)
        matmul_tile_avx512<1, 1>(Ap + i * a_rs, a_rs, a_cs, Bp + j, ldb, C + i * ldc + j, ldc, kb, last, acc);
    }
  }
}

__attribute__((target("avx512f"), always_inline)) inline __m256 fold512(__m512 v) {
  return _mm256_add_ps(lo256(v), hi256(v));
}

// The four horizontal sums of a0..a3, as one 128-bit vector.
__attribute__((target("avx512f"), always_inline)) inline __m128 hsum4_512(__m512 a0, __m512 a1, __m512 a2,
                                                                          __m512 a3) {
  const __m256 t =
      _mm256_hadd_ps(_mm256_hadd_ps(fold512(a0), fold512(a1)), _mm256_hadd_ps(fold512(a2), fold512(a3)));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

template <int R, int S>
__attribute__((target("avx512f"), always_inline)) inline void matmul_bt_tile_avx512(const float* A, int64_t lda,
                                                                                     const float* B, int64_t ldb,
                                                                                     float* C, int64_t ldc, int64_t k) {
  __m512 acc[R][S];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 16 <= k; p += 16) {
    __m512 bv[S];
    for (int s = 0; s < S; ++s) bv[s] = _mm512_loadu_ps(B + s * ldb + p);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_loadu_ps(A + r * lda + p);
      for (int s = 0; s < S; ++s) acc[r][s] = _mm512_fmadd_ps(a, bv[s], acc[r][s]);
    }
  }
  if (p < k) {
    const __mmask16 msk = tail_mask(k - p);
    __m512 bv[S];
    for (int s = 0; s < S; ++s) bv[s] = _mm512_maskz_loadu_ps(msk, B + s * ldb + p);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_maskz_loadu_ps(msk, A + r * lda + p);
      for (int s = 0; s < S; ++s) acc[r][s] = _mm512_fmadd_ps(a, bv[s], acc[r][s]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (S == 4) {
      _mm_storeu_ps(C + r * ldc, hsum4_512(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    } else {
      for (int s = 0; s < S; ++s) C[r * ldc + s] = hsum512(acc[r][s]);
    }
  }
}

__attribute__((target("avx512f"))) void matmul_bt_avx512(const float* A, int64_t lda, const float* B, int64_t ldb,
                                                          float* C, int64_t ldc, int64_t m, int64_t n, int64_t k) {
  // Rows of A outer, rows of B inner: a caller passes a few rows of B (they stay in L1) and
  // many rows of A (each read once).
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
      matmul_bt_tile_avx512<4, 4>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
    for (; j < n; ++j) matmul_bt_tile_avx512<4, 1>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
  }
  for (; i < m; ++i) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
      matmul_bt_tile_avx512<1, 4>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
    for (; j < n; ++j) matmul_bt_tile_avx512<1, 1>(A + i * lda, lda, B + j * ldb, ldb, C + i * ldc + j, ldc, k);
  }
}

#pragma GCC diagnostic pop
#endif

const Kernels kGeneric{&dot_generic,     &axpy_generic,      &backprop_generic, &dot_multi_generic, &dot_multi2_generic,
                       &exp_sum_generic, &exp_store_generic, &adam_generic,     &matmul_generic,
                       &matmul_bt_generic, "generic",
                       &dot_bf16_generic, &axpy_bf16_generic, &adam_bf16_generic, &to_bf16_generic,
                       &from_bf16_generic, "generic", nullptr};
#ifdef SLIDE_X86
const Kernels kAvx2{&dot_avx2,       &axpy_avx2, &backprop_avx2, &dot_multi_avx2, &dot_multi2_avx2, &exp_sum_avx2,
                    &exp_store_avx2, &adam_avx2, &matmul_avx2,   &matmul_bt_avx2, "avx2",
                    &dot_bf16_avx2,  &axpy_bf16_avx2, &adam_bf16_avx2, &to_bf16_avx2,
                    &from_bf16_avx2, "avx2", nullptr};
// AVX-512 CPUs also run the AVX2 multi-dot and exp kernels (not the bottleneck there); exact
// scoring's two-row multi-dot also has a form on 512-bit registers (dot_multi2_pairs).
const Kernels kAvx512{&dot_avx512,     &axpy_avx512, &backprop_avx512, &dot_multi_avx2, &dot_multi2_avx2, &exp_sum_avx2,
                      &exp_store_avx2, &adam_avx512, &matmul_avx512,   &matmul_bt_avx512, "avx512",
                      &dot_bf16_avx2,  &axpy_bf16_avx2, &adam_bf16_avx2, &to_bf16_avx2,
                      &from_bf16_avx2, "avx2", &dot_multi2_pairs_avx512};
// The same with the AVX512_BF16 instructions for bf16 layers.
const Kernels kAvx512Bf16{&dot_avx512,     &axpy_avx512, &backprop_avx512, &dot_multi_avx2, &dot_multi2_avx2, &exp_sum_avx2,
                          &exp_store_avx2, &adam_avx512, &matmul_avx512,   &matmul_bt_avx512, "avx512",
                          &dot_bf16_avx512bf16, &axpy_bf16_avx512bf16, &adam_bf16_avx512bf16,
                          &to_bf16_avx512bf16, &from_bf16_avx512bf16, "avx512_bf16", &dot_multi2_pairs_avx512};
#endif

}  // namespace

const Kernels& kernels_for(const CpuFeatures& f) noexcept {
#ifdef SLIDE_X86
  if (f.avx512f && f.avx512bf16) return kAvx512Bf16;
  if (f.avx512f) return kAvx512;
  if (f.avx2 && f.fma) return kAvx2;
#endif
  return kGeneric;
}

const Kernels& kernels() noexcept {
  static const Kernels& selected = kernels_for(cpu_features());
  return selected;
}

}  // namespace slide
