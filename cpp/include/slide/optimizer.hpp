// Fused sparse Adam: the optimizer step of a batch visits only the weight rows the
// batch touched, and does gradient read, both moment updates and the weight write in
// one pass per row, instead of the dense sweeps over every weight that the original
// SLIDE implementation runs after each batch.
//
// Adam: Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
// Decoupled weight decay: Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
// Rows that a batch does not touch keep their moments unchanged (lazy/sparse Adam); the
// bias correction uses the network's global step, as in the dense algorithm.
//
// This unit holds the maths (AdamStep, the scalar step and its reference row form) and the
// batch passes over a layer; the vectorised row kernel is Kernels::adam (simd.hpp), which
// computes exactly adam_row_reference.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace slide {

struct Layer;
struct SampleRecord;
struct SampleWorkspace;

// No defaults of its own: a network takes them from its resolved configuration.
struct AdamParams {
  float beta1{};
  float beta2{};
  float eps{};
  float weight_decay{};  // decoupled, applied to the touched weight rows only (not biases)
};

// One fused Adam step with bias correction folded into lr_t:
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   w -= lr_t m / (sqrt(v) + eps) + decay w;  g = 0
struct AdamStep {
  float beta1, beta2;
  float lr_t;   // lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  float eps;    // eps * sqrt(1 - beta2^t): keeps eps in the units of the uncorrected v
  float decay;  // lr * weight_decay (0 for biases)
};

// The per-step constants for global step t >= 1 and learning rate lr (decay only when
// with_decay: weights yes, biases no).
AdamStep make_adam_step(const AdamParams& p, float lr, int64_t t, bool with_decay) noexcept;

// Scalar fused Adam on one value (biases); zeroes g.
inline void adam_scalar(float& w, float& m, float& v, float& g, const AdamStep& s) noexcept {
  const float gi = g;
  m = s.beta1 * m + (1.0f - s.beta1) * gi;
  v = s.beta2 * v + (1.0f - s.beta2) * gi * gi;
  w -= s.lr_t * m / (__builtin_sqrtf(v) + s.eps) + s.decay * w;
  g = 0.0f;
}

// The step on a row of n values, one adam_scalar per value: the reference every row kernel
// (Kernels::adam) matches to rounding (tests compare them).
void adam_row_reference(float* w, float* m, float* v, float* g, int64_t n, const AdamStep& s) noexcept;

// What a batch pass over a layer did (the profiler's byte counts): rows updated, and
// gradient entries summed into them (recorded layers).
struct AdamPassStats {
  int64_t rows = 0;
  int64_t entries = 0;
  // Bytes the pass moved: each row's weights and both moments read and written, its bias
  // triple, the entries, and the recorded pass's per-row offsets over the whole layer.
  double bytes(int64_t row_len, int64_t layer_rows, bool recorded) const noexcept {
    return static_cast<double>(rows) * (6.0 * 4.0 * static_cast<double>(row_len) + 64.0) +
           static_cast<double>(entries) * 8.0 + (recorded ? 16.0 * static_cast<double>(layer_rows) : 0.0);
  }
};

// Thread-safety of the passes below: each runs its own parallel region over `num_threads`
// threads and must not run concurrently with anything else touching the layer.

// The batch step of a recorded layer (records == true): groups the first b records'
// entries for this layer by row (samples in batch order), forms each touched row's
// gradient from them and updates it, in ascending row order; then layer 0's biases from
// the samples' output deltas. Results do not depend on num_threads. `scratch` holds one
// workspace per thread (its grad_row and adam_rows are used); vec_ptrs is reused scratch.
AdamPassStats adam_step_recorded(Layer& L, const std::vector<std::unique_ptr<SampleRecord>>& records, int64_t b,
                        const AdamStep& sw, const AdamStep& sb,
                        const std::vector<std::unique_ptr<SampleWorkspace>>& scratch,
                        std::vector<const float*>& vec_ptrs, int num_threads);

// The batch step of a lock-free layer (records == false): every row (all_rows) or the rows
// the workspaces' touched lists name, from the layer's gradient buffers, which it leaves zero
// (and the markers and lists cleared).
AdamPassStats adam_step_buffered(Layer& L, const AdamStep& sw, const AdamStep& sb,
                        const std::vector<std::unique_ptr<SampleWorkspace>>& workspaces, int num_threads);

// Drops the gradients a failed or interrupted batch left in a lock-free layer's buffers
// (recorded layers need nothing: every sample rewrites its record).
void discard_buffered_gradients(Layer& L, const std::vector<std::unique_ptr<SampleWorkspace>>& workspaces);

}  // namespace slide
