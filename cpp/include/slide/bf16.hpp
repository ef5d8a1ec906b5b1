// bfloat16 storage: the upper 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits).
//
// A layer with `precision: bf16` keeps its weights and Adam moments in this format (half the
// bytes of float32) and computes in float32: values are widened exactly on load and rounded
// to nearest, ties to even, on store. The rounding is bit for bit that of the AVX512_BF16
// conversion instructions (VCVTNEPS2BF16), so the kernels with and without them store the
// same values: zero and denormal inputs give a zero of the same sign, NaNs stay (quiet) NaNs,
// infinities stay infinite, and finite values that round past the largest bf16 become infinite.
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

}  // namespace slide
