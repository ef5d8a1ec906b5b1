// Vector kernels of the training hot loop, chosen once at run time for the CPU.
//
// The distributable build targets plain x86-64; each kernel also exists compiled with
// __attribute__((target("avx2,fma"))) and target("avx512f"), and kernels() returns the
// widest set this CPU supports (SLIDE_ISA=generic|avx2|avx512f caps it, see cpu.hpp).
// The bfloat16 kernels (layers with precision: bf16, see bf16.hpp) use the AVX512_BF16
// instructions where the CPU has them, and elsewhere an exact fallback (AVX2+FMA, or scalar
// on the generic set) that widens bf16 to float32 by a shift and emulates the rounding of
// VCVTNEPS2BF16 bit for bit. All round stores to nearest even and accumulate in float32, so
// they agree up to the order of the float32 additions: to_bf16 and from_bf16 bit for bit,
// adam_bf16 bit for bit between AVX2 and AVX512_BF16 (same operations) and to one unit in
// the last place against the scalar loop (no fused multiply-adds there).
// All kernels accept unaligned pointers and any length n >= 0.
#pragma once

#include <cstdint>

#include "slide/cpu.hpp"
#include "slide/optimizer.hpp"  // AdamStep

namespace slide {

struct Kernels {
  // sum_i a[i] b[i]
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[i] += alpha x[i]
  void (*axpy)(float alpha, const float* x, float* y, int64_t n);
  // Backward through one neuron: g[i] += d h[i] (weight gradient) and dh[i] += d w[i]
  // (gradient of the layer input), in one pass over the row.
  void (*backprop_row)(float d, const float* h, const float* w, float* g, float* dh, int64_t n);
  // out[s] = dot(w, H + s ldh) for s < ns: one row against several vectors (w read once).
  void (*dot_multi)(const float* w, const float* H, int64_t ldh, int64_t ns, int64_t n, float* out);
  // dot_multi of two rows at once, out0 for w0 and out1 for w1, each value the same bits as
  // dot_multi's (each vector of H is loaded once for both rows: half the cache traffic).
  void (*dot_multi2)(const float* w0, const float* w1, const float* H, int64_t ldh, int64_t ns, int64_t n,
                     float* out0, float* out1);
  // sum_i exp(z[i] - m), for z[i] <= m (softmax normalisers); relative error ~1e-7.
  double (*exp_sum)(const float* z, int64_t n, float m);
  // out[i] = exp(z[i] - m) for z[i] <= m; returns their sum (out may be z).
  double (*exp_store)(const float* z, int64_t n, float m, float* out);
  // Fused Adam over one row (optimizer.hpp: adam_row_reference); reads and zeroes g.
  void (*adam)(float* w, float* m, float* v, float* g, int64_t n, const AdamStep& s);
  // Matrix products of the batched dense layers (row-major, C overwritten):
  // matmul:    C[i][j] = sum_p A[i*a_rs + p*a_cs] * B[p*ldb + j], i < m, j < n, p < k
  //            (A given by its row and column strides, so it may be a transposed view);
  // matmul_bt: C[i][j] = sum_p A[i*lda + p] * B[j*ldb + p]   (C = A B^T).
  // Each C element is summed in a fixed order, whatever the blocking of the caller.
  void (*matmul)(const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb, float* C, int64_t ldc,
                 int64_t m, int64_t n, int64_t k);
  void (*matmul_bt)(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t m,
                    int64_t n, int64_t k);
  const char* isa;  // "generic", "avx2" or "avx512"

  // ---- bfloat16 storage (uint16_t holds the bits, see bf16.hpp); float32 arithmetic.
  // sum_i w[i] x[i], both bf16: each product is exact in float32, the sum is accumulated in
  // float32 (with AVX512_BF16: VDPBF16PS, two products per lane and step).
  float (*dot_bf16)(const uint16_t* w, const uint16_t* x, int64_t n);
  // y[i] += alpha float(x[i])
  void (*axpy_bf16)(float alpha, const uint16_t* x, float* y, int64_t n);
  // Fused Adam over one bf16 row: the float32 step of Kernels::adam on the widened values; m
  // is stored rounded to nearest even, w and v with stochastic rounding from the counter
  // noise of `key` (bf16.hpp: bf16_row_key, float_to_bf16_stochastic); reads and zeroes g.
  void (*adam_bf16)(uint16_t* w, uint16_t* m, uint16_t* v, float* g, int64_t n, const AdamStep& s, uint32_t key);
  // out[i] = bf16(x[i]) (round to nearest even), out[i] = float(x[i]) (exact).
  void (*to_bf16)(const float* x, uint16_t* out, int64_t n);
  void (*from_bf16)(const uint16_t* x, float* out, int64_t n);
  const char* bf16_isa;  // "avx512_bf16" (the BF16 instructions), "avx2" or "generic" (exact fallbacks)

  // dot_multi2 on 512-bit registers (null where the CPU lacks AVX-512): the first ns vectors
  // (ns a multiple of 4, n of 8) given interleaved in pairs by interleave_pairs, each 512-bit
  // register holding the eight-lane sums of two vectors, so every value is the same bits as
  // dot_multi2's on the plain vectors.
  void (*dot_multi2_pairs)(const float* w0, const float* w1, const float* H2, int64_t ns, int64_t n, float* out0,
                           float* out1);
};

// H2 for Kernels::dot_multi2_pairs: vectors 2p and 2p+1 of H (ldh floats apart, n a multiple
// of 8) as 2n floats from H2 + 2pn, eight of the first then eight of the second, for p < pairs.
inline void interleave_pairs(const float* H, int64_t ldh, int64_t pairs, int64_t n, float* H2) noexcept {
  for (int64_t p = 0; p < pairs; ++p) {
    const float* a = H + 2 * p * ldh;
    const float* b = a + ldh;
    float* o = H2 + 2 * p * n;
    for (int64_t c = 0; c < n; c += 8, o += 16)
      for (int j = 0; j < 8; ++j) {
        o[j] = a[c + j];
        o[8 + j] = b[c + j];
      }
  }
}

// Hints the cache to load a row of n floats that the loop will read soon.
inline void prefetch_row(const float* p, int64_t n) noexcept {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(float)); b += 64) __builtin_prefetch(c + b, 0, 3);
}

// Kernels for the given feature set (exposed for tests of each path).
const Kernels& kernels_for(const CpuFeatures& f) noexcept;
// Kernels for the running CPU (selected once).
const Kernels& kernels() noexcept;

}  // namespace slide
