// Shared in-batch negatives as one block (Network::set_shared_negatives).
//
// On a very wide hash-sampled output layer, most of a sample's active set is shared with the
// other samples of its batch: the batch's labels (in-batch negatives, negatives.hpp) and the
// uniform fill drawn from the batch's stream. The per-sample trainer still reads, for every
// sample, each of those rows from a matrix far larger than the caches, and the optimizer
// then updates them from per-sample records. Here the shared rows form a block S scored once
// for the whole batch:
//
//   1. S = the batch's labels (sorted, capped at max_active as collect_batch_negatives keeps
//      them), then min_active neurons drawn uniformly from the others (the batch's fill);
//   2. per sample (parallel): the hidden layers, the hash candidates and the sample's own
//      labels that S does not hold (its private rows), their logits;
//   3. the block's rows gathered once (|S| x d) and Z = H W_S^T + b_S for the batch (matrix
//      product, H: the batch's output-layer inputs, b x d);
//   4. per sample (parallel): the softmax over S and its private rows with the sampled-softmax
//      log-weights of negatives.hpp (the fill stands for the neurons outside S and the private
//      rows; a batch label j for 1 / q'_j labels), dL/dz, the private rows' gradient records,
//      dL/dh = D_S W_S + sum over private rows, and the hidden layers' backward;
//   5. the block's gradient G = D_S^T H straight into its fused Adam step (each shared row
//      read and written once per batch), then the recorded Adam pass for the private rows
//      and the hidden layers (disjoint from S).
// The estimator is the per-sample one's (same proposal and weights), with the fill drawn once
// per batch for all samples and the hash candidates that S holds scored in S. Results are
// deterministic for a seed and do not depend on the number of threads (every sum runs in a
// fixed order), but differ from the per-sample trainer's bits.
//
// A bf16 output layer (precision: bf16) keeps its semantics here: logits are sums of exact
// products of the bf16 row and the layer input rounded to bf16 (the block's rows are widened
// exactly when gathered, H16 holds the rounded inputs), dL/dh reads the widened rows, the
// gradient is taken against the float32 input (as the per-sample records do) and every row,
// block or private, gets the bf16 Adam step with the stochastic rounding keyed by (step,
// layer, row) of the per-sample path (each row is updated once per step either way).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine_internal.hpp"
#include "slide/bf16.hpp"
#include "slide/negatives.hpp"
#include "slide/network.hpp"
#include "slide/sample_step.hpp"
#include "slide/simd.hpp"

namespace slide {

size_t shared_block_bytes(const SharedBlock* s) { return s ? s->bytes() : 0; }

bool Network::uses_shared_negatives() const noexcept {
  if (shared_negatives_ == 0 || layers_.size() < 2 || sharded()) return false;
  const Layer& out = layers_.back();
  if (out.sparse_input || !out.records || !uses_in_batch_negatives(out)) return false;
  return shared_negatives_ == 1 || out.out_dim >= kSharedNegativesWidth;
}

void Network::set_shared_negatives(int mode) {
  if (mode < -1 || mode > 1)
    throw InvalidArgument("shared_negatives: expected True, False or 'auto', got " + std::to_string(mode));
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (mode == 1) {
    const Layer& out = layers_.back();
    if (layers_.size() < 2 || out.sparse_input || sharded() || !uses_in_batch_negatives(out))
      throw InvalidArgument(
          "shared_negatives=True needs a hash-sampled output layer after a hidden layer that takes in-batch "
          "negatives (min_active > 0, more than " + std::to_string(kInBatchWidth) +
          " neurons per slot of its widest active set), in a network that is not a label shard");
  }
  shared_negatives_ = mode;
}

namespace {

// The per-label binary loss (sigmoid output) over a sample's block and private rows, with the
// weights of the per-sample path (binary_output_sampled in output_layer.cpp): a positive weighs
// 1; a negative weighs lsh.negative_weight, or with 0 the neurons it stands for (a batch label
// j: 1 / (q_j + (1 - q_j) fill_rate), a fill neuron: 1 / fill_rate, a hash candidate: 1).
// The sample's own labels may sit in the block or among its private rows.
float binary_shared(const Layer& out, SampleWorkspace& ws, const SharedBlock& B, const std::vector<float>* q,
                    double fill_rate, float inv_b) {
  const std::vector<float>& z = ws.out.back();
  std::vector<float>& dz = ws.delta.back();
  const std::vector<int32_t>& A = ws.active[static_cast<size_t>(out.index)];
  const size_t m = z.size();
  const size_t nS = B.set.size(), n_lab = static_cast<size_t>(B.n_labels);
  dz.resize(m);
  const float fixed = out.spec.negative_weight;
  const float fill_weight = static_cast<float>(1.0 / fill_rate);
  float loss = 0.0f;
  for (size_t k = 0; k < m; ++k) {
    const bool pos = std::binary_search(ws.labels.begin(), ws.labels.end(), A[k]);
    float w = 1.0f;
    if (!pos) {
      if (fixed > 0.0f) w = fixed;
      else if (k < n_lab) w = q ? static_cast<float>(1.0 / ((*q)[k] + (1.0 - (*q)[k]) * fill_rate)) : 1.0f;
      else if (k < nS) w = fill_weight;
    }
    loss += binary_term(z[k], pos, w, inv_b, dz[k]);
  }
  return loss;
}

}  // namespace

float Network::train_batch_shared(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr) {
  const int64_t t = step_ + 1;
  const Kernels& kr = kernels();
  const float inv_b = 1.0f / static_cast<float>(b);
  const float dropout = spec_.dropout;
  const int nl = static_cast<int>(layers_.size());
  const size_t lo = static_cast<size_t>(nl - 1);
  Layer& out = layers_.back();
  const int64_t d = out.in_dim, n_out = out.out_dim;
  if (!shared_) shared_ = std::make_unique<SharedBlock>();
  SharedBlock& B = *shared_;
  while (static_cast<int64_t>(B.ws.size()) < b) B.ws.push_back(make_workspace(layers_, true, false));
  if (static_cast<int64_t>(B.mark.size()) != n_out) B.mark.assign(static_cast<size_t>(n_out), 0);
  if (static_cast<int>(B.grad.size()) < threads_)
    B.grad.assign(static_cast<size_t>(threads_), std::vector<float>(static_cast<size_t>(kGradRows * d)));
  B.has_labels.assign(static_cast<size_t>(b), 0);
  const Rng shared_fill(stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(t)));

  // 1. The shared set.
  {
    PhaseTimer timer(profiler_.serial(), Phase::Selection);
    collect_batch_negatives(out, y, rows, b, label_freq_,
                            stream_seed(spec_.seed, kFillSalt, static_cast<uint64_t>(t), 1), negatives_);
    B.set.assign(negatives_.labels.begin(), negatives_.labels.end());
    B.n_labels = static_cast<int64_t>(B.set.size());
    for (const int32_t j : B.set) B.mark[j] = 1;
    // Fewer than n_out - |labels| by construction: uses_in_batch_negatives keeps the layer
    // more than twice as wide as min_active + max_active, so each draw succeeds w.p. > 1/2.
    const int64_t fill = std::min<int64_t>(out.spec.selection.min_active, n_out - B.n_labels);
    Rng rng = shared_fill;
    while (static_cast<int64_t>(B.set.size()) < B.n_labels + fill) {
      const int32_t j = static_cast<int32_t>(rng.below(static_cast<uint64_t>(n_out)));
      if (B.mark[j]) continue;
      B.mark[j] = 1;
      B.set.push_back(j);
    }
    timer.add_bytes(static_cast<double>(B.set.size()) * 128.0);  // a marker line set and cleared per neuron
  }
  const int64_t nS = static_cast<int64_t>(B.set.size());
  B.H.resize(static_cast<size_t>(b * d));
  const bool bf16 = out.bf16;
  const double elem_bytes = bf16 ? 2.0 : 4.0;
  if (bf16) B.H16.resize(static_cast<size_t>(b * d));
  B.Z.resize(static_cast<size_t>(b * nS));
  B.weights.resize(static_cast<size_t>(nS * d));
  B.bias.resize(static_cast<size_t>(nS));
  const SelectionParams base = out.spec.selection;
  const bool parallel = b * sample_work_ > kParallelWork;
  InterruptPoller poller;
  ExceptionCatcher catcher;
  auto abandon = [&] {
    for (const int32_t j : B.set) B.mark[j] = 0;
    for (Layer& L : layers_) discard_buffered_gradients(L, workspaces_);
  };
  const float* W = out.weight.data();  // null for a bf16 layer (rows in out.weight16)
  const float* bias = out.bias.data();
  auto prefetch_out_row = [&](int64_t n) {
    if (bf16)
      prefetch_row(reinterpret_cast<const float*>(out.row16(n)), d / 2);
    else
      prefetch_row(W + n * d, d);
  };

  // 2. Per sample: hidden layers, private rows (own labels and hash candidates outside S).
  int team = 1;
#pragma omp parallel num_threads(threads_) if (parallel)
  {
    SampleWorkspace& tw = *workspaces_[omp_get_thread_num()];
    tw.prof = profiler_.slot(omp_get_thread_num());
#pragma omp master
    team = omp_get_num_threads();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < b; ++i) {
      if (catcher.failed() || poller.should_stop()) continue;
      catcher.run([&] {
        SampleWorkspace& ws = *B.ws[i];
        records_[i]->clear();
        float* h_row = B.H.data() + i * d;
        const int64_t r = rows[i];
        ws.labels.assign(y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
        std::sort(ws.labels.begin(), ws.labels.end());
        ws.labels.erase(std::unique(ws.labels.begin(), ws.labels.end()), ws.labels.end());
        if (ws.labels.empty()) {
          std::fill(h_row, h_row + d, 0.0f);
          if (bf16) std::fill(B.H16.data() + i * d, B.H16.data() + (i + 1) * d, 0.0f);
          return;
        }
        B.has_labels[i] = 1;
        Borrow borrow(ws, tw);
        Rng rng(stream_seed(spec_.seed, kTrainSalt, static_cast<uint64_t>(t), static_cast<uint64_t>(i)));
        const LayerInput in = forward_hidden(layers_, ws, kr, csr_row(x, r), true, dropout, rng, &shared_fill);
        std::copy(in.dense, in.dense + d, h_row);
        const uint16_t* h16 = nullptr;
        if (bf16) {
          // The input rounded to bf16 once (as output_logits does), widened for the block.
          ws.input16.resize(static_cast<size_t>(d));
          kr.to_bf16(in.dense, ws.input16.data(), d);
          kr.from_bf16(ws.input16.data(), B.H16.data() + i * d, d);
          h16 = ws.input16.data();
        }
        {
          PhaseTimer timer(ws.prof, Phase::Hashing, static_cast<double>(d + out.hash->num_tables()) * 4.0);
          out.hash->hash_dense(in.dense, ws.buckets.data());
        }
        std::vector<int32_t>& A = ws.active[lo];
        {
          PhaseTimer timer(ws.prof, Phase::Selection);
          // Own labels (forced) and hash candidates, no fill: the block holds the batch's.
          SelectionParams sel = base;
          sel.min_active = 0;
          const int n_own = static_cast<int>(ws.labels.size());
          if (sel.max_active > 0) sel.max_active += n_own;
          Rng pick = shared_fill;
          ActiveSetSampler& sampler = *ws.samplers[lo];
          sampler.select(*out.tables, ws.buckets.data(), ws.labels.data(), n_own, sel, pick, A);
          timer.add_bytes(static_cast<double>(out.hash->num_tables()) * 64.0 +
                          static_cast<double>(sampler.visited()) * 4.0 +
                          static_cast<double>(sampler.candidates() + n_own) * 64.0 +
                          static_cast<double>(A.size()) * 68.0);  // the active list and a marker line each
          A.erase(std::remove_if(A.begin(), A.end(), [&](int32_t j) { return B.mark[j] != 0; }), A.end());
        }
        // Logits of the private rows, scattered over the layer: prefetch a few ahead.
        PhaseTimer timer(ws.prof, Phase::Forward,
                         static_cast<double>(A.size()) * (static_cast<double>(d) * elem_bytes + 64.0));
        std::vector<float>& z = ws.out[lo];
        const size_t na = A.size();
        z.resize(na);
        for (size_t k = 0; k < na; ++k) {
          if (k + kPrefetch < na) {
            prefetch_out_row(A[k + kPrefetch]);
            __builtin_prefetch(bias + A[k + kPrefetch], 0, 3);
          }
          const int64_t n = A[k];
          z[k] = (bf16 ? kr.dot_bf16(out.row16(n), h16, d) : kr.dot(W + n * d, in.dense, d)) + bias[n];
        }
      });
    }
  }
  if (profiler_.enabled()) profiler_.fold(team);
  if (catcher.failed() || poller.stopped()) {
    abandon();
    catcher.rethrow();
    throw Interrupted();
  }

  // 3. The block's logits for the whole batch: its rows gathered once, Z = H W_S^T + b_S.
  {
    PhaseTimer timer(profiler_.serial(), Phase::Forward,
                     static_cast<double>(nS) * (static_cast<double>(d) * (elem_bytes + 4.0) + 64.0) +
                         static_cast<double>(b * nS) * 4.0);
    const int32_t* S = B.set.data();
    float* WS = B.weights.data();
    float* bS = B.bias.data();
    float* Z = B.Z.data();
    const float* H = bf16 ? B.H16.data() : B.H.data();
    const int64_t blocks = (nS + kForwardRows - 1) / kForwardRows;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1) if (parallel)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t j0 = blk * kForwardRows, nj = std::min(kForwardRows, nS - j0);
      for (int64_t j = j0; j < j0 + nj; ++j) {
        if (j + static_cast<int64_t>(kPrefetch) < nS) prefetch_out_row(S[j + kPrefetch]);
        if (bf16)
          kr.from_bf16(out.row16(S[j]), WS + j * d, d);  // exact
        else
          std::copy(W + static_cast<int64_t>(S[j]) * d, W + static_cast<int64_t>(S[j] + 1) * d, WS + j * d);
        bS[j] = bias[S[j]];
      }
      kr.matmul_bt(H, d, WS + j0 * d, d, Z + j0, nS, b, nj, d);
      for (int64_t i = 0; i < b; ++i) {
        float* zi = Z + i * nS + j0;
        for (int64_t j = 0; j < nj; ++j) zi[j] += bS[j0 + j];
      }
    }
  }

  // 4. Per sample: softmax over S and the private rows, dL/dz, records, dL/dh, hidden backward.
  const NeuronRange all{0, n_out};
  const int64_t n_fill = nS - B.n_labels;
  const bool weighted = !negatives_.q.empty();
  const bool binary = out.spec.activation == Activation::Sigmoid;
  double total = 0.0;
#pragma omp parallel num_threads(threads_) reduction(+ : total) if (parallel)
  {
    SampleWorkspace& tw = *workspaces_[omp_get_thread_num()];
    tw.prof = profiler_.slot(omp_get_thread_num());
#pragma omp master
    team = omp_get_num_threads();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < b; ++i) {
      float* zs = B.Z.data() + i * nS;
      if (!B.has_labels[i]) {
        std::fill(zs, zs + nS, 0.0f);  // no gradient from a sample without labels
        continue;
      }
      if (catcher.failed()) continue;
      catcher.run([&] {
        SampleWorkspace& ws = *B.ws[i];
        SampleRecord& rec = *records_[i];
        Borrow borrow(ws, tw);
        std::vector<int32_t>& A = ws.active[lo];
        std::vector<float>& z = ws.out[lo];
        const int64_t np = static_cast<int64_t>(A.size());
        double fill_rate = 1.0;
        {
          PhaseTimer timer(ws.prof, Phase::Softmax);
          // Selection order for normalise_output: the block, then the private rows.
          z.insert(z.begin(), zs, zs + nS);
          A.insert(A.begin(), B.set.begin(), B.set.end());
          const double chosen = static_cast<double>(B.n_labels + np);
          if (n_fill > 0 && static_cast<double>(n_out) - chosen > static_cast<double>(n_fill)) {
            fill_rate = static_cast<double>(n_fill) / (static_cast<double>(n_out) - chosen);
            if (!binary) {
              const float log_w = static_cast<float>(-std::log(fill_rate));
              for (int64_t k = B.n_labels; k < nS; ++k) z[k] += log_w;
            }
          } else if (n_fill == 0) {
            fill_rate = std::min(1.0, static_cast<double>(nS + np) / static_cast<double>(n_out));
          }
          if (weighted && !binary)
            for (int64_t k = 0; k < B.n_labels; ++k) {
              if (std::binary_search(ws.labels.begin(), ws.labels.end(), B.set[k])) continue;
              const double q = negatives_.q[k];
              z[k] -= static_cast<float>(std::log(q + (1.0 - q) * fill_rate));
            }
        }
        if (binary) {
          PhaseTimer timer(ws.prof, Phase::Softmax, static_cast<double>(z.size()) * 8.0);
          total += binary_shared(out, ws, B, weighted ? &negatives_.q : nullptr, fill_rate, inv_b);
        } else {
          const SoftmaxStats st = partial_softmax(ws);
          total += normalise_output(out, ws, st, st, all, true, inv_b);
        }
        const std::vector<float>& dz = ws.delta[lo];
        PhaseTimer timer(ws.prof, Phase::Backward,
                         static_cast<double>(np) * (static_cast<double>(d) * elem_bytes + 8.0) +
                             static_cast<double>(nS) * 4.0);
        std::copy(dz.begin(), dz.begin() + nS, zs);  // the block's dL/dz, for its update
        // dL/dh: the block through the gathered rows, then the private rows.
        std::vector<float>& dh = ws.delta[lo - 1];
        dh.resize(static_cast<size_t>(d));
        kr.matmul(zs, nS, 1, B.weights.data(), d, dh.data(), d, 1, d, nS);
        std::vector<int32_t>& rr = rec.rows[lo];
        std::vector<float>& rc = rec.coef[lo];
        rec.vec[lo].assign(B.H.data() + i * d, B.H.data() + (i + 1) * d);
        for (int64_t k = 0; k < np; ++k) {
          const int32_t n = A[nS + k];
          if (k + static_cast<int64_t>(kPrefetch) < np) prefetch_out_row(A[nS + k + kPrefetch]);
          const float dn = dz[nS + k];
          if (dn == 0.0f) continue;
          rr.push_back(n);
          rc.push_back(dn);
          if (bf16)
            kr.axpy_bf16(dn, out.row16(n), dh.data(), d);
          else
            kr.axpy(dn, W + static_cast<int64_t>(n) * d, dh.data(), d);
        }
        backward_hidden(layers_, ws, rec, kr, csr_row(x, rows[i]), dropout);
      });
    }
  }
  if (profiler_.enabled()) profiler_.fold(team);
  if (catcher.failed()) {
    abandon();
    catcher.rethrow();
  }

  // 5. The update: the block's rows from G = D_S^T H (fused with Adam), then the recorded rows.
  const AdamStep sw = make_adam_step(spec_.adam, lr, t, true);
  const AdamStep sb = make_adam_step(spec_.adam, lr, t, false);
  {
    PhaseTimer timer(profiler_.serial(), Phase::Adam,
                     static_cast<double>(nS) * (6.0 * elem_bytes * static_cast<double>(d) + 64.0));
    float* Wt = out.weight.data();
    float* Wm = out.weight_m.data();
    float* Wv = out.weight_v.data();
    uint16_t* Wt16 = out.weight16.data();
    uint16_t* Wm16 = out.weight16_m.data();
    uint16_t* Wv16 = out.weight16_v.data();
    const int out_layer = out.index;
    const int64_t key_row0 = out.key_row0;
    float* bt = out.bias.data();
    float* bm = out.bias_m.data();
    float* bv = out.bias_v.data();
    const int32_t* S = B.set.data();
    const float* D = B.Z.data();
    const float* H = B.H.data();
    const int64_t blocks = (nS + kGradRows - 1) / kGradRows;
#pragma omp parallel num_threads(threads_) if (parallel)
    {
      float* grad = B.grad[omp_get_thread_num()].data();
#pragma omp for schedule(dynamic, 1)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t j0 = blk * kGradRows, nj = std::min(kGradRows, nS - j0);
        if (blk + 1 < blocks)
          for (int64_t j = j0 + kGradRows; j < std::min(nS, j0 + 2 * kGradRows); ++j) {
            const int64_t off = static_cast<int64_t>(S[j]) * d;
            if (bf16) {
              prefetch_row(reinterpret_cast<const float*>(Wm16 + off), d / 2);
              prefetch_row(reinterpret_cast<const float*>(Wv16 + off), d / 2);
            } else {
              prefetch_row(Wm + off, d);
              prefetch_row(Wv + off, d);
            }
          }
        kr.matmul(D + j0, 1, nS, H, d, grad, d, nj, d, b);
        for (int64_t jj = 0; jj < nj; ++jj) {
          const int64_t j = j0 + jj, row = S[j];
          float gb = 0.0f;
          for (int64_t i = 0; i < b; ++i) gb += D[i * nS + j];
          if (bf16)  // the per-sample path's bf16 step and rounding key (AdamArrays::step_row)
            kr.adam_bf16(Wt16 + row * d, Wm16 + row * d, Wv16 + row * d, grad + jj * d, d, sw,
                         bf16_row_key(sw.step, out_layer, key_row0 + row));
          else
            kr.adam(Wt + row * d, Wm + row * d, Wv + row * d, grad + jj * d, d, sw);
          adam_scalar(bt[row], bm[row], bv[row], gb, sb);
        }
      }
    }
    for (Layer& L : layers_) {
      const AdamPassStats st = L.records ? adam_step_recorded(L, records_, b, sw, sb, workspaces_, vec_ptrs_, threads_)
                                         : adam_step_buffered(L, sw, sb, workspaces_, threads_);
      timer.add_bytes(st.bytes(L.row_len, L.rows, L.records, L.bf16 ? 2.0 : 4.0));
    }
  }
  for (const int32_t j : B.set) B.mark[j] = 0;
  finish_step(t);
  return static_cast<float>(total / static_cast<double>(b));
}

}  // namespace slide
