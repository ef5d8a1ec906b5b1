// The network: construction, input checks and the hash-table rebuild schedule. Training,
// prediction and checkpoint access live in their own units (see slide/network.hpp).
#include "slide/network.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

#include "engine_internal.hpp"
#include "slide/common.hpp"
#include "slide/random.hpp"
#include "slide/simd.hpp"

namespace slide {

namespace {

// The output layer's spec for a shard of `n` of its `full` neurons: the active-set sizes
// scaled to the shard's share (rounded up), so the shards together select what one would.
LayerSpec shard_layer_spec(LayerSpec s, int64_t n, int64_t full) {
  auto share = [&](int64_t v) { return v <= 0 ? v : std::max<int64_t>(1, (v * n + full - 1) / full); };
  s.size = n;
  s.selection.min_active = static_cast<int>(share(s.selection.min_active));
  s.selection.max_active = static_cast<int>(share(s.selection.max_active));
  return s;
}

}  // namespace

Network::Network(const NetworkSpec& spec, OutputShard shard) : spec_(spec) {
  spec_.validate();
  threads_ = resolve_threads(spec_.threads);
  const size_t n = spec_.layers.size();
  const int64_t full_out = spec_.layers.back().size;
  if (shard.end < 0) shard.end = full_out;
  if (shard.begin < 0 || shard.begin >= shard.end || shard.end > full_out)
    throw InvalidArgument("shard: output neurons [" + std::to_string(shard.begin) + ", " + std::to_string(shard.end) +
                          ") are not a non-empty range of the output layer's " + std::to_string(full_out));
  shard_begin_ = shard.begin;
  layers_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Layer& L = layers_[i];
    const bool last = i + 1 == n;
    const int64_t in_dim = i == 0 ? spec_.input_dim : spec_.layers[i - 1].size;
    const LayerSpec ls = last ? shard_layer_spec(spec_.layers[i], shard.end - shard.begin, full_out) : spec_.layers[i];
    allocate_layer(L, ls, static_cast<int>(i), in_dim, spec_.hugepages, stream_seed(spec_.seed, kHashSalt, i));
    if (last) L.key_row0 = shard.begin;
    has_lsh_ = has_lsh_ || L.lsh();
    init_weights(L, stream_seed(spec_.seed, kInitSalt, static_cast<uint64_t>(i)), threads_, last ? shard.begin : 0,
                 last ? full_out : -1);
    // The Adam moments are zero pages the kernel has not mapped yet: a batch's sparse update
    // touches rows all over them, so the first batches paid for faulting in the whole arrays
    // (seconds on a 670K x 128 layer). Touch them here, in parallel, once.
    for (AlignedBuffer<float>* a : {&L.weight_m, &L.weight_v}) {
      float* p = a->data();
      const int64_t n = static_cast<int64_t>(a->size());
      constexpr int64_t kPage = 1024;  // floats per 4 KiB page
#pragma omp parallel for num_threads(threads_) schedule(static) if (n > kParallelWork)
      for (int64_t k = 0; k < n; k += kPage) p[k] = 0.0f;
    }
    for (AlignedBuffer<uint16_t>* a : {&L.weight16_m, &L.weight16_v}) {  // the same for bf16 moments
      uint16_t* p = a->data();
      const int64_t n = static_cast<int64_t>(a->size());
      constexpr int64_t kPage = 2048;  // bf16 values per 4 KiB page
#pragma omp parallel for num_threads(threads_) schedule(static) if (n > kParallelWork)
      for (int64_t k = 0; k < n; k += kPage) p[k] = 0;
    }
  }
  // Rough multiply-adds per sample (forward and backward), to decide when to go parallel.
  sample_work_ = 0;
  for (const Layer& L : layers_) {
    int64_t active = L.out_dim;
    if (L.lsh()) active = std::min<int64_t>(L.out_dim, std::max<int64_t>(L.spec.selection.min_active, 256));
    sample_work_ += (L.sparse_input ? 32 : active) * L.row_len * 3;
  }
  for (int t = 0; t < threads_; ++t) workspaces_.push_back(make_workspace(layers_, true, true));
  predict_cache_ = std::make_unique<PredictCache>();
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
    plan_batch_activations(*batch_, layers_, spec_.recompute);
  }
  if (has_lsh_) {
    rebuild_tables_locked();
    next_rebuild_ = schedule_after(0);
  }
}

Network::~Network() = default;

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
  // At once, for every layer (a spread rebuild in progress is dropped: build() replaces it).
  for (Layer& L : layers_) {
    if (!L.lsh()) continue;
    const uint64_t seed =
        stream_seed(spec_.seed, kTableSalt, static_cast<uint64_t>(L.index), static_cast<uint64_t>(step_));
    if (L.bf16)
      L.tables->build(*L.hash, L.weight16.data(), L.rows, L.row_len, threads_, seed);
    else
      L.tables->build(*L.hash, L.weight.data(), L.rows, L.row_len, threads_, seed);
  }
  predict_cache_->invalidate();
}

namespace {
// Bytes an at-once rebuild of L moves: every weight row read, each table's bucket ids written,
// sorted (two radix passes over key and item) and stored.
double rebuild_bytes(const Layer& L) {
  const double rows = static_cast<double>(L.rows);
  return rows * static_cast<double>(L.row_len) * (L.bf16 ? 2.0 : 4.0) +
         rows * static_cast<double>(L.spec.lsh.L) * 4.0 * 10.0;
}

// One share of L's rebuild in progress from its weights as stored: a bf16 layer's rows are
// widened exactly before hashing (LshTables::rebuild_step's bf16 overload), so a spread
// rebuild of unchanged bf16 rows equals the at-once build of initial_build.
bool rebuild_step_of(Layer& L, int threads) {
  return L.bf16 ? L.tables->rebuild_step(*L.hash, L.weight16.data(), threads)
                : L.tables->rebuild_step(*L.hash, L.weight.data(), threads);
}
}  // namespace

int64_t Network::spread_for(const Layer& L) const noexcept {
  int64_t n = rebuild_spread_;
  if (n == 0)
    n = L.rows >= kSpreadRebuildRows ? std::min<int64_t>(kMaxRebuildSpread, spec_.rebuild_first / 2) : 1;
  // Done before the next rebuild is due (the schedule's gaps are at least rebuild_first).
  return std::max<int64_t>(1, std::min<int64_t>(n, spec_.rebuild_first));
}

void Network::start_scheduled_rebuild() {
  PhaseCounters* prof = profiler_.serial();
  for (Layer& L : layers_) {
    if (!L.lsh()) continue;
    // A spread rebuild still running (only when the schedule was changed under it) finishes first.
    while (L.tables->rebuild_pending() && !rebuild_step_of(L, threads_)) {
    }
    const int64_t n = spread_for(L);
    if (prof) prof->bytes[static_cast<int>(Phase::Rebuild)] += rebuild_bytes(L) / static_cast<double>(n);
    L.tables->begin_rebuild(*L.hash, L.rows, L.row_len, static_cast<int>(n),
                            stream_seed(spec_.seed, kTableSalt, static_cast<uint64_t>(L.index), static_cast<uint64_t>(step_)));
    rebuild_step_of(L, threads_);
  }
  predict_cache_->invalidate();
}

void Network::advance_rebuilds() {
  PhaseCounters* prof = profiler_.serial();
  for (Layer& L : layers_) {
    if (!L.lsh() || !L.tables->rebuild_pending()) continue;
    if (prof) prof->bytes[static_cast<int>(Phase::Rebuild)] += rebuild_bytes(L) / static_cast<double>(spread_for(L));
    if (rebuild_step_of(L, threads_)) predict_cache_->invalidate();
  }
}

void Network::cancel_rebuilds() {
  for (Layer& L : layers_)
    if (L.lsh()) L.tables->cancel_rebuild();
}

void Network::set_rebuild_spread(int64_t batches) {
  if (batches < 0)
    throw InvalidArgument("rebuild_spread: must be >= 0 (0 = auto, 1 = at once), got " + std::to_string(batches));
  std::unique_lock<std::shared_mutex> lock(mutex_);
  rebuild_spread_ = batches;
}

int64_t Network::rebuild_batches(int layer) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (layer < 0 || layer >= static_cast<int>(layers_.size()) || !layers_[layer].lsh())
    throw InvalidArgument("layer " + std::to_string(layer) + " does not sample by LSH");
  return spread_for(layers_[layer]);
}

bool Network::rebuild_pending() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  for (const Layer& L : layers_)
    if (L.lsh() && L.tables->rebuild_pending()) return true;
  return false;
}

// ------------------------------------------------------------------ profiling

void Network::set_profiling(bool on) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  profiler_.ensure_threads(threads_);
  profiler_.set_enabled(on);
}

bool Network::profiling() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return profiler_.enabled();
}

ProfileReport Network::profile() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return profiler_.report();
}

void Network::reset_profile() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  profiler_.reset();
}

void Network::add_profile_time(Phase p, double seconds, double bytes) {
  if (static_cast<int>(p) < 0 || static_cast<int>(p) >= kPhases) throw InvalidArgument("add_profile_time: unknown phase");
  if (!(seconds >= 0.0) || !(bytes >= 0.0))
    throw InvalidArgument("add_profile_time: seconds and bytes must be >= 0");
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (profiler_.enabled()) profiler_.add_time(p, seconds, bytes);
}

void Network::set_step(int64_t step) {
  if (step < 0) throw InvalidArgument("step: must be >= 0, got " + std::to_string(step));
  std::unique_lock<std::shared_mutex> lock(mutex_);
  step_ = step;
  next_rebuild_ = has_lsh_ ? schedule_after(step) : -1;
  cancel_rebuilds();  // it was begun for another position of the schedule
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
  // A shard keeps its own labels' share (the output layer's neuron ids are local).
  if (n == 0) label_freq_.clear();
  else label_freq_.assign(freq + shard_begin_, freq + shard_begin_ + layers_.back().out_dim);
}

const char* Network::kernel_isa() const noexcept { return kernels().isa; }

}  // namespace slide
