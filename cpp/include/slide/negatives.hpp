// The active set of a hash-sampled output layer in training, beyond the hash candidates:
// the sample's own labels (forced in), the batch's other labels as in-batch negatives, the
// uniform random fill up to min_active, and the sampled-softmax log-weights that make the
// normaliser over this set estimate the full softmax normaliser.
//
// In-batch negatives and their logQ correction: Yi et al., "Sampling-Bias-Corrected Neural
// Modeling for Large Corpus Item Recommendations", RecSys 2019. Uniform proposals with
// importance weights: Bengio & Senecal, IEEE TNN 2008; Jean et al., ACL 2015.
#pragma once

#include <cstdint>
#include <vector>

#include "slide/csr.hpp"
#include "slide/hash.hpp"
#include "slide/layer.hpp"
#include "slide/workspace.hpp"

namespace slide {

// The batch's labels shared by its samples as negatives, and their inclusion chances.
struct BatchNegatives {
  std::vector<int32_t> labels;       // sorted, unique; at most max_active of them
  std::vector<float> q;              // per label: chance that it is here (empty: unweighted)
  std::vector<int32_t> occurrences;  // scratch: the batch's label occurrences
  void clear() {
    labels.clear();
    q.clear();
  }
};

// True when the output layer `out` takes in-batch negatives: hash-sampled, min_active > 0
// and more than kInBatchWidth neurons per slot of its widest active set (training_paths.hpp).
bool uses_in_batch_negatives(const Layer& out) noexcept;

// Collects the labels of samples `rows` (b of them) of y into neg (cleared first; nothing
// when !uses_in_batch_negatives(out)). Beyond max_active labels, keeps max_active drawn
// from the label occurrences in a random order from stream `pick_seed`, so frequent labels
// are the likeliest to stay. With label_freq (share of training points per label; may be
// empty) it sets q: the chance that each label is one of the other b - 1 samples' labels and
// survives the cap.
void collect_batch_negatives(const Layer& out, const CsrView& y, const int64_t* rows, int64_t b,
                             const std::vector<float>& label_freq, uint64_t pick_seed, BatchNegatives& neg);

// One sample's forced neurons: ws.forced = ws.labels (sorted, unique, not empty) that are
// neurons of the layer (ids in [0, out.out_dim); a label shard's others lie outside), then, when
// neg has labels, the batch's labels that are not the sample's own (with their q in
// ws.forced_q, when neg is weighted). Returns the output layer's selection parameters with
// min_active and max_active widened by the forced count, so the negatives do not count
// against them (min_active = 0 takes no negatives at all).
SelectionParams force_labels(const Layer& out, const BatchNegatives& neg, SampleWorkspace& ws);

// Adds the sampled-softmax log-weights to the m logits z of one sample's selected output
// neurons (order: n_labels own labels, the forced_q.size() batch labels, hash candidates,
// then the n_fill random fill). The fill stands for every neuron of the range_size neurons
// outside the chosen ones: weight (range_size - chosen) / n_fill. Batch label i stands for
// 1 / q'_i labels, q'_i = q_i + (1 - q_i) x (its chance to be in the fill).
void add_sampling_log_weights(float* z, int64_t m, int64_t n_labels, const std::vector<float>& forced_q,
                              int64_t n_fill, int64_t range_size);

}  // namespace slide
