// The label term's pools on a wide output layer: see slide/label_pools.hpp.
#include "slide/label_pools.hpp"

#include <omp.h>

#include <algorithm>
#include <string>

#include "slide/common.hpp"

namespace slide {

namespace {

// A thread's sums over the labels, all zero (and unmarked) between rows: the labels a row touched
// are listed and reset after it. A row that failed part way (an allocation) leaves it dirty, and
// the next row clears all of it.
struct Scratch {
  std::vector<float> sum;
  std::vector<uint8_t> seen;
  std::vector<int32_t> touched;
  bool dirty = false;
  void fit(int64_t num_labels) {
    if (static_cast<int64_t>(sum.size()) < num_labels) {
      sum.assign(static_cast<size_t>(num_labels), 0.0f);
      seen.assign(static_cast<size_t>(num_labels), 0);
      dirty = false;
    }
    if (dirty) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      std::fill(seen.begin(), seen.end(), 0);
      dirty = false;
    }
  }
};

Scratch& thread_scratch() {
  static thread_local Scratch s;  // OpenMP's threads persist: the scratch is allocated once
  return s;
}

}  // namespace

LabelPools label_pools(const CsrView& q, const CsrView& ct, int64_t num_labels, const int32_t* top,
                       int64_t top_width, int64_t pool, int threads) {
  if (num_labels < 0 || top_width < 0 || pool < 0) throw InvalidArgument("label_pools: negative size");
  for (int64_t i = 0; i < q.nnz; ++i)
    if (q.indices[i] < 0 || q.indices[i] >= ct.n)
      throw InvalidArgument("label_pools: feature " + std::to_string(q.indices[i]) + " is outside [0, " +
                            std::to_string(ct.n) + ")");
  for (int64_t i = 0; i < q.n * top_width; ++i)
    if (top[i] >= num_labels)
      throw InvalidArgument("label_pools: top label " + std::to_string(top[i]) + " is outside [0, " +
                            std::to_string(num_labels) + ")");
  std::vector<std::vector<int32_t>> labels(static_cast<size_t>(q.n));
  std::vector<std::vector<float>> scores(static_cast<size_t>(q.n));
  const int nt = std::max(1, std::min<int>(resolve_threads(threads), static_cast<int>(std::max<int64_t>(1, q.n))));
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    Scratch& s = thread_scratch();
#pragma omp for schedule(dynamic, 16)
    for (int64_t i = 0; i < q.n; ++i) {
      if (catcher.failed()) continue;
      catcher.run([&] {
        s.fit(num_labels);
        s.dirty = true;
        s.touched.clear();
        const SparseRow r = csr_row(q, i);
        for (int64_t a = 0; a < r.nnz; ++a) {
          const SparseRow c = csr_row(ct, r.indices[a]);
          const float v = r.values[a];
          for (int64_t b = 0; b < c.nnz; ++b) {
            const int32_t l = c.indices[b];
            // checked as read: a query touches a few of the matrix's entries
            if (l < 0 || l >= num_labels)
              throw InvalidArgument("label_pools: label " + std::to_string(l) + " is outside [0, " +
                                    std::to_string(num_labels) + ")");
            if (!s.seen[l]) {
              s.seen[l] = 1;
              s.touched.push_back(l);
            }
            s.sum[l] += v * c.values[b];
          }
        }
        // the row's scored labels (a zero sum is no score), its best `pool` of them first
        std::vector<int32_t>& out = labels[static_cast<size_t>(i)];
        out.reserve(std::min<size_t>(s.touched.size(), static_cast<size_t>(pool)) + static_cast<size_t>(top_width));
        for (int32_t l : s.touched)
          if (s.sum[l] != 0.0f) out.push_back(l);
        const auto better = [&s](int32_t x, int32_t y) {
          return s.sum[x] > s.sum[y] || (s.sum[x] == s.sum[y] && x < y);
        };
        if (static_cast<int64_t>(out.size()) > pool) {
          std::nth_element(out.begin(), out.begin() + pool, out.end(), better);
          out.resize(static_cast<size_t>(pool));
        }
        for (int64_t j = 0; j < top_width; ++j)
          if (top[i * top_width + j] >= 0) out.push_back(top[i * top_width + j]);
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        std::vector<float>& sc = scores[static_cast<size_t>(i)];
        sc.resize(out.size());
        for (size_t j = 0; j < out.size(); ++j) sc[j] = s.sum[out[j]];  // 0 for a label not touched
        for (int32_t l : s.touched) {
          s.sum[l] = 0.0f;
          s.seen[l] = 0;
        }
        s.dirty = false;
      });
    }
  }
  catcher.rethrow();
  LabelPools res;
  res.indptr.assign(static_cast<size_t>(q.n) + 1, 0);
  for (int64_t i = 0; i < q.n; ++i) res.indptr[i + 1] = res.indptr[i] + static_cast<int64_t>(labels[i].size());
  res.labels.resize(static_cast<size_t>(res.indptr[q.n]));
  res.scores.resize(res.labels.size());
  for (int64_t i = 0; i < q.n; ++i) {
    std::copy(labels[i].begin(), labels[i].end(), res.labels.begin() + res.indptr[i]);
    std::copy(scores[i].begin(), scores[i].end(), res.scores.begin() + res.indptr[i]);
  }
  return res;
}

}  // namespace slide
