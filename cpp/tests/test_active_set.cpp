// Active sets: labels forced in first, fill up to min_active, cut at max_active, no
// duplicates, neuron ranges; in-batch negatives and the sampled-softmax log-weights.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "slide/common.hpp"
#include "slide/hash.hpp"
#include "slide/layer.hpp"
#include "slide/negatives.hpp"
#include "slide/random.hpp"

using namespace slide;

namespace {

LshParams simhash(int K, int L) {
  LshParams p;
  p.family = HashFamily::SimHash;
  p.K = K;
  p.L = L;
  p.range_pow = 0;
  p.bucket_capacity = 32;
  p.policy = BucketPolicy::FIFO;
  p.bin_size = 8;
  return p;
}

SelectionParams selection(Selection mode, int min_active, int max_active) {
  SelectionParams s;
  s.mode = mode;
  s.threshold = 2;
  s.min_active = min_active;
  s.max_active = max_active;
  return s;
}

struct Fixture {
  static constexpr int kDim = 16;
  static constexpr int64_t kItems = 500;
  LshParams p = simhash(3, 6);
  std::unique_ptr<HashFunction> h = HashFunction::create(p, kDim, 4);
  LshTables tables{p, kItems};
  ActiveSetSampler sampler{kItems};
  std::vector<float> x = std::vector<float>(kDim);
  std::vector<uint32_t> buckets = std::vector<uint32_t>(6);

  Fixture() {
    Rng rng(9);
    std::vector<float> w(static_cast<size_t>(kItems * kDim));
    for (float& v : w) v = rng.normal();
    tables.build(*h, w.data(), kItems, kDim, 1, 1);
    for (float& v : x) v = rng.normal();
    h->hash_dense(x.data(), buckets.data());
  }
};

bool unique(const std::vector<int32_t>& a) { return std::set<int32_t>(a.begin(), a.end()).size() == a.size(); }

}  // namespace

TEST_CASE("forced labels come first in order, the fill reaches min_active, no duplicates") {
  Fixture f;
  const std::vector<int32_t> forced = {42, 7, 42, 499};  // a repeat is kept once
  for (Selection mode : {Selection::Vanilla, Selection::TopK, Selection::Threshold}) {
    Rng rng(3);
    std::vector<int32_t> active;
    f.sampler.select(f.tables, f.buckets.data(), forced.data(), 4, selection(mode, 120, 0), rng, active);
    REQUIRE(active.size() >= 120);
    CHECK(active[0] == 42);
    CHECK(active[1] == 7);
    CHECK(active[2] == 499);
    CHECK(unique(active));
    for (int32_t a : active) CHECK((a >= 0 && a < Fixture::kItems));
    // the fill comes last and only tops the set up to min_active
    const int64_t before_fill = static_cast<int64_t>(active.size()) - f.sampler.filled();
    CHECK(before_fill >= 3);
    if (f.sampler.filled() > 0) CHECK(active.size() == 120);
  }
}

TEST_CASE("max_active cuts the set but keeps every forced neuron") {
  Fixture f;
  std::vector<int32_t> forced;
  for (int i = 0; i < 30; ++i) forced.push_back(i * 7);
  Rng rng(5);
  std::vector<int32_t> active;
  f.sampler.select(f.tables, f.buckets.data(), forced.data(), 30, selection(Selection::Vanilla, 10, 20), rng, active);
  CHECK(active.size() == 30);  // more forced than the cap: all forced, nothing else
  f.sampler.select(f.tables, f.buckets.data(), forced.data(), 5, selection(Selection::Vanilla, 50, 60), rng, active);
  CHECK((active.size() >= 50 && active.size() <= 60));
  CHECK(std::equal(forced.begin(), forced.begin() + 5, active.begin()));
  f.sampler.select(f.tables, f.buckets.data(), nullptr, 0, selection(Selection::Vanilla, 0, 3), rng, active);
  CHECK(active.size() <= 3);
  CHECK(unique(active));
}

TEST_CASE("a neuron range keeps the selection within it and the full range is the plain call") {
  Fixture f;
  const std::vector<int32_t> forced = {260, 300};
  Rng a(8), b(8);
  std::vector<int32_t> full, plain, part;
  f.sampler.select(f.tables, f.buckets.data(), forced.data(), 2, selection(Selection::TopK, 90, 0), a, full, 0,
                   Fixture::kItems);
  f.sampler.select(f.tables, f.buckets.data(), forced.data(), 2, selection(Selection::TopK, 90, 0), b, plain);
  CHECK(full == plain);
  Rng c(8);
  f.sampler.select(f.tables, f.buckets.data(), forced.data(), 2, selection(Selection::Vanilla, 90, 0), c, part, 250,
                   400);
  CHECK((part.size() >= 90 && part.size() <= 150));
  CHECK(unique(part));
  for (int32_t n : part) CHECK((n >= 250 && n < 400));
  const std::vector<int32_t> outside = {10};
  CHECK_THROWS_AS(f.sampler.select(f.tables, f.buckets.data(), outside.data(), 1,
                                   selection(Selection::Vanilla, 5, 0), c, part, 250, 400),
                  InvalidArgument);
}

TEST_CASE("a small layer is filled completely, without duplicates") {
  LshParams p = simhash(2, 2);
  auto h = HashFunction::create(p, 4, 1);
  LshTables tables(p, 10);
  std::vector<float> w(40, 1.0f);
  tables.build(*h, w.data(), 10, 4, 1, 1);
  ActiveSetSampler sampler(10);
  std::vector<uint32_t> buckets(2);
  std::vector<float> x = {1, -1, 1, -1};
  h->hash_dense(x.data(), buckets.data());
  Rng rng(1);
  std::vector<int32_t> active;
  sampler.select(tables, buckets.data(), nullptr, 0, selection(Selection::Vanilla, 50, 0), rng, active);
  CHECK(active.size() == 10);
  CHECK(unique(active));
}

namespace {

Layer output_layer(int64_t size, int min_active, int max_active) {
  Layer L;
  LayerSpec s;
  s.size = size;
  s.activation = Activation::Softmax;
  s.sampling = Sampling::Lsh;
  s.lsh = simhash(3, 4);
  s.selection = selection(Selection::Vanilla, min_active, max_active);
  allocate_layer(L, s, 1, 8, false, 1);
  return L;
}

}  // namespace

TEST_CASE("in-batch negatives: the batch's labels, unique, capped at max_active, forced after own labels") {
  Layer wide = output_layer(1000, 10, 20);
  CHECK(uses_in_batch_negatives(wide));
  CHECK_FALSE(uses_in_batch_negatives(output_layer(40, 10, 20)));  // not > 2 x 20 wide
  // 4 samples; labels 5 and 9 repeat
  const std::vector<int64_t> indptr = {0, 2, 3, 5, 6};
  const std::vector<int32_t> labels = {5, 9, 9, 5, 700, 3};
  CsrView y;
  y.indptr = indptr.data();
  y.indices = labels.data();
  y.n = 4;
  y.nnz = 6;
  const std::vector<int64_t> rows = {0, 1, 2, 3};
  BatchNegatives neg;
  std::vector<float> freq(1000, 0.01f);
  collect_batch_negatives(wide, y, rows.data(), 4, freq, 77, neg);
  CHECK(neg.labels == std::vector<int32_t>({3, 5, 9, 700}));
  REQUIRE(neg.q.size() == 4);
  for (float q : neg.q) CHECK((q > 0.0f && q < 1.0f));

  SampleWorkspace ws;
  ws.labels = {5, 9};
  const SelectionParams sel = force_labels(wide, neg, ws);
  CHECK(ws.forced == std::vector<int32_t>({5, 9, 3, 700}));
  CHECK(ws.forced_q.size() == 2);
  CHECK(sel.min_active == 10 + 4);
  CHECK(sel.max_active == 20 + 4);

  // more distinct labels than max_active: a cap of 20
  std::vector<int64_t> ptr2 = {0};
  std::vector<int32_t> lab2;
  for (int i = 0; i < 60; ++i) {
    lab2.push_back(i * 3);
    ptr2.push_back(static_cast<int64_t>(lab2.size()));
  }
  CsrView y2;
  y2.indptr = ptr2.data();
  y2.indices = lab2.data();
  std::vector<int64_t> rows2(60);
  for (int i = 0; i < 60; ++i) rows2[i] = i;
  collect_batch_negatives(wide, y2, rows2.data(), 60, {}, 5, neg);
  CHECK(neg.labels.size() == 20);
  CHECK(std::is_sorted(neg.labels.begin(), neg.labels.end()));
  CHECK(neg.q.empty());
}

TEST_CASE("sampled-softmax log-weights: the fill stands for the unchosen neurons") {
  // 2 own labels, 1 batch label (q = 0.5), 3 hash candidates, 4 fill neurons of a 106-neuron range
  std::vector<float> z(10, 0.0f);
  add_sampling_log_weights(z.data(), 10, 2, {0.5f}, 4, 106);
  const double fill_rate = 4.0 / (106 - 6);
  for (int i = 6; i < 10; ++i) CHECK(z[i] == doctest::Approx(-std::log(fill_rate)));
  CHECK(z[0] == 0.0f);
  CHECK(z[1] == 0.0f);
  CHECK(z[2] == doctest::Approx(-std::log(0.5 + 0.5 * fill_rate)));
  for (int i = 3; i < 6; ++i) CHECK(z[i] == 0.0f);
}
