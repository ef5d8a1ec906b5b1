// The inference index of label_index.hpp: k-means over the bias-augmented output rows,
// capped cluster sizes, cluster means for probing.
#include "slide/label_index.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "engine_internal.hpp"
#include "slide/common.hpp"
#include "slide/random.hpp"

namespace slide {

namespace {

constexpr int64_t kBlockRows = 256;  // rows scored against all centroids at once

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Augmented rows [w_j, b_j, 0...] (ld floats each) of rows ids[0..m) into dst.
void load_rows(const float* W, const uint16_t* W16, const float* bias, int64_t dim, const int32_t* ids, int64_t m,
               float* dst, int64_t ld, const Kernels& kr) {
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = ids[i];
    float* d = dst + i * ld;
    if (W)
      std::copy(W + r * dim, W + (r + 1) * dim, d);
    else
      kr.from_bf16(W16 + r * dim, d, dim);
    d[dim] = bias[r];
    std::fill(d + dim + 1, d + ld, 0.0f);
  }
}

// For each of the m rows in A (ld floats), the nearest centroid in squared Euclidean distance
// (largest 2 a.c - |c|^2; ties to the lower id).
void nearest(const Kernels& kr, const float* A, int64_t m, const float* cent, const float* cent_sq, int64_t C,
             int64_t ld, float* scratch, int32_t* out) {
  kr.matmul_bt(A, ld, cent, ld, scratch, C, m, C, ld);
  for (int64_t i = 0; i < m; ++i) {
    const float* s = scratch + i * C;
    float best = -std::numeric_limits<float>::infinity();
    int32_t arg = 0;
    for (int64_t c = 0; c < C; ++c) {
      const float v = 2.0f * s[c] - cent_sq[c];
      if (v > best) {
        best = v;
        arg = static_cast<int32_t>(c);
      }
    }
    out[i] = arg;
  }
}

}  // namespace

int64_t auto_index_clusters(int64_t rows) noexcept {
  if (rows < 1) return 1;
  const int64_t c = static_cast<int64_t>(std::llround(5.0 * std::sqrt(static_cast<double>(rows))));
  return std::max<int64_t>(1, std::min(rows, c));
}

LabelIndex::LabelIndex(const float* W, const uint16_t* W16, const float* bias, int64_t n, int64_t dim,
                       const LabelIndexParams& params, int num_threads, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  if (n < 1 || n > INT32_MAX) throw InvalidArgument("index: rows must be in [1, 2^31), got " + std::to_string(n));
  if (dim < 1) throw InvalidArgument("index: dim must be >= 1, got " + std::to_string(dim));
  if (!W && !W16) throw InvalidArgument("index: no weights");
  if (!bias) throw InvalidArgument("index: no biases");
  if (params.clusters < 0)
    throw InvalidArgument("index: clusters must be >= 0 (0 = auto), got " + std::to_string(params.clusters));
  if (params.iterations < 0)
    throw InvalidArgument("index: iterations must be >= 0, got " + std::to_string(params.iterations));
  if (params.sample < 0)
    throw InvalidArgument("index: sample must be >= 0 (0 = auto), got " + std::to_string(params.sample));
  if (!(params.capacity >= 1.0) || !std::isfinite(params.capacity))
    throw InvalidArgument("index: capacity must be a finite number >= 1, got " + std::to_string(params.capacity));
  if (num_threads < 1) throw InvalidArgument("index: num_threads must be >= 1, got " + std::to_string(num_threads));
  rows_ = n;
  dim_ = dim;
  const Kernels& kr = kernels();
  const int64_t C = std::min(n, params.clusters > 0 ? params.clusters : auto_index_clusters(n));
  const int64_t S = std::min(n, std::max(C, params.sample > 0 ? params.sample : 32 * C));
  const int64_t ld = round_up(dim + 1, 16);

  // A seeded permutation of the rows: its first S entries are the k-means sample (and the
  // first C of those the initial centroids); the whole of it is the order in which rows
  // claim room in the capped assignment, so that no range of label ids is favoured.
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng(stream_seed(seed, 0x494E4458ull));
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i + 1))]);

  std::vector<float> sample(static_cast<size_t>(S * ld));
  load_rows(W, W16, bias, dim, order.data(), S, sample.data(), ld, kr);
  std::vector<float> cent(sample.begin(), sample.begin() + C * ld), cent_sq(static_cast<size_t>(C));
  auto norms = [&] {
    for (int64_t c = 0; c < C; ++c) cent_sq[c] = kr.dot(cent.data() + c * ld, cent.data() + c * ld, ld);
  };
  const int64_t blocks_s = (S + kBlockRows - 1) / kBlockRows;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, blocks_s)));
  std::vector<int32_t> assign(static_cast<size_t>(S));
  InterruptPoller poller;
  ExceptionCatcher catcher;
  for (int it = 0; it < params.iterations && C > 1; ++it) {
    norms();
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      std::vector<float> scratch;
      catcher.run([&] { scratch.resize(static_cast<size_t>(kBlockRows * C)); });
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < blocks_s; ++b) {
        if (catcher.failed() || poller.should_stop()) continue;
        const int64_t r0 = b * kBlockRows, m = std::min(kBlockRows, S - r0);
        catcher.run([&] {
          nearest(kr, sample.data() + r0 * ld, m, cent.data(), cent_sq.data(), C, ld, scratch.data(), assign.data() + r0);
        });
      }
    }
    catcher.rethrow();
    if (poller.stopped()) throw Interrupted();
    // New centroids: means of their sample rows, summed in sample order (the same result
    // for any thread count); an empty cluster restarts at a sample row drawn from the seed.
    std::vector<double> sum(static_cast<size_t>(C * ld), 0.0);
    std::vector<int64_t> count(static_cast<size_t>(C), 0);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t c = assign[i];
      const float* a = sample.data() + i * ld;
      double* s = sum.data() + c * ld;
      for (int64_t d = 0; d <= dim; ++d) s[d] += a[d];
      ++count[c];
    }
    for (int64_t c = 0; c < C; ++c) {
      float* ce = cent.data() + c * ld;
      if (count[c] == 0) {
        const float* a = sample.data() + static_cast<int64_t>(rng.below(static_cast<uint64_t>(S))) * ld;
        std::copy(a, a + ld, ce);
      } else {
        for (int64_t d = 0; d <= dim; ++d) ce[d] = static_cast<float>(sum[c * ld + d] / static_cast<double>(count[c]));
      }
    }
  }
  norms();

  // Every row joins its nearest centroid. Clusters over the cap (frequent-label and
  // untrained rows crowd a few centroids) are split by k-means over their own members into
  // clusters of about the mean size, which keeps neighbours together (a cap that pushed rows
  // into other clusters would put them where no query of theirs looks); what still exceeds
  // the cap (identical rows) is cut into consecutive pieces.
  std::vector<int32_t> cluster_of(static_cast<size_t>(n));
  const int64_t blocks_n = (n + kBlockRows - 1) / kBlockRows;
  const int ntn = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, blocks_n)));
#pragma omp parallel num_threads(ntn) if (ntn > 1)
  {
    std::vector<float> scratch, A;
    std::vector<int32_t> ids;
    catcher.run([&] {
      scratch.resize(static_cast<size_t>(kBlockRows * C));
      A.resize(static_cast<size_t>(kBlockRows * ld));
      ids.resize(static_cast<size_t>(kBlockRows));
    });
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks_n; ++b) {
      if (catcher.failed() || poller.should_stop()) continue;
      const int64_t r0 = b * kBlockRows, m = std::min(kBlockRows, n - r0);
      catcher.run([&] {
        std::iota(ids.begin(), ids.begin() + m, static_cast<int32_t>(r0));
        load_rows(W, W16, bias, dim, ids.data(), m, A.data(), ld, kr);
        nearest(kr, A.data(), m, cent.data(), cent_sq.data(), C, ld, scratch.data(), cluster_of.data() + r0);
      });
    }
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
  std::vector<std::vector<int32_t>> groups(static_cast<size_t>(C));
  for (int64_t r = 0; r < n; ++r) groups[cluster_of[r]].push_back(static_cast<int32_t>(r));
  const double mean_size = static_cast<double>(n) / static_cast<double>(C);
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(params.capacity * mean_size)));
  std::vector<int64_t> big;
  for (int64_t c = 0; c < C; ++c)
    if (static_cast<int64_t>(groups[c].size()) > cap) big.push_back(c);
  std::vector<std::vector<std::vector<int32_t>>> parts(big.size());
  const int ntb = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, static_cast<int64_t>(big.size()))));
#pragma omp parallel for num_threads(ntb) schedule(dynamic, 1) if (ntb > 1)
  for (int64_t q = 0; q < static_cast<int64_t>(big.size()); ++q) {
    if (catcher.failed() || poller.should_stop()) continue;
    catcher.run([&] {
      const std::vector<int32_t>& g = groups[big[q]];
      const int64_t m = static_cast<int64_t>(g.size());
      const int64_t k = std::min<int64_t>(m, static_cast<int64_t>(std::ceil(static_cast<double>(m) / mean_size)));
      std::vector<float> A(static_cast<size_t>(m * ld)), sub(static_cast<size_t>(k * ld)), sub_sq(static_cast<size_t>(k));
      std::vector<float> scratch(static_cast<size_t>(kBlockRows * k));
      std::vector<int32_t> a(static_cast<size_t>(m));
      load_rows(W, W16, bias, dim, g.data(), m, A.data(), ld, kr);
      Rng sr(stream_seed(seed, 0x53504C54ull, static_cast<uint64_t>(big[q])));
      for (int64_t j = 0; j < k; ++j) {  // k distinct members, spread over the cluster
        const int64_t pick = j * m / k + static_cast<int64_t>(sr.below(static_cast<uint64_t>(std::max<int64_t>(1, m / k))));
        std::copy(A.begin() + std::min(pick, m - 1) * ld, A.begin() + (std::min(pick, m - 1) + 1) * ld,
                  sub.begin() + j * ld);
      }
      for (int it = 0; it <= params.iterations; ++it) {
        for (int64_t j = 0; j < k; ++j) sub_sq[j] = kr.dot(sub.data() + j * ld, sub.data() + j * ld, ld);
        for (int64_t r0 = 0; r0 < m; r0 += kBlockRows)
          nearest(kr, A.data() + r0 * ld, std::min(kBlockRows, m - r0), sub.data(), sub_sq.data(), k, ld,
                  scratch.data(), a.data() + r0);
        if (it == params.iterations) break;
        std::vector<double> sum(static_cast<size_t>(k * ld), 0.0);
        std::vector<int64_t> count(static_cast<size_t>(k), 0);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t d = 0; d <= dim; ++d) sum[a[i] * ld + d] += A[i * ld + d];
          ++count[a[i]];
        }
        for (int64_t j = 0; j < k; ++j)
          if (count[j] > 0)
            for (int64_t d = 0; d <= dim; ++d) sub[j * ld + d] = static_cast<float>(sum[j * ld + d] / static_cast<double>(count[j]));
      }
      std::vector<std::vector<int32_t>> split(static_cast<size_t>(k));
      for (int64_t i = 0; i < m; ++i) split[a[i]].push_back(g[i]);
      for (auto& s : split)
        for (size_t p0 = 0; p0 < s.size(); p0 += static_cast<size_t>(cap))
          parts[q].emplace_back(s.begin() + p0, s.begin() + std::min(s.size(), p0 + static_cast<size_t>(cap)));
    });
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
  // Final clusters: the small ones in centroid order, then the pieces of the split ones.
  std::vector<std::vector<int32_t>> final_groups;
  final_groups.reserve(static_cast<size_t>(C) + big.size() * 4);
  for (int64_t c = 0, q = 0; c < C; ++c) {
    if (q < static_cast<int64_t>(big.size()) && big[q] == c) {
      for (auto& p : parts[q]) final_groups.push_back(std::move(p));
      ++q;
    } else if (!groups[c].empty()) {
      final_groups.push_back(std::move(groups[c]));
    }
  }
  groups.clear();
  const int64_t F = static_cast<int64_t>(final_groups.size());
  std::vector<int64_t> size(static_cast<size_t>(F));
  offsets_.assign(static_cast<size_t>(F + 1), 0);
  members_.clear();
  members_.reserve(static_cast<size_t>(n));
  for (int64_t c = 0; c < F; ++c) {
    size[c] = static_cast<int64_t>(final_groups[c].size());
    members_.insert(members_.end(), final_groups[c].begin(), final_groups[c].end());
    offsets_[c + 1] = offsets_[c] + size[c];
  }
  final_groups.clear();
  largest_ = *std::max_element(size.begin(), size.end());

  // What a query scores a cluster by: the mean of its members' augmented rows.
  centroids_.assign(static_cast<size_t>(F * dim), 0.0f);
  centroid_bias_.assign(static_cast<size_t>(F), 0.0f);
  radius_.assign(static_cast<size_t>(F), 0.0f);
  const int ntc = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, F)));
#pragma omp parallel num_threads(ntc) if (ntc > 1 && n * dim > (int64_t(1) << 20))
  {
    std::vector<double> s(static_cast<size_t>(dim + 1));
    std::vector<float> wide(W ? 0 : static_cast<size_t>(dim));
#pragma omp for schedule(dynamic, 16)
    for (int64_t c = 0; c < F; ++c) {
      std::fill(s.begin(), s.end(), 0.0);
      for (int64_t q = offsets_[c]; q < offsets_[c + 1]; ++q) {
        const int64_t r = members_[q];
        const float* w = W ? W + r * dim : wide.data();
        if (!W) kr.from_bf16(W16 + r * dim, wide.data(), dim);
        for (int64_t d = 0; d < dim; ++d) s[d] += w[d];
        s[dim] += bias[r];
      }
      const double inv = size[c] > 0 ? 1.0 / static_cast<double>(size[c]) : 0.0;
      for (int64_t d = 0; d < dim; ++d) centroids_[c * dim + d] = static_cast<float>(s[d] * inv);
      centroid_bias_[c] = static_cast<float>(s[dim] * inv);
      // The radius of the cluster around its mean, in the augmented space.
      double mx = 0.0;
      for (int64_t q = offsets_[c]; q < offsets_[c + 1]; ++q) {
        const int64_t r = members_[q];
        const float* w = W ? W + r * dim : wide.data();
        if (!W) kr.from_bf16(W16 + r * dim, wide.data(), dim);
        double d2 = 0.0;
        for (int64_t d = 0; d < dim; ++d) d2 += (w[d] - centroids_[c * dim + d]) * (w[d] - centroids_[c * dim + d]);
        d2 += (bias[r] - centroid_bias_[c]) * (bias[r] - centroid_bias_[c]);
        mx = std::max(mx, d2);
      }
      radius_[c] = static_cast<float>(std::sqrt(mx));
    }
  }
  // Transposed for the query: a block of queries times it is a broadcast-and-add product
  // (Kernels::matmul), several times faster than dot products against each row.
  centroids_t_.resize(static_cast<size_t>(F * dim));
  for (int64_t c = 0; c < F; ++c)
    for (int64_t d = 0; d < dim; ++d) centroids_t_[d * F + c] = centroids_[c * dim + d];
  centroids_.clear();
  centroids_.shrink_to_fit();
  build_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void LabelIndex::cluster_scores(const Kernels& kr, const float* H, int64_t ldh, int64_t ns, float* out) const {
  const int64_t C = clusters();
  kr.matmul(H, ldh, 1, centroids_t_.data(), C, out, C, ns, C, dim_);
  for (int64_t s = 0; s < ns; ++s) {
    const float qn = kRadiusWeight * std::sqrt(kr.dot(H + s * ldh, H + s * ldh, dim_) + 1.0f);
    for (int64_t c = 0; c < C; ++c) out[s * C + c] += centroid_bias_[c] + qn * radius_[c];
  }
}

void LabelIndex::best_clusters(const float* scores, int64_t probe, std::vector<int32_t>& scratch, int32_t* out) const {
  // One pass with a heap of the best `probe` so far (worst in front): the scan compares each
  // score with one threshold, and few clusters ever enter the heap.
  const int64_t C = clusters();
  probe = std::max<int64_t>(0, std::min(probe, C));
  if (probe == 0) return;
  auto better = [scores](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  scratch.clear();
  for (int64_t c = 0; c < probe; ++c) scratch.push_back(static_cast<int32_t>(c));
  std::make_heap(scratch.begin(), scratch.end(), better);
  float worst = scores[scratch.front()];
  for (int64_t c = probe; c < C; ++c) {
    if (scores[c] <= worst) continue;  // ties keep the lower id, which is in the heap already
    std::pop_heap(scratch.begin(), scratch.end(), better);
    scratch.back() = static_cast<int32_t>(c);
    std::push_heap(scratch.begin(), scratch.end(), better);
    worst = scores[scratch.front()];
  }
  std::sort_heap(scratch.begin(), scratch.end(), better);
  std::copy(scratch.begin(), scratch.end(), out);
}

int64_t LabelIndex::default_probe() const noexcept {
  const int64_t C = clusters();
  const int64_t by_rows = (kDefaultProbeRows * C + rows_ - 1) / rows_;
  return std::min(C, std::max(kDefaultProbe, by_rows));
}

size_t LabelIndex::bytes() const noexcept {
  return centroids_t_.capacity() * sizeof(float) + centroid_bias_.capacity() * sizeof(float) +
         radius_.capacity() * sizeof(float) +
         offsets_.capacity() * sizeof(int64_t) + members_.capacity() * sizeof(int32_t);
}

}  // namespace slide
