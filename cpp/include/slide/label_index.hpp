// An inference index over the rows of a wide output layer: the labels of largest logit
// z_j = w_j . h + b_j for a query h (maximum inner-product search), found by scoring only a
// few clusters of rows.
//
// Why not the training hash tables: they are tuned to sample a varied active set while the
// weights move, and DWTA codes depend only on the ranks of a row's coordinates, so they
// ignore the row norms and biases that, after long training, decide which labels score
// highest. The index is an inverted file (IVF) over the final rows instead:
//  - each row is augmented with its bias, a_j = [w_j, b_j], so that z_j = [h, 1] . a_j;
//  - Lloyd's k-means (Lloyd 1982) on a seeded sample of the augmented rows gives the
//    centroids and every row joins its nearest one; a cluster larger than `capacity` times
//    the mean size (frequent-label and untrained rows crowd a few centroids) is split by
//    k-means over its own members, which bounds the work of a query while neighbours stay
//    together;
//  - each cluster is summarised by the mean m_c of its members and their largest distance
//    r_c from it; the best member of cluster c scores at most q . m_c + |q| r_c for the
//    query q = [h, 1] (Cauchy-Schwarz). A query ranks the clusters by
//    q . m_c + kRadiusWeight |q| r_c (a fraction of that bound: the mean alone passes over
//    wide clusters whose best member wins, the whole bound over-rates them) and scores every
//    member of the `probe` best clusters exactly (Jegou et al., "Product quantization for
//    nearest neighbor search", TPAMI 2011, for the inverted file; here without quantization:
//    the scores are exact logits).
// Probing every cluster scores every row: the top-k then equals exact scoring.
//
// Thread safety: a built index is immutable; its const methods may run from several
// threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "slide/simd.hpp"

namespace slide {

struct LabelIndexParams {
  // Clusters of the first k-means; 0 = auto: about 5 sqrt(rows) (4,093 for 670,091 rows),
  // at most rows. Splitting oversized clusters adds some.
  int64_t clusters = 0;
  // Lloyd iterations over the sample.
  int iterations = 8;
  // Rows k-means trains on; 0 = auto: min(rows, 32 x clusters).
  int64_t sample = 0;
  // Clusters above this many times the mean size (rows / clusters) are split (>= 1).
  double capacity = 2.0;
};

// How much of a cluster's radius its score gets (see above). On the full-size amazon-670k
// model (datasets/synthetic.md, 4,000 test points), with 16 clusters probed: 0 finds the exact
// top label of 87.5% of the points, 0.05 of 93.6%, 0.1 of 94.6%, 0.15 of 94.9%, 0.4 of 91.1%;
// the wider clusters a larger weight prefers cost more rows per probe, and 0.1 gave the best
// accuracy per second.
constexpr float kRadiusWeight = 0.1f;

// Clusters a query probes by default (IndexQuery::probe = 0): kDefaultProbe, or more where
// that many clusters hold fewer than about kDefaultProbeRows labels, at most all of them (a
// small output layer, whose rows seldom cluster well, is then scored all or nearly all).
// Amazon-670k-shaped models (datasets/synthetic.md): on the full-size one (10 epochs) 16 probes
// lose 0.004 P@1, 24 probes 0.0025 (~2,500 of 670,091 labels scored); on the 3-epoch,
// 20,000-point one of benchmarks/inference_latency.py 16 and 20 probes lose 0.0105, 24 0.0015.
constexpr int64_t kDefaultProbe = 24;
constexpr int64_t kDefaultProbeRows = 1024;

// Clusters that auto (LabelIndexParams::clusters == 0) gives `rows` rows.
int64_t auto_index_clusters(int64_t rows) noexcept;

class LabelIndex {
 public:
  // Builds the index over n rows of `dim` weights (row j at W + j * dim, float32, or at
  // W16 + j * dim as bf16 bits when W is null) and their biases, with num_threads threads
  // (>= 1) and a seed (the sample and the initial centroids). Deterministic for a seed and
  // a thread count. Throws InvalidArgument for n < 1, dim < 1, bad params.
  LabelIndex(const float* W, const uint16_t* W16, const float* bias, int64_t n, int64_t dim,
             const LabelIndexParams& params, int num_threads, uint64_t seed);

  int64_t rows() const noexcept { return rows_; }
  int64_t dim() const noexcept { return dim_; }
  int64_t clusters() const noexcept { return static_cast<int64_t>(offsets_.size()) - 1; }
  // Cluster scores of ns queries (query s at H + s * ldh, dim() floats):
  // out[s * clusters() + c] = centroid_c . h_s + centroid_bias_c.
  void cluster_scores(const Kernels& kr, const float* H, int64_t ldh, int64_t ns, float* out) const;
  // The `probe` best clusters by `scores` (clusters() values), best first, into `out`
  // (probe <= clusters()); `scratch` is reused between calls.
  void best_clusters(const float* scores, int64_t probe, std::vector<int32_t>& scratch, int32_t* out) const;
  // Members (row ids, ascending) of cluster c: [begin, end).
  const int32_t* members_begin(int64_t c) const noexcept { return members_.data() + offsets_[c]; }
  const int32_t* members_end(int64_t c) const noexcept { return members_.data() + offsets_[c + 1]; }
  int64_t cluster_size(int64_t c) const noexcept { return offsets_[c + 1] - offsets_[c]; }
  int64_t largest_cluster() const noexcept { return largest_; }
  // The probe of IndexQuery::probe = 0 (see kDefaultProbe).
  int64_t default_probe() const noexcept;
  // Bytes held (centroids, member lists).
  size_t bytes() const noexcept;
  // Seconds the constructor took.
  double build_seconds() const noexcept { return build_seconds_; }

 private:
  int64_t rows_ = 0, dim_ = 0, largest_ = 0;
  std::vector<float> centroids_;      // clusters x dim (while building)
  std::vector<float> centroids_t_;    // dim x clusters
  std::vector<float> centroid_bias_;  // clusters
  std::vector<float> radius_;         // clusters: largest distance of a member from the mean
  std::vector<int64_t> offsets_;      // clusters + 1
  std::vector<int32_t> members_;      // rows, grouped by cluster
  double build_seconds_ = 0.0;
};

}  // namespace slide
