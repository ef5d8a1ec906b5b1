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
    has_lsh_ = has_lsh_ || L.lsh();
    init_weights(L, stream_seed(spec_.seed, kInitSalt, static_cast<uint64_t>(i)), threads_, last ? shard.begin : 0,
                 last ? full_out : -1);
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
  // A shard keeps its own labels' share (the output layer's neuron ids are local).
  if (n == 0) label_freq_.clear();
  else label_freq_.assign(freq + shard_begin_, freq + shard_begin_ + layers_.back().out_dim);
}

const char* Network::kernel_isa() const noexcept { return kernels().isa; }

}  // namespace slide
