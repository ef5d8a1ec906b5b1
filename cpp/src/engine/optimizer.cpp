#include "slide/optimizer.hpp"

#include <cmath>

namespace slide {

AdamStep make_adam_step(const AdamParams& p, float lr, int64_t t, bool with_decay) noexcept {
  // Computed in double: for large t, 1 - beta^t must not round to 0 or 1 prematurely.
  const double c1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(t));
  const double c2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(t));
  AdamStep s;
  s.beta1 = p.beta1;
  s.beta2 = p.beta2;
  // m_hat / (sqrt(v_hat) + eps) = (sqrt(c2)/c1) m / (sqrt(v) + eps sqrt(c2))
  s.lr_t = static_cast<float>(lr * std::sqrt(c2) / c1);
  s.eps = static_cast<float>(p.eps * std::sqrt(c2));
  s.decay = with_decay ? lr * p.weight_decay : 0.0f;
  return s;
}

}  // namespace slide
