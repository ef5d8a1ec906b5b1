// Internal to the engine's units (not installed): stream salts, work thresholds and the
// small helpers the trainers, the optimizer and the predictors share.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

#include "slide/common.hpp"
#include "slide/csr.hpp"
#include "slide/workspace.hpp"
#include <memory>
#include "slide/label_index.hpp"
#include "slide/layer.hpp"
#include "slide/random.hpp"
#include "slide/workspace.hpp"

namespace slide {

// Salts that separate the random streams derived from the network seed.
constexpr uint64_t kInitSalt = 0x494e4954ull;     // weight initialisation
constexpr uint64_t kHashSalt = 0x48415348ull;     // hash functions
constexpr uint64_t kTableSalt = 0x5441424cull;    // table rebuilds (reservoir choices)
constexpr uint64_t kTrainSalt = 0x5452414eull;    // per-sample training streams
constexpr uint64_t kPredictSalt = 0x50524544ull;  // per-sample prediction streams
constexpr uint64_t kFillSalt = 0x46494c4cull;     // batch-shared active-set streams (training)
constexpr int64_t kInitBlock = 256;               // rows per initialisation stream
constexpr size_t kPrefetch = 4;                   // neurons ahead to prefetch in sparse loops
// Below about this many multiply-adds a loop runs on the calling thread: waking a team
// costs more than it saves, and far more when the cores are shared with other processes.
constexpr int64_t kParallelWork = int64_t(1) << 17;
// Batched dense path: blocks of the matrix products that one thread takes at a time.
constexpr int64_t kForwardRows = 16;   // weight rows per block of Z = H W^T
constexpr int64_t kBackSamples = 32;   // samples x columns per block of dH = D W
constexpr int64_t kBackCols = 64;
constexpr int64_t kGradRows = 16;      // weight rows per block of G = D^T H (then Adam)

// Lets a parallel loop stop on Ctrl-C: OpenMP thread 0 (the calling thread, the one that
// may talk to Python) polls interrupt_requested() at most every 50 ms; every thread then
// skips its remaining iterations.
class InterruptPoller {
 public:
  bool should_stop() {
    if (stop_.load(std::memory_order_relaxed)) return true;
    if (omp_get_thread_num() != 0) return false;
    const auto now = std::chrono::steady_clock::now();
    if (polled_ && now - last_ < std::chrono::milliseconds(50)) return false;
    polled_ = true;
    last_ = now;
    if (!interrupt_requested()) return false;
    stop_.store(true, std::memory_order_relaxed);
    return true;
  }
  bool stopped() const { return stop_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> stop_{false};
  bool polled_ = false;  // touched by thread 0 only
  std::chrono::steady_clock::time_point last_;
};

// Activation and (in training) inverted dropout of one sample's hidden-layer outputs, in
// place; `mask` (may be null) receives the multipliers (kept units are scaled by 1 / (1 - dropout), so
// inference needs no rescaling). Draws one uniform per unit from rng when dropout > 0.
inline void activate(Activation act, float* z, float* mask, int64_t n, float dropout, Rng& rng) {
  if (act == Activation::ReLU)
    for (int64_t j = 0; j < n; ++j) z[j] = z[j] > 0.0f ? z[j] : 0.0f;
  if (dropout > 0.0f) {
    const float keep = 1.0f / (1.0f - dropout);
    for (int64_t j = 0; j < n; ++j) {
      const float m = rng.uniform() < dropout ? 0.0f : keep;
      if (mask) mask[j] = m;  // null: the caller regenerates the mask later (replay_dropout)
      z[j] *= m;
    }
  }
}

// The largest of z[0..n), n >= 1 (softmax normalisers). Not inlined on purpose: inlined
// into the batched trainer's softmax loop, the running maximum (live across the later
// kernel call) was kept on the stack, a store-load chain that cost ~15% of a dense batch.
__attribute__((noinline)) inline float max_value(const float* z, int64_t n) {
  float mx = z[0];
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, z[j]);
  return mx;
}

// The gradient dh of a hidden layer's outputs h, taken back through activate().
inline void backprop_activation(Activation act, const float* h, const float* mask, float* dh, int64_t n) {
  const bool relu = act == Activation::ReLU;
  for (int64_t j = 0; j < n; ++j) {
    if (relu && h[j] <= 0.0f) dh[j] = 0.0f;
    else if (mask) dh[j] *= mask[j];
  }
}

// backprop_activation with the dropout mask regenerated instead of read: `rng` must be the
// stream activate() drew this sample's mask of the layer from, in the state it had then.
// Draws one uniform per unit as activate() did, so the multipliers (and dh) are the same bits.
inline void backprop_activation_replay(Activation act, const float* h, float* dh, int64_t n, float dropout, Rng rng) {
  const bool relu = act == Activation::ReLU;
  const float keep = 1.0f / (1.0f - dropout);
  for (int64_t j = 0; j < n; ++j) {
    const float m = rng.uniform() < dropout ? 0.0f : keep;
    if (relu && h[j] <= 0.0f) dh[j] = 0.0f;
    else dh[j] *= m;
  }
}

// The batch as matrices (row i = sample i of the batch), for networks trained layer by
// layer (the batched dense path, trainer_batched.cpp). O(batch x neurons) per layer; these
// networks have no wide layer.
struct BatchMatrices {
  std::vector<std::vector<float>> out;    // per layer [b x size]: outputs after activation and
                                          // dropout; the output layer's logits
  std::vector<std::vector<float>> mask;   // per hidden layer [b x size]: dropout multipliers
  std::vector<std::vector<float>> delta;  // per layer [b x size]: dL/dz
  std::vector<float> loss;                // per sample
  std::vector<Rng> rng;                   // per sample: its training stream (dropout)
  std::vector<std::vector<float>> grad;   // per thread: gradients of a block of weight rows
  // Per layer l >= 1 with bf16 storage: its weights widened to float32 at the start of each
  // batch, for the matrix products (empty for float32 layers and layer 0).
  std::vector<std::vector<float>> wide;
  int64_t width = 0;                      // neurons over all layers
  int64_t floats_per_sample = 0;          // activation floats a batch keeps per sample (batched_for)

  // training.recompute: `out` holds only the output layer's logits; hidden outputs are kept
  // for the batch only at checkpoints (checkpoint[l]; the last hidden layer is one), the
  // others are recomputed from the checkpoint below them in the backward pass. No masks are
  // kept: rng_at holds each sample's stream as it was before each hidden layer's dropout, to
  // regenerate them. Hidden outputs (as first computed and as recomputed) and deltas live in
  // `slots`, shared by matrices whose lifetimes in the batch do not overlap (the plan of
  // plan_batch_activations); slot_width: floats per sample of each slot.
  bool recompute = false;
  std::vector<char> checkpoint;             // per layer
  std::vector<int> out_slot, redo_slot, delta_slot;  // per hidden layer (-1: none)
  std::vector<int64_t> slot_width;
  std::vector<std::vector<float>> slots;
  std::vector<Rng> rng_at;                  // [hidden layer][sample]
  // Per layer, this batch: its output in the forward pass, its recomputed output (recompute,
  // non-checkpoint layers), dL/dz and dropout multipliers (null = none kept).
  std::vector<float*> out_ptr, redo_ptr, delta_ptr, mask_ptr;

  // Bytes of the batch's activations: outputs, dropout masks, deltas and the streams kept for
  // the backward pass (the per-thread gradient blocks are not activations).
  size_t activation_bytes() const {
    size_t b = loss.capacity() * sizeof(float) + (rng.capacity() + rng_at.capacity()) * sizeof(Rng);
    for (auto* group : {&out, &mask, &delta})
      for (auto& v : *group) b += v.capacity() * sizeof(float);
    for (auto& v : slots) b += v.capacity() * sizeof(float);
    return b;
  }
  size_t bytes() const {
    size_t b = activation_bytes();
    for (auto& v : grad) b += v.capacity() * sizeof(float);
    for (auto& v : wide) b += v.capacity() * sizeof(float);
    return b;
  }
};

// Decides where the batched dense path keeps each layer's activations: all of them, or with
// recompute only checkpoints (trainer_batched.cpp); sets floats_per_sample.
void plan_batch_activations(BatchMatrices& M, const std::vector<Layer>& layers, bool recompute);

// What prediction keeps between calls (predict_topk is const and may run from several
// threads at once; each member is guarded by the cache's own lock):
// - workspaces: a call checks them out and gives them back when it ends, so it allocates
//   nothing of size O(neurons) (an LSH layer's sampler is one), which would otherwise
//   dominate the time of a single query. At most as many as were in use at once.
// - the label prior of LshQuery::prior: output neurons by decreasing bias, taken at the
//   first call that needs it after the weights or tables changed (invalidate()).
// - the inference index of predict_index (label_index.hpp) with its scratch pool: built at
//   the first call that needs it after the weights changed (invalidate(), or another step),
//   under its own lock so that concurrent callers wait for one build while the workspace
//   pool stays free.
struct IndexScratch {
  std::vector<float> H;              // the block's output-layer inputs
  std::vector<float> cluster_scores;  // block x clusters
  std::vector<int32_t> probe, order;  // probed clusters of the block's samples; best_clusters' scratch
  std::vector<std::pair<int64_t, int64_t>> visits;  // (cluster << 32 | sample, first slot) per probe
  std::vector<int64_t> offset;        // each sample's first slot
  std::vector<float> logits;          // slots: scored labels of the block's samples
  std::vector<int32_t> ids;
  std::vector<float> wide;            // a bf16 row widened
};

class PredictCache {
 public:
  // The index for weights at training step `step`, built by `make` when missing or stale.
  template <class Make>
  std::shared_ptr<const LabelIndex> index(int64_t step, Make&& make) {
    std::lock_guard<std::mutex> build_lock(index_build_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (index_ && index_step_ == step) return index_;
    }
    std::shared_ptr<const LabelIndex> built = make();
    std::lock_guard<std::mutex> lock(mutex_);
    index_ = built;
    index_step_ = step;
    return index_;
  }
  // The index if one is built for step `step`, else null.
  std::shared_ptr<const LabelIndex> current_index(int64_t step) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return index_ && index_step_ == step ? index_ : nullptr;
  }
  std::unique_ptr<IndexScratch> take_scratch() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (scratch_.empty()) return std::make_unique<IndexScratch>();
    std::unique_ptr<IndexScratch> s = std::move(scratch_.back());
    scratch_.pop_back();
    return s;
  }
  void give_scratch(std::unique_ptr<IndexScratch> s) {
    std::lock_guard<std::mutex> lock(mutex_);
    scratch_.push_back(std::move(s));
  }
  std::unique_ptr<SampleWorkspace> take(const std::vector<Layer>& layers) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        std::unique_ptr<SampleWorkspace> ws = std::move(free_.back());
        free_.pop_back();
        return ws;
      }
    }
    return make_workspace(layers, false, true);
  }
  void give(std::unique_ptr<SampleWorkspace> ws) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(ws));
  }
  // Called with the network's exclusive lock held (tables rebuilt or restored).
  void invalidate() {
    std::lock_guard<std::mutex> lock(mutex_);
    prior_.reset();
    index_.reset();
  }
  // The first min(out_dim, kMaxPrior) neurons of `out` by decreasing bias (ties: lower id),
  // for weights at training step `step`.
  std::shared_ptr<const std::vector<int32_t>> prior(const Layer& out, int64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (prior_ && prior_step_ == step) return prior_;
    constexpr int64_t kMaxPrior = 65536;
    const float* bias = out.bias.data();
    const int64_t n = out.out_dim, keep = std::min(n, kMaxPrior);
    auto order = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) (*order)[j] = static_cast<int32_t>(j);
    auto higher = [bias](int32_t a, int32_t b) { return bias[a] > bias[b] || (bias[a] == bias[b] && a < b); };
    std::nth_element(order->begin(), order->begin() + (keep - 1), order->end(), higher);
    std::sort(order->begin(), order->begin() + keep, higher);
    order->resize(static_cast<size_t>(keep));
    order->shrink_to_fit();
    prior_ = order;
    prior_step_ = step;
    return prior_;
  }
  size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t b = prior_ ? prior_->capacity() * sizeof(int32_t) : 0;
    for (const auto& ws : free_) b += ws->bytes();
    if (index_) b += index_->bytes();
    return b;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<SampleWorkspace>> free_;
  std::shared_ptr<const std::vector<int32_t>> prior_;
  int64_t prior_step_ = -1;
  std::mutex index_build_mutex_;  // held while an index is built (taken before mutex_)
  std::shared_ptr<const LabelIndex> index_;
  int64_t index_step_ = -1;
  std::vector<std::unique_ptr<IndexScratch>> scratch_;
};

// A label shard's batch between its phases (trainer_sharded.cpp): the data views (the
// caller keeps the arrays alive until shard_update), each sample's workspace (its hidden
// activations, dropout masks, active output neurons and their exponentials) and local
// softmax statistics.
struct ShardBatch {
  int phase = 0;  // 0: no batch; 1: after shard_forward; 2: after shard_backward
  CsrView x;
  std::vector<int64_t> rows;
  int64_t b = 0;
  int64_t t = 0;  // the step this batch will be
  std::vector<std::unique_ptr<SampleWorkspace>> ws;  // per batch position
  std::vector<float> local_max;
  std::vector<double> local_sum;
  std::vector<uint8_t> has_labels;
  std::vector<int64_t> y_indptr, positions;  // the batch's labels in this shard, local ids
  std::vector<int32_t> y_indices;
};

// The batch state of the shared-negatives trainer (trainer_shared.cpp; kept between batches for its capacity).
struct SharedBlock {
  std::vector<std::unique_ptr<SampleWorkspace>> ws;  // per batch position
  std::vector<uint8_t> has_labels;                   // per sample
  std::vector<int32_t> set;                          // S: the batch's labels, then the fill
  int64_t n_labels = 0;                              // batch labels at the front of S
  std::vector<uint8_t> mark;                         // per output neuron: in S (zero between batches)
  std::vector<float> weights;                        // S's weight rows gathered, |S| x d
  std::vector<float> bias;                           // S's biases
  std::vector<float> H;                              // the batch's output-layer inputs, b x d
  std::vector<float> H16;                            // bf16 output layer: H rounded to bf16, widened
  std::vector<float> Z;                              // b x |S|: logits, then dL/dz
  std::vector<std::vector<float>> grad;              // per thread: kGradRows x d

  size_t bytes() const {
    size_t n = has_labels.capacity() + set.capacity() * 4 + mark.capacity() +
               (weights.capacity() + bias.capacity() + H.capacity() + H16.capacity() + Z.capacity()) * sizeof(float);
    for (const auto& g : grad) n += g.capacity() * sizeof(float);
    for (const auto& w : ws) n += w->bytes();
    return n;
  }
};

// Its bytes (0 for null).
size_t shared_block_bytes(const SharedBlock* s);

// Lends a thread workspace's O(neurons) scratch (samplers, bucket ids, lock-free row lists)
// and its profiler slot to a sample's workspace for one phase (trainers that keep a
// workspace per batch position between phases).
class Borrow {
 public:
  Borrow(SampleWorkspace& sample, SampleWorkspace& thread) : a_(sample), b_(thread) { swap(); }
  ~Borrow() { swap(); }
  Borrow(const Borrow&) = delete;
  Borrow& operator=(const Borrow&) = delete;

 private:
  void swap() {
    std::swap(a_.samplers, b_.samplers);
    std::swap(a_.buckets, b_.buckets);
    std::swap(a_.touched, b_.touched);
    std::swap(a_.prof, b_.prof);
  }
  SampleWorkspace& a_;
  SampleWorkspace& b_;
};

// Marks row r of a lock-free layer as touched by this batch; exactly one thread lists it.
// One sampled label's term of the per-label binary loss on logit z (sigmoid output): sets
// dz = dL/dz (positives weigh 1, a negative weighs w), scaled by inv_b, and returns the loss
// term, in forms that do not overflow for large |z|.
inline float binary_term(float z, bool positive, float w, float inv_b, float& dz) {
  const float e = std::exp(-std::fabs(z));
  const float p = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  const float softplus = std::max(z, 0.0f) + std::log1p(e);
  if (positive) {
    dz = (p - 1.0f) * inv_b;
    return softplus - z;
  }
  dz = w * p * inv_b;
  return w * softplus;
}

inline void mark_row(Layer& L, int32_t r, std::vector<int32_t>& list) {
  uint8_t* m = L.row_touched.data() + r;
  // A plain load first: most rows of a hot batch are already marked, and the atomic
  // exchange (which makes exactly one thread list the row) is then skipped.
  if (__atomic_load_n(m, __ATOMIC_RELAXED) == 0 && __atomic_exchange_n(m, uint8_t(1), __ATOMIC_RELAXED) == 0)
    list.push_back(r);
}

}  // namespace slide
