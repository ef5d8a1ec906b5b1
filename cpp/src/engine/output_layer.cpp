// Phases 2-6a of a sample's step on the output layer (see slide/sample_step.hpp).
#include <algorithm>
#include <cmath>
#include <string>

#include "engine_internal.hpp"
#include "slide/sample_step.hpp"

namespace slide {

namespace {
// Prefetches output row `row` (len values) as the layer stores it: float32 from W, or bf16.
inline void prefetch_out_row(const Layer& out, const float* W, int64_t row, int64_t len) {
  if (out.bf16)
    prefetch_row(reinterpret_cast<const float*>(out.row16(row)), len / 2);
  else
    prefetch_row(W + row * len, len);
}
}  // namespace

namespace {
bool sampled(const Layer& out, bool use_lsh) { return out.lsh() && use_lsh; }
}  // namespace

SoftmaxStats combine_softmax_stats(const SoftmaxStats& a, const SoftmaxStats& b) noexcept {
  if (a.sum == 0.0) return b;
  if (b.sum == 0.0) return a;
  const float mx = std::max(a.max, b.max);
  return SoftmaxStats{mx, a.sum * std::exp(static_cast<double>(a.max) - mx) +
                              b.sum * std::exp(static_cast<double>(b.max) - mx)};
}

void select_output(const Layer& out, SampleWorkspace& ws, const LayerInput& in, bool use_lsh,
                   const SelectionParams& sel, const int32_t* forced, int n_forced, NeuronRange range, Rng& rng) {
  const size_t l = static_cast<size_t>(out.index);
  if (!sampled(out, use_lsh)) {
    ws.active[l].clear();
    ws.filled = 0;
    return;
  }
  {
    PhaseTimer timer(ws.prof, Phase::Hashing, static_cast<double>(out.in_dim + out.hash->num_tables()) * 4.0);
    out.hash->hash_dense(in.dense, ws.buckets.data());
  }
  PhaseTimer timer(ws.prof, Phase::Selection);
  ActiveSetSampler& sampler = *ws.samplers[l];
  sampler.select(*out.tables, ws.buckets.data(), forced, n_forced, sel, rng, ws.active[l], range.begin, range.end);
  ws.filled = sampler.filled();
  // A bucket lookup and its entries, then one scattered slot line per candidate and per
  // forced or filled neuron, and the active list.
  timer.add_bytes(static_cast<double>(out.hash->num_tables()) * 64.0 + static_cast<double>(sampler.visited()) * 4.0 +
                  static_cast<double>(sampler.candidates() + n_forced + ws.filled) * 64.0 +
                  static_cast<double>(ws.active[l].size()) * 4.0);
}

void output_logits(const Layer& out, SampleWorkspace& ws, const Kernels& kr, const LayerInput& in,
                   bool use_lsh, NeuronRange range) {
  const size_t l = static_cast<size_t>(out.index);
  std::vector<float>& z = ws.out[l];
  const float* W = out.weight.data();
  const float* b = out.bias.data();
  const int64_t len = out.row_len;
  PhaseTimer timer(ws.prof, Phase::Forward);
  if (ws.prof) {
    const double rows = out.sparse_input ? static_cast<double>(in.sparse.nnz)
                        : sampled(out, use_lsh) ? static_cast<double>(ws.active[l].size())
                                                : static_cast<double>(range.size());
    const double row_elems = out.sparse_input ? static_cast<double>(range.size()) : static_cast<double>(out.row_len);
    const double elem_bytes = out.bf16 ? 2.0 : 4.0;
    timer.add_bytes(rows * (row_elems * elem_bytes + 64.0));  // each row and its bias line
  }
  if (out.sparse_input) {
    // The network's only layer: rows are features, columns the neurons of the range.
    const SparseRow& x = in.sparse;
    z.assign(b + range.begin, b + range.end);
    for (int64_t k = 0; k < x.nnz; ++k) {
      const int64_t row = static_cast<int64_t>(x.indices[k]);
      if (out.bf16)
        kr.axpy_bf16(x.values[k], out.row16(row) + range.begin, z.data(), range.size());
      else
        kr.axpy(x.values[k], W + row * len + range.begin, z.data(), range.size());
    }
    return;
  }
  // bf16 storage: the input is rounded to bf16 once, and each logit is a bf16 dot product
  // accumulated in float32 (VDPBF16PS where the CPU has it).
  const uint16_t* h16 = nullptr;
  if (out.bf16) {
    ws.input16.resize(static_cast<size_t>(len));
    kr.to_bf16(in.dense, ws.input16.data(), len);
    h16 = ws.input16.data();
  }
  auto logit = [&](int64_t n) {
    return (out.bf16 ? kr.dot_bf16(out.row16(n), h16, len) : kr.dot(W + n * len, in.dense, len)) + b[n];
  };
  if (sampled(out, use_lsh)) {
    // Active rows are scattered over a large matrix: prefetch a few neurons ahead.
    const std::vector<int32_t>& A = ws.active[l];
    const size_t na = A.size();
    z.resize(na);
    for (size_t i = 0; i < na; ++i) {
      if (i + kPrefetch < na) {
        const int64_t ahead = static_cast<int64_t>(A[i + kPrefetch]);
        prefetch_out_row(out, W, ahead, len);
        __builtin_prefetch(b + ahead, 0, 3);
      }
      z[i] = logit(A[i]);
    }
  } else {
    z.resize(static_cast<size_t>(range.size()));
    for (int64_t i = range.begin; i < range.end; ++i) z[i - range.begin] = logit(i);
  }
}

SoftmaxStats partial_softmax(SampleWorkspace& ws) {
  // Softmax in a numerically safe form: exponents relative to the maximum.
  const std::vector<float>& z = ws.out.back();
  std::vector<float>& d = ws.delta.back();
  const size_t m = z.size();
  PhaseTimer timer(ws.prof, Phase::Softmax, static_cast<double>(m) * 8.0);
  d.resize(m);
  SoftmaxStats s;
  if (m == 0) return s;
  float mx = z[0];
  for (size_t i = 1; i < m; ++i) mx = std::max(mx, z[i]);
  double sum = 0.0;
  for (size_t i = 0; i < m; ++i) {
    d[i] = std::exp(z[i] - mx);
    sum += d[i];
  }
  s.max = mx;
  s.sum = sum;
  return s;
}

namespace {
// Per-label binary cross-entropy over every neuron of `range` (a dense output layer, or an
// lsh layer scored in full): dL/dz_j = (sigmoid(z_j) - y_j) / b,
// loss = sum_j softplus(z_j) - z_j y_j, in forms that do not overflow for large |z|.
float binary_output(SampleWorkspace& ws, NeuronRange range, float inv_b) {
  const std::vector<float>& z = ws.out.back();
  std::vector<float>& d = ws.delta.back();
  const size_t m = z.size();
  d.resize(m);
  float loss = 0.0f;
  for (size_t i = 0; i < m; ++i) {
    const float e = std::exp(-std::fabs(z[i]));
    d[i] = (z[i] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e)) * inv_b;
    loss += std::max(z[i], 0.0f) + std::log1p(e);
  }
  for (const int32_t label : ws.labels) {
    if (label < range.begin || label >= range.end) continue;
    const size_t pos = static_cast<size_t>(label - range.begin);
    loss -= z[pos];
    d[pos] -= inv_b;
  }
  return loss;
}

// Per-label binary cross-entropy on the sampled neurons of a hash-sampled layer (the sample's
// labels, then the batch's other labels, hash candidates and the random fill, see
// negatives.hpp): the recipe of ASTRA (Mehta et al., "Accelerating Extreme Classification
// via Adaptive Feature Agnostic Proxies", 2024), a per-label binary loss on positives, hard
// negatives from an index over the classifier vectors (our hash tables) and uniform ones.
// Each negative weighs out.spec.negative_weight, or with 0 the neurons it stands for (the
// importance weights of add_sampling_log_weights, as multipliers instead of log-weights), so
// that the loss estimates the binary loss over all labels of the range.
float binary_output_sampled(const Layer& out, SampleWorkspace& ws, NeuronRange range, float inv_b) {
  const std::vector<float>& z = ws.out.back();
  std::vector<float>& d = ws.delta.back();
  const std::vector<int32_t>& A = ws.active[static_cast<size_t>(out.index)];
  const size_t m = z.size();
  d.resize(m);
  // The labels of the range come first in the selection, in order (select_output).
  size_t n_pos = 0;
  for (const int32_t label : ws.labels) {
    if (label < range.begin || label >= range.end) continue;
    if (n_pos >= m || A[n_pos] != label) throw Error("internal error: a true label is missing from the active set");
    ++n_pos;
  }
  const float fixed = out.spec.negative_weight;
  const size_t n_batch = std::min(ws.forced_q.size(), m - n_pos);
  const size_t n_fill = std::min(static_cast<size_t>(ws.filled), m - n_pos - n_batch);
  const int64_t chosen = static_cast<int64_t>(m - n_fill);
  double fill_rate = 1.0;
  if (n_fill > 0 && range.size() - chosen > static_cast<int64_t>(n_fill))
    fill_rate = static_cast<double>(n_fill) / static_cast<double>(range.size() - chosen);
  else if (n_fill == 0)
    fill_rate = std::min(1.0, static_cast<double>(m) / static_cast<double>(range.size()));
  const float fill_weight = static_cast<float>(1.0 / fill_rate);
  float loss = 0.0f;
  for (size_t i = 0; i < m; ++i) {
    float w = 1.0f;
    if (i >= n_pos) {
      if (fixed > 0.0f) w = fixed;
      else if (i < n_pos + n_batch) {
        const double qb = ws.forced_q[i - n_pos];
        w = static_cast<float>(1.0 / (qb + (1.0 - qb) * fill_rate));
      } else if (i >= m - n_fill) w = fill_weight;
    }
    loss += binary_term(z[i], i < n_pos, w, inv_b, d[i]);
  }
  return loss;
}
}  // namespace

float normalise_output(const Layer& out, SampleWorkspace& ws, const SoftmaxStats& local, const SoftmaxStats& global,
                       NeuronRange range, bool use_lsh, float inv_b) {
  const std::vector<float>& z = ws.out.back();
  std::vector<float>& d = ws.delta.back();
  const size_t m = d.size();
  PhaseTimer timer(ws.prof, Phase::Softmax, static_cast<double>(m) * 8.0);
  if (out.spec.activation == Activation::Sigmoid)
    return sampled(out, use_lsh) ? binary_output_sampled(out, ws, range, inv_b) : binary_output(ws, range, inv_b);
  if (m > 0 && local.max != global.max) {
    // Another range holds a larger logit: rebase this range's exponents onto it.
    const float rebase = std::exp(local.max - global.max);
    for (size_t i = 0; i < m; ++i) d[i] *= rebase;
  }
  const float mx = global.max;
  const float inv_sum = static_cast<float>(1.0 / global.sum);
  const float log_sum = static_cast<float>(std::log(global.sum));
  for (size_t i = 0; i < m; ++i) d[i] *= inv_sum * inv_b;
  const std::vector<int32_t>& labels = ws.labels;
  const std::vector<int32_t>& A = ws.active[static_cast<size_t>(out.index)];
  const bool by_position = sampled(out, use_lsh);
  const float t = 1.0f / static_cast<float>(labels.size());
  float loss = 0.0f;
  size_t in_range = 0;  // labels of this range seen so far: select_output put them first, in order
  for (const int32_t label : labels) {
    if (label < range.begin || label >= range.end) continue;
    size_t pos = static_cast<size_t>(label - range.begin);
    if (by_position) {
      pos = in_range;
      if (pos >= A.size() || A[pos] != label)
        pos = static_cast<size_t>(std::find(A.begin(), A.end(), label) - A.begin());
      if (pos >= A.size()) throw Error("internal error: a true label is missing from the active set");
    }
    ++in_range;
    loss -= t * (z[pos] - mx - log_sum);
    d[pos] -= t * inv_b;
  }
  return loss;
}

void output_backward(Layer& out, SampleWorkspace& ws, SampleRecord& rec, const Kernels& kr, const LayerInput& in,
                     bool use_lsh, NeuronRange range) {
  const size_t l = static_cast<size_t>(out.index);
  const std::vector<float>& d = ws.delta[l];
  PhaseTimer timer(ws.prof, Phase::Backward, static_cast<double>(d.size()) * 8.0);
  float* Wg = out.weight_grad.data();
  float* bg = out.bias_grad.data();
  if (out.sparse_input) {
    // The network's only layer: a feature row's gradient is value x the output deltas.
    if (range.begin != 0 || range.end != out.out_dim)
      throw InvalidArgument("output_backward: a layer that reads the sparse input takes the full neuron range");
    const SparseRow& x = in.sparse;
    if (out.records) {
      rec.rows[l].assign(x.indices, x.indices + x.nnz);
      rec.coef[l].assign(x.values, x.values + x.nnz);
      rec.vec[l].assign(d.begin(), d.begin() + out.out_dim);
    } else {
      for (int64_t k = 0; k < x.nnz; ++k) {
        kr.axpy(x.values[k], d.data(), Wg + static_cast<int64_t>(x.indices[k]) * out.row_len, out.row_len);
        mark_row(out, x.indices[k], ws.touched[l]);
      }
      for (int64_t j = 0; j < out.out_dim; ++j) bg[j] += d[j];
    }
    return;
  }
  if (out.records) {
    // The row gradients are formed by the optimizer from (row, coefficient) and the input.
    std::vector<int32_t>& rr = rec.rows[l];
    std::vector<float>& rc = rec.coef[l];
    rec.vec[l].assign(in.dense, in.dense + out.in_dim);
    if (sampled(out, use_lsh)) {
      const std::vector<int32_t>& A = ws.active[l];
      for (size_t i = 0; i < A.size(); ++i) {
        if (d[i] == 0.0f) continue;
        rr.push_back(A[i]);
        rc.push_back(d[i]);
      }
    } else {
      for (int64_t n = range.begin; n < range.end; ++n) {
        const float dn = d[n - range.begin];
        if (dn == 0.0f) continue;
        rr.push_back(static_cast<int32_t>(n));
        rc.push_back(dn);
      }
    }
    return;
  }
  // Lock-free buffers (a dense layer wider than kMaxRecordedWidth): every neuron's row.
  for (int64_t n = range.begin; n < range.end; ++n) {
    const float dn = d[n - range.begin];
    if (dn == 0.0f) continue;
    kr.axpy(dn, in.dense, Wg + n * out.row_len, out.row_len);
    bg[n] += dn;
  }
}

void output_input_gradient(const Layer& out, const SampleWorkspace& ws, const Kernels& kr, bool use_lsh,
                           NeuronRange range, float* dh) {
  if (out.sparse_input) return;
  const size_t l = static_cast<size_t>(out.index);
  const std::vector<float>& d = ws.delta[l];
  const float* W = out.weight.data();
  const int64_t len = out.row_len;
  auto add_row = [&](float dn, int64_t n) {
    if (out.bf16)
      kr.axpy_bf16(dn, out.row16(n), dh, len);
    else
      kr.axpy(dn, W + n * len, dh, len);
  };
  PhaseTimer timer(ws.prof, Phase::Backward,
                   static_cast<double>(d.size()) * static_cast<double>(len) * (out.bf16 ? 2.0 : 4.0));
  if (sampled(out, use_lsh)) {
    const std::vector<int32_t>& A = ws.active[l];
    const size_t na = A.size();
    for (size_t i = 0; i < na; ++i) {
      if (i + kPrefetch < na) {
        const int64_t ahead = static_cast<int64_t>(A[i + kPrefetch]);
        prefetch_out_row(out, W, ahead, len);
      }
      if (d[i] == 0.0f) continue;
      add_row(d[i], A[i]);
    }
  } else {
    for (int64_t n = range.begin; n < range.end; ++n) {
      const float dn = d[n - range.begin];
      if (dn == 0.0f) continue;
      add_row(dn, n);
    }
  }
}

}  // namespace slide
