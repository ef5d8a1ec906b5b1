// In-batch negatives, forced labels and sampled-softmax log-weights (see slide/negatives.hpp).
#include "slide/negatives.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "slide/random.hpp"
#include "slide/training_paths.hpp"

namespace slide {

bool uses_in_batch_negatives(const Layer& out) noexcept {
  // Only for layers more than kInBatchWidth times wider than their active sets: in a layer
  // not much wider, the fill and hash candidates already reach every frequent label. Measured
  // on 20K-label synthetic data (hidden 128, min_active 1000, max_active 4000, 4 epochs):
  // test P@1 0.51 with the batch's labels as negatives against 0.17 without (frequent labels
  // are then pushed up by their positives far more often than down as negatives, and rank
  // first for every input); a dense output layer reaches 0.575.
  const SelectionParams& sel = out.spec.selection;
  const int64_t widest_set = std::max<int64_t>(sel.min_active, sel.max_active);
  return out.lsh() && sel.min_active > 0 && out.out_dim > kInBatchWidth * widest_set;
}

void collect_batch_negatives(const Layer& out, const CsrView& y, const int64_t* rows, int64_t b,
                             const std::vector<float>& label_freq, uint64_t pick_seed, BatchNegatives& neg) {
  neg.clear();
  if (!uses_in_batch_negatives(out)) return;
  std::vector<int32_t>& batch_labels = neg.labels;
  const SelectionParams& out_sel = out.spec.selection;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t r = rows[i];
    batch_labels.insert(batch_labels.end(), y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
  }
  // Many labels per point (Delicious: ~75) would make every active set huge: keep at most
  // max_active of them, taken from the label occurrences in a shared random order, so that
  // frequent labels (the ones that need the negatives) are the likeliest to stay.
  const size_t cap = static_cast<size_t>(out_sel.max_active > 0 ? out_sel.max_active : INT32_MAX);
  std::vector<int32_t>& occ = neg.occurrences;
  occ.assign(batch_labels.begin(), batch_labels.end());
  std::sort(batch_labels.begin(), batch_labels.end());
  batch_labels.erase(std::unique(batch_labels.begin(), batch_labels.end()), batch_labels.end());
  double draw_share = 1.0;  // share of the occurrences drawn to fill the cap
  if (batch_labels.size() > cap) {
    Rng pick(pick_seed);
    batch_labels.clear();
    size_t k = 0;
    while (batch_labels.size() < cap && k < occ.size()) {
      std::swap(occ[k], occ[k + pick.below(occ.size() - k)]);
      const int32_t j = occ[k++];
      // Sorted insertion keeps the list ready for binary search (it holds at most cap ids).
      auto it = std::lower_bound(batch_labels.begin(), batch_labels.end(), j);
      if (it == batch_labels.end() || *it != j) batch_labels.insert(it, j);
    }
    draw_share = static_cast<double>(k) / static_cast<double>(occ.size());
  }
  // Inclusion probabilities for the sampling correction: label j is a label of one of the
  // other b - 1 samples with probability 1 - (1 - f_j)^(b-1) (f_j: its share of the training
  // points), and survives the cap with probability 1 - (1 - draw_share)^c_j (c_j: its
  // occurrences in this batch).
  if (!label_freq.empty()) {
    if (draw_share < 1.0) std::sort(occ.begin(), occ.end());  // counted only after a cap
    neg.q.resize(batch_labels.size());
    const double others = static_cast<double>(b - 1);
    for (size_t i = 0; i < batch_labels.size(); ++i) {
      const int32_t j = batch_labels[i];
      const double f = std::min(static_cast<double>(label_freq[static_cast<size_t>(j)]), 1.0 - 1e-9);
      double q = -std::expm1(others * std::log1p(-f));
      if (draw_share < 1.0) {
        const auto range = std::equal_range(occ.begin(), occ.end(), j);
        const double c = static_cast<double>(range.second - range.first);
        q *= -std::expm1(c * std::log1p(-draw_share));
      }
      neg.q[i] = static_cast<float>(q);
    }
  }
}

SelectionParams force_labels(const Layer& out, const BatchNegatives& neg, SampleWorkspace& ws) {
  // The batch's other labels are scored by every sample (weighted when the label
  // frequencies are known, hash candidates always unweighted): the labels that appear most
  // often are then negatives in nearly every batch and get the gradient a full softmax would
  // give them, instead of one only when the uniform fill hits them; without this a short
  // run ranks the most frequent labels first for every input.
  SelectionParams sel = out.spec.selection;
  // Own labels of this layer's neurons only: on a shard of the labels (network.hpp), the
  // others are ids outside [0, out_dim) and belong to other shards.
  ws.forced.clear();
  for (const int32_t j : ws.labels)
    if (j >= 0 && j < out.out_dim) ws.forced.push_back(j);
  ws.forced_q.clear();  // this sample's, never a previous batch's (its batch may have no labels)
  if (out.lsh() && sel.min_active > 0 && !neg.labels.empty()) {
    const bool weighted = !neg.q.empty();
    for (size_t i = 0; i < neg.labels.size(); ++i) {
      const int32_t j = neg.labels[i];
      if (std::binary_search(ws.labels.begin(), ws.labels.end(), j)) continue;
      ws.forced.push_back(j);
      if (weighted) ws.forced_q.push_back(neg.q[i]);
    }
    const int n_forced = static_cast<int>(ws.forced.size());
    sel.min_active += n_forced;
    if (sel.max_active > 0) sel.max_active += n_forced;
  }
  return sel;
}

void add_sampling_log_weights(float* z, int64_t m, int64_t n_labels, const std::vector<float>& forced_q,
                              int64_t n_fill, int64_t range_size) {
  // Each of the n_fill fill members, drawn uniformly from the range_size - chosen neurons
  // outside the labels and the hash candidates, gets weight (range_size - chosen) / n_fill in
  // the softmax normaliser (a log-weight on its logit): the normaliser then estimates the
  // full one, so the far more numerous unsampled labels push scores down as they would in a
  // full softmax. Without it a wide layer drifts to scoring its most frequent labels first.
  const int64_t chosen = m - n_fill;
  double fill_rate = 1.0;  // chance that a neuron outside the chosen ones is in the fill
  if (n_fill > 0 && range_size - chosen > n_fill) {
    fill_rate = static_cast<double>(n_fill) / static_cast<double>(range_size - chosen);
    const float log_w = static_cast<float>(-std::log(fill_rate));
    for (int64_t i = chosen; i < m; ++i) z[i] += log_w;
  } else if (n_fill == 0) {
    fill_rate = std::min(1.0, static_cast<double>(m) / static_cast<double>(range_size));
  }
  // The batch's other labels: label j is here with probability q_j (a label of another
  // sample of the batch, from its training frequency, or else drawn in the fill), so it
  // stands for 1/q_j such labels. Unweighted, a rare label is pushed down as a negative far
  // less often than a full softmax would and, with many labels per point, ends up scored
  // above the frequent ones as training goes on.
  for (size_t i = 0; i < forced_q.size(); ++i) {
    const double qb = forced_q[i];
    const double q = qb + (1.0 - qb) * fill_rate;
    z[static_cast<size_t>(n_labels) + i] -= static_cast<float>(std::log(q));
  }
}

}  // namespace slide
