// Where a network's training time goes: wall time and bytes moved per engine phase, and a
// STREAM-like memory-bandwidth figure to compare the bytes with.
//
// The profiler is off by default. Off, a phase costs one test of a null pointer (no clock
// is read); on, a phase reads the steady clock twice and adds into counters of its own
// thread (cache-line sized slots, no sharing between threads).
//
// Seconds: phases that run once per batch on the calling thread (the optimizer step, table
// rebuilds, collecting the batch's negatives) count their wall time. Phases that run per
// sample on every thread of a parallel region count thread-seconds, which the trainer folds
// into wall-time equivalents at the end of the region (thread-seconds / threads of the team):
// per-phase seconds then add up to about the batch time, and a share is seconds / batch time.
//
// Bytes: what each phase reads and writes of arrays that do not stay in the caches (weight
// rows and their Adam moments, table buckets, sampler slots), counted from the sizes the
// phase works on: a scattered access counts a 64-byte line, a row its floats. The figure is
// a model of the traffic (it ignores cache hits between phases), not a hardware counter.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace slide {

enum class Phase : int {
  Hashing = 0,   // hash codes of a layer input (LSH layers)
  Selection,     // active sets from the buckets, forced labels, random fill; batch negatives
  Forward,       // hidden layers and the selected output logits
  Softmax,       // softmax statistics, sampled-softmax weights, dL/dz and the loss
  Backward,      // gradient records and dL/dh through every layer
  Adam,          // the fused sparse Adam step of the batch
  Rebuild,       // hash-table rebuilds (at once or a spread rebuild's share of this batch)
  Shuffle,       // batch order and data gathering (recorded by the caller, add_time)
  Count
};
constexpr int kPhases = static_cast<int>(Phase::Count);

// "hashing", "selection", ... (the keys of the Python profile dict).
const char* phase_name(Phase p) noexcept;

// One thread's counters, padded to a cache line multiple so threads never share a line.
struct alignas(64) PhaseCounters {
  double seconds[kPhases] = {};
  double bytes[kPhases] = {};
  int64_t calls[kPhases] = {};
  void clear() noexcept { *this = PhaseCounters{}; }
};

// Times one phase into `c` (nothing when c is null). Bytes may be added before it ends.
class PhaseTimer {
 public:
  PhaseTimer(PhaseCounters* c, Phase p, double bytes = 0.0) noexcept : c_(c), p_(static_cast<int>(p)) {
    if (c_) {
      c_->bytes[p_] += bytes;
      t0_ = std::chrono::steady_clock::now();
    }
  }
  ~PhaseTimer() {
    if (c_) {
      c_->seconds[p_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      ++c_->calls[p_];
    }
  }
  void add_bytes(double b) noexcept {
    if (c_) c_->bytes[p_] += b;
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  PhaseCounters* c_;
  int p_;
  std::chrono::steady_clock::time_point t0_;
};

// What Profiler::report() returns.
struct ProfileReport {
  bool enabled = false;
  PhaseCounters totals;          // seconds: wall-time equivalents (see above)
  double thread_seconds[kPhases] = {};  // per-sample phases: summed over threads, unfolded
  int64_t batches = 0;
  int64_t samples = 0;
  double batch_seconds = 0.0;    // wall time inside train_batch (all phases and the rest)
  double longest_batch = 0.0;    // the longest single train_batch call
  int64_t longest_batch_step = -1;  // the step that batch became
};

// A network's profiler. Not thread-safe by itself: the network calls it under its lock;
// slot(t) is written by thread t of a parallel region only.
class Profiler {
 public:
  bool enabled() const noexcept { return enabled_; }
  void set_enabled(bool on) noexcept { enabled_ = on; }
  void reset() noexcept;
  // Room for `threads` per-thread slots (call before a region; allocates only when growing).
  void ensure_threads(int threads);
  // Thread t's slot in a parallel region, or null when the profiler is off.
  PhaseCounters* slot(int t) noexcept { return enabled_ ? &slots_[static_cast<size_t>(t)] : nullptr; }
  // The calling thread's slot for once-per-batch phases (wall time), or null when off.
  PhaseCounters* serial() noexcept { return enabled_ ? &serial_ : nullptr; }
  // After a parallel region of `team` threads: moves the slots' counters into the totals,
  // seconds divided by team.
  void fold(int team) noexcept;
  // A whole train_batch call of `samples` samples that took `seconds` and became step `step`.
  void end_batch(double seconds, int64_t samples, int64_t step) noexcept;
  // Adds time measured outside the engine (e.g. Phase::Shuffle by the Python loop).
  void add_time(Phase p, double seconds, double bytes) noexcept;
  ProfileReport report() const noexcept;

 private:
  bool enabled_ = false;
  std::vector<PhaseCounters> slots_;
  PhaseCounters serial_;
  PhaseCounters totals_;
  double thread_seconds_[kPhases] = {};
  int64_t batches_ = 0, samples_ = 0, longest_step_ = -1;
  double batch_seconds_ = 0.0, longest_ = 0.0;
};

// STREAM-like triad a[i] = b[i] + s c[i] over three arrays of `mib` MiB each (doubles, first
// touched by the threads that use them), `threads` threads (0 = all cores), best of `reps`
// timed passes after one untimed one. Returns GB/s (10^9 bytes) counting 24 bytes per
// element (two reads and a write, as STREAM does; write-allocate traffic is not counted).
// Throws InvalidArgument for mib < 1, reps < 1 or threads < 0.
double stream_triad(int64_t mib, int threads, int reps);

}  // namespace slide
