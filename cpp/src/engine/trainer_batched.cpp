// The batched dense trainer: networks without hash-sampled layers (whose first layer keeps
// records, and whose batch activations fit kMaxBatchFloats, see training_paths.hpp) train a
// batch layer by layer. The samples' layer-0 outputs are gathered into a batch matrix, and
// every later layer runs as matrix products over the whole batch (forward, input gradient,
// then each weight row's gradient formed and passed to Adam in the same pass), which reads
// each weight matrix a few times per batch instead of a few times per sample.
//
// The phases below are called by every thread of one parallel region (one region per batch:
// barriers are costly when cores are shared); each holds its own worksharing loops.
//
// training.recompute (gradient checkpointing, Chen et al., "Training Deep Nets with Sublinear
// Memory Cost", 2016): the forward pass keeps the outputs of checkpoint layers only (every
// ceil(sqrt(hidden layers))-th hidden layer from layer 0, and the last one) and no dropout
// masks, and matrices whose lifetimes do not overlap share memory; the backward pass recomputes a non-checkpoint layer's output from the checkpoint
// below it, with the same kernels, blocks and weights (layers below the one being updated
// are still unchanged), and regenerates each mask from the sample's stream as it was before
// that layer's dropout. So the result is the same bits as the stored path's.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "engine_internal.hpp"
#include "slide/bf16.hpp"
#include "slide/network.hpp"
#include "slide/simd.hpp"

namespace slide {

namespace {

// What the phases of one batch share.
struct BatchStep {
  std::vector<Layer>& layers;
  BatchMatrices& M;
  std::vector<std::unique_ptr<SampleRecord>>& records;
  const Kernels& kr;
  int64_t b;
  float inv_b;
  float dropout;
};

// Layer l's weights as float32: its own array, or for bf16 storage the copy widened at the
// start of the batch (the layer's update comes after its last use in the batch).
const float* weights_f32(const BatchStep& s, int l) {
  const Layer& L = s.layers[l];
  return L.bf16 ? s.M.wide[l].data() : L.weight.data();
}

// The float32 copies of the bf16 layers after the first (sized by the caller), in blocks
// shared by the threads of the region.
void widen_bf16_weights(const BatchStep& s) {
  constexpr int64_t kChunk = 1 << 14;
  const int nl = static_cast<int>(s.layers.size());
  for (int l = 1; l < nl; ++l) {
    const Layer& L = s.layers[l];
    if (!L.bf16) continue;
    const int64_t n = L.rows * L.row_len;
    float* dst = s.M.wide[l].data();
#pragma omp for schedule(static)
    for (int64_t c = 0; c < n; c += kChunk) s.kr.from_bf16(L.weight16.data() + c, dst + c, std::min(kChunk, n - c));
  }
}

// Layer 0 reads the sparse input: one sample at a time, into row i of the batch matrix; the
// sample's labels and layer-0 rows go into its record. Everything that may allocate happens
// here, before any weight changes.
void forward_first_layer(const BatchStep& s, const CsrView& x, const CsrView& y, const int64_t* rows, uint64_t seed,
                         int64_t t, ExceptionCatcher& catcher, InterruptPoller& poller) {
  const Layer& first = s.layers[0];
  const int64_t w0 = first.out_dim;
  const bool hidden = s.layers.size() > 1;
#pragma omp for schedule(dynamic, 4)
  for (int64_t i = 0; i < s.b; ++i) {
    if (catcher.failed() || poller.should_stop()) continue;
    catcher.run([&] {
      const int64_t r = rows[i], a = x.indptr[r], nnz = x.indptr[r + 1] - a;
      SampleRecord& rec = *s.records[i];
      rec.clear();
      rec.labels.assign(y.indices + y.indptr[r], y.indices + y.indptr[r + 1]);
      std::sort(rec.labels.begin(), rec.labels.end());
      rec.labels.erase(std::unique(rec.labels.begin(), rec.labels.end()), rec.labels.end());
      if (!rec.labels.empty()) {
        // Layer 0's rows are the sample's features (gradient: value x output delta).
        rec.rows[0].assign(x.indices + a, x.indices + a + nnz);
        rec.coef[0].assign(x.values + a, x.values + a + nnz);
        rec.vec[0].resize(static_cast<size_t>(w0));
      }
      s.M.rng[i] = Rng(stream_seed(seed, kTrainSalt, static_cast<uint64_t>(t), static_cast<uint64_t>(i)));
      float* z = s.M.out_ptr[0] + i * w0;
      std::copy(first.bias.data(), first.bias.data() + w0, z);
      for (int64_t k = 0; k < nnz; ++k) {
        const int64_t row = static_cast<int64_t>(x.indices[a + k]);
        if (first.bf16)
          s.kr.axpy_bf16(x.values[a + k], first.row16(row), z, w0);
        else
          s.kr.axpy(x.values[a + k], first.weight.data() + row * first.row_len, z, w0);
      }
      if (hidden) {
        if (s.M.recompute) s.M.rng_at[i] = s.M.rng[i];
        activate(first.spec.activation, z, s.M.mask_ptr[0] ? s.M.mask_ptr[0] + i * w0 : nullptr, w0, s.dropout,
                 s.M.rng[i]);
      }
    });
  }
}

// Forward through dense layer l >= 1: Z = H W^T + bias, by blocks of weight rows, then (hidden
// layers) activation and dropout. replay: a recomputation, drawing the masks from the streams
// saved by the first pass (rng_at) instead of advancing the samples' streams.
void forward_layer(const BatchStep& s, int l, bool replay) {
  const int nl = static_cast<int>(s.layers.size());
  const Layer& L = s.layers[l];
  const int64_t out = L.out_dim, in = L.in_dim;
  const float* H = replay && !s.M.checkpoint[l - 1] ? s.M.redo_ptr[l - 1] : s.M.out_ptr[l - 1];
  float* Z = replay ? s.M.redo_ptr[l] : s.M.out_ptr[l];
  const int64_t blocks = (out + kForwardRows - 1) / kForwardRows;
#pragma omp for schedule(dynamic, 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kForwardRows, nj = std::min(kForwardRows, out - j0);
    s.kr.matmul_bt(H, in, weights_f32(s, l) + j0 * in, in, Z + j0, out, s.b, nj, in);
    const float* bias = L.bias.data() + j0;
    for (int64_t i = 0; i < s.b; ++i) {
      float* z = Z + i * out + j0;
      for (int64_t j = 0; j < nj; ++j) z[j] += bias[j];
    }
  }
  if (l + 1 < nl) {
    float* mask = s.M.mask_ptr[l];
#pragma omp for schedule(static)
    for (int64_t i = 0; i < s.b; ++i) {
      if (replay) {
        Rng r = s.M.rng_at[static_cast<size_t>(l * s.b + i)];
        activate(L.spec.activation, Z + i * out, nullptr, out, s.dropout, r);
      } else {
        if (s.M.recompute) s.M.rng_at[static_cast<size_t>(l * s.b + i)] = s.M.rng[i];
        activate(L.spec.activation, Z + i * out, mask ? mask + i * out : nullptr, out, s.dropout, s.M.rng[i]);
      }
    }
  }
}

void forward_dense_layers(const BatchStep& s) {
  const int nl = static_cast<int>(s.layers.size());
  for (int l = 1; l < nl; ++l) forward_layer(s, l, false);
}

// Recompute mode: before the backward pass of layer l, makes its input (layer l - 1's output)
// available again. At the top of a segment of non-checkpoint layers, the whole segment is
// recomputed from the checkpoint below it (layer 0 always is one) and kept, for this and the
// following backward passes.
void recompute_input(const BatchStep& s, int l) {
  if (!s.M.recompute || s.M.checkpoint[l - 1] || !s.M.checkpoint[l]) return;
  int j = l - 1;
  while (!s.M.checkpoint[j]) --j;
  for (int m = j + 1; m <= l - 1; ++m) forward_layer(s, m, true);
}

// Softmax cross-entropy per sample: delta = (softmax - target) / b, target mass 1/|y|.
void softmax_cross_entropy(const BatchStep& s) {
  const int nl = static_cast<int>(s.layers.size());
  const int64_t out = s.layers[nl - 1].out_dim;
#pragma omp for schedule(static)
  for (int64_t i = 0; i < s.b; ++i) {
    const std::vector<int32_t>& lab = s.records[i]->labels;
    const float* z = s.M.out_ptr[nl - 1] + i * out;
    float* d = s.M.delta_ptr[nl - 1] + i * out;
    if (lab.empty()) {
      std::fill(d, d + out, 0.0f);
      continue;
    }
    const float mx = max_value(z, out);
    const double sum = s.kr.exp_store(z, out, mx, d);
    const float scale = static_cast<float>(1.0 / sum) * s.inv_b;
    for (int64_t j = 0; j < out; ++j) d[j] *= scale;
    const float log_sum = static_cast<float>(std::log(sum));
    const float tm = 1.0f / static_cast<float>(lab.size());
    float loss = 0.0f;
    for (int32_t c : lab) {
      loss -= tm * (z[c] - mx - log_sum);
      d[c] -= tm * s.inv_b;
    }
    s.M.loss[i] = loss;
  }
}

// Per-label binary cross-entropy (sigmoid output): delta = (sigmoid(z) - y) / b; samples
// without labels contribute nothing, as with softmax.
void sigmoid_cross_entropy(const BatchStep& s) {
  const int nl = static_cast<int>(s.layers.size());
  const int64_t out = s.layers[nl - 1].out_dim;
#pragma omp for schedule(static)
  for (int64_t i = 0; i < s.b; ++i) {
    const std::vector<int32_t>& lab = s.records[i]->labels;
    const float* z = s.M.out[nl - 1].data() + i * out;
    float* d = s.M.delta[nl - 1].data() + i * out;
    if (lab.empty()) {
      std::fill(d, d + out, 0.0f);
      continue;
    }
    float loss = 0.0f;
    for (int64_t j = 0; j < out; ++j) {
      const float e = std::exp(-std::fabs(z[j]));
      d[j] = (z[j] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e)) * s.inv_b;
      loss += std::max(z[j], 0.0f) + std::log1p(e);
    }
    for (int32_t c : lab) {
      loss -= z[c];
      d[c] -= s.inv_b;
    }
    s.M.loss[i] = loss;
  }
}

// Backward through layer l >= 1 and its update: dL/dH = D W with the weights as they were
// before this batch, through the previous layer's activation; then each weight row's
// gradient (row j: sum over samples of D[s][j] H[s]) goes straight into its fused Adam step
// (every row of a dense layer is touched by the batch). grad: this thread's row-block scratch.
void backward_and_update(const BatchStep& s, int l, const AdamStep& sw, const AdamStep& sb, float* grad) {
  Layer& L = s.layers[l];
  const int64_t out = L.out_dim, in = L.in_dim, b = s.b;
  const float* D = s.M.delta_ptr[l];
  const float* H = s.M.checkpoint[l - 1] ? s.M.out_ptr[l - 1] : s.M.redo_ptr[l - 1];
  float* dH = s.M.delta_ptr[l - 1];
  const int64_t sblocks = (b + kBackSamples - 1) / kBackSamples;
  const int64_t cblocks = (in + kBackCols - 1) / kBackCols;
#pragma omp for schedule(dynamic, 1)
  for (int64_t task = 0; task < sblocks * cblocks; ++task) {
    const int64_t s0 = (task / cblocks) * kBackSamples, c0 = (task % cblocks) * kBackCols;
    s.kr.matmul(D + s0 * out, out, 1, weights_f32(s, l) + c0, in, dH + s0 * in + c0, in,
                std::min(kBackSamples, b - s0), std::min(kBackCols, in - c0), out);
  }
  // (barrier) Through the previous layer's activation and dropout.
  const Activation act = s.layers[l - 1].spec.activation;
  const float* mask = s.M.mask_ptr[l - 1];
  const bool replay = s.M.recompute && s.dropout > 0.0f;
#pragma omp for schedule(static) nowait
  for (int64_t i = 0; i < b; ++i) {
    if (replay)
      backprop_activation_replay(act, H + i * in, dH + i * in, in, s.dropout,
                                 s.M.rng_at[static_cast<size_t>((l - 1) * b + i)]);
    else
      backprop_activation(act, H + i * in, mask ? mask + i * in : nullptr, dH + i * in, in);
  }
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
    s.kr.matmul(D + j0, 1, out, H, in, grad, in, nj, in, b);
    for (int64_t jj = 0; jj < nj; ++jj) {
      const int64_t j = j0 + jj;
      float gb = 0.0f;
      for (int64_t i = 0; i < b; ++i) gb += D[i * out + j];
      if (L.bf16)
        s.kr.adam_bf16(L.weight16.data() + j * in, L.weight16_m.data() + j * in, L.weight16_v.data() + j * in,
                       grad + jj * in, in, sw, bf16_row_key(sw.step, l, L.key_row0 + j));
      else
        s.kr.adam(W + j * in, Wm + j * in, Wv + j * in, grad + jj * in, in, sw);
      adam_scalar(bias[j], bm[j], bv[j], gb, sb);
    }
  }
}

// Layer 0's output deltas into the samples' records (sized by forward_first_layer: no
// allocation), for the recorded update of layer 0 after the region.
void record_first_layer_deltas(const BatchStep& s) {
  const int64_t w0 = s.layers[0].out_dim;
#pragma omp for schedule(static)
  for (int64_t i = 0; i < s.b; ++i) {
    std::vector<float>& v = s.records[i]->vec[0];
    if (!v.empty()) std::copy(s.M.delta_ptr[0] + i * w0, s.M.delta_ptr[0] + (i + 1) * w0, v.begin());
  }
}

// Sizes this batch's matrices (capacity is kept between batches) and points each layer at its own.
void place_batch_activations(BatchMatrices& M, const std::vector<Layer>& layers, int64_t b, float dropout) {
  const int nl = static_cast<int>(layers.size());
  const size_t sb = static_cast<size_t>(b);
  if (M.recompute) {
    for (size_t k = 0; k < M.slots.size(); ++k) M.slots[k].resize(sb * static_cast<size_t>(M.slot_width[k]));
    M.rng_at.resize(sb * static_cast<size_t>(nl - 1));
  }
  for (int l = 0; l < nl; ++l) {
    const size_t n = sb * static_cast<size_t>(layers[l].out_dim);
    const bool hidden = l + 1 < nl;
    if (!M.recompute || !hidden) {
      M.out[l].resize(n);
      M.delta[l].resize(n);
      if (hidden && dropout > 0.0f) M.mask[l].resize(n);
      M.out_ptr[l] = M.redo_ptr[l] = M.out[l].data();
      M.delta_ptr[l] = M.delta[l].data();
      M.mask_ptr[l] = hidden && dropout > 0.0f ? M.mask[l].data() : nullptr;
      continue;
    }
    M.out_ptr[l] = M.slots[M.out_slot[l]].data();
    M.redo_ptr[l] = M.redo_slot[l] >= 0 ? M.slots[M.redo_slot[l]].data() : nullptr;
    M.delta_ptr[l] = M.slots[M.delta_slot[l]].data();
    M.mask_ptr[l] = nullptr;
  }
}

}  // namespace

void plan_batch_activations(BatchMatrices& M, const std::vector<Layer>& layers, bool recompute) {
  const int nl = static_cast<int>(layers.size());
  const size_t n = static_cast<size_t>(nl);
  M.recompute = recompute;
  M.checkpoint.assign(n, 1);
  M.out_slot.assign(n, -1);
  M.redo_slot.assign(n, -1);
  M.delta_slot.assign(n, -1);
  M.slot_width.clear();
  M.slots.clear();
  M.out_ptr.assign(n, nullptr);
  M.redo_ptr.assign(n, nullptr);
  M.delta_ptr.assign(n, nullptr);
  M.mask_ptr.assign(n, nullptr);
  if (!recompute) {
    M.floats_per_sample = 3 * M.width;
    return;
  }
  // Checkpoints every c = ceil(sqrt(h)) of the h hidden layers: about h / c outputs kept for
  // the batch and at most c - 1 recomputed ones at a time; each non-checkpoint layer is
  // recomputed once per batch.
  const int h = nl - 1;
  int c = 1;
  while (c * c < h) ++c;
  for (int l = 0; l < h; ++l) M.checkpoint[l] = l % c == 0 || l == h - 1;
  // The batch step by step (trainer below), each hidden matrix taking the first free slot when
  // it is made and freeing it after its last use.
  std::vector<char> busy;
  auto take = [&](int l) {
    const int64_t w = layers[l].out_dim;
    size_t s = 0;
    while (s < busy.size() && busy[s]) ++s;
    if (s == busy.size()) {
      busy.push_back(0);
      M.slot_width.push_back(0);
    }
    busy[s] = 1;
    M.slot_width[s] = std::max(M.slot_width[s], w);
    return static_cast<int>(s);
  };
  auto release = [&](int s) { busy[static_cast<size_t>(s)] = 0; };
  for (int l = 0; l < h; ++l) {  // forward: a non-checkpoint output lives until the next layer's is made
    M.out_slot[l] = take(l);
    if (l > 0 && !M.checkpoint[l - 1]) release(M.out_slot[l - 1]);
  }
  for (int l = nl - 1; l >= 1; --l) {  // backward through layer l: needs layer l - 1's output
    if (!M.checkpoint[l - 1] && M.checkpoint[l]) {  // recompute_input: the segment below l
      int j = l - 1;
      while (!M.checkpoint[j]) --j;
      for (int m = j + 1; m <= l - 1; ++m) M.redo_slot[m] = take(m);
    }
    const int in = M.checkpoint[l - 1] ? M.out_slot[l - 1] : M.redo_slot[l - 1];
    M.delta_slot[l - 1] = take(l - 1);
    if (l + 1 < nl) release(M.delta_slot[l]);
    release(in);  // a checkpoint's last use is the backward pass of the layer above it
  }
  M.slots.resize(M.slot_width.size());
  M.floats_per_sample = 2 * layers.back().out_dim;  // the output layer's logits and deltas
  for (const int64_t w : M.slot_width) M.floats_per_sample += w;
}

bool Network::batched_for(int64_t b) const noexcept {
  return batch_ && b <= kMaxBatchFloats / batch_->floats_per_sample;
}

float Network::train_batch_layerwise(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr) {
  const int64_t t = step_ + 1;
  const int nl = static_cast<int>(layers_.size());
  const float dropout = spec_.dropout;
  BatchMatrices& M = *batch_;
  place_batch_activations(M, layers_, b, dropout);
  M.loss.assign(static_cast<size_t>(b), 0.0f);
  M.rng.resize(static_cast<size_t>(b));
  const AdamStep sw = make_adam_step(spec_.adam, lr, t, true);
  const AdamStep sb = make_adam_step(spec_.adam, lr, t, false);
  const BatchStep step{layers_, M, records_, kernels(), b, 1.0f / static_cast<float>(b), dropout};
  M.wide.resize(static_cast<size_t>(nl));
  for (int l = 1; l < nl; ++l)
    if (layers_[l].bf16) M.wide[l].resize(static_cast<size_t>(layers_[l].rows * layers_[l].row_len));
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (b * sample_work_ > kParallelWork)
  {
    widen_bf16_weights(step);
    forward_first_layer(step, x, y, rows, spec_.seed, t, catcher, poller);
    // After the loop's barrier every thread sees the same flags: the batch goes on (and can no
    // longer fail) or is abandoned with the weights untouched.
    if (!catcher.failed() && !poller.stopped()) {
      forward_dense_layers(step);
      if (layers_.back().spec.activation == Activation::Sigmoid) sigmoid_cross_entropy(step);
      else softmax_cross_entropy(step);
      float* grad = M.grad[omp_get_thread_num()].data();
      for (int l = nl - 1; l >= 1; --l) {
        recompute_input(step, l);
        backward_and_update(step, l, sw, sb, grad);
      }
      record_first_layer_deltas(step);
    }
  }
  catcher.rethrow();  // only the first loop can fail, before any weight changed
  if (poller.stopped()) throw Interrupted();
  adam_step_recorded(layers_[0], records_, b, sw, sb, workspaces_, vec_ptrs_, threads_);
  finish_step(t);
  double total = 0.0;
  for (int64_t i = 0; i < b; ++i) total += M.loss[i];
  return static_cast<float>(total / static_cast<double>(b));
}

}  // namespace slide
