// The multi-row dot kernels of exact scoring: two rows at a time give the bits of one row at a
// time on every kernel set this CPU runs, and AVX-512's interleaved pairs the bits of the plain
// vectors.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "slide/cpu.hpp"
#include "slide/random.hpp"
#include "slide/simd.hpp"
#include "kernel_sets.hpp"

using namespace slide;

namespace {

std::vector<float> normal_vec(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal();
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("dot_multi2 gives each row the bits dot_multi gives it, whatever the vector count") {
  for (const auto& set : runnable_kernel_sets()) {
    const char* isa = set.first;
    const Kernels& kr = *set.second;
    for (int64_t n : {1, 8, 13, 64, 1024}) {      // 13: no 8-lane path; the rest: the vector path
      const int64_t ldh = n + 3;                   // rows of H apart by more than their length
      for (int64_t ns : {1, 3, 4, 7, 16, 64}) {    // whole groups of four and remainders
        const std::vector<float> w0 = normal_vec(n, 1), w1 = normal_vec(n, 2), H = normal_vec(ns * ldh, 3);
        std::vector<float> a0(ns), a1(ns), b0(ns, -1.0f), b1(ns, -1.0f);
        kr.dot_multi(w0.data(), H.data(), ldh, ns, n, a0.data());
        kr.dot_multi(w1.data(), H.data(), ldh, ns, n, a1.data());
        kr.dot_multi2(w0.data(), w1.data(), H.data(), ldh, ns, n, b0.data(), b1.data());
        INFO(std::string(isa) << " n=" << n << " ns=" << ns);
        for (int64_t s = 0; s < ns; ++s) {
          CHECK(same_bits(a0[s], b0[s]));
          CHECK(same_bits(a1[s], b1[s]));
        }
        // and the scores are the dot products (float32 sums of normal products)
        double ref = 0.0;
        for (int64_t i = 0; i < n; ++i) ref += static_cast<double>(w1[i]) * H[(ns - 1) * ldh + i];
        CHECK(b1[ns - 1] == doctest::Approx(ref).epsilon(1e-4).scale(1.0));
      }
    }
  }
}

TEST_CASE("dot_multi2_pairs on interleaved vectors gives the bits dot_multi2 gives on the plain ones") {
  const Kernels& kr = kernels_for(cpu_features());
  if (kr.dot_multi2_pairs == nullptr) return;  // no AVX-512 here: the plain kernels run instead
  for (int64_t n : {8, 64, 1024}) {
    const int64_t ldh = n + 16;
    for (int64_t ns : {4, 8, 12, 20, 64}) {   // steps of eight vectors, of four, and both
      const std::vector<float> w0 = normal_vec(n, 4), w1 = normal_vec(n, 5), H = normal_vec(ns * ldh, 6);
      std::vector<float> H2(ns * n), a0(ns), a1(ns), b0(ns, -1.0f), b1(ns, -1.0f);
      interleave_pairs(H.data(), ldh, ns / 2, n, H2.data());
      kr.dot_multi2(w0.data(), w1.data(), H.data(), ldh, ns, n, a0.data(), a1.data());
      kr.dot_multi2_pairs(w0.data(), w1.data(), H2.data(), ns, n, b0.data(), b1.data());
      INFO("n=" << n << " ns=" << ns);
      for (int64_t s = 0; s < ns; ++s) {
        CHECK(same_bits(a0[s], b0[s]));
        CHECK(same_bits(a1[s], b1[s]));
      }
    }
  }
}
