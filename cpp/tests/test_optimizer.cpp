// Fused sparse Adam: every kernel set against the scalar reference, and the batch step of
// a recorded layer against a step computed by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <memory>
#include <vector>

#include "slide/cpu.hpp"
#include "slide/layer.hpp"
#include "slide/optimizer.hpp"
#include "slide/random.hpp"
#include "slide/simd.hpp"
#include "slide/workspace.hpp"
#include "kernel_sets.hpp"

using namespace slide;

namespace {

AdamParams adam_params(float weight_decay) {
  AdamParams p;
  p.beta1 = 0.9f;
  p.beta2 = 0.999f;
  p.eps = 1e-8f;
  p.weight_decay = weight_decay;
  return p;
}

std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

void check_close(const std::vector<float>& a, const std::vector<float>& b, double rel = 1e-5) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(rel).scale(1.0));
}

}  // namespace

TEST_CASE("bias correction folds into lr_t and eps") {
  const AdamStep s = make_adam_step(adam_params(0.01f), 0.1f, 1, true);
  CHECK(s.lr_t == doctest::Approx(0.1 * std::sqrt(1 - 0.999) / (1 - 0.9)));
  CHECK(s.eps == doctest::Approx(1e-8 * std::sqrt(1 - 0.999)));
  CHECK(s.decay == doctest::Approx(0.1f * 0.01f));
  CHECK(make_adam_step(adam_params(0.01f), 0.1f, 1, false).decay == 0.0f);
  // late steps: the correction tends to 1 without rounding trouble
  const AdamStep late = make_adam_step(adam_params(0.0f), 0.1f, 1000000, true);
  CHECK(late.lr_t == doctest::Approx(0.1));
}

TEST_CASE("every kernel set's fused Adam row matches the scalar reference") {
  for (const auto& set : runnable_kernel_sets()) {
    const char* isa = set.first;
    const Kernels& kr = *set.second;
    for (int64_t n : {1, 7, 8, 16, 37, 128, 131}) {
      for (int t : {1, 2, 50}) {
        const AdamStep s = make_adam_step(adam_params(0.01f), 0.003f, t, true);
        std::vector<float> w = random_vec(n, 1), m = random_vec(n, 2, 0.1f), v = random_vec(n, 3, 0.1f);
        for (float& x : v) x = x * x;
        std::vector<float> g = random_vec(n, 4);
        std::vector<float> w2 = w, m2 = m, v2 = v, g2 = g;
        kr.adam(w.data(), m.data(), v.data(), g.data(), n, s);
        adam_row_reference(w2.data(), m2.data(), v2.data(), g2.data(), n, s);
        INFO(std::string(isa) << " n=" << n << " t=" << t);
        check_close(w, w2);
        check_close(m, m2);
        check_close(v, v2);
        for (float x : g) CHECK(x == 0.0f);  // the gradient is consumed
      }
    }
  }
}

TEST_CASE("the batch step of a recorded layer updates exactly the touched rows, as by hand") {
  // Layer 1 of a network: 6 neurons of 5 inputs, recorded gradients.
  std::vector<Layer> layers(2);
  LayerSpec hidden, out;
  hidden.size = 5;
  hidden.activation = Activation::ReLU;
  hidden.sampling = Sampling::Dense;
  out = hidden;
  out.size = 6;
  out.activation = Activation::Softmax;
  allocate_layer(layers[0], hidden, 0, 10, false, 1);
  allocate_layer(layers[1], out, 1, 5, false, 1);
  init_weights(layers[1], 3, 1);
  Layer& L = layers[1];
  REQUIRE(L.records);
  for (int64_t i = 0; i < 6; ++i) L.bias[i] = 0.1f * static_cast<float>(i);
  // Two samples: sample 0 touches rows 1 and 4, sample 1 touches rows 4 and 5.
  std::vector<std::unique_ptr<SampleRecord>> records;
  records.push_back(std::make_unique<SampleRecord>(2));
  records.push_back(std::make_unique<SampleRecord>(2));
  records[0]->rows[1] = {1, 4};
  records[0]->coef[1] = {0.5f, -0.25f};
  records[0]->vec[1] = random_vec(5, 10);
  records[1]->rows[1] = {4, 5};
  records[1]->coef[1] = {0.75f, 2.0f};
  records[1]->vec[1] = random_vec(5, 11);
  std::vector<float> W(L.weight.data(), L.weight.data() + 30);
  std::vector<float> Mo(30, 0.0f), Vo(30, 0.0f), B(L.bias.data(), L.bias.data() + 6), bm(6, 0.0f), bv(6, 0.0f);
  const AdamStep sw = make_adam_step(adam_params(0.02f), 0.01f, 1, true);
  const AdamStep sb = make_adam_step(adam_params(0.02f), 0.01f, 1, false);
  // By hand: gradient of row r = sum over its entries, in sample order.
  std::vector<float> G(30, 0.0f), gb(6, 0.0f);
  for (int s = 0; s < 2; ++s)
    for (size_t k = 0; k < records[s]->rows[1].size(); ++k) {
      const int r = records[s]->rows[1][k];
      const float c = records[s]->coef[1][k];
      for (int j = 0; j < 5; ++j) G[r * 5 + j] += c * records[s]->vec[1][j];
      gb[r] += c;
    }
  for (int r : {1, 4, 5}) {
    adam_row_reference(W.data() + r * 5, Mo.data() + r * 5, Vo.data() + r * 5, G.data() + r * 5, 5, sw);
    adam_scalar(B[r], bm[r], bv[r], gb[r], sb);
  }
  std::vector<std::unique_ptr<SampleWorkspace>> scratch;
  scratch.push_back(make_workspace(layers, true, false));
  std::vector<const float*> vec_ptrs;
  const std::vector<float> before(L.weight.data(), L.weight.data() + 30);
  adam_step_recorded(L, records, 2, sw, sb, scratch, vec_ptrs, 1);
  check_close(std::vector<float>(L.weight.data(), L.weight.data() + 30), W);
  check_close(std::vector<float>(L.weight_m.data(), L.weight_m.data() + 30), Mo);
  check_close(std::vector<float>(L.weight_v.data(), L.weight_v.data() + 30), Vo);
  check_close(std::vector<float>(L.bias.data(), L.bias.data() + 6), B);
  for (int r : {0, 2, 3})
    for (int j = 0; j < 5; ++j) CHECK(L.weight[r * 5 + j] == before[r * 5 + j]);  // untouched rows keep their bits
  for (int64_t r = 0; r < 6; ++r) CHECK(L.row_end[r] == 0);  // ready for the next batch
}
