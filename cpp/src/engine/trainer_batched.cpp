// The batched dense trainer: networks without hash-sampled layers (whose first layer keeps
// records, and whose batch activations fit kMaxBatchFloats, see training_paths.hpp) train a
// batch layer by layer. The samples' layer-0 outputs are gathered into a batch matrix, and
// every later layer runs as matrix products over the whole batch (forward, input gradient,
// then each weight row's gradient formed and passed to Adam in the same pass), which reads
// each weight matrix a few times per batch instead of a few times per sample.
//
// The phases below are called by every thread of one parallel region (one region per batch:
// barriers are costly when cores are shared); each holds its own worksharing loops.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "engine_internal.hpp"
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
      float* z = s.M.out[0].data() + i * w0;
      std::copy(first.bias.data(), first.bias.data() + w0, z);
      for (int64_t k = 0; k < nnz; ++k)
        s.kr.axpy(x.values[a + k], first.weight.data() + static_cast<int64_t>(x.indices[a + k]) * first.row_len, z,
                  w0);
      if (hidden)
        activate(first.spec.activation, z, s.dropout > 0.0f ? s.M.mask[0].data() + i * w0 : nullptr, w0, s.dropout,
                 s.M.rng[i]);
    });
  }
}

// Forward through the dense layers: Z = H W^T + bias, by blocks of weight rows.
void forward_dense_layers(const BatchStep& s) {
  const int nl = static_cast<int>(s.layers.size());
  for (int l = 1; l < nl; ++l) {
    const Layer& L = s.layers[l];
    const int64_t out = L.out_dim, in = L.in_dim;
    const float* H = s.M.out[l - 1].data();
    float* Z = s.M.out[l].data();
    const int64_t blocks = (out + kForwardRows - 1) / kForwardRows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t j0 = blk * kForwardRows, nj = std::min(kForwardRows, out - j0);
      s.kr.matmul_bt(H, in, L.weight.data() + j0 * in, in, Z + j0, out, s.b, nj, in);
      const float* bias = L.bias.data() + j0;
      for (int64_t i = 0; i < s.b; ++i) {
        float* z = Z + i * out + j0;
        for (int64_t j = 0; j < nj; ++j) z[j] += bias[j];
      }
    }
    if (l + 1 < nl) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < s.b; ++i)
        activate(L.spec.activation, Z + i * out, s.dropout > 0.0f ? s.M.mask[l].data() + i * out : nullptr, out,
                 s.dropout, s.M.rng[i]);
    }
  }
}

// Softmax cross-entropy per sample: delta = (softmax - target) / b, target mass 1/|y|.
void softmax_cross_entropy(const BatchStep& s) {
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
  const float* D = s.M.delta[l].data();
  const float* H = s.M.out[l - 1].data();
  float* dH = s.M.delta[l - 1].data();
  const int64_t sblocks = (b + kBackSamples - 1) / kBackSamples;
  const int64_t cblocks = (in + kBackCols - 1) / kBackCols;
#pragma omp for schedule(dynamic, 1)
  for (int64_t task = 0; task < sblocks * cblocks; ++task) {
    const int64_t s0 = (task / cblocks) * kBackSamples, c0 = (task % cblocks) * kBackCols;
    s.kr.matmul(D + s0 * out, out, 1, L.weight.data() + c0, in, dH + s0 * in + c0, in,
                std::min(kBackSamples, b - s0), std::min(kBackCols, in - c0), out);
  }
  // (barrier) Through the previous layer's activation and dropout.
  const Activation act = s.layers[l - 1].spec.activation;
#pragma omp for schedule(static) nowait
  for (int64_t i = 0; i < b; ++i)
    backprop_activation(act, H + i * in, s.dropout > 0.0f ? s.M.mask[l - 1].data() + i * in : nullptr, dH + i * in,
                        in);
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
    if (!v.empty()) std::copy(s.M.delta[0].data() + i * w0, s.M.delta[0].data() + (i + 1) * w0, v.begin());
  }
}

}  // namespace

bool Network::batched_for(int64_t b) const noexcept {
  return batch_ && b <= kMaxBatchFloats / (3 * batch_->width);
}

float Network::train_batch_layerwise(const CsrView& x, const CsrView& y, const int64_t* rows, int64_t b, float lr) {
  const int64_t t = step_ + 1;
  const int nl = static_cast<int>(layers_.size());
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
  const AdamStep sw = make_adam_step(spec_.adam, lr, t, true);
  const AdamStep sb = make_adam_step(spec_.adam, lr, t, false);
  const BatchStep step{layers_, M, records_, kernels(), b, 1.0f / static_cast<float>(b), dropout};
  InterruptPoller poller;
  ExceptionCatcher catcher;
#pragma omp parallel num_threads(threads_) if (b * sample_work_ > kParallelWork)
  {
    forward_first_layer(step, x, y, rows, spec_.seed, t, catcher, poller);
    // After the loop's barrier every thread sees the same flags: the batch goes on (and can no
    // longer fail) or is abandoned with the weights untouched.
    if (!catcher.failed() && !poller.stopped()) {
      forward_dense_layers(step);
      if (layers_.back().spec.activation == Activation::Sigmoid) sigmoid_cross_entropy(step);
      else softmax_cross_entropy(step);
      float* grad = M.grad[omp_get_thread_num()].data();
      for (int l = nl - 1; l >= 1; --l) backward_and_update(step, l, sw, sb, grad);
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
