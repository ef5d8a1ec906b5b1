// Fused sparse Adam over the rows a batch touched (see slide/optimizer.hpp).
#include "slide/optimizer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine_internal.hpp"
#include "slide/bf16.hpp"
#include "slide/common.hpp"
#include "slide/layer.hpp"
#include "slide/simd.hpp"
#include "slide/workspace.hpp"

namespace slide {

AdamStep make_adam_step(const AdamParams& p, float lr, int64_t t, bool with_decay) noexcept {
  // Computed in double: for large t, 1 - beta^t must not round to 0 or 1 prematurely.
  const double c1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(t));
  const double c2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(t));
  AdamStep s;
  s.beta1 = p.beta1;
  s.beta2 = p.beta2;
  // m_hat / (sqrt(v_hat) + eps) = (sqrt(c2)/c1) m / (sqrt(v) + eps sqrt(c2))
  s.lr_t = static_cast<float>(lr * std::sqrt(c2) / c1);
  s.eps = static_cast<float>(p.eps * std::sqrt(c2));
  s.decay = with_decay ? lr * p.weight_decay : 0.0f;
  s.step = t;
  return s;
}

void adam_row_reference(float* w, float* m, float* v, float* g, int64_t n, const AdamStep& s) noexcept {
  for (int64_t i = 0; i < n; ++i) adam_scalar(w[i], m[i], v[i], g[i], s);
}

namespace {

// The arrays one fused pass writes: a layer's weights, biases and their moments.
struct AdamArrays {
  float *w, *m, *v, *bias, *bm, *bv;
  uint16_t *w16, *m16, *v16;  // bf16 layers (w, m, v are null then)
  int64_t rows, len, key_row0;
  bool row_bias;  // bias r travels with weight row r (every layer but the first)
  bool bf16;
  int layer;

  explicit AdamArrays(Layer& L)
      : w(L.weight.data()), m(L.weight_m.data()), v(L.weight_v.data()), bias(L.bias.data()),
        bm(L.bias_m.data()), bv(L.bias_v.data()), w16(L.weight16.data()), m16(L.weight16_m.data()),
        v16(L.weight16_v.data()), rows(L.rows), len(L.row_len), key_row0(L.key_row0), row_bias(!L.sparse_input), bf16(L.bf16),
        layer(L.index) {}

  // The fused step on row r from its gradient g (zeroed).
  void step_row(const Kernels& kr, int64_t r, float* g, const AdamStep& s) const {
    const int64_t off = r * len;
    if (bf16)
      kr.adam_bf16(w16 + off, m16 + off, v16 + off, g, len, s, bf16_row_key(s.step, layer, key_row0 + r));
    else
      kr.adam(w + off, m + off, v + off, g, len, s);
  }
  void prefetch(int64_t r) const {
    const int64_t off = r * len;
    if (bf16) {
      // prefetch_row counts floats: a bf16 row is len / 2 of them.
      prefetch_row(reinterpret_cast<const float*>(w16 + off), len / 2);
      prefetch_row(reinterpret_cast<const float*>(m16 + off), len / 2);
      prefetch_row(reinterpret_cast<const float*>(v16 + off), len / 2);
    } else {
      prefetch_row(w + off, len);
      prefetch_row(m + off, len);
      prefetch_row(v + off, len);
    }
  }
};

// Rows per block of the touched-row scan: each thread takes whole blocks, lists the block's
// touched rows, then updates them in ascending order with the next rows' arrays prefetched
// (touched rows are sparse in a matrix far larger than the caches).
constexpr int64_t kRowBlock = 4096;
// Rows ahead whose weights and moments are prefetched (each row is 3 x row_len floats in
// three arrays: enough lines in flight to cover the memory latency of scattered rows).
constexpr size_t kAdamPrefetch = 4;

// The one blocking routine of both passes: update(r, scratch) for every row r of `a` with
// touched(r), in parallel over blocks of rows when `parallel`.
template <class Touched, class Update>
void for_each_touched_row(const AdamArrays& a, const std::vector<std::unique_ptr<SampleWorkspace>>& scratch,
                          int num_threads, bool parallel, Touched touched, Update update) {
  const int64_t n = a.rows;
  const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
#pragma omp parallel num_threads(num_threads) if (parallel)
  {
    SampleWorkspace& ws = *scratch[omp_get_thread_num()];
    std::vector<int32_t>& todo = ws.adam_rows;
#pragma omp for schedule(dynamic, 2)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t last = std::min(n, (blk + 1) * kRowBlock);
      todo.clear();
      for (int64_t r = blk * kRowBlock; r < last; ++r)
        if (touched(r)) todo.push_back(static_cast<int32_t>(r));
      const size_t nt = todo.size();
      for (size_t q = 0; q < nt; ++q) {
        if (q + kAdamPrefetch < nt) a.prefetch(static_cast<int64_t>(todo[q + kAdamPrefetch]));
        update(static_cast<int64_t>(todo[q]), ws);
      }
    }
  }
}

}  // namespace

AdamPassStats adam_step_recorded(Layer& L, const std::vector<std::unique_ptr<SampleRecord>>& records, int64_t b,
                        const AdamStep& sw, const AdamStep& sb,
                        const std::vector<std::unique_ptr<SampleWorkspace>>& scratch,
                        std::vector<const float*>& vec_ptrs, int num_threads) {
  const Kernels& kr = kernels();
  const int li = L.index;
  // Group the batch's (row, sample, coef) entries by row: counting sort into row_end,
  // samples in batch order, so each row's gradient is summed in a fixed order.
  int32_t* end = L.row_end.data();
  int64_t entries = 0;
  AdamPassStats stats;
  for (int64_t s = 0; s < b; ++s)
    for (int32_t r : records[s]->rows[li]) ++end[r];
  for (int64_t r = 0; r < L.rows; ++r) {
    const int32_t c = end[r];
    stats.rows += c != 0;
    end[r] = static_cast<int32_t>(entries);
    entries += c;
  }
  if (entries > INT32_MAX) throw Error("batch too large: more than 2^31 gradient entries in one layer");
  L.entry_sample.resize(entries);
  L.entry_coef.resize(entries);
  int32_t* es = L.entry_sample.data();
  float* ec = L.entry_coef.data();
  for (int64_t s = 0; s < b; ++s) {
    const std::vector<int32_t>& rr = records[s]->rows[li];
    const std::vector<float>& rc = records[s]->coef[li];
    for (size_t k = 0; k < rr.size(); ++k) {
      const int32_t pos = end[rr[k]]++;
      es[pos] = static_cast<int32_t>(s);
      ec[pos] = rc[k];
    }
  }
  // Now row r's entries are [end[r-1], end[r]) (end[-1] = 0). One fused pass per touched
  // row: gradient from the records, both moments, the weights.
  std::vector<const float*>& vecs = vec_ptrs;
  vecs.resize(b);
  for (int64_t s = 0; s < b; ++s) vecs[s] = records[s]->vec[li].data();
  const AdamArrays a(L);
  const int64_t len = a.len;
  for_each_touched_row(
      a, scratch, num_threads, entries * len > kParallelWork,
      [end](int64_t r) { return (r == 0 ? 0 : end[r - 1]) != end[r]; },
      [&](int64_t r, SampleWorkspace& ws) {
        float* g = ws.grad_row.data();
        const int32_t e0 = r == 0 ? 0 : end[r - 1], e1 = end[r];
        float gb = 0.0f;
        std::fill(g, g + len, 0.0f);
        for (int32_t e = e0; e < e1; ++e) {
          kr.axpy(ec[e], vecs[es[e]], g, len);
          gb += ec[e];
        }
        a.step_row(kr, r, g, sw);
        if (a.row_bias) adam_scalar(a.bias[r], a.bm[r], a.bv[r], gb, sb);
      });
  std::memset(end, 0, sizeof(int32_t) * static_cast<size_t>(a.rows));
  if (!a.row_bias) {
    // Layer 0's bias gradient is the sum of the samples' output deltas.
    float* g = scratch[0]->grad_row.data();
    std::fill(g, g + L.out_dim, 0.0f);
    for (int64_t s = 0; s < b; ++s)
      if (!records[s]->vec[li].empty()) kr.axpy(1.0f, vecs[s], g, L.out_dim);
    for (int64_t j = 0; j < L.out_dim; ++j) adam_scalar(a.bias[j], a.bm[j], a.bv[j], g[j], sb);
  }
  stats.entries = entries;
  return stats;
}

AdamPassStats adam_step_buffered(Layer& L, const AdamStep& sw, const AdamStep& sb,
                        const std::vector<std::unique_ptr<SampleWorkspace>>& workspaces, int num_threads) {
  const Kernels& kr = kernels();
  const AdamArrays a(L);
  float* G = L.weight_grad.data();
  float* bg = L.bias_grad.data();
  const int64_t len = a.len;
  AdamPassStats stats;
  auto update = [&](int64_t r) {
    a.step_row(kr, r, G + r * len, sw);
    if (a.row_bias) adam_scalar(a.bias[r], a.bm[r], a.bv[r], bg[r], sb);
  };
  if (L.all_rows) {
    const int64_t n = a.rows;
    stats.rows = n;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n * len > kParallelWork)
    for (int64_t r = 0; r < n; ++r) update(r);
  } else {
    uint8_t* mk = L.row_touched.data();
    size_t total = 0;
    for (auto& ws : workspaces) total += ws->touched[L.index].size();
    stats.rows = static_cast<int64_t>(total);
    if (static_cast<int64_t>(total) * 16 >= a.rows) {
      // Many rows touched: scan the markers instead of the lists, so the arrays are walked
      // in ascending order (hardware prefetch) rather than at random.
      for_each_touched_row(
          a, workspaces, num_threads, static_cast<int64_t>(total) * len > kParallelWork,
          [mk](int64_t r) { return mk[r] != 0; },
          [&](int64_t r, SampleWorkspace&) {
            update(r);
            mk[r] = 0;
          });
    } else {
      std::vector<int32_t>& list = L.touched_rows;
      list.clear();
      for (auto& ws : workspaces) {
        const std::vector<int32_t>& mine = ws->touched[L.index];
        list.insert(list.end(), mine.begin(), mine.end());
      }
      const int64_t n = static_cast<int64_t>(list.size());
      const int32_t* rows = list.data();
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n * len > kParallelWork)
      for (int64_t i = 0; i < n; ++i) {
        update(rows[i]);
        mk[rows[i]] = 0;
      }
    }
    for (auto& ws : workspaces) ws->touched[L.index].clear();
  }
  if (!a.row_bias) {
    // Layer 0's biases belong to its outputs, which every sample computes.
    const int64_t n = L.out_dim;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n > kParallelWork)
    for (int64_t j = 0; j < n; ++j) adam_scalar(a.bias[j], a.bm[j], a.bv[j], bg[j], sb);
  }
  return stats;
}

void discard_buffered_gradients(Layer& L, const std::vector<std::unique_ptr<SampleWorkspace>>& workspaces) {
  if (L.records) return;  // records are rebuilt by every sample
  const int64_t len = L.row_len;
  if (L.all_rows) {
    std::memset(L.weight_grad.data(), 0, L.weight_grad.bytes());
  } else {
    for (auto& ws : workspaces) {
      for (int32_t r : ws->touched[L.index]) {
        std::memset(L.weight_grad.data() + static_cast<int64_t>(r) * len, 0, sizeof(float) * len);
        L.row_touched[r] = 0;
      }
      ws->touched[L.index].clear();
    }
  }
  std::memset(L.bias_grad.data(), 0, L.bias_grad.bytes());
}

}  // namespace slide
