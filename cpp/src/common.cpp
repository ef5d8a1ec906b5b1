#include "slide/common.hpp"

#include <omp.h>

namespace slide {

int resolve_threads(int requested) noexcept {
  // Far beyond any machine, and libgomp aborts the process on absurd team sizes; configs
  // are refused above this with a clear error before they get here.
  constexpr int kMaxThreads = 1024;
  if (requested > 0) return requested < kMaxThreads ? requested : kMaxThreads;
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
