// The labels a wide output layer scores with the label-centroid term (slide/centroids.py): each
// row's best labels by the term beside the network's own best, in one pass over the rows.
#pragma once

#include <cstdint>
#include <vector>

#include "slide/csr.hpp"

namespace slide {

// Per row, ascending label ids: the labels scored and each one's term score.
struct LabelPools {
  std::vector<int64_t> indptr;  // rows + 1
  std::vector<int32_t> labels;
  std::vector<float> scores;
};

// For each row i of q (rows already scaled to unit length), the term score of label l is
// s_il = sum over the row's features f of q_if * ct_fl, where ct is the feature-by-label matrix of
// the label vectors (its rows are features, each with its labels and values). Summed in float32 in
// the order of the row's features and of each feature's labels, as a CSR product of q and ct
// computes it, and a sum of exactly zero counts as no score, as such a product stores it. Row i's
// labels are the union of its `pool` best scored labels (higher score first, ties to the lower
// label id) and the labels top[i * top_width .. (i + 1) * top_width) (entries < 0 are none), each
// with its score (0 where it has none). Rows run in parallel on `threads` threads; each thread
// keeps a scratch of num_labels floats and bytes between calls, so that a call on a few rows costs
// what the rows touch, not the width of the layer. Throws InvalidArgument on ids out of range.
LabelPools label_pools(const CsrView& q, const CsrView& ct, int64_t num_labels, const int32_t* top,
                       int64_t top_width, int64_t pool, int threads);

}  // namespace slide
