#include "slide/common.hpp"

#include <omp.h>

namespace slide {

int resolve_threads(int requested) noexcept {
  if (requested > 0) return requested;
  int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}

namespace {
std::atomic<InterruptHook> g_interrupt_hook{nullptr};
}

void set_interrupt_hook(InterruptHook hook) noexcept { g_interrupt_hook.store(hook); }

bool interrupt_requested() noexcept {
  InterruptHook hook = g_interrupt_hook.load();
  return hook != nullptr && hook();
}

}  // namespace slide
