// bfloat16 storage: the upper 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits).
//
// A layer with `precision: bf16` keeps its weights and Adam moments in this format (half the
// bytes of float32) and computes in float32: values are widened exactly on load and rounded
// to nearest, ties to even, on store. The rounding is bit for bit that of the AVX512_BF16
// conversion instructions (VCVTNEPS2BF16), so the kernels with and without them store the
// same values: zero and denormal inputs give a zero of the same sign, NaNs stay (quiet) NaNs,
// infinities stay infinite, and finite values that round past the largest bf16 become infinite.
// The Adam step stores weights and second moments with stochastic rounding instead (below).
#pragma once

#include <cstdint>
#include <cstring>

namespace slide {

inline float bf16_to_float(uint16_t b) noexcept {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t exponent = u & 0x7F800000u;
  if (exponent == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);  // zero, denormal: signed zero
  if (exponent == 0x7F800000u) {
    if (u & 0x007FFFFFu) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet
    return static_cast<uint16_t>(u >> 16);                                   // infinity
  }
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Stochastic rounding (weights and second moments in the Adam step): rounds up with
// probability equal to the distance to the lower neighbour in units of the bf16 spacing, so
// updates smaller than half that spacing still move a weight in expectation instead of being
// lost, and v = beta2 v + ... still decays. `noise` supplies the 16 random bits (its low half);
// special values as float_to_bf16.
inline uint16_t float_to_bf16_stochastic(float f, uint32_t noise) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t exponent = u & 0x7F800000u;
  if (exponent == 0 || exponent == 0x7F800000u) return float_to_bf16(f);
  return static_cast<uint16_t>((u + (noise & 0xFFFFu)) >> 16);
}

// The noise: the murmur3 finaliser of a counter, keyed by (step, layer, row) through
// bf16_row_key and by the column inside a row (key + 2 i for the weight, key + 2 i + 1 for
// the second moment). Counter-based, so the result depends neither on the number of threads
// nor on the kernel set.
inline uint32_t bf16_mix(uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}

inline uint32_t bf16_row_key(int64_t step, int layer, int64_t row) noexcept {
  return bf16_mix(static_cast<uint32_t>(step) * 0x9E3779B1u + static_cast<uint32_t>(layer) * 0x632BE5ABu) +
         static_cast<uint32_t>(row) * 0xC2B2AE3Du;
}

}  // namespace slide
