// The inference index (label_index.hpp): every row in exactly one cluster, sizes capped, probing
// every cluster finds the true maximum inner product, a few probes find it on clustered rows,
// determinism, bad arguments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "slide/bf16.hpp"
#include "slide/common.hpp"
#include "slide/label_index.hpp"
#include "slide/random.hpp"
#include "slide/simd.hpp"

using namespace slide;

namespace {

// n rows around `groups` random directions (norms and biases varied, as after training).
struct Rows {
  std::vector<float> W, bias;
  int64_t n, dim;
};
Rows clustered_rows(int64_t n, int64_t dim, int groups, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> centers(static_cast<size_t>(groups * dim));
  for (float& v : centers) v = rng.normal();
  Rows r{std::vector<float>(static_cast<size_t>(n * dim)), std::vector<float>(static_cast<size_t>(n)), n, dim};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = static_cast<int64_t>(rng.below(static_cast<uint64_t>(groups)));
    const float scale = 0.5f + 2.0f * rng.uniform();
    for (int64_t d = 0; d < dim; ++d) r.W[i * dim + d] = scale * (centers[g * dim + d] + 0.3f * rng.normal());
    r.bias[i] = rng.normal();
  }
  return r;
}

// Index of the largest w . h + b (ties: lower id) among `ids`, or over all rows.
int64_t best_row(const Rows& r, const float* h, const std::vector<int32_t>* ids = nullptr) {
  int64_t best = -1;
  float top = -INFINITY;
  const int64_t m = ids ? static_cast<int64_t>(ids->size()) : r.n;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t row = ids ? (*ids)[j] : j;
    float z = r.bias[row];
    for (int64_t d = 0; d < r.dim; ++d) z += r.W[row * r.dim + d] * h[d];
    if (z > top || (z == top && row < best)) {
      top = z;
      best = row;
    }
  }
  return best;
}

std::vector<int32_t> probed_rows(const LabelIndex& ix, const float* h, int64_t probe) {
  std::vector<float> scores(static_cast<size_t>(ix.clusters()));
  ix.cluster_scores(kernels(), h, ix.dim(), 1, scores.data());
  std::vector<int32_t> order, best(static_cast<size_t>(std::min(probe, ix.clusters())));
  ix.best_clusters(scores.data(), probe, order, best.data());
  std::vector<int32_t> ids;
  for (int32_t c : best) ids.insert(ids.end(), ix.members_begin(c), ix.members_end(c));
  return ids;
}

}  // namespace

TEST_CASE("label index: a partition of the rows with capped clusters") {
  const Rows r = clustered_rows(3000, 24, 12, 1);
  LabelIndexParams p;
  p.clusters = 60;
  const LabelIndex ix(r.W.data(), nullptr, r.bias.data(), r.n, r.dim, p, 2, 7);
  CHECK(ix.clusters() >= 60);
  std::vector<int> seen(static_cast<size_t>(r.n), 0);
  int64_t total = 0;
  for (int64_t c = 0; c < ix.clusters(); ++c) {
    CHECK(ix.cluster_size(c) >= 1);
    CHECK(ix.cluster_size(c) <= static_cast<int64_t>(std::ceil(p.capacity * 3000.0 / 60.0)));
    CHECK(std::is_sorted(ix.members_begin(c), ix.members_end(c)));
    for (const int32_t* m = ix.members_begin(c); m != ix.members_end(c); ++m) ++seen[*m];
    total += ix.cluster_size(c);
  }
  CHECK(total == r.n);
  CHECK(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
  CHECK(ix.largest_cluster() <= 50 * p.capacity);
  CHECK(ix.bytes() > 0);
  CHECK(ix.default_probe() == std::min<int64_t>(ix.clusters(), std::max<int64_t>(kDefaultProbe, (1024 * ix.clusters() + 2999) / 3000)));
}

TEST_CASE("label index: probing every cluster is exact, a few probes find most maxima") {
  const Rows r = clustered_rows(4000, 32, 20, 2);
  const LabelIndex ix(r.W.data(), nullptr, r.bias.data(), r.n, r.dim, LabelIndexParams(), 2, 3);
  Rng rng(9);
  int found = 0;
  const int queries = 200;
  for (int q = 0; q < queries; ++q) {
    std::vector<float> h(static_cast<size_t>(r.dim));
    for (float& v : h) v = std::max(0.0f, rng.normal());  // ReLU outputs
    const int64_t truth = best_row(r, h.data());
    const std::vector<int32_t> all = probed_rows(ix, h.data(), ix.clusters());
    CHECK(static_cast<int64_t>(all.size()) == r.n);
    CHECK(best_row(r, h.data(), &all) == truth);
    const std::vector<int32_t> few = probed_rows(ix, h.data(), 8);  // 8 of ~316 clusters
    CHECK(few.size() < all.size() / 10);
    found += best_row(r, h.data(), &few) == truth;
  }
  CHECK(found >= queries * 9 / 10);
}

TEST_CASE("label index: deterministic for a seed and thread count; bf16 rows") {
  const Rows r = clustered_rows(1500, 16, 8, 4);
  LabelIndexParams p;
  p.clusters = 40;
  const LabelIndex a(r.W.data(), nullptr, r.bias.data(), r.n, r.dim, p, 2, 5);
  const LabelIndex b(r.W.data(), nullptr, r.bias.data(), r.n, r.dim, p, 2, 5);
  REQUIRE(a.clusters() == b.clusters());
  for (int64_t c = 0; c < a.clusters(); ++c)
    CHECK(std::equal(a.members_begin(c), a.members_end(c), b.members_begin(c), b.members_end(c)));
  std::vector<uint16_t> w16(r.W.size());
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = float_to_bf16(r.W[i]);
  const LabelIndex h(nullptr, w16.data(), r.bias.data(), r.n, r.dim, p, 1, 5);
  int64_t total = 0;
  for (int64_t c = 0; c < h.clusters(); ++c) total += h.cluster_size(c);
  CHECK(total == r.n);
}

TEST_CASE("label index: bad arguments") {
  const Rows r = clustered_rows(50, 4, 2, 6);
  LabelIndexParams p;
  CHECK_THROWS_AS(LabelIndex(r.W.data(), nullptr, r.bias.data(), 0, 4, p, 1, 0), InvalidArgument);
  CHECK_THROWS_AS(LabelIndex(r.W.data(), nullptr, r.bias.data(), 50, 0, p, 1, 0), InvalidArgument);
  CHECK_THROWS_AS(LabelIndex(nullptr, nullptr, r.bias.data(), 50, 4, p, 1, 0), InvalidArgument);
  CHECK_THROWS_AS(LabelIndex(r.W.data(), nullptr, r.bias.data(), 50, 4, p, 0, 0), InvalidArgument);
  p.capacity = 0.5;
  CHECK_THROWS_WITH_AS(LabelIndex(r.W.data(), nullptr, r.bias.data(), 50, 4, p, 1, 0), doctest::Contains("capacity"),
                       InvalidArgument);
  p = LabelIndexParams();
  p.clusters = -1;
  CHECK_THROWS_WITH_AS(LabelIndex(r.W.data(), nullptr, r.bias.data(), 50, 4, p, 1, 0), doctest::Contains("clusters"),
                       InvalidArgument);
  // More clusters than rows: one row each at most.
  p.clusters = 500;
  const LabelIndex ix(r.W.data(), nullptr, r.bias.data(), 50, 4, p, 1, 0);
  CHECK(ix.clusters() <= 50);
  CHECK(auto_index_clusters(670091) == 4093);
  CHECK(auto_index_clusters(1) == 1);
}
