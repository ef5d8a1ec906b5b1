// SLIDE training engine (Chen et al., MLSys 2020): per-sample forward/backward on the
// active neurons of each layer, per-sample gradient records (or lock-free HOGWILD
// buffers for wide dense layers), fused sparse Adam.
#include "slide/network.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

#include "slide/common.hpp"
#include "slide/random.hpp"
#include "slide/simd.hpp"

namespace slide {

// Per-thread scratch: allocated once per network (or per predict call) and reused, so
// the hot loop does not allocate once capacities have grown to their working size.
// Holds state for one sample at a time: O(active) per layer, never O(neurons x batch).
struct Network::Workspace {
  // Hidden layers: dense outputs (after activation and dropout), indexed by neuron.
  // Output layer: logits of the active set, in active-set order.
  std::vector<std::vector<float>> out;
  std::vector<std::vector<float>> mask;   // dropout multipliers (hidden layers, training)
  // dL/dz: hidden layers dense by neuron, the output layer in active-set order.
  std::vector<std::vector<float>> delta;
  std::vector<std::vector<int32_t>> active;  // LSH layers: the sampled neurons
  std::vector<std::unique_ptr<ActiveSetSampler>> samplers;
  std::vector<uint32_t> buckets;
  std::vector<int32_t> labels;
  std::vector<int32_t> forced;  // training: own labels, then the batch's other labels
  std::vector<float> forced_q;  // inclusion probability of each of those other labels
  std::vector<std::vector<int32_t>> touched;  // rows this thread marked in this batch
  std::vector<std::pair<float, int32_t>> heap;  // predict: top-k candidates
  std::vector<float> grad_row;                  // optimizer: one row's gradient
  std::vector<int32_t> adam_rows;               // optimizer: touched rows of one block

  size_t bytes() const {
    size_t b = buckets.capacity() * sizeof(uint32_t) + labels.capacity() * sizeof(int32_t) +
               heap.capacity() * sizeof(heap[0]) + grad_row.capacity() * sizeof(float) +
               adam_rows.capacity() * sizeof(int32_t);
    for (auto& v : out) b += v.capacity() * sizeof(float);
    for (auto& v : mask) b += v.capacity() * sizeof(float);
    for (auto& v : delta) b += v.capacity() * sizeof(float);
    for (auto& v : active) b += v.capacity() * sizeof(int32_t);
    for (auto& v : touched) b += v.capacity() * sizeof(int32_t);
    return b;
  }
};

// What one sample of the batch contributes to the gradients of the `records` layers:
// gradient of row rows[l][k] += coef[l][k] * vec[l] (vec: the layer input for a neuron
// row, the layer-0 output delta for a feature row).
struct Network::SampleRecord {
  std::vector<std::vector<int32_t>> rows;
  std::vector<std::vector<float>> coef;
  std::vector<std::vector<float>> vec;
  std::vector<int32_t> labels;  // layer-by-layer path: the sample's labels, sorted and unique

  explicit SampleRecord(size_t layers) : rows(layers), coef(layers), vec(layers) {}
  void clear() {
    for (auto& v : rows) v.clear();
    for (auto& v : coef) v.clear();
    for (auto& v : vec) v.clear();
    labels.clear();
  }
  size_t bytes() const {
    size_t b = labels.capacity() * sizeof(int32_t);
    for (auto& v : rows) b += v.capacity() * sizeof(int32_t);
    for (auto& v : coef) b += v.capacity() * sizeof(float);
    for (auto& v : vec) b += v.capacity() * sizeof(float);
    return b;
  }
};

// The batch as matrices (row i = sample i of the batch), for networks trained layer by
// layer (see network.hpp). O(batch x neurons) per layer; these networks have no wide layer.
struct Network::BatchMatrices {
  std::vector<std::vector<float>> out;    // per layer [b x size]: outputs after activation and
                                          // dropout; the output layer's logits
  std::vector<std::vector<float>> mask;   // per hidden layer [b x size]: dropout multipliers
  std::vector<std::vector<float>> delta;  // per layer [b x size]: dL/dz
  std::vector<float> loss;                // per sample
  std::vector<Rng> rng;                   // per sample: its training stream (dropout)
  std::vector<std::vector<float>> grad;   // per thread: gradients of a block of weight rows
  int64_t width = 0;                      // neurons over all layers

  size_t bytes() const {
    size_t b = loss.capacity() * sizeof(float) + rng.capacity() * sizeof(Rng);
    for (auto* group : {&out, &mask, &delta, &grad})
      for (auto& v : *group) b += v.capacity() * sizeof(float);
    return b;
  }
};

namespace {

// Dense layers keep per-sample records (O(batch x neurons)) while they are this narrow;
// wider ones accumulate into lock-free gradient buffers.
constexpr int64_t kMaxRecordedWidth = 4096;
// A hash-sampled output layer adds the batch's labels as negatives when it has more than this
// many neurons per active-set slot (see train_batch).
constexpr int64_t kInBatchWidth = 2;

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
// Layer-by-layer path: used while a batch's activations (three floats per sample and neuron)
// stay under 256 MiB; blocks of the matrix products that one thread takes at a time.
constexpr int64_t kMaxBatchFloats = int64_t(1) << 26;
constexpr int64_t kForwardRows = 16;   // weight rows per block of Z = H W^T
constexpr int64_t kBackSamples = 32;   // samples x columns per block of dH = D W
constexpr int64_t kBackCols = 64;
constexpr int64_t kGradRows = 16;      // weight rows per block of G = D^T H (then Adam)

std::string key(int l, const char* name) { return "layers[" + std::to_string(l) + "]." + name; }

inline void mark_row(Layer& L, int32_t r, std::vector<int32_t>& list) {
  uint8_t* m = L.row_touched.data() + r;
  // A plain load first: most rows of a hot batch are already marked, and the atomic
  // exchange (which makes exactly one thread list the row) is then skipped.
  if (__atomic_load_n(m, __ATOMIC_RELAXED) == 0 && __atomic_exchange_n(m, uint8_t(1), __ATOMIC_RELAXED) == 0)
    list.push_back(r);
}

std::unique_ptr<Network::Workspace> make_workspace(const std::vector<Layer>& layers, bool training,
                                                   bool with_samplers) {
  auto ws = std::make_unique<Network::Workspace>();
  const size_t n = layers.size();
  ws->out.resize(n);
  ws->mask.resize(n);
  ws->delta.resize(n);
  ws->active.resize(n);
  ws->samplers.resize(n);
  ws->touched.resize(n);
  int max_tables = 0;
  for (size_t l = 0; l < n; ++l) {
    const Layer& L = layers[l];
    const bool last = l + 1 == n;
    int64_t width = L.out_dim;
    if (last && L.lsh()) {
      const auto& s = L.spec.selection;
      width = std::min<int64_t>(L.out_dim, std::max<int64_t>({s.max_active, s.min_active, 64}) + 64);
    }
    ws->out[l].reserve(width);
    if (training) {
      ws->delta[l].reserve(width);
      if (!last) ws->mask[l].reserve(width);
    }
    if (L.lsh()) {
      ws->active[l].reserve(width);
      max_tables = std::max(max_tables, L.spec.lsh.L);
      if (with_samplers) ws->samplers[l] = std::make_unique<ActiveSetSampler>(L.out_dim);
    }
  }
  ws->buckets.resize(max_tables);
  if (training) {
    int64_t max_len = 0;
    for (const Layer& L : layers) max_len = std::max(max_len, L.row_len);
    ws->grad_row.assign(max_len, 0.0f);
    ws->adam_rows.reserve(4096);
  }
  return ws;
}

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
// place; `mask` receives the multipliers (kept units are scaled by 1 / (1 - dropout), so
// inference needs no rescaling). Draws one uniform per unit from rng when dropout > 0.
inline void activate(Activation act, float* z, float* mask, int64_t n, float dropout, Rng& rng) {
  if (act == Activation::ReLU)
    for (int64_t j = 0; j < n; ++j) z[j] = z[j] > 0.0f ? z[j] : 0.0f;
  if (dropout > 0.0f) {
    const float keep = 1.0f / (1.0f - dropout);
    for (int64_t j = 0; j < n; ++j) {
      mask[j] = rng.uniform() < dropout ? 0.0f : keep;
      z[j] *= mask[j];
    }
  }
}

// The gradient dh of a hidden layer's outputs h, taken back through activate().
inline void backprop_activation(Activation act, const float* h, const float* mask, float* dh, int64_t n) {
  const bool relu = act == Activation::ReLU;
  for (int64_t j = 0; j < n; ++j) {
    if (relu && h[j] <= 0.0f) dh[j] = 0.0f;
    else if (mask) dh[j] *= mask[j];
  }
}

// Forward pass of one sample through every layer. `forced` (sorted, unique true labels)
// go into the output layer's active set when it is hash-sampled and `use_lsh` is set.
// `upto` < number of layers stops early (the hidden layers only); `last` still means the
// network's output layer.
void forward(const std::vector<Layer>& layers, Network::Workspace& ws, const Kernels& kr,
             const int32_t* feat, const float* val, int64_t nnz, const int32_t* forced, int n_forced,
             bool use_lsh, float dropout, Rng& rng, int upto = -1, const Rng* shared_fill = nullptr,
             const SelectionParams* out_selection = nullptr) {
  const int nl = static_cast<int>(layers.size());
  const int stop = upto < 0 ? nl : upto;
  for (int l = 0; l < stop; ++l) {
    const Layer& L = layers[l];
    const bool last = l == nl - 1;
    std::vector<float>& z = ws.out[l];
    if (L.sparse_input) {
      z.assign(L.bias.data(), L.bias.data() + L.out_dim);
      for (int64_t k = 0; k < nnz; ++k)
        kr.axpy(val[k], L.weight.data() + static_cast<int64_t>(feat[k]) * L.row_len, z.data(), L.out_dim);
    } else {
      const float* h = ws.out[l - 1].data();
      const float* W = L.weight.data();
      const float* b = L.bias.data();
      if (L.lsh() && use_lsh) {
        L.hash->hash_dense(h, ws.buckets.data());
        // Training draws the random part of the active set from a stream shared by the whole
        // batch (each sample starts from the same state), so the samples share their random
        // negatives, as in sampled softmax with batch-shared negatives (Jean et al., ACL 2015):
        // the batch then touches about min_active random rows instead of batch x min_active,
        // which is most of the optimizer's work on a wide output layer.
        Rng fill = shared_fill ? *shared_fill : Rng(0);
        ws.samplers[l]->select(*L.tables, ws.buckets.data(), last ? forced : nullptr, last ? n_forced : 0,
                               last && out_selection ? *out_selection : L.spec.selection, shared_fill ? fill : rng,
                               ws.active[l]);
        // Active rows are scattered over a large matrix: prefetch a few neurons ahead.
        const std::vector<int32_t>& A = ws.active[l];
        const size_t na = A.size();
        if (!last) z.assign(L.out_dim, 0.0f);
        else z.resize(na);
        for (size_t i = 0; i < na; ++i) {
          if (i + kPrefetch < na) {
            prefetch_row(W + static_cast<int64_t>(A[i + kPrefetch]) * L.row_len, L.row_len);
            __builtin_prefetch(b + A[i + kPrefetch], 0, 3);
          }
          const float v = kr.dot(W + static_cast<int64_t>(A[i]) * L.row_len, h, L.row_len) + b[A[i]];
          z[last ? i : static_cast<size_t>(A[i])] = v;
        }
      } else {
        z.resize(L.out_dim);
        for (int64_t i = 0; i < L.out_dim; ++i) z[i] = kr.dot(W + i * L.row_len, h, L.row_len) + b[i];
      }
    }
    if (!last) {
      if (dropout > 0.0f) ws.mask[l].resize(z.size());
      activate(L.spec.activation, z.data(), ws.mask[l].data(), static_cast<int64_t>(z.size()), dropout, rng);
    }
  }
}

}  // namespace

// ------------------------------------------------------------------ spec

void NetworkSpec::validate() const {
  auto bad = [](const std::string& k, const std::string& msg) { throw InvalidArgument(k + ": " + msg); };
  if (input_dim < 1) bad("input_dim", "must be >= 1, got " + std::to_string(input_dim));
  if (input_dim > INT32_MAX) bad("input_dim", "must fit in int32, got " + std::to_string(input_dim));
  if (layers.empty()) bad("layers", "at least one layer (the output layer) is needed");
  for (size_t i = 0; i < layers.size(); ++i) {
    const int l = static_cast<int>(i);
    const LayerSpec& s = layers[i];
    const bool last = i + 1 == layers.size();
    if (s.size < 1 || s.size > INT32_MAX) bad(key(l, "size"), "must be in [1, 2^31), got " + std::to_string(s.size));
    if (s.activation == Activation::Softmax && !last)
      bad(key(l, "activation"), "softmax is only allowed on the last (output) layer");
    if (last && s.activation != Activation::Softmax)
      bad(key(l, "activation"), "the output layer must use softmax");
    if (s.sampling == Sampling::Lsh) {
      if (i == 0) bad(key(l, "sampling"), "lsh is not allowed on layer 0 (its input is the sparse feature vector)");
      if (s.lsh.K < 1 || s.lsh.K > 32) bad(key(l, "K"), "must be in [1, 32], got " + std::to_string(s.lsh.K));
      if (s.lsh.L < 1 || s.lsh.L > 1024) bad(key(l, "L"), "must be in [1, 1024], got " + std::to_string(s.lsh.L));
      if (s.lsh.range_pow < 0 || s.lsh.range_pow > 30)
        bad(key(l, "range_pow"), "must be in [0, 30], got " + std::to_string(s.lsh.range_pow));
      if (s.lsh.bucket_capacity < 1)
        bad(key(l, "bucket_capacity"), "must be >= 1, got " + std::to_string(s.lsh.bucket_capacity));
      try {
        validate_lsh_params(s.lsh);
      } catch (const InvalidArgument& e) {
        bad("layers[" + std::to_string(l) + "]", e.what());
      }
      if (s.lsh.family != HashFamily::SimHash && s.lsh.bin_size > (i == 0 ? input_dim : layers[i - 1].size))
        bad(key(l, "bin_size"), std::to_string(s.lsh.bin_size) + " exceeds the layer's input dimension " +
                                    std::to_string(layers[i - 1].size));
      if (s.selection.threshold < 1) bad(key(l, "threshold"), "must be >= 1, got " + std::to_string(s.selection.threshold));
      if (s.selection.min_active < 0) bad(key(l, "min_active"), "must be >= 0");
      if (s.selection.max_active < 0) bad(key(l, "max_active"), "must be >= 0");
      if (s.selection.max_active > 0 && s.selection.min_active > s.selection.max_active)
        bad(key(l, "min_active"), std::to_string(s.selection.min_active) + " is larger than max_active=" +
                                      std::to_string(s.selection.max_active));
    }
  }
  if (!(adam.beta1 >= 0.0f && adam.beta1 < 1.0f)) bad("beta1", "must be in [0, 1), got " + std::to_string(adam.beta1));
  if (!(adam.beta2 >= 0.0f && adam.beta2 < 1.0f)) bad("beta2", "must be in [0, 1), got " + std::to_string(adam.beta2));
  if (!(adam.eps > 0.0f)) bad("eps", "must be > 0, got " + std::to_string(adam.eps));
  if (!(adam.weight_decay >= 0.0f) || !std::isfinite(adam.weight_decay))
    bad("weight_decay", "must be >= 0, got " + std::to_string(adam.weight_decay));
  if (!(lr > 0.0f) || !std::isfinite(lr)) bad("lr", "must be > 0, got " + std::to_string(lr));
  if (!(dropout >= 0.0f && dropout < 1.0f)) bad("dropout", "must be in [0, 1), got " + std::to_string(dropout));
  if (threads < 0) bad("threads", "must be >= 0 (0 = all cores), got " + std::to_string(threads));
  if (rebuild_first < 1) bad("rebuild_first", "must be >= 1, got " + std::to_string(rebuild_first));
  if (!(rebuild_decay >= 0.0) || !std::isfinite(rebuild_decay))
    bad("rebuild_decay", "must be >= 0, got " + std::to_string(rebuild_decay));
}

// ------------------------------------------------------------------ construction

Network::Network(const NetworkSpec& spec) : spec_(spec) {
  spec_.validate();
  threads_ = resolve_threads(spec_.threads);
  const size_t n = spec_.layers.size();
  layers_.resize(n);
  const bool hp = spec_.hugepages;
  for (size_t i = 0; i < n; ++i) {
    Layer& L = layers_[i];
    L.spec = spec_.layers[i];
    L.index = static_cast<int>(i);
    L.in_dim = i == 0 ? spec_.input_dim : spec_.layers[i - 1].size;
    L.out_dim = L.spec.size;
    L.sparse_input = i == 0;
    L.rows = L.sparse_input ? L.in_dim : L.out_dim;
    L.row_len = L.sparse_input ? L.out_dim : L.in_dim;
    const size_t w = static_cast<size_t>(L.rows) * static_cast<size_t>(L.row_len);
    L.weight = AlignedBuffer<float>(w, hp);
    L.weight_m = AlignedBuffer<float>(w, hp);
    L.weight_v = AlignedBuffer<float>(w, hp);
    L.bias = AlignedBuffer<float>(L.out_dim, hp);
    L.bias_m = AlignedBuffer<float>(L.out_dim, hp);
    L.bias_v = AlignedBuffer<float>(L.out_dim, hp);
    L.records = L.lsh() || L.out_dim <= kMaxRecordedWidth;
    if (L.records) {
      L.row_end = AlignedBuffer<int32_t>(L.rows, false);
    } else {
      L.weight_grad = AlignedBuffer<float>(w, hp);
      L.bias_grad = AlignedBuffer<float>(L.out_dim, hp);
      L.all_rows = !L.sparse_input;
      if (!L.all_rows) {
        L.row_touched = AlignedBuffer<uint8_t>(L.rows, false);
        L.touched_rows.reserve(L.rows);
      }
    }
    if (L.lsh()) {
      has_lsh_ = true;
      L.hash = HashFunction::create(L.spec.lsh, static_cast<int>(L.in_dim), stream_seed(spec_.seed, kHashSalt, i));
      L.tables = std::make_unique<LshTables>(L.spec.lsh, L.rows);
    }
  }
  init_weights();
  // Rough multiply-adds per sample (forward and backward), to decide when to go parallel.
  sample_work_ = 0;
  for (const Layer& L : layers_) {
    int64_t active = L.out_dim;
    if (L.lsh()) active = std::min<int64_t>(L.out_dim, std::max<int64_t>(L.spec.selection.min_active, 256));
    sample_work_ += (L.sparse_input ? 32 : active) * L.row_len * 3;
  }
  for (int t = 0; t < threads_; ++t) workspaces_.push_back(make_workspace(layers_, true, true));
  if (!has_lsh_ && layers_[0].records) {
    batch_ = std::make_unique<BatchMatrices>();
    batch_->out.resize(n);
    batch_->mask.resize(n);
    batch_->delta.resize(n);
    int64_t max_in = 0;
    for (const Layer& L : layers_) {
      batch_->width += L.out_dim;
      if (!L.sparse_input) max_in = std::max(max_in, L.in_dim);
    }
    batch_->grad.assign(threads_, std::vector<float>(static_cast<size_t>(kGradRows * max_in)));
  }
  if (has_lsh_) {
    rebuild_tables_locked();
    next_rebuild_ = schedule_after(0);
  }
}

Network::~Network() = default;

void Network::init_weights() {
  // Glorot normal (Glorot & Bengio, AISTATS 2010), std = sqrt(2 / (fan_in + fan_out)).
  // Each block of rows has its own stream, so the result does not depend on threads.
  for (Layer& L : layers_) {
    const float std_dev = std::sqrt(2.0f / static_cast<float>(L.in_dim + L.out_dim));
    const int64_t blocks = (L.rows + kInitBlock - 1) / kInitBlock;
    float* W = L.weight.data();
    const int64_t len = L.row_len;
    const uint64_t seed = stream_seed(spec_.seed, kInitSalt, static_cast<uint64_t>(L.index));
#pragma omp parallel for num_threads(threads_) schedule(static) if (L.rows * len > kParallelWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      Rng rng(stream_seed(seed, static_cast<uint64_t>(blk)));
      const int64_t begin = blk * kInitBlock * len;
      const int64_t end = std::min(L.rows, (blk + 1) * kInitBlock) * len;
      // Box-Muller, using both outputs of each pair of uniforms.
      for (int64_t j = begin; j < end; j += 2) {
        const float u1 = 1.0f - rng.uniform(), u2 = rng.uniform();
        const float rad = std_dev * std::sqrt(-2.0f * std::log(u1));
        const float ang = 6.2831853071795864f * u2;
        W[j] = rad * std::cos(ang);
        if (j + 1 < end) W[j + 1] = rad * std::sin(ang);
      }
    }
  }
}

// ------------------------------------------------------------------ validation

void Network::check_batch(const CsrView& x, const CsrView* y, const int64_t* rows, int64_t b) const {
  if (y && y->n != x.n)
    throw InvalidArgument("y_indptr describes " + std::to_string(y->n) + " samples but x_indptr describes " +
                          std::to_string(x.n));
  const int64_t out_dim = output_dim();
  auto check_row = [](const CsrView& c, const char* what, int64_t r, int64_t limit, const char* id_name,
                      const char* limit_name) {
    const int64_t s = c.indptr[r], e = c.indptr[r + 1];
    if (s < 0 || e < s || e > c.nnz)
      throw InvalidArgument(std::string(what) + "_indptr is not a valid CSR index pointer at sample " +
                            std::to_string(r) + ": indptr[" + std::to_string(r) + "]=" + std::to_string(s) +
                            ", indptr[" + std::to_string(r + 1) + "]=" + std::to_string(e) +
                            ", nnz=" + std::to_string(c.nnz));
    for (int64_t k = s; k < e; ++k) {
      const int32_t id = c.indices[k];
      if (id < 0 || id >= limit)
        throw InvalidArgument(std::string(what) + "_indices: " + id_name + " " + std::to_string(id) +
                              " in sample " + std::to_string(r) + " is out of range for " + limit_name + "=" +
                              std::to_string(limit));
      if (c.values && !std::isfinite(c.values[k]))
        throw InvalidArgument(std::string(what) + "_values: non-finite value " + std::to_string(c.values[k]) +
                              " in sample " + std::to_string(r) + " (feature " + std::to_string(id) + ")");
    }
  };
  for (int64_t i = 0; i < b; ++i) {
    const int64_t r = rows ? rows[i] : i;
    if (r < 0 || r >= x.n)
      throw InvalidArgument("rows[" + std::to_string(i) + "] = " + std::to_string(r) + " is out of range for " +
                            std::to_string(x.n) + " samples");
    check_row(x, "x", r, spec_.input_dim, "feature id", "input_dim");
    if (y) check_row(*y, "y", r, out_dim, "label id", "output size");
  }
}

// ------------------------------------------------------------------ training

namespace {

// Forward, softmax cross-entropy and backward for one sample; accumulates gradients
// into `rec` (record layers) or the layers' shared buffers (lock-free layers) and returns
// the sample's loss.
float train_sample(std::vector<Layer>& layers, Network::Workspace& ws, Network::SampleRecord& rec,
                   const Kernels& kr, const CsrView& x, const CsrView& y, int64_t r, float inv_b, float dropout,
                   Rng& rng, const Rng& shared_fill, const std::vector<int32_t>& batch_labels,
                   const std::vector<float>& batch_q) {
  rec.clear();
  // Sorted unique labels: the target puts mass 1/|y| on each.
  ws.labels.assign(y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
  if (ws.labels.empty()) return 0.0f;
  std::sort(ws.labels.begin(), ws.labels.end());
  ws.labels.erase(std::unique(ws.labels.begin(), ws.labels.end()), ws.labels.end());
  const int n_lab = static_cast<int>(ws.labels.size());

  const int32_t* feat = x.indices + x.indptr[r];
  const float* val = x.values + x.indptr[r];
  const int64_t nnz = x.indptr[r + 1] - x.indptr[r];
  const int nl = static_cast<int>(layers.size());
  Layer& out = layers[nl - 1];
  const bool sampled = out.lsh();
  // A hash-sampled output layer also scores every other label of the batch (in-batch
  // negatives, as in Yi et al., RecSys 2019; weighted below when the label frequencies are
  // known, unweighted otherwise, and hash candidates always unweighted). The
  // labels that appear most often are then negatives in nearly every batch and get the
  // gradient a full softmax would give them, instead of one only when the uniform fill hits
  // them: without this a short run ranks the most frequent labels first for every input.
  // They do not count against min_active / max_active. min_active = 0 turns them off.
  SelectionParams sel = out.spec.selection;
  const int32_t* forced = ws.labels.data();
  int n_forced = n_lab;
  ws.forced_q.clear();  // this sample's, never a previous batch's (its batch may have no labels)
  if (sampled && sel.min_active > 0 && !batch_labels.empty()) {
    ws.forced.assign(ws.labels.begin(), ws.labels.end());
    const bool weighted = !batch_q.empty();
    for (size_t i = 0; i < batch_labels.size(); ++i) {
      const int32_t j = batch_labels[i];
      if (std::binary_search(ws.labels.begin(), ws.labels.end(), j)) continue;
      ws.forced.push_back(j);
      if (weighted) ws.forced_q.push_back(batch_q[i]);
    }
    forced = ws.forced.data();
    n_forced = static_cast<int>(ws.forced.size());
    sel.min_active += n_forced;
    if (sel.max_active > 0) sel.max_active += n_forced;
  }
  forward(layers, ws, kr, feat, val, nnz, forced, n_forced, true, dropout, rng, -1, &shared_fill, &sel);

  std::vector<float>& z = ws.out[nl - 1];
  const std::vector<int32_t>& A = ws.active[nl - 1];
  const size_t m = z.size();

  // The random fill stands for every neuron outside the labels and the hash candidates: each
  // of its n_fill members, drawn uniformly from those N - chosen neurons, gets weight
  // (N - chosen) / n_fill in the softmax normaliser (a log-weight on its logit). This is the
  // sampled-softmax correction for uniform proposals (Bengio & Senecal, IEEE TNN 2008; Jean et
  // al., ACL 2015): the normaliser then estimates the full one, so the far more numerous
  // unsampled labels push scores down as they would in a full softmax. Without it a wide layer
  // drifts to scoring its most frequent labels first for every input.
  if (sampled) {
    const int64_t n_fill = ws.samplers[nl - 1]->filled();
    const int64_t chosen = static_cast<int64_t>(m) - n_fill;
    double fill_rate = 1.0;  // chance that a neuron outside the chosen ones is in the fill
    if (n_fill > 0 && out.out_dim - chosen > n_fill) {
      fill_rate = static_cast<double>(n_fill) / static_cast<double>(out.out_dim - chosen);
      const float log_w = static_cast<float>(-std::log(fill_rate));
      for (size_t i = static_cast<size_t>(chosen); i < m; ++i) z[i] += log_w;
    } else if (n_fill == 0) {
      fill_rate = std::min(1.0, static_cast<double>(m) / static_cast<double>(out.out_dim));
    }
    // The same correction for the batch's other labels (logQ correction of in-batch
    // negatives, Yi et al., RecSys 2019): label j is here with probability q_j (it is a label
    // of another sample of the batch, from its training frequency, or else drawn in the fill),
    // so it stands for 1/q_j such labels. Unweighted, a rare label is pushed down as a
    // negative far less often than a full softmax would and, with many labels per point, ends
    // up scored above the frequent ones as training goes on.
    if (!ws.forced_q.empty()) {
      for (size_t i = 0; i < ws.forced_q.size(); ++i) {
        const double qb = ws.forced_q[i];
        const double q = qb + (1.0 - qb) * fill_rate;
        z[static_cast<size_t>(n_lab) + i] -= static_cast<float>(std::log(q));
      }
    }
  }
  // Softmax over the active set, in a numerically safe form.
  float mx = z[0];
  for (size_t i = 1; i < m; ++i) mx = std::max(mx, z[i]);
  std::vector<float>& d = ws.delta[nl - 1];
  d.resize(m);
  double sum = 0.0;
  for (size_t i = 0; i < m; ++i) {
    d[i] = std::exp(z[i] - mx);
    sum += d[i];
  }
  const float inv_sum = static_cast<float>(1.0 / sum);
  const float log_sum = static_cast<float>(std::log(sum));
  for (size_t i = 0; i < m; ++i) d[i] *= inv_sum * inv_b;
  const float t = 1.0f / static_cast<float>(n_lab);
  float loss = 0.0f;
  for (int j = 0; j < n_lab; ++j) {
    // The sampler puts the forced labels first, in order; the dense layer indexes by id.
    size_t pos = static_cast<size_t>(ws.labels[j]);
    if (sampled) {
      pos = static_cast<size_t>(j);
      if (pos >= A.size() || A[pos] != ws.labels[j])
        pos = static_cast<size_t>(std::find(A.begin(), A.end(), ws.labels[j]) - A.begin());
      if (pos >= A.size()) throw Error("internal error: a true label is missing from the active set");
    }
    loss -= t * (z[pos] - mx - log_sum);
    d[pos] -= t * inv_b;
  }

  // Backward, last layer first, over active neurons only.
  for (int l = nl - 1; l >= 0; --l) {
    Layer& L = layers[l];
    const bool last = l == nl - 1;
    const std::vector<float>& dl = ws.delta[l];
    float* Wg = L.weight_grad.data();
    float* bg = L.bias_grad.data();
    if (L.sparse_input) {
      if (L.records) {
        rec.rows[l].assign(feat, feat + nnz);
        rec.coef[l].assign(val, val + nnz);
        rec.vec[l].assign(dl.begin(), dl.begin() + L.out_dim);
      } else {
        for (int64_t k = 0; k < nnz; ++k) {
          kr.axpy(val[k], dl.data(), Wg + static_cast<int64_t>(feat[k]) * L.row_len, L.row_len);
          mark_row(L, feat[k], ws.touched[l]);
        }
        for (int64_t j = 0; j < L.out_dim; ++j) bg[j] += dl[j];
      }
      continue;
    }
    const float* h = ws.out[l - 1].data();
    const float* W = L.weight.data();
    std::vector<float>& dh = ws.delta[l - 1];
    dh.assign(L.in_dim, 0.0f);
    if (L.records) {
      // Only dL/dh needs the weights now; the row gradients are formed by the optimizer.
      std::vector<int32_t>& rr = rec.rows[l];
      std::vector<float>& rc = rec.coef[l];
      rec.vec[l].assign(h, h + L.in_dim);
      if (L.lsh()) {
        const std::vector<int32_t>& act = ws.active[l];
        const size_t na = act.size();
        for (size_t i = 0; i < na; ++i) {
          if (i + kPrefetch < na) prefetch_row(W + static_cast<int64_t>(act[i + kPrefetch]) * L.row_len, L.row_len);
          const int32_t n = act[i];
          const float dn = last ? dl[i] : dl[n];
          if (dn == 0.0f) continue;
          rr.push_back(n);
          rc.push_back(dn);
          kr.axpy(dn, W + static_cast<int64_t>(n) * L.row_len, dh.data(), L.row_len);
        }
      } else {
        for (int64_t n = 0; n < L.out_dim; ++n) {
          const float dn = dl[n];
          if (dn == 0.0f) continue;
          rr.push_back(static_cast<int32_t>(n));
          rc.push_back(dn);
          kr.axpy(dn, W + n * L.row_len, dh.data(), L.row_len);
        }
      }
    } else {
      for (int64_t i = 0; i < L.out_dim; ++i) {
        const float dn = dl[i];
        if (dn == 0.0f) continue;
        kr.backprop_row(dn, h, W + i * L.row_len, Wg + i * L.row_len, dh.data(), L.row_len);
        bg[i] += dn;
      }
    }
    // Through the previous layer's dropout and activation.
    backprop_activation(layers[l - 1].spec.activation, ws.out[l - 1].data(),
                        dropout > 0.0f ? ws.mask[l - 1].data() : nullptr, dh.data(), L.in_dim);
  }
  return loss;
}

}  // namespace

float Network::train_batch(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (b <= 0) return 0.0f;
  // lr = 0 is allowed: a schedule may decay the rate to nothing (moments still advance).
  if (!(lr >= 0.0f) || !std::isfinite(lr)) throw InvalidArgument("lr: must be >= 0 and finite, got " + std::to_string(lr));
  if (batched_for(b)) return train_batch_layerwise(x, y, rows, b, lr);
  const int64_t t = step_ + 1;
  const Kernels& kr = kernels();
  const float inv_b = 1.0f / static_cast<float>(b);
  const float dropout = spec_.dropout;
  while (static_cast<int64_t>(records_.size()) < b) records_.push_back(std::make_unique<SampleRecord>(layers_.size()));
  // One parallel region per batch (barriers are costly when cores are shared); the calling
  // thread polls for Ctrl-C between its samples.
  InterruptPoller poller;
  ExceptionCatcher catcher;
  double total = 0.0;
  std::vector<Layer>& layers = layers_;
  const Rng shared_fill(stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(t)));
  // The batch's labels, sorted and unique (in-batch negatives of a hash-sampled output layer).
  std::vector<int32_t>& batch_labels = batch_labels_;
  std::vector<float>& batch_q = batch_q_;
  batch_labels.clear();
  batch_q.clear();
  const SelectionParams& out_sel = layers_.back().spec.selection;
  // Only for layers more than kInBatchWidth times wider than their active sets: in a layer
  // not much wider, the fill and hash candidates already reach every frequent label. Measured
  // on 20K-label synthetic data (hidden 128, min_active 1000, max_active 4000, 4 epochs):
  // test P@1 0.51 with the batch's labels as negatives against 0.17 without (frequent labels
  // are then pushed up by their positives far more often than down as negatives, and rank
  // first for every input); a dense output layer reaches 0.575.
  const int64_t widest_set = std::max<int64_t>(out_sel.min_active, out_sel.max_active);
  if (layers_.back().lsh() && out_sel.min_active > 0 && layers_.back().out_dim > kInBatchWidth * widest_set) {
    for (int64_t i = 0; i < b; ++i) {
      const int64_t r = rows[i];
      batch_labels.insert(batch_labels.end(), y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
    }
    // Many labels per point (Delicious: ~75) would make every active set huge: keep at most
    // max_active of them, taken from the label occurrences in a shared random order, so that
    // frequent labels (the ones that need the negatives) are the likeliest to stay.
    const size_t cap = static_cast<size_t>(out_sel.max_active > 0 ? out_sel.max_active : INT32_MAX);
    std::vector<int32_t>& occ = batch_occurrences_;
    occ.assign(batch_labels.begin(), batch_labels.end());
    std::sort(batch_labels.begin(), batch_labels.end());
    batch_labels.erase(std::unique(batch_labels.begin(), batch_labels.end()), batch_labels.end());
    double draw_share = 1.0;  // share of the occurrences drawn to fill the cap
    if (batch_labels.size() > cap) {
      Rng pick(stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(t), 1));
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
    // Inclusion probabilities for the sampling correction in train_sample: label j is a label
    // of one of the other b - 1 samples with probability 1 - (1 - f_j)^(b-1) (f_j: its share
    // of the training points), and survives the cap with probability 1 - (1 - draw_share)^c_j
    // (c_j: its occurrences in this batch).
    if (!label_freq_.empty()) {
      if (draw_share < 1.0) std::sort(occ.begin(), occ.end());  // counted only after a cap
      batch_q.resize(batch_labels.size());
      const double others = static_cast<double>(b - 1);
      for (size_t i = 0; i < batch_labels.size(); ++i) {
        const int32_t j = batch_labels[i];
        const double f = std::min(static_cast<double>(label_freq_[static_cast<size_t>(j)]), 1.0 - 1e-9);
        double q = -std::expm1(others * std::log1p(-f));
        if (draw_share < 1.0) {
          const auto range = std::equal_range(occ.begin(), occ.end(), j);
          const double c = static_cast<double>(range.second - range.first);
          q *= -std::expm1(c * std::log1p(-draw_share));
        }
        batch_q[i] = static_cast<float>(q);
      }
    }
  }
#pragma omp parallel num_threads(threads_) reduction(+ : total) if (b * sample_work_ > kParallelWork)
  {
    Workspace& ws = *workspaces_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < b; ++i) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        Rng rng(stream_seed(spec_.seed, kTrainSalt, static_cast<uint64_t>(t), static_cast<uint64_t>(i)));
        total += train_sample(layers, ws, *records_[i], kr, x, y, rows[i], inv_b, dropout, rng, shared_fill,
                              batch_labels, batch_q);
      });
    }
  }
  try {
    catcher.rethrow();
  } catch (...) {
    discard_gradients();
    throw;
  }
  if (poller.stopped()) {
    discard_gradients();
    throw Interrupted();
  }
  apply_adam(lr, t, b);
  step_ = t;
  if (has_lsh_ && step_ >= next_rebuild_) {
    rebuild_tables_locked();
    next_rebuild_ = schedule_after(step_);
  }
  return static_cast<float>(total / static_cast<double>(b));
}

bool Network::batched_for(int64_t b) const noexcept {
  return batch_ && b <= kMaxBatchFloats / (3 * batch_->width);
}

float Network::train_batch_layerwise(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr) {
  const int64_t t = step_ + 1;
  const Kernels& kr = kernels();
  const int nl = static_cast<int>(layers_.size());
  const float inv_b = 1.0f / static_cast<float>(b);
  const float dropout = spec_.dropout;
  BatchMatrices& M = *batch_;
  for (int l = 0; l < nl; ++l) {
    const size_t n = static_cast<size_t>(b) * static_cast<size_t>(layers_[l].out_dim);
    M.out[l].resize(n);
    M.delta[l].resize(n);
    if (l + 1 < nl && dropout > 0.0f) M.mask[l].resize(n);
  }
  M.loss.assign(static_cast<size_t>(b), 0.0f);
  M.rng.resize(static_cast<size_t>(b));
  while (static_cast<int64_t>(records_.size()) < b) records_.push_back(std::make_unique<SampleRecord>(layers_.size()));
  const AdamStep sw = make_adam_step(spec_.adam, lr, t, true);
  const AdamStep sb = make_adam_step(spec_.adam, lr, t, false);
  std::vector<Layer>& layers = layers_;
  Layer& first = layers[0];
  const int64_t w0 = first.out_dim;
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (b * sample_work_ > kParallelWork)
  {
    float* grad = M.grad[omp_get_thread_num()].data();
    // Layer 0 reads the sparse input: one sample at a time, into row i of the batch matrix.
    // Everything that may allocate happens here, before any weight changes.
#pragma omp for schedule(dynamic, 4)
    for (int64_t i = 0; i < b; ++i) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        const int64_t r = rows[i], s = x.indptr[r], nnz = x.indptr[r + 1] - s;
        SampleRecord& rec = *records_[i];
        rec.clear();
        rec.labels.assign(y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
        std::sort(rec.labels.begin(), rec.labels.end());
        rec.labels.erase(std::unique(rec.labels.begin(), rec.labels.end()), rec.labels.end());
        if (!rec.labels.empty()) {
          // Layer 0's rows are the sample's features (gradient: value x output delta).
          rec.rows[0].assign(x.indices + s, x.indices + s + nnz);
          rec.coef[0].assign(x.values + s, x.values + s + nnz);
          rec.vec[0].resize(static_cast<size_t>(w0));
        }
        M.rng[i] = Rng(stream_seed(spec_.seed, kTrainSalt, static_cast<uint64_t>(t), static_cast<uint64_t>(i)));
        float* z = M.out[0].data() + i * w0;
        std::copy(first.bias.data(), first.bias.data() + w0, z);
        for (int64_t k = 0; k < nnz; ++k)
          kr.axpy(x.values[s + k], first.weight.data() + static_cast<int64_t>(x.indices[s + k]) * first.row_len, z, w0);
        if (nl > 1)
          activate(first.spec.activation, z, dropout > 0.0f ? M.mask[0].data() + i * w0 : nullptr, w0, dropout,
                   M.rng[i]);
      });
    }
    // After the loop's barrier every thread sees the same flags: the batch goes on (and can no
    // longer fail) or is abandoned with the weights untouched.
    if (!catcher.failed() && !poller.stopped()) {
      // Forward through the dense layers: Z = H W^T + bias, by blocks of weight rows.
      for (int l = 1; l < nl; ++l) {
        const Layer& L = layers[l];
        const int64_t out = L.out_dim, in = L.in_dim;
        const float* H = M.out[l - 1].data();
        float* Z = M.out[l].data();
        const int64_t blocks = (out + kForwardRows - 1) / kForwardRows;
#pragma omp for schedule(dynamic, 1)
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t j0 = blk * kForwardRows, nj = std::min(kForwardRows, out - j0);
          kr.matmul_bt(H, in, L.weight.data() + j0 * in, in, Z + j0, out, b, nj, in);
          const float* bias = L.bias.data() + j0;
          for (int64_t i = 0; i < b; ++i) {
            float* z = Z + i * out + j0;
            for (int64_t j = 0; j < nj; ++j) z[j] += bias[j];
          }
        }
        if (l + 1 < nl) {
#pragma omp for schedule(static)
          for (int64_t i = 0; i < b; ++i)
            activate(L.spec.activation, Z + i * out, dropout > 0.0f ? M.mask[l].data() + i * out : nullptr, out,
                     dropout, M.rng[i]);
        }
      }
      // Softmax cross-entropy per sample: delta = (softmax - target) / b, target mass 1/|y|.
      {
        const int64_t out = layers[nl - 1].out_dim;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < b; ++i) {
          const std::vector<int32_t>& lab = records_[i]->labels;
          const float* z = M.out[nl - 1].data() + i * out;
          float* d = M.delta[nl - 1].data() + i * out;
          if (lab.empty()) {
            std::fill(d, d + out, 0.0f);
            continue;
          }
          float mx = z[0];
          for (int64_t j = 1; j < out; ++j) mx = std::max(mx, z[j]);
          const double sum = kr.exp_store(z, out, mx, d);
          const float scale = static_cast<float>(1.0 / sum) * inv_b;
          for (int64_t j = 0; j < out; ++j) d[j] *= scale;
          const float log_sum = static_cast<float>(std::log(sum));
          const float tm = 1.0f / static_cast<float>(lab.size());
          float loss = 0.0f;
          for (int32_t c : lab) {
            loss -= tm * (z[c] - mx - log_sum);
            d[c] -= tm * inv_b;
          }
          M.loss[i] = loss;
        }
      }
      // Backward, last layer first.
      for (int l = nl - 1; l >= 1; --l) {
        Layer& L = layers[l];
        const int64_t out = L.out_dim, in = L.in_dim;
        const float* D = M.delta[l].data();
        const float* H = M.out[l - 1].data();
        float* dH = M.delta[l - 1].data();
        // dL/dH = D W, with the weights as they were before this batch.
        const int64_t sblocks = (b + kBackSamples - 1) / kBackSamples;
        const int64_t cblocks = (in + kBackCols - 1) / kBackCols;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < sblocks * cblocks; ++task) {
          const int64_t s0 = (task / cblocks) * kBackSamples, c0 = (task % cblocks) * kBackCols;
          kr.matmul(D + s0 * out, out, 1, L.weight.data() + c0, in, dH + s0 * in + c0, in,
                    std::min(kBackSamples, b - s0), std::min(kBackCols, in - c0), out);
        }
        // (barrier) Through the previous layer's activation and dropout.
        const Activation act = layers[l - 1].spec.activation;
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < b; ++i)
          backprop_activation(act, H + i * in, dropout > 0.0f ? M.mask[l - 1].data() + i * in : nullptr, dH + i * in,
                              in);
        // Each weight row's gradient (row j: sum over samples of D[s][j] H[s]) goes straight
        // into its fused Adam step; every row of a dense layer is touched by the batch.
        float* W = L.weight.data();
        float* Wm = L.weight_m.data();
        float* Wv = L.weight_v.data();
        float* bias = L.bias.data();
        float* bm = L.bias_m.data();
        float* bv = L.bias_v.data();
        const int64_t rblocks = (out + kGradRows - 1) / kGradRows;
#pragma omp for schedule(dynamic, 1)
        for (int64_t blk = 0; blk < rblocks; ++blk) {
          const int64_t j0 = blk * kGradRows, nj = std::min(kGradRows, out - j0);
          kr.matmul(D + j0, 1, out, H, in, grad, in, nj, in, b);
          for (int64_t jj = 0; jj < nj; ++jj) {
            const int64_t j = j0 + jj;
            float gb = 0.0f;
            for (int64_t i = 0; i < b; ++i) gb += D[i * out + j];
            kr.adam(W + j * in, Wm + j * in, Wv + j * in, grad + jj * in, in, sw);
            adam_scalar(bias[j], bm[j], bv[j], gb, sb);
          }
        }
      }
      // Layer 0's output deltas into the samples' records (sized above: no allocation).
#pragma omp for schedule(static)
      for (int64_t i = 0; i < b; ++i) {
        std::vector<float>& v = records_[i]->vec[0];
        if (!v.empty()) std::copy(M.delta[0].data() + i * w0, M.delta[0].data() + (i + 1) * w0, v.begin());
      }
    }
  }
  catcher.rethrow();  // only the first loop can fail, before any weight changed
  if (poller.stopped()) throw Interrupted();
  apply_adam_records(first, b, sw, sb);
  step_ = t;
  double total = 0.0;
  for (int64_t i = 0; i < b; ++i) total += M.loss[i];
  return static_cast<float>(total / static_cast<double>(b));
}

void Network::apply_adam(float lr, int64_t t, int64_t b) {
  const Kernels& kr = kernels();
  const AdamStep sw = make_adam_step(spec_.adam, lr, t, true);
  const AdamStep sb = make_adam_step(spec_.adam, lr, t, false);
  for (Layer& L : layers_) {
    if (L.records) {
      apply_adam_records(L, b, sw, sb);
      continue;
    }
    float* W = L.weight.data();
    float* M = L.weight_m.data();
    float* V = L.weight_v.data();
    float* G = L.weight_grad.data();
    float* bias = L.bias.data();
    float* bm = L.bias_m.data();
    float* bv = L.bias_v.data();
    float* bg = L.bias_grad.data();
    const int64_t len = L.row_len;
    const bool row_bias = !L.sparse_input;  // a neuron's bias travels with its row
    if (L.all_rows) {
      const int64_t n = L.rows;
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * len > kParallelWork)
      for (int64_t r = 0; r < n; ++r) {
        kr.adam(W + r * len, M + r * len, V + r * len, G + r * len, len, sw);
        adam_scalar(bias[r], bm[r], bv[r], bg[r], sb);
      }
    } else {
      uint8_t* mk = L.row_touched.data();
      size_t total = 0;
      for (auto& ws : workspaces_) total += ws->touched[L.index].size();
      auto update = [&](int64_t r) {
        kr.adam(W + r * len, M + r * len, V + r * len, G + r * len, len, sw);
        if (row_bias) adam_scalar(bias[r], bm[r], bv[r], bg[r], sb);
        mk[r] = 0;
      };
      if (static_cast<int64_t>(total) * 16 >= L.rows) {
        // Many rows touched: scan the markers instead of the lists, so the four arrays are
        // walked in ascending order (hardware prefetch) rather than at random.
        const int64_t n = L.rows;
        const int64_t block = 4096;
        const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 4) if (static_cast<int64_t>(total) * len > kParallelWork)
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t end = std::min(n, (blk + 1) * block);
          for (int64_t r = blk * block; r < end; ++r)
            if (mk[r]) update(r);
        }
      } else {
        std::vector<int32_t>& list = L.touched_rows;
        list.clear();
        for (auto& ws : workspaces_) {
          const std::vector<int32_t>& mine = ws->touched[L.index];
          list.insert(list.end(), mine.begin(), mine.end());
        }
        const int64_t n = static_cast<int64_t>(list.size());
        const int32_t* rows = list.data();
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * len > kParallelWork)
        for (int64_t i = 0; i < n; ++i) update(rows[i]);
      }
      for (auto& ws : workspaces_) ws->touched[L.index].clear();
    }
    if (!row_bias) {
      // Layer 0's biases belong to its outputs, which every sample computes.
      const int64_t n = L.out_dim;
#pragma omp parallel for num_threads(threads_) schedule(static) if (n > kParallelWork)
      for (int64_t j = 0; j < n; ++j) adam_scalar(bias[j], bm[j], bv[j], bg[j], sb);
    }
  }
}

void Network::apply_adam_records(Layer& L, int64_t b, const AdamStep& sw, const AdamStep& sb) {
  const Kernels& kr = kernels();
  const int li = L.index;
  // Group the batch's (row, sample, coef) entries by row: counting sort into row_end,
  // samples in batch order, so each row's gradient is summed in a fixed order.
  int32_t* end = L.row_end.data();
  int64_t entries = 0;
  for (int64_t s = 0; s < b; ++s)
    for (int32_t r : records_[s]->rows[li]) ++end[r];
  for (int64_t r = 0; r < L.rows; ++r) {
    const int32_t c = end[r];
    end[r] = static_cast<int32_t>(entries);
    entries += c;
  }
  if (entries > INT32_MAX) throw Error("batch too large: more than 2^31 gradient entries in one layer");
  L.entry_sample.resize(entries);
  L.entry_coef.resize(entries);
  int32_t* es = L.entry_sample.data();
  float* ec = L.entry_coef.data();
  for (int64_t s = 0; s < b; ++s) {
    const std::vector<int32_t>& rr = records_[s]->rows[li];
    const std::vector<float>& rc = records_[s]->coef[li];
    for (size_t k = 0; k < rr.size(); ++k) {
      const int32_t pos = end[rr[k]]++;
      es[pos] = static_cast<int32_t>(s);
      ec[pos] = rc[k];
    }
  }
  // Now row r's entries are [end[r-1], end[r]) (end[-1] = 0). One fused pass per touched
  // row, in ascending row order: gradient from the records, both moments, the weights.
  std::vector<const float*>& vecs = vec_ptrs_;
  vecs.resize(b);
  for (int64_t s = 0; s < b; ++s) vecs[s] = records_[s]->vec[li].data();
  float* W = L.weight.data();
  float* M = L.weight_m.data();
  float* V = L.weight_v.data();
  float* bias = L.bias.data();
  float* bm = L.bias_m.data();
  float* bv = L.bias_v.data();
  const int64_t len = L.row_len;
  const bool row_bias = !L.sparse_input;
  const int64_t n = L.rows;
  const int64_t block = 4096;
  const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel num_threads(threads_) if (entries * len > kParallelWork)
  {
    Workspace& ws = *workspaces_[omp_get_thread_num()];
    float* g = ws.grad_row.data();
    std::vector<int32_t>& todo = ws.adam_rows;
#pragma omp for schedule(dynamic, 2)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t last = std::min(n, (blk + 1) * block);
      todo.clear();
      for (int64_t r = blk * block; r < last; ++r)
        if ((r == 0 ? 0 : end[r - 1]) != end[r]) todo.push_back(static_cast<int32_t>(r));
      const size_t nt = todo.size();
      for (size_t q = 0; q < nt; ++q) {
        // Touched rows are sparse in a matrix far larger than the caches: prefetch ahead.
        if (q + 2 < nt) {
          const int64_t off = static_cast<int64_t>(todo[q + 2]) * len;
          prefetch_row(W + off, len);
          prefetch_row(M + off, len);
          prefetch_row(V + off, len);
        }
        const int64_t r = todo[q];
        const int32_t e0 = r == 0 ? 0 : end[r - 1], e1 = end[r];
        float gb = 0.0f;
        std::fill(g, g + len, 0.0f);
        for (int32_t e = e0; e < e1; ++e) {
          kr.axpy(ec[e], vecs[es[e]], g, len);
          gb += ec[e];
        }
        kr.adam(W + r * len, M + r * len, V + r * len, g, len, sw);
        if (row_bias) adam_scalar(bias[r], bm[r], bv[r], gb, sb);
      }
    }
  }
  std::memset(end, 0, sizeof(int32_t) * static_cast<size_t>(n));
  if (!row_bias) {
    // Layer 0's bias gradient is the sum of the samples' output deltas.
    float* g = workspaces_[0]->grad_row.data();
    std::fill(g, g + L.out_dim, 0.0f);
    for (int64_t s = 0; s < b; ++s)
      if (!records_[s]->vec[li].empty()) kr.axpy(1.0f, vecs[s], g, L.out_dim);
    for (int64_t j = 0; j < L.out_dim; ++j) adam_scalar(bias[j], bm[j], bv[j], g[j], sb);
  }
}

void Network::discard_gradients() {
  for (Layer& L : layers_) {
    if (L.records) continue;  // records are rebuilt by every sample
    const int64_t len = L.row_len;
    if (L.all_rows) {
      std::memset(L.weight_grad.data(), 0, L.weight_grad.bytes());
    } else {
      for (auto& ws : workspaces_) {
        for (int32_t r : ws->touched[L.index]) {
          std::memset(L.weight_grad.data() + static_cast<int64_t>(r) * len, 0, sizeof(float) * len);
          L.row_touched[r] = 0;
        }
        ws->touched[L.index].clear();
      }
    }
    std::memset(L.bias_grad.data(), 0, L.bias_grad.bytes());
  }
}

// ------------------------------------------------------------------ hash tables

int64_t Network::schedule_after(int64_t step) const {
  // Rebuild steps: r1 = rebuild_first, r_{i+1} = r_i + rebuild_first * exp(i * decay).
  // Recomputed from the step alone, so a restored step resumes the same schedule.
  double gap = static_cast<double>(spec_.rebuild_first);
  int64_t r = spec_.rebuild_first;
  const double growth = std::exp(spec_.rebuild_decay);
  while (r <= step) {
    gap *= growth;
    if (gap > 1e15) return INT64_MAX;
    r += std::max<int64_t>(1, std::llround(gap));
  }
  return r;
}

void Network::rebuild_tables() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  rebuild_tables_locked();
}

void Network::rebuild_tables_locked() {
  for (Layer& L : layers_) {
    if (!L.lsh()) continue;
    L.tables->build(*L.hash, L.weight.data(), L.rows, L.row_len, threads_,
                    stream_seed(spec_.seed, kTableSalt, static_cast<uint64_t>(L.index), static_cast<uint64_t>(step_)));
  }
}

void Network::set_step(int64_t step) {
  if (step < 0) throw InvalidArgument("step: must be >= 0, got " + std::to_string(step));
  std::unique_lock<std::shared_mutex> lock(mutex_);
  step_ = step;
  next_rebuild_ = has_lsh_ ? schedule_after(step) : -1;
}

void Network::set_label_frequencies(const float* freq, int64_t n) {
  if (n != 0 && n != output_dim())
    throw InvalidArgument("label frequencies: expected " + std::to_string(output_dim()) +
                          " values (one per label), got " + std::to_string(n));
  for (int64_t j = 0; j < n; ++j)
    if (!(freq[j] >= 0.0f && freq[j] <= 1.0f))
      throw InvalidArgument("label frequencies: value " + std::to_string(freq[j]) + " of label " +
                            std::to_string(j) + " is not in [0, 1]");
  std::unique_lock<std::shared_mutex> lock(mutex_);
  label_freq_.assign(freq, freq + n);
}

// ------------------------------------------------------------------ prediction

namespace {

using Scored = std::pair<float, int32_t>;
// "Better" = higher score, ties to the lower label id; a top-k heap keeps its worst in front.
inline bool better(const Scored& a, const Scored& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}
inline void heap_offer(std::vector<Scored>& heap, size_t k, Scored c) {
  if (heap.size() < k) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), better);
  } else if (better(c, heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), better);
    heap.back() = c;
    std::push_heap(heap.begin(), heap.end(), better);
  }
}

}  // namespace

void Network::predict_exact_blocked(const CsrView& x, int k, int32_t* out_labels, float* out_scores) const {
  // The output matrix is far larger than the caches, so a per-sample pass over it is bound
  // by memory bandwidth: a block of samples shares each pass (every row is read once per
  // block), with an online softmax normaliser and top-k per sample.
  constexpr int64_t kBlock = 16;
  constexpr int64_t kRowChunk = 1024;
  const Kernels& kr = kernels();
  const int nl = static_cast<int>(layers_.size());
  const Layer& out = layers_.back();
  const int64_t len = out.row_len, N = out.out_dim;
  const float* W = out.weight.data();
  const float* bias = out.bias.data();
  const int64_t blocks = (x.n + kBlock - 1) / kBlock;
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (x.n * sample_work_ > kParallelWork)
  {
    std::unique_ptr<Workspace> wsp;
    std::vector<float> H, Z;
    std::vector<std::vector<Scored>> heaps(kBlock);
    catcher.run([&] {
      wsp = make_workspace(layers_, false, false);
      H.resize(kBlock * len);
      Z.resize(kBlock * kRowChunk);
    });
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        const int64_t s0 = blk * kBlock, ns = std::min(kBlock, x.n - s0);
        for (int64_t s = 0; s < ns; ++s) {
          const int64_t i = s0 + s, a = x.indptr[i];
          Rng rng(0);  // unused: no sampling and no dropout here
          forward(layers_, *wsp, kr, x.indices + a, x.values + a, x.indptr[i + 1] - a, nullptr, 0, false, 0.0f, rng,
                  nl - 1);
          std::copy(wsp->out[nl - 2].begin(), wsp->out[nl - 2].end(), H.begin() + s * len);
          heaps[s].clear();
        }
        float mx[kBlock];
        double sum[kBlock];
        for (int64_t s = 0; s < ns; ++s) {
          mx[s] = -INFINITY;
          sum[s] = 0.0;
        }
        for (int64_t c = 0; c < N; c += kRowChunk) {
          const int64_t cl = std::min(kRowChunk, N - c);
          float d[kBlock];
          for (int64_t r = 0; r < cl; ++r) {
            const float* w = W + (c + r) * len;
            if (r + 4 < cl) prefetch_row(w + 4 * len, len);
            kr.dot_multi(w, H.data(), len, ns, len, d);
            for (int64_t s = 0; s < ns; ++s) Z[s * kRowChunk + r] = d[s] + bias[c + r];
          }
          for (int64_t s = 0; s < ns; ++s) {
            const float* z = Z.data() + s * kRowChunk;
            float cm = mx[s];
            for (int64_t r = 0; r < cl; ++r) cm = std::max(cm, z[r]);
            if (cm > mx[s]) {
              sum[s] *= std::exp(static_cast<double>(mx[s]) - cm);
              mx[s] = cm;
            }
            sum[s] += kr.exp_sum(z, cl, cm);
            std::vector<Scored>& heap = heaps[s];
            for (int64_t r = 0; r < cl; ++r)
              if (heap.size() < static_cast<size_t>(k) || z[r] >= heap.front().first)
                heap_offer(heap, k, Scored(z[r], static_cast<int32_t>(c + r)));
          }
        }
        for (int64_t s = 0; s < ns; ++s) {
          std::vector<Scored>& heap = heaps[s];
          std::sort_heap(heap.begin(), heap.end(), better);
          int32_t* lab = out_labels + (s0 + s) * k;
          float* sc = out_scores + (s0 + s) * k;
          for (int j = 0; j < k; ++j) {
            lab[j] = j < static_cast<int>(heap.size()) ? heap[j].second : -1;
            sc[j] = j < static_cast<int>(heap.size()) ? static_cast<float>(std::exp(heap[j].first - mx[s]) / sum[s]) : 0.0f;
          }
        }
      });
    }
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
}

void Network::predict_layerwise(const CsrView& x, int k, int32_t* out_labels, float* out_scores) const {
  // Blocks of samples through the dense layers as matrix products, as in training.
  constexpr int64_t kBlock = 128;
  const Kernels& kr = kernels();
  const int nl = static_cast<int>(layers_.size());
  const Layer& first = layers_[0];
  const int64_t w0 = first.out_dim;
  const int64_t blocks = (x.n + kBlock - 1) / kBlock;
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (x.n * sample_work_ > kParallelWork)
  {
    std::vector<std::vector<float>> act(static_cast<size_t>(nl));
    std::vector<Scored> heap;
    catcher.run([&] {
      for (int l = 0; l < nl; ++l) act[l].resize(static_cast<size_t>(kBlock * layers_[l].out_dim));
      heap.reserve(static_cast<size_t>(k) + 1);
    });
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (catcher.failed() || poller.should_stop()) continue;
      const int64_t s0 = blk * kBlock, ns = std::min(kBlock, x.n - s0);
      Rng unused(0);  // no dropout at inference
      for (int64_t s = 0; s < ns; ++s) {
        const int64_t a = x.indptr[s0 + s], nnz = x.indptr[s0 + s + 1] - a;
        float* z = act[0].data() + s * w0;
        std::copy(first.bias.data(), first.bias.data() + w0, z);
        for (int64_t q = 0; q < nnz; ++q)
          kr.axpy(x.values[a + q], first.weight.data() + static_cast<int64_t>(x.indices[a + q]) * first.row_len, z, w0);
        if (nl > 1) activate(first.spec.activation, z, nullptr, w0, 0.0f, unused);
      }
      for (int l = 1; l < nl; ++l) {
        const Layer& L = layers_[l];
        const int64_t out = L.out_dim, in = L.in_dim;
        for (int64_t j0 = 0; j0 < out; j0 += kForwardRows) {
          const int64_t nj = std::min(kForwardRows, out - j0);
          kr.matmul_bt(act[l - 1].data(), in, L.weight.data() + j0 * in, in, act[l].data() + j0, out, ns, nj, in);
        }
        for (int64_t s = 0; s < ns; ++s) {
          float* z = act[l].data() + s * out;
          for (int64_t j = 0; j < out; ++j) z[j] += L.bias[j];
          if (l + 1 < nl) activate(L.spec.activation, z, nullptr, out, 0.0f, unused);
        }
      }
      const int64_t out = layers_.back().out_dim;
      for (int64_t s = 0; s < ns; ++s) {
        const float* z = act[nl - 1].data() + s * out;
        float mx = z[0];
        for (int64_t j = 1; j < out; ++j) mx = std::max(mx, z[j]);
        const double sum = kr.exp_sum(z, out, mx);
        heap.clear();
        for (int64_t j = 0; j < out; ++j)
          if (heap.size() < static_cast<size_t>(k) || z[j] >= heap.front().first)
            heap_offer(heap, static_cast<size_t>(k), Scored(z[j], static_cast<int32_t>(j)));
        std::sort_heap(heap.begin(), heap.end(), better);
        int32_t* lab = out_labels + (s0 + s) * k;
        float* sc = out_scores + (s0 + s) * k;
        for (int j = 0; j < k; ++j) {
          const bool have = j < static_cast<int>(heap.size());
          lab[j] = have ? heap[j].second : -1;
          sc[j] = have ? static_cast<float>(std::exp(static_cast<double>(heap[j].first) - mx) / sum) : 0.0f;
        }
      }
    }
  }
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
}

void Network::predict_topk(const CsrView& x, int k, bool use_lsh, int32_t* out_labels, float* out_scores) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (k < 1) throw InvalidArgument("k: must be >= 1, got " + std::to_string(k));
  const Layer& out = layers_.back();
  use_lsh = use_lsh && out.lsh();
  if (batch_ && out.out_dim <= kMaxRecordedWidth) {
    predict_layerwise(x, k, out_labels, out_scores);
    return;
  }
  if (!use_lsh && !out.sparse_input && out.out_dim > kMaxRecordedWidth) {
    predict_exact_blocked(x, k, out_labels, out_scores);
    return;
  }
  const Kernels& kr = kernels();
  // Scratch local to this call: several threads may predict at once.
  std::vector<std::unique_ptr<Workspace>> wss;
  for (int t = 0; t < threads_; ++t) wss.push_back(make_workspace(layers_, false, use_lsh));
  const int nl = static_cast<int>(layers_.size());
  {
    InterruptPoller poller;
    ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (x.n * sample_work_ > kParallelWork)
    {
      Workspace& ws = *wss[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 4)
      for (int64_t i = 0; i < x.n; ++i) {
        if (catcher.failed() || poller.should_stop()) continue;
        catcher.run([&] {
          Rng rng(stream_seed(spec_.seed, kPredictSalt, static_cast<uint64_t>(i)));
          const int64_t s = x.indptr[i];
          forward(layers_, ws, kr, x.indices + s, x.values + s, x.indptr[i + 1] - s, nullptr, 0, use_lsh, 0.0f,
                  rng);
          const std::vector<float>& z = ws.out[nl - 1];
          const std::vector<int32_t>& A = ws.active[nl - 1];
          int32_t* lab = out_labels + i * k;
          float* sc = out_scores + i * k;
          std::fill(lab, lab + k, -1);
          std::fill(sc, sc + k, 0.0f);
          const size_t m = z.size();
          if (m == 0) return;
          float mx = z[0];
          for (size_t j = 1; j < m; ++j) mx = std::max(mx, z[j]);
          double sum = 0.0;
          for (size_t j = 0; j < m; ++j) sum += std::exp(z[j] - mx);
          auto& heap = ws.heap;
          heap.clear();
          for (size_t j = 0; j < m; ++j) {
            heap_offer(heap, static_cast<size_t>(k), Scored(z[j], use_lsh ? A[j] : static_cast<int32_t>(j)));
          }
          std::sort_heap(heap.begin(), heap.end(), better);
          const float inv_sum = static_cast<float>(1.0 / sum);
          for (size_t j = 0; j < heap.size(); ++j) {
            lab[j] = heap[j].second;
            sc[j] = std::exp(heap[j].first - mx) * inv_sum;
          }
        });
      }
    }
    catcher.rethrow();
    if (poller.stopped()) throw Interrupted();
  }
}

// ------------------------------------------------------------------ introspection

std::vector<ParameterArray> Network::parameters() {
  std::vector<ParameterArray> p;
  for (Layer& L : layers_) {
    const std::string base = "layers." + std::to_string(L.index) + ".";
    const std::vector<int64_t> ws{L.rows, L.row_len}, bs{L.out_dim};
    p.push_back({base + "weight", L.weight.data(), ws});
    p.push_back({base + "bias", L.bias.data(), bs});
    p.push_back({base + "weight.adam_m", L.weight_m.data(), ws});
    p.push_back({base + "weight.adam_v", L.weight_v.data(), ws});
    p.push_back({base + "bias.adam_m", L.bias_m.data(), bs});
    p.push_back({base + "bias.adam_v", L.bias_v.data(), bs});
  }
  return p;
}

MemoryReport Network::memory_report() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  MemoryReport r;
  for (const Layer& L : layers_) {
    const std::string base = "layers." + std::to_string(L.index) + ".";
    r.weights += L.weight.bytes() + L.bias.bytes();
    r.optimizer += L.weight_m.bytes() + L.weight_v.bytes() + L.bias_m.bytes() + L.bias_v.bytes();
    r.gradients += L.weight_grad.bytes() + L.bias_grad.bytes() + L.row_touched.bytes() +
                   L.touched_rows.capacity() * sizeof(int32_t) + L.row_end.bytes() +
                   L.entry_sample.capacity() * sizeof(int32_t) + L.entry_coef.capacity() * sizeof(float);
    if (L.tables) r.tables += L.tables->memory_bytes();
    const std::pair<const char*, const AlignedBuffer<float>*> arrays[] = {
        {"weight", &L.weight},       {"weight.adam_m", &L.weight_m}, {"weight.adam_v", &L.weight_v},
        {"weight.grad", &L.weight_grad}, {"bias", &L.bias},          {"bias.adam_m", &L.bias_m},
        {"bias.adam_v", &L.bias_v},  {"bias.grad", &L.bias_grad}};
    for (const auto& a : arrays)
      if (a.second->hugepages()) r.hugepages.push_back(base + a.first);
  }
  for (const auto& ws : workspaces_) {
    const size_t b = ws->bytes();
    r.scratch += b;
    r.scratch_per_thread = std::max(r.scratch_per_thread, b);
  }
  // Per-sample gradient records of the last batch: O(batch x active).
  for (const auto& rec : records_) r.gradients += rec->bytes();
  if (batch_) r.scratch += batch_->bytes();
  return r;
}

const char* Network::kernel_isa() const noexcept { return kernels().isa; }

// ------------------------------------------------------------------ checkpoint access

namespace {
const Layer& lsh_layer(const std::vector<Layer>& layers, int layer) {
  if (layer < 0 || layer >= static_cast<int>(layers.size()))
    throw InvalidArgument("layer " + std::to_string(layer) + " out of range 0.." + std::to_string(layers.size() - 1));
  if (!layers[layer].lsh()) throw InvalidArgument("layer " + std::to_string(layer) + " does not sample by LSH");
  return layers[layer];
}
}  // namespace

LshTablesState Network::table_state(int layer) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return lsh_layer(layers_, layer).tables->export_state();
}

void Network::set_table_state(int layer, const LshTablesState& state) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  lsh_layer(layers_, layer).tables->import_state(state);
}

void Network::set_next_rebuild(int64_t next) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (has_lsh_ ? next <= step_ : next != -1)
    throw InvalidArgument("next_rebuild: must be " +
                          (has_lsh_ ? "> step=" + std::to_string(step_) : std::string("-1 without LSH layers")) +
                          ", got " + std::to_string(next));
  next_rebuild_ = next;
}

}  // namespace slide
