// The phase profiler and the memory-bandwidth triad (see slide/profile.hpp).
#include "slide/profile.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "slide/common.hpp"
#include "slide/memory.hpp"

namespace slide {

const char* phase_name(Phase p) noexcept {
  switch (p) {
    case Phase::Hashing: return "hashing";
    case Phase::Selection: return "selection";
    case Phase::Forward: return "forward";
    case Phase::Softmax: return "softmax";
    case Phase::Backward: return "backward";
    case Phase::Adam: return "adam";
    case Phase::Rebuild: return "rebuild";
    case Phase::Shuffle: return "shuffle";
    default: return "?";
  }
}

void Profiler::reset() noexcept {
  for (PhaseCounters& c : slots_) c.clear();
  serial_.clear();
  totals_.clear();
  std::fill(thread_seconds_, thread_seconds_ + kPhases, 0.0);
  batches_ = samples_ = 0;
  longest_step_ = -1;
  batch_seconds_ = longest_ = 0.0;
}

void Profiler::ensure_threads(int threads) {
  if (static_cast<int>(slots_.size()) < threads) slots_.resize(static_cast<size_t>(threads));
}

void Profiler::fold(int team) noexcept {
  const double inv = 1.0 / std::max(1, team);
  for (PhaseCounters& c : slots_) {
    for (int p = 0; p < kPhases; ++p) {
      totals_.seconds[p] += c.seconds[p] * inv;
      thread_seconds_[p] += c.seconds[p];
      totals_.bytes[p] += c.bytes[p];
      totals_.calls[p] += c.calls[p];
    }
    c.clear();
  }
}

void Profiler::end_batch(double seconds, int64_t samples, int64_t step) noexcept {
  for (int p = 0; p < kPhases; ++p) {
    totals_.seconds[p] += serial_.seconds[p];
    totals_.bytes[p] += serial_.bytes[p];
    totals_.calls[p] += serial_.calls[p];
  }
  serial_.clear();
  ++batches_;
  samples_ += samples;
  batch_seconds_ += seconds;
  if (seconds > longest_) {
    longest_ = seconds;
    longest_step_ = step;
  }
}

void Profiler::add_time(Phase p, double seconds, double bytes) noexcept {
  const int i = static_cast<int>(p);
  totals_.seconds[i] += seconds;
  totals_.bytes[i] += bytes;
  ++totals_.calls[i];
}

ProfileReport Profiler::report() const noexcept {
  ProfileReport r;
  r.enabled = enabled_;
  r.totals = totals_;
  std::copy(thread_seconds_, thread_seconds_ + kPhases, r.thread_seconds);
  r.batches = batches_;
  r.samples = samples_;
  r.batch_seconds = batch_seconds_;
  r.longest_batch = longest_;
  r.longest_batch_step = longest_step_;
  return r;
}

double stream_triad(int64_t mib, int threads, int reps) {
  if (mib < 1) throw InvalidArgument("mib: must be >= 1, got " + std::to_string(mib));
  if (reps < 1) throw InvalidArgument("reps: must be >= 1, got " + std::to_string(reps));
  if (threads < 0) throw InvalidArgument("threads: must be >= 0, got " + std::to_string(threads));
  const int nt = resolve_threads(threads);
  const int64_t n = mib * (int64_t(1) << 20) / static_cast<int64_t>(sizeof(double));
  AlignedBuffer<double> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)), c(static_cast<size_t>(n));
  double* pa = a.data();
  double* pb = b.data();
  double* pc = c.data();
  // First touch by the threads (and the static schedule) that run the triad: pages land
  // on the memory of the cores that use them.
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = 0.0;
    pb[i] = 1.0;
    pc[i] = 2.0;
  }
  const double s = 3.0;
  double best = 1e300;
  for (int rep = 0; rep <= reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, dt);  // the first pass warms the pages and the team
  }
  if (pa[n / 2] != 7.0) throw Error("stream_triad: wrong result");  // keeps the loop from being elided
  return 24.0 * static_cast<double>(n) / best / 1e9;
}

}  // namespace slide
