// The slide training engine: a feed-forward network whose wide layers compute, per
// sample, only an active set of neurons chosen by locality-sensitive hashing.
//
// Algorithm: SLIDE, Chen, Medini, Farwell, Gobriel, Tai, Shrivastava, "SLIDE: In Defense
// of Smart Algorithms over Hardware Acceleration for Large-Scale Deep Learning Systems",
// MLSys 2020. Samples of a batch run in parallel, each computing forward, softmax and
// backward on its active neurons only; then a fused sparse Adam step (optimizer.hpp)
// visits only the weight rows the batch touched.
//
// Active sets of a hash-sampled output layer in training: the sample's labels; on a layer
// more than kInBatchWidth times as wide as its largest active set, the batch's other labels
// (in-batch negatives, at most max_active); the hash candidates; then a random fill to
// min_active drawn from a stream shared by the batch (so the batch shares its random
// negatives and touches few rows). The fill neurons carry the sampled-softmax weight
// (unchosen neurons / fill size) in the normaliser, so the loss estimates the full softmax
// loss (negatives.hpp).
//
// Networks without hash-sampled layers train a batch layer by layer instead, when their
// first layer keeps records and the batch's activations fit kMaxBatchFloats: every layer
// after the first runs as matrix products over the whole batch.
//
// Gradients: hash-sampled layers and dense layers of at most kMaxRecordedWidth neurons
// never form a gradient matrix. Each sample records its touched rows, their coefficients
// and one vector (memory O(batch x active)); the optimizer groups the records by row and
// sums them in batch order. Wider dense layers add into shared gradient buffers without
// locks instead (HOGWILD, Recht et al., NeurIPS 2011). training_paths.hpp states the
// constants that choose these paths and what each decides.
//
// Determinism: with a fixed seed a run is bit-identical run to run and across a
// checkpoint (all randomness comes from counter-based streams keyed by seed, step and
// sample position). Networks without lock-free layers (every layer hash-sampled or at
// most kMaxRecordedWidth wide) are bit-identical for any number of threads. Lock-free
// layers are bit-identical with one thread; with several, racing float additions may be
// lost or reordered, so results differ run to run while accuracy does not.
//
// Very wide output layers (training_paths.hpp): the negatives a batch's samples share are
// scored as one block per batch (set_shared_negatives), and table rebuilds are spread over
// several batches (set_rebuild_spread), so no batch stalls for a whole rebuild.
//
// Thread safety: train_batch, set_step and rebuild_tables take an exclusive lock;
// predict_topk, parameters and memory_report may run from several threads at once.
//
// Where each part lives (cpp/src/engine):
//   spec.cpp            NetworkSpec: the one parser from key/value pairs, validation
//   layer.cpp           one layer's arrays, gradient path and initial weights
//   network.cpp         construction, input checks, the table rebuild schedule
//   negatives.cpp       in-batch negatives, forced labels, sampled-softmax log-weights
//   hidden_layers.cpp   phases 1 and 6b of a sample's step (sample_step.hpp)
//   output_layer.cpp    phases 2-6a: selection, logits, softmax, backward, input gradient
//   trainer_sample.cpp  the per-sample trainer (composes the phases; HOGWILD over samples)
//   trainer_batched.cpp the batched dense trainer (matrix products over the batch)
//   trainer_sharded.cpp a label shard's batch step, in phases around the exchanges
//   trainer_shared.cpp  very wide output layers: the batch's shared negatives as one block
//   profile.cpp         the phase profiler and the bandwidth triad (profile.hpp)
//   optimizer.cpp       fused sparse Adam over the touched rows (optimizer.hpp)
//   predict.cpp         exact blocked, layer-wise and per-sample (LSH top-k) prediction
//   state.cpp           what a checkpoint saves and restores; the memory report
//   workspace.cpp       per-thread scratch (workspace.hpp)
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "slide/csr.hpp"
#include "slide/layer.hpp"
#include "slide/negatives.hpp"
#include "slide/network_spec.hpp"
#include "slide/optimizer.hpp"
#include "slide/profile.hpp"
#include "slide/sample_step.hpp"
#include "slide/training_paths.hpp"
#include "slide/workspace.hpp"

namespace slide {

struct BatchMatrices;  // activations of a batch for the batched dense path (trainer_batched.cpp)
class PredictCache;   // prediction workspaces and the label prior, kept between calls (predict.cpp)

// Query-time settings of predict_topk with use_lsh on a hash-sampled output layer.
struct LshQuery {
  // 0: the hash candidates as the layer selects them in training (its selection mode, a
  // random fill to min_active, a cut at max_active). N > 0: the N candidates found in the
  // most tables (ties at the cut drawn from the sample's stream), no random fill.
  int64_t candidates = 0;
  // Also score the `prior` labels with the largest bias (the tables index weight vectors,
  // not biases, so labels that a large bias puts on top are often in no bucket of the
  // query). The ranking is taken from the biases at the first such call after training
  // or a change of the tables, then reused: a query does no O(labels) work.
  int64_t prior = 0;
};

// Query-time settings of predict_index.
struct IndexQuery {
  // Clusters of the index whose members are scored; 0 = auto (LabelIndex::default_probe:
  // 24 on 670,091 labels, all of them on a thousand or so). Probing every cluster scores every
  // label (the top-k of exact scoring).
  int64_t probe = 0;
};

// Facts about a network's inference index (predict_index builds it on first use).
struct IndexInfo {
  bool built = false;
  int64_t clusters = 0;
  int64_t largest_cluster = 0;  // members of the largest cluster
  int64_t default_probe = 0;    // clusters a query probes by default
  int64_t rows = 0;
  size_t bytes = 0;
  double build_seconds = 0.0;
};

struct ShardBatch;     // a label-sharded batch between its phases (trainer_sharded.cpp)
struct SharedBlock;    // the shared-negatives trainer's batch state (trainer_shared.cpp)

// The part of the output layer one process holds when the labels are sharded over
// processes: output neurons [begin, end) of the spec's output layer. end = -1: all of it.
// The hidden layers are whole (replicated) in every shard.
struct OutputShard {
  int64_t begin = 0;
  int64_t end = -1;
};

struct MemoryReport {
  size_t weights = 0;    // weights and biases
  size_t optimizer = 0;  // Adam moments
  size_t gradients = 0;  // per-row gradient accumulators and row markers
  size_t tables = 0;     // LSH tables
  size_t scratch_per_thread = 0;
  size_t scratch = 0;    // all threads
  size_t activations = 0;  // of it: the batched dense path's batch activations (last batch)
  std::vector<std::string> hugepages;  // arrays that got transparent hugepages
};

struct ParameterArray {
  std::string name;  // "layers.0.weight", "layers.0.weight.adam_m", ...
  float* data;       // float32 arrays; null for bf16 ones
  std::vector<int64_t> shape;
  uint16_t* data_bf16 = nullptr;  // bf16 arrays (precision: bf16 weights and moments): the bits
};

class Network {
 public:
  // Validates; throws InvalidArgument. With a shard, only output neurons [begin, end) are
  // allocated, initialised exactly as those rows of the whole layer, with the output
  // layer's min_active and max_active scaled to the shard's share of the labels.
  explicit Network(const NetworkSpec& spec, OutputShard shard = {});
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Checks the samples `rows` (all rows when rows == nullptr) of x (and y if given):
  // CSR structure, feature ids < input_dim, label ids < output size, finite values,
  // rows in range. Throws InvalidArgument naming the offending value.
  void check_batch(const CsrView& x, const CsrView* y, const int64_t* rows, int64_t b) const;

  // Trains one batch made of samples `rows` of (x, y); returns the mean loss (samples
  // without labels count with loss 0). Increments step() and rebuilds hash tables when
  // the schedule says so. Inputs must have passed check_batch. Polls
  // interrupt_requested() every 50 ms between samples: on interrupt the partial batch is
  // discarded (weights untouched, step unchanged) and Interrupted is thrown.
  float train_batch(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr);

  // Top-k labels and softmax scores per sample of x, written row-major into
  // labels[n*k], scores[n*k] (descending score). exact: all output neurons, softmax over
  // all labels. use_lsh on an LSH output layer: only hash-selected neurons, softmax over
  // that active set; slots beyond the active set get label -1, score 0.
  // With `stats` (n entries), also the softmax statistics (max logit, sum of exp(z - max))
  // of the scored neurons: on a shard, what combines the shards' scores into one softmax.
  // `query` sets what use_lsh scores (LshQuery; the default selects as in training).
  void predict_topk(const CsrView& x, int k, bool use_lsh, int32_t* labels, float* scores,
                    SoftmaxStats* stats = nullptr, const LshQuery& query = LshQuery()) const;

  // Top-k labels and scores as predict_topk, from the inference index of the output layer
  // (label_index.hpp): the rows of the `query.probe` clusters that score best against the
  // sample's output-layer input, scored exactly; softmax over the scored labels (each
  // label's sigmoid on a sigmoid output layer); slots beyond them get label -1, score 0.
  // The index is built from the output layer's weights and biases at the first call after
  // the network was created, trained, restored or handed out parameters() (which may write
  // the weights), and reused until then; building takes the index's own lock, so
  // concurrent calls wait for one build. Throws InvalidArgument when the output layer reads
  // the sparse input directly (no hidden layer to index against) or probe < 0.
  void predict_index(const CsrView& x, int k, int32_t* labels, float* scores, SoftmaxStats* stats = nullptr,
                     const IndexQuery& query = IndexQuery()) const;
  // The output layer's logits (before softmax or sigmoid) of chosen labels: for row i of x,
  // the labels cand[cand_indptr[i] .. cand_indptr[i+1]) (ids of this network's output
  // neurons), written to out at the same positions. What a caller needs to re-rank a pool of
  // labels with a score of its own (slide's label-centroid term). Throws InvalidArgument for
  // a label outside [0, output_dim) or a decreasing cand_indptr.
  void label_logits(const CsrView& x, const int64_t* cand_indptr, const int32_t* cand, float* out) const;
  // Every label's logit, row-major into out[n * output_dim], by the batched dense path (matrix
  // products over blocks of rows). Returns false, writing nothing, on a network that does not
  // predict by that path (a hash-sampled layer, or more than 4,096 labels): use label_logits.
  bool all_logits(const CsrView& x, float* out) const;
  // The index as it stands (built = false until predict_index or build_index builds it).
  IndexInfo index_info() const;
  // Builds the index now (if it is missing or stale), e.g. before serving queries.
  IndexInfo build_index() const;

  // ------------------------------------------------------------ label-sharded training
  // One batch step of a shard, in three calls between which the caller exchanges with
  // the other shards (the same batch on every shard; see trainer_sharded.cpp):
  //  1. shard_forward: hidden layers, this shard's active output neurons, their logits;
  //     writes each sample's softmax statistics (max[b], sum[b]) over those neurons.
  //  2. shard_backward, given the statistics combined over all shards: the output layer's
  //     gradient, and this shard's part of dL/dh into dh[b x shard_dh_dim()] (zeroed
  //     here); returns this shard's part of the summed sample losses.
  //  3. shard_update, given dh summed over all shards: the hidden layers' gradients, then
  //     the Adam step of every layer (increments step(), rebuilds tables on schedule).
  // Labels in y are global ids. check_batch first. A batch must run all three in order.
  void shard_forward(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float* max, double* sum);
  double shard_backward(const float* max, const double* sum, float* dh);
  void shard_update(const float* dh, float lr);
  // Floats per sample of dh: the output layer's input width (0 when it reads the input).
  int64_t shard_dh_dim() const noexcept;
  int64_t shard_begin() const noexcept { return shard_begin_; }
  int64_t shard_end() const noexcept { return shard_begin_ + layers_.back().out_dim; }
  bool sharded() const noexcept { return layers_.back().out_dim != output_dim(); }

  // Share of the training points that carry each label (output_dim values in [0, 1]), or
  // n == 0 to clear. A hash-sampled output layer uses it to weight the batch's labels when
  // they serve as negatives (negatives.hpp); without it they are unweighted.
  void set_label_frequencies(const float* freq, int64_t n);
  bool has_label_frequencies() const noexcept { return !label_freq_.empty(); }

  int64_t step() const noexcept { return step_; }
  void set_step(int64_t step);
  // Rebuilds every LSH layer's tables from the current weights.
  void rebuild_tables();
  // Views of every persistent array (weights, biases and their Adam moments).
  std::vector<ParameterArray> parameters();
  MemoryReport memory_report() const;

  // The validated spec the network runs (as given: a range_pow of 0 stays 0 here;
  // spec_to_dict reports the derived value).
  const NetworkSpec& spec() const noexcept { return spec_; }
  int num_threads() const noexcept { return threads_; }
  uint64_t seed() const noexcept { return spec_.seed; }
  int64_t input_dim() const noexcept { return spec_.input_dim; }
  int64_t output_dim() const noexcept { return spec_.layers.back().size; }  // all shards
  const char* kernel_isa() const noexcept;
  // Step after which the next table rebuild happens (-1 when no layer uses LSH).
  int64_t next_rebuild() const noexcept { return next_rebuild_; }

  // ------------------------------------------------------------ profiling (profile.hpp)
  // Off by default; while on, train_batch adds each phase's time and bytes and the batch
  // time. Turning it on or off keeps the counters; reset_profile clears them.
  void set_profiling(bool on);
  bool profiling() const;
  ProfileReport profile() const;
  void reset_profile();
  // Adds time spent outside the engine to a phase (e.g. Phase::Shuffle by the caller's loop).
  void add_profile_time(Phase p, double seconds, double bytes);

  // ------------------------------------------------------------ spread table rebuilds
  // How a scheduled rebuild of an LSH layer's tables runs: 1 = at once, inside the batch
  // that reaches the step (a stall of seconds on a layer of 10^5-10^6 neurons); n >= 2 =
  // spread over n batches (LshTables::begin_rebuild): each batch hashes a share of the rows
  // as they are then, or builds a share of the tables, while the old tables keep serving;
  // 0 = auto (the default): layers of at least kSpreadRebuildRows rows spread over
  // min(64, rebuild_first / 2) batches, smaller ones rebuild at once. The spread is capped at
  // rebuild_first batches, so a rebuild always ends before the next one is due. Deterministic
  // for a seed. A checkpoint taken while a spread rebuild runs saves the old tables.
  void set_rebuild_spread(int64_t batches);
  int64_t rebuild_spread() const noexcept { return rebuild_spread_; }
  // Batches over which layer `layer`'s next rebuild is spread (1 = at once).
  int64_t rebuild_batches(int layer) const;
  // True while a spread rebuild of some layer is in progress.
  bool rebuild_pending() const;

  // ------------------------------------------------------------ shared in-batch negatives
  // How a very wide hash-sampled output layer scores the negatives its samples share (the
  // batch's labels and the uniform fill, see trainer_shared.cpp): 1 = as one block for the
  // whole batch (matrix products; each shared row read and updated once per batch), 0 = per
  // sample among its scattered active rows, -1 = auto (the default): the block when the
  // output layer has at least kSharedNegativesWidth neurons, takes in-batch negatives and
  // reads a hidden layer. The two give different (each deterministic) results.
  void set_shared_negatives(int mode);
  int shared_negatives() const noexcept { return shared_negatives_; }
  // Whether train_batch uses the block now (the mode resolved for this network).
  bool uses_shared_negatives() const noexcept;

 private:
  bool batched_for(int64_t b) const noexcept;
  float train_batch_samples(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr);
  float train_batch_shared(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr);
  float train_batch_layerwise(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr);
  void predict_exact_blocked(const CsrView& x, int k, int32_t* labels, float* scores, SoftmaxStats* stats) const;
  void predict_layerwise(const CsrView& x, int k, int32_t* labels, float* scores, SoftmaxStats* stats,
                         float* logits = nullptr) const;
  void predict_samples(const CsrView& x, int k, bool use_lsh, int32_t* labels, float* scores,
                       SoftmaxStats* stats, const LshQuery& query) const;
  void rebuild_tables_locked();
  void start_scheduled_rebuild();
  void advance_rebuilds();
  void cancel_rebuilds();
  int64_t spread_for(const Layer& L) const noexcept;
  int64_t schedule_after(int64_t step) const;
  void ensure_records(int64_t b);
  void finish_step(int64_t t);

  NetworkSpec spec_;
  int threads_ = 1;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<SampleWorkspace>> workspaces_;  // one per thread
  std::vector<std::unique_ptr<SampleRecord>> records_;  // one per batch position, reused
  std::vector<const float*> vec_ptrs_;                  // optimizer scratch
  BatchNegatives negatives_;                            // train_batch scratch: the batch's labels
  std::vector<float> label_freq_;                       // share of training points per label, or empty
  int64_t sample_work_ = 0;  // estimated multiply-adds per sample
  int64_t step_ = 0;
  int64_t next_rebuild_ = -1;
  bool has_lsh_ = false;
  std::unique_ptr<BatchMatrices> batch_;  // layer-by-layer path (null when it does not apply)
  std::unique_ptr<PredictCache> predict_cache_;
  int64_t shard_begin_ = 0;               // first output neuron held here (global id)
  std::unique_ptr<ShardBatch> shard_;     // label-sharded training: the batch between phases
  mutable std::shared_mutex mutex_;
  Profiler profiler_;
  int64_t rebuild_spread_ = 0;            // 0 = auto (set_rebuild_spread)
  int shared_negatives_ = -1;             // -1 = auto (set_shared_negatives)
  std::unique_ptr<SharedBlock> shared_;  // the shared-negatives trainer's batch state

 public:
  // Checkpoint access to the hash tables of layer `layer`, which must sample by LSH
  // (InvalidArgument otherwise). set_table_state checks `state` as LshTables::import_state
  // does and leaves the tables unchanged when it does not fit.
  LshTablesState table_state(int layer) const;
  void set_table_state(int layer, const LshTablesState& state);
  // Restores the step of the next scheduled rebuild: > step() with LSH layers, -1 without
  // (InvalidArgument otherwise). set_step derives it from the step; this keeps a saved one.
  void set_next_rebuild(int64_t next);
};

}  // namespace slide
