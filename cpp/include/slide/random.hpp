// Seeded, counter-friendly random numbers for the engine. No global state:
// each network owns its seed and derives independent streams from it, so runs
// with one thread and a fixed seed are bit-identical, and resuming from a
// checkpoint (which stores the step counter) continues the same streams.
#pragma once

#include <cstdint>

namespace slide {

// SplitMix64 finaliser: a strong 64-bit mixer, used to derive stream seeds.
inline uint64_t mix64(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Seed for the stream identified by (seed, a, b, c): e.g. (network seed, step, sample).
inline uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) noexcept {
  return mix64(mix64(mix64(mix64(seed) ^ a) ^ b) ^ c);
}

// xoshiro256** (Blackman & Vigna, 2018): small, fast, good statistical quality.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) noexcept { reseed(seed); }
  void reseed(uint64_t seed) noexcept {
    uint64_t z = seed;
    for (auto& s : s_) { z = mix64(z); s = z; }
  }
  uint64_t next() noexcept {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0]; s_[3] ^= s_[1]; s_[1] ^= s_[2]; s_[0] ^= s_[3];
    s_[2] ^= t; s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform integer in [0, n) (Lemire's multiply-shift; bias negligible for n << 2^64).
  uint64_t below(uint64_t n) noexcept {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
  // Uniform float in [0, 1).
  float uniform() noexcept { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  // Standard normal (Box-Muller; one value per call, simplicity over speed: used at init only).
  float normal() noexcept;

 private:
  static uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

inline float Rng::normal() noexcept {
  // 1 - u keeps the logarithm's argument in (0, 1].
  float u1 = 1.0f - uniform();
  float u2 = uniform();
  return __builtin_sqrtf(-2.0f * __builtin_logf(u1)) * __builtin_cosf(6.2831853071795864f * u2);
}

}  // namespace slide
