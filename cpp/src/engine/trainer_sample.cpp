// The per-sample trainer (SLIDE, Chen et al., MLSys 2020): the samples of a batch run in
// parallel, each through the phases of sample_step.hpp on its own active sets, with
// gradients in per-sample records (or lock-free HOGWILD buffers, Recht et al., NeurIPS
// 2011, for wide dense layers); then one fused sparse Adam step over the touched rows.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>

#include "engine_internal.hpp"
#include "slide/network.hpp"
#include "slide/sample_step.hpp"

namespace slide {

namespace {

// Forward, loss (softmax or per-label binary cross-entropy) and backward for sample r; returns its loss (0 for a
// sample without labels, which contributes no gradient).
float train_sample(std::vector<Layer>& layers, SampleWorkspace& ws, SampleRecord& rec, const Kernels& kr,
                   const CsrView& x, const CsrView& y, int64_t r, float inv_b, float dropout, Rng& rng,
                   const Rng& shared_fill, const BatchNegatives& negatives) {
  rec.clear();
  // Sorted unique labels: the target puts mass 1/|y| on each.
  ws.labels.assign(y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
  if (ws.labels.empty()) return 0.0f;
  std::sort(ws.labels.begin(), ws.labels.end());
  ws.labels.erase(std::unique(ws.labels.begin(), ws.labels.end()), ws.labels.end());
  const SparseRow sample = csr_row(x, r);
  Layer& out = layers.back();
  const NeuronRange all{0, out.out_dim};

  const LayerInput in = forward_hidden(layers, ws, kr, sample, true, dropout, rng, &shared_fill);
  // The random part of the output active set comes from the stream shared by the batch
  // (each sample starts from the same state), so the samples share their random negatives,
  // as in sampled softmax with batch-shared negatives (Jean et al., ACL 2015): the batch then
  // touches about min_active random rows instead of batch x min_active, which is most of the
  // optimizer's work on a wide output layer.
  const SelectionParams sel = force_labels(out, negatives, ws);
  Rng fill = shared_fill;
  select_output(out, ws, in, true, sel, ws.forced.data(), static_cast<int>(ws.forced.size()), all, fill);
  output_logits(out, ws, kr, in, true, all);
  const bool sigmoid = out.spec.activation == Activation::Sigmoid;
  if (out.lsh() && !sigmoid) {
    std::vector<float>& z = ws.out.back();
    add_sampling_log_weights(z.data(), static_cast<int64_t>(z.size()), static_cast<int64_t>(ws.labels.size()),
                             ws.forced_q, ws.filled, out.out_dim);
  }
  // Sigmoid: per-label binary loss, with the sampling weights applied to the gradient.
  const SoftmaxStats stats = sigmoid ? SoftmaxStats{} : partial_softmax(ws);
  const float loss = normalise_output(out, ws, stats, stats, all, true, inv_b);
  output_backward(out, ws, rec, kr, in, true, all);
  if (layers.size() > 1) {
    std::vector<float>& dh = ws.delta[layers.size() - 2];
    dh.assign(static_cast<size_t>(out.in_dim), 0.0f);
    output_input_gradient(out, ws, kr, true, all, dh.data());
    backward_hidden(layers, ws, rec, kr, sample, dropout);
  }
  return loss;
}

}  // namespace

float Network::train_batch(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (sharded())
    throw InvalidArgument("train_batch: this network holds a shard of the output layer; train it with "
                          "shard_forward, shard_backward and shard_update");
  if (b <= 0) return 0.0f;
  // lr = 0 is allowed: a schedule may decay the rate to nothing (moments still advance).
  if (!(lr >= 0.0f) || !std::isfinite(lr)) throw InvalidArgument("lr: must be >= 0 and finite, got " + std::to_string(lr));
  ensure_records(b);
  auto run = [&] {
    if (batched_for(b)) return train_batch_layerwise(x, y, rows, b, lr);
    if (uses_shared_negatives()) return train_batch_shared(x, y, rows, b, lr);
    return train_batch_samples(x, y, rows, b, lr);
  };
  if (!profiler_.enabled()) return run();
  const auto t0 = std::chrono::steady_clock::now();
  const float loss = run();
  profiler_.end_batch(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), b, step_);
  return loss;
}

void Network::ensure_records(int64_t b) {
  while (static_cast<int64_t>(records_.size()) < b) records_.push_back(std::make_unique<SampleRecord>(layers_.size()));
}

float Network::train_batch_samples(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr) {
  const int64_t t = step_ + 1;
  const Kernels& kr = kernels();
  const float inv_b = 1.0f / static_cast<float>(b);
  const float dropout = spec_.dropout;
  const Rng shared_fill(stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(t)));
  {
    PhaseTimer timer(profiler_.serial(), Phase::Selection);
    collect_batch_negatives(layers_.back(), y, rows, b, label_freq_,
                            stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(t), 1), negatives_);
  }
  // One parallel region per batch (barriers are costly when cores are shared); the calling
  // thread polls for Ctrl-C between its samples.
  InterruptPoller poller;
  ExceptionCatcher catcher;
  double total = 0.0;
  std::vector<Layer>& layers = layers_;
  const BatchNegatives& negatives = negatives_;
  int team = 1;
#pragma omp parallel num_threads(threads_) reduction(+ : total) if (b * sample_work_ > kParallelWork)
  {
    SampleWorkspace& ws = *workspaces_[omp_get_thread_num()];
    ws.prof = profiler_.slot(omp_get_thread_num());
#pragma omp master
    team = omp_get_num_threads();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < b; ++i) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        Rng rng(stream_seed(spec_.seed, kTrainSalt, static_cast<uint64_t>(t), static_cast<uint64_t>(i)));
        total += train_sample(layers, ws, *records_[i], kr, x, y, rows[i], inv_b, dropout, rng, shared_fill,
                              negatives);
      });
    }
  }
  if (profiler_.enabled()) profiler_.fold(team);
  const bool failed = catcher.failed() || poller.stopped();
  if (failed)
    for (Layer& L : layers_) discard_buffered_gradients(L, workspaces_);
  catcher.rethrow();
  if (poller.stopped()) throw Interrupted();
  // The update: one fused sparse Adam pass per layer over the rows the batch touched.
  const AdamStep sw = make_adam_step(spec_.adam, lr, t, true);
  const AdamStep sb = make_adam_step(spec_.adam, lr, t, false);
  {
    PhaseTimer timer(profiler_.serial(), Phase::Adam);
    for (Layer& L : layers_) {
      const AdamPassStats st = L.records ? adam_step_recorded(L, records_, b, sw, sb, workspaces_, vec_ptrs_, threads_)
                                         : adam_step_buffered(L, sw, sb, workspaces_, threads_);
      timer.add_bytes(st.bytes(L.row_len, L.rows, L.records, L.bf16 ? 2.0 : 4.0));
    }
  }
  finish_step(t);
  return static_cast<float>(total / static_cast<double>(b));
}

void Network::finish_step(int64_t t) {
  step_ = t;
  if (!has_lsh_) return;
  PhaseTimer timer(profiler_.serial(), Phase::Rebuild);
  // A spread rebuild (set_rebuild_spread) does its share of this batch; then a scheduled one
  // starts (at once, or its first share).
  advance_rebuilds();
  if (step_ >= next_rebuild_) {
    start_scheduled_rebuild();
    next_rebuild_ = schedule_after(step_);
  }
}

}  // namespace slide
