// Fused sparse Adam: the optimizer step of a batch visits only the weight rows the
// batch touched, and does gradient read, both moment updates and the weight write in
// one pass per row (then zeroes the row's gradient), instead of the dense sweeps over
// every weight that the original SLIDE implementation runs after each batch.
//
// Adam: Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
// Decoupled weight decay: Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
// Rows that a batch does not touch keep their moments unchanged (lazy/sparse Adam); the
// bias correction uses the network's global step, as in the dense algorithm.
#pragma once

#include <cstdint>

#include "slide/simd.hpp"

namespace slide {

struct AdamParams {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled, applied to the touched weight rows only (not biases)
};

// The per-step constants for global step t >= 1 and learning rate lr.
AdamStep make_adam_step(const AdamParams& p, float lr, int64_t t, bool with_decay) noexcept;

// Scalar fused Adam on one value (biases); zeroes *g.
inline void adam_scalar(float& w, float& m, float& v, float& g, const AdamStep& s) noexcept {
  const float gi = g;
  m = s.beta1 * m + (1.0f - s.beta1) * gi;
  v = s.beta2 * v + (1.0f - s.beta2) * gi * gi;
  w -= s.lr_t * m / (__builtin_sqrtf(v) + s.eps) + s.decay * w;
  g = 0.0f;
}

}  // namespace slide
