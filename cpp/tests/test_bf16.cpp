// bf16 storage: the rounding rule, and the AVX512_BF16 kernels against the exact fallback.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "slide/bf16.hpp"
#include "slide/cpu.hpp"
#include "slide/optimizer.hpp"
#include "slide/random.hpp"
#include "slide/simd.hpp"

using namespace slide;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

std::vector<uint16_t> to16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = float_to_bf16(v[i]);
  return o;
}

// The kernel sets to compare with the generic one: the running CPU's, when it has AVX512_BF16.
bool have_bf16_instructions() { return cpu_features().avx512f && cpu_features().avx512bf16; }

AdamStep step(int t) {
  AdamParams p;
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.eps = 1e-8f;
  p.weight_decay = 0.01f;
  return make_adam_step(p, 0.003f, t, true);
}

}  // namespace

TEST_CASE("float_to_bf16 rounds to nearest even and keeps the special values") {
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  // halfway between 1 and the next bf16 (1 + 2^-7): ties to even (down to 1)
  CHECK(float_to_bf16(from_bits(0x3F808000u)) == 0x3F80);
  // halfway above an odd mantissa: ties to even (up)
  CHECK(float_to_bf16(from_bits(0x3F818000u)) == 0x3F82);
  CHECK(float_to_bf16(from_bits(0x3F808001u)) == 0x3F81);  // above halfway: up
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  CHECK(float_to_bf16(from_bits(0x00000001u)) == 0x0000);  // denormals: signed zero
  CHECK(float_to_bf16(from_bits(0x80400000u)) == 0x8000);
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds past the largest bf16
  const uint16_t nan = float_to_bf16(from_bits(0x7F800001u));        // signalling NaN: quiet NaN
  CHECK((nan & 0x7F80) == 0x7F80);
  CHECK((nan & 0x0040) != 0);
  for (float x : {3.14159f, -2.5e-3f, 1e30f, -7.0e-20f}) {
    const float back = bf16_to_float(float_to_bf16(x));
    CHECK(std::fabs(back - x) <= std::fabs(x) * (1.0f / 256.0f));
    CHECK((bits(back) & 0xFFFFu) == 0u);
  }
}

// The fallback sets this CPU can run, to compare with `reference`.
std::vector<const Kernels*> fallbacks() {
  std::vector<const Kernels*> out{&kernels_for(CpuFeatures{})};
  if (cpu_features().avx2 && cpu_features().fma) out.push_back(&kernels_for(cap_features(cpu_features(), "avx2", true)));
  return out;
}

TEST_CASE("the conversions of every fallback store exactly what the scalar rule stores") {
  std::vector<float> x = random_vec(1000, 9, 10.0f);
  x[3] = from_bits(0x00000123u);
  x[4] = from_bits(0xFF800001u);
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = from_bits(0x3F818000u);
  for (const Kernels* k : fallbacks()) {
    INFO(k->bf16_isa);
    for (int64_t n : {0, 5, 8, 17, 1000}) {
      std::vector<uint16_t> a(n);
      k->to_bf16(x.data(), a.data(), n);
      for (int64_t i = 0; i < n; ++i) CHECK(a[i] == float_to_bf16(x[i]));
      std::vector<float> back(n);
      k->from_bf16(a.data(), back.data(), n);
      for (int64_t i = 0; i < n; ++i) CHECK(bits(back[i]) == bits(bf16_to_float(a[i])));
    }
  }
}

TEST_CASE("the AVX512_BF16 conversions store exactly what the fallback stores") {
  if (!have_bf16_instructions()) return;
  const Kernels& fast = kernels_for(cpu_features());
  const Kernels& exact = kernels_for(cap_features(cpu_features(), "avx512f", true));
  REQUIRE(std::string(fast.bf16_isa) == "avx512_bf16");
  REQUIRE(std::string(exact.bf16_isa) != "avx512_bf16");
  // Random values across the exponent range, ties, denormals, zeros, infinities and NaNs.
  Rng rng(7);
  std::vector<float> x(4099);
  for (size_t i = 0; i < x.size(); ++i) x[i] = from_bits(static_cast<uint32_t>(rng.next()));
  for (size_t i = 0; i < 64; ++i) x[i * 13] = from_bits((static_cast<uint32_t>(rng.next()) & 0xFFFF0000u) | 0x8000u);
  x[5] = 0.0f;
  x[6] = -0.0f;
  x[7] = std::numeric_limits<float>::infinity();
  x[8] = from_bits(0x00000123u);
  x[9] = from_bits(0xFF800001u);
  for (int64_t n : {0, 1, 15, 16, 31, 32, 33, 4099}) {
    std::vector<uint16_t> a(n), b(n);
    fast.to_bf16(x.data(), a.data(), n);
    exact.to_bf16(x.data(), b.data(), n);
    INFO("n=" << n);
    CHECK(a == b);
    std::vector<float> wa(n), wb(n);
    fast.from_bf16(a.data(), wa.data(), n);
    exact.from_bf16(a.data(), wb.data(), n);
    CHECK(std::memcmp(wa.data(), wb.data(), sizeof(float) * n) == 0);
  }
}

TEST_CASE("bf16 dot, axpy and Adam: AVX512_BF16 and the fallbacks agree") {
  if (!have_bf16_instructions()) return;
  const Kernels& fast = kernels_for(cpu_features());
  for (const Kernels* ex : fallbacks()) {
  const Kernels& exact = *ex;
  const bool same_ops = std::string(exact.bf16_isa) == "avx2";  // Adam: the same operations as AVX512_BF16
  INFO(exact.bf16_isa);
  for (int64_t n : {1, 7, 16, 31, 32, 64, 100, 128, 131, 1024}) {
    INFO("n=" << n);
    const std::vector<uint16_t> w = to16(random_vec(n, 1, 0.05f)), h = to16(random_vec(n, 2));
    // dot: the same exact products summed in another order
    double ref = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(bf16_to_float(w[i])) * bf16_to_float(h[i]);
      mag += std::fabs(static_cast<double>(bf16_to_float(w[i])) * bf16_to_float(h[i]));
    }
    const double tol = 4e-7 * mag + 1e-30;
    CHECK(std::fabs(fast.dot_bf16(w.data(), h.data(), n) - ref) <= tol);
    CHECK(std::fabs(exact.dot_bf16(w.data(), h.data(), n) - ref) <= tol);
    // axpy: float32 arithmetic on exactly widened values (one rounding per element either way)
    std::vector<float> y1 = random_vec(n, 3), y2 = y1;
    fast.axpy_bf16(0.37f, w.data(), y1.data(), n);
    exact.axpy_bf16(0.37f, w.data(), y2.data(), n);
    for (int64_t i = 0; i < n; ++i) CHECK(y1[i] == doctest::Approx(y2[i]).epsilon(1e-6).scale(1e-6));
    // Adam: the stored bf16 values agree to one unit in the last place (fused multiply-adds
    // against separate roundings can move a value across a rounding boundary)
    for (int t : {1, 10}) {
      std::vector<uint16_t> w1 = to16(random_vec(n, 4, 0.05f)), m1 = to16(random_vec(n, 5, 0.01f));
      std::vector<float> vv = random_vec(n, 6, 0.01f);
      for (float& v : vv) v *= v;
      std::vector<uint16_t> v1 = to16(vv);
      std::vector<float> g1 = random_vec(n, 7, 0.1f);
      std::vector<uint16_t> w2 = w1, m2 = m1, v2 = v1;
      std::vector<float> g2 = g1;
      const uint32_t key = bf16_row_key(t, 1, 42);
      fast.adam_bf16(w1.data(), m1.data(), v1.data(), g1.data(), n, step(t), key);
      exact.adam_bf16(w2.data(), m2.data(), v2.data(), g2.data(), n, step(t), key);
      int differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (auto pair : {std::make_pair(w1[i], w2[i]), std::make_pair(m1[i], m2[i]), std::make_pair(v1[i], v2[i])}) {
          const int d = static_cast<int>(pair.first) - static_cast<int>(pair.second);
          CHECK(std::abs(d) <= (same_ops ? 0 : 1));
          differ += d != 0;
        }
        CHECK(g1[i] == 0.0f);
        CHECK(g2[i] == 0.0f);
      }
      CHECK(differ <= std::max<int64_t>(2, 3 * n / 50));
    }
  }
  }
}

TEST_CASE("stochastic rounding is unbiased and keeps the special values") {
  // 1 + 2^-9 lies a quarter of the way from 1 to the next bf16, 1 + 2^-7: rounded up a quarter
  // of the time, so the mean of the stored values is the value.
  const float x = 1.0f + 1.0f / 512.0f;
  double sum = 0.0;
  int up = 0;
  const int trials = 200000;
  for (int i = 0; i < trials; ++i) {
    const uint16_t b = float_to_bf16_stochastic(x, bf16_mix(static_cast<uint32_t>(i)));
    CHECK((b == 0x3F80 || b == 0x3F81));
    up += b == 0x3F81;
    sum += bf16_to_float(b);
  }
  CHECK(std::fabs(up / static_cast<double>(trials) - 0.25) < 0.01);
  CHECK(std::fabs(sum / trials - x) < 1e-4 * x);
  CHECK(float_to_bf16_stochastic(1.0f, 0xFFFFFFFFu) == 0x3F80);  // exact values stay
  CHECK(float_to_bf16_stochastic(from_bits(0x00000123u), 0xFFFFu) == 0x0000);
  CHECK(float_to_bf16_stochastic(std::numeric_limits<float>::infinity(), 0xFFFFu) == 0x7F80);
}

TEST_CASE("the bf16 Adam step is the float32 step rounded") {
  // Against the float32 reference on the widened values: each stored value is that result
  // rounded to a bf16 neighbour (m to the nearest, w and v stochastically: either neighbour).
  const Kernels& kr = kernels();
  const int64_t n = 128;
  std::vector<uint16_t> w = to16(random_vec(n, 11, 0.05f)), m = to16(random_vec(n, 12, 0.01f));
  std::vector<float> vv = random_vec(n, 13, 0.01f);
  for (float& v : vv) v *= v;
  std::vector<uint16_t> v = to16(vv);
  std::vector<float> g = random_vec(n, 14, 0.1f);
  std::vector<float> wf(n), mf(n), vf(n), gf = g;
  for (int64_t i = 0; i < n; ++i) {
    wf[i] = bf16_to_float(w[i]);
    mf[i] = bf16_to_float(m[i]);
    vf[i] = bf16_to_float(v[i]);
  }
  kr.adam_bf16(w.data(), m.data(), v.data(), g.data(), n, step(3), bf16_row_key(3, 0, 7));
  adam_row_reference(wf.data(), mf.data(), vf.data(), gf.data(), n, step(3));
  for (int64_t i = 0; i < n; ++i) {
    CHECK(std::abs(static_cast<int>(w[i]) - static_cast<int>(float_to_bf16(wf[i]))) <= 1);
    CHECK(std::abs(static_cast<int>(m[i]) - static_cast<int>(float_to_bf16(mf[i]))) <= 1);
    CHECK(std::abs(static_cast<int>(v[i]) - static_cast<int>(float_to_bf16(vf[i]))) <= 1);
  }
}
