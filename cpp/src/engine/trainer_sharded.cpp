// A label shard's batch step (network.hpp: shard_forward, shard_backward, shard_update).
//
// The output layer's labels are split over processes; each holds the hidden layers whole
// and its range of output neurons. Every process trains the same batch, and between the
// three calls the caller exchanges with the others (slide/distributed.py):
//   forward   the replicated hidden layers, then this shard's active output neurons (its
//             labels, its share of the batch's labels as negatives, hash candidates from
//             its own tables, a random fill from its range with min_active scaled to its
//             share) and their sampled-softmax log-weights; per sample the softmax
//             statistics (max, sum of exp) of those logits.
//   -- exchange: the statistics combined over shards (max of maxima, rescaled sums), so
//      each sample's normaliser covers every label as one process would estimate it.
//   backward  dL/dz from the global statistics, the output layer's gradient records, and
//             this shard's part of dL/dh = sum_j dL/dz_j w_j.
//   -- exchange: dL/dh summed over shards (batch x hidden floats).
//   update    the hidden layers' backward from the full dL/dh, then the fused Adam step of
//             every layer: the hidden layers stay identical on every shard (same data,
//             same random streams, same sums), the output layer changes only here.
// Each sample keeps its own workspace between the calls; the per-thread workspaces lend
// their active-set samplers, bucket scratch and lock-free row lists while a sample runs.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>

#include "engine_internal.hpp"
#include "slide/network.hpp"
#include "slide/sample_step.hpp"

namespace slide {

int64_t Network::shard_dh_dim() const noexcept {
  const Layer& out = layers_.back();
  return out.sparse_input ? 0 : out.in_dim;
}

void Network::shard_forward(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float* max,
                            double* sum) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (b <= 0) throw InvalidArgument("shard_forward: the batch is empty");
  if (!shard_) shard_ = std::make_unique<ShardBatch>();
  ShardBatch& S = *shard_;
  ensure_records(b);
  while (static_cast<int64_t>(S.ws.size()) < b) S.ws.push_back(make_workspace(layers_, true, false));
  S.phase = 0;
  S.x = x;
  S.rows.assign(rows, rows + b);
  S.b = b;
  S.t = step_ + 1;
  S.local_max.assign(b, -INFINITY);
  S.local_sum.assign(b, 0.0);
  S.has_labels.assign(b, 0);
  Layer& out = layers_.back();
  const int64_t n_local = out.out_dim, begin = shard_begin_;
  const NeuronRange local{0, n_local};
  // The batch's labels that are this shard's neurons, as local ids: its in-batch negatives.
  S.y_indptr.assign(1, 0);
  S.y_indices.clear();
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t k = y.indptr[rows[i]]; k < y.indptr[rows[i] + 1]; ++k)
      if (y.indices[k] >= begin && y.indices[k] < begin + n_local)
        S.y_indices.push_back(static_cast<int32_t>(y.indices[k] - begin));
    S.y_indptr.push_back(static_cast<int64_t>(S.y_indices.size()));
  }
  S.positions.resize(b);
  std::iota(S.positions.begin(), S.positions.end(), int64_t(0));
  const CsrView local_y{S.y_indptr.data(), S.y_indices.data(), nullptr, b, static_cast<int64_t>(S.y_indices.size())};
  collect_batch_negatives(out, local_y, S.positions.data(), b, label_freq_,
                          stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(S.t), 1), negatives_);
  const Kernels& kr = kernels();
  const float dropout = spec_.dropout;
  const Rng shared_fill(stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(S.t)));
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (b * sample_work_ > kParallelWork)
  {
    SampleWorkspace& tw = *workspaces_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < b; ++i) {
      if (catcher.failed()) continue;
      catcher.run([&] {
        SampleWorkspace& ws = *S.ws[i];
        records_[i]->clear();
        const int64_t r = rows[i];
        // All of the sample's labels (sorted, unique; the target mass is 1/|labels|) as ids
        // relative to this shard: those outside [0, n_local) belong to other shards.
        ws.labels.assign(y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
        if (ws.labels.empty()) return;
        std::sort(ws.labels.begin(), ws.labels.end());
        ws.labels.erase(std::unique(ws.labels.begin(), ws.labels.end()), ws.labels.end());
        for (int32_t& j : ws.labels) j = static_cast<int32_t>(j - begin);
        S.has_labels[i] = 1;
        Borrow borrow(ws, tw);
        Rng rng(stream_seed(spec_.seed, kTrainSalt, static_cast<uint64_t>(S.t), static_cast<uint64_t>(i)));
        const LayerInput in = forward_hidden(layers_, ws, kr, csr_row(x, r), true, dropout, rng, &shared_fill);
        const SelectionParams sel = force_labels(out, negatives_, ws);
        // The sample's own labels in this shard: the first forced neurons.
        const int64_t own = std::count_if(ws.labels.begin(), ws.labels.end(),
                                          [&](int32_t j) { return j >= 0 && j < n_local; });
        Rng fill = shared_fill;
        select_output(out, ws, in, true, sel, ws.forced.data(), static_cast<int>(ws.forced.size()), local, fill);
        output_logits(out, ws, kr, in, true, local);
        if (out.lsh() && out.spec.activation != Activation::Sigmoid) {  // sigmoid: weights in the loss
          std::vector<float>& z = ws.out.back();
          add_sampling_log_weights(z.data(), static_cast<int64_t>(z.size()), own, ws.forced_q, ws.filled, n_local);
        }
        const SoftmaxStats st = partial_softmax(ws);
        S.local_max[i] = st.max;
        S.local_sum[i] = st.sum;
      });
    }
  }
  catcher.rethrow();
  std::copy(S.local_max.begin(), S.local_max.end(), max);
  std::copy(S.local_sum.begin(), S.local_sum.end(), sum);
  S.phase = 1;
}

double Network::shard_backward(const float* max, const double* sum, float* dh) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!shard_ || shard_->phase != 1) throw InvalidArgument("shard_backward: call shard_forward first");
  ShardBatch& S = *shard_;
  const int64_t b = S.b, D = shard_dh_dim();
  for (int64_t i = 0; i < b; ++i)
    if (S.has_labels[i] && !(sum[i] > 0.0 && std::isfinite(sum[i]) && max[i] >= S.local_max[i]))
      throw InvalidArgument("shard_backward: the combined softmax statistics of sample " + std::to_string(i) +
                            " (max " + std::to_string(max[i]) + ", sum " + std::to_string(sum[i]) +
                            ") do not cover this shard's (max " + std::to_string(S.local_max[i]) + ")");
  Layer& out = layers_.back();
  const NeuronRange local{0, out.out_dim};
  const Kernels& kr = kernels();
  const float inv_b = 1.0f / static_cast<float>(b);
  const int nl = static_cast<int>(layers_.size());
  ExceptionCatcher catcher;
  double total = 0.0;
#pragma omp parallel num_threads(threads_) reduction(+ : total) if (b * sample_work_ > kParallelWork)
  {
    SampleWorkspace& tw = *workspaces_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < b; ++i) {
      if (catcher.failed()) continue;
      catcher.run([&] {
        float* d = D > 0 ? dh + i * D : nullptr;
        if (d) std::fill(d, d + D, 0.0f);
        if (!S.has_labels[i]) return;
        SampleWorkspace& ws = *S.ws[i];
        Borrow borrow(ws, tw);
        const SoftmaxStats own{S.local_max[i], S.local_sum[i]}, global{max[i], sum[i]};
        total += normalise_output(out, ws, own, global, local, true, inv_b);
        LayerInput in;
        if (nl > 1) in.dense = ws.out[nl - 2].data();
        else in.sparse = csr_row(S.x, S.rows[i]);
        output_backward(out, ws, *records_[i], kr, in, true, local);
        if (d) output_input_gradient(out, ws, kr, true, local, d);
      });
    }
  }
  if (catcher.failed()) {
    discard_buffered_gradients(out, workspaces_);
    S.phase = 0;
  }
  catcher.rethrow();
  S.phase = 2;
  return total;
}

void Network::shard_update(const float* dh, float lr) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!shard_ || shard_->phase != 2) throw InvalidArgument("shard_update: call shard_backward first");
  if (!(lr >= 0.0f) || !std::isfinite(lr)) throw InvalidArgument("lr: must be >= 0 and finite, got " + std::to_string(lr));
  ShardBatch& S = *shard_;
  S.phase = 0;
  const int64_t b = S.b, D = shard_dh_dim();
  const int nl = static_cast<int>(layers_.size());
  const Kernels& kr = kernels();
  const float dropout = spec_.dropout;
  ExceptionCatcher catcher;
  if (nl > 1) {
#pragma omp parallel num_threads(threads_) if (b * sample_work_ > kParallelWork)
    {
      SampleWorkspace& tw = *workspaces_[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < b; ++i) {
        if (catcher.failed() || !S.has_labels[i]) continue;
        catcher.run([&] {
          SampleWorkspace& ws = *S.ws[i];
          Borrow borrow(ws, tw);
          ws.delta[nl - 2].assign(dh + i * D, dh + (i + 1) * D);
          backward_hidden(layers_, ws, *records_[i], kr, csr_row(S.x, S.rows[i]), dropout);
        });
      }
    }
  }
  if (catcher.failed())
    for (Layer& L : layers_) discard_buffered_gradients(L, workspaces_);
  catcher.rethrow();
  const AdamStep sw = make_adam_step(spec_.adam, lr, S.t, true);
  const AdamStep sb = make_adam_step(spec_.adam, lr, S.t, false);
  for (Layer& L : layers_) {
    if (L.records) adam_step_recorded(L, records_, b, sw, sb, workspaces_, vec_ptrs_, threads_);
    else adam_step_buffered(L, sw, sb, workspaces_, threads_);
  }
  finish_step(S.t);
}

}  // namespace slide
