// Shared error types and parallel-region helpers for the slide engine.
//
// User errors (bad files, bad arguments) are thrown as the types below and
// mapped to Python exceptions by the bindings; internal invariants use assert.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>

namespace slide {

// Base of every error the engine reports to its caller.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Malformed or inconsistent input data; message names path, 1-based line and problem.
// Maps to slide.DataError (a ValueError).
struct DataError : Error {
  using Error::Error;
};
// A bad argument or configuration value. Maps to ValueError.
struct InvalidArgument : Error {
  using Error::Error;
};
// A file that cannot be opened. Maps to FileNotFoundError.
struct FileNotFound : Error {
  using Error::Error;
};
// Raised when the interrupt hook asks a long loop to stop. Maps to KeyboardInterrupt.
struct Interrupted : Error {
  Interrupted() : Error("interrupted") {}
};

// Captures the first exception thrown inside an OpenMP region so that it can be
// rethrown on the calling thread after the region ends (an exception escaping
// a parallel region would call std::terminate).
class ExceptionCatcher {
 public:
  template <class F>
  void run(F&& f) noexcept {
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  // True once any iteration failed; long loops may use it to skip remaining work.
  bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  void rethrow() {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

// Number of threads to use when a caller asks for `requested` (0 = all hardware threads).
int resolve_threads(int requested) noexcept;

// Interrupt hook: long loops call check_interrupt() between units of work. The
// bindings install a hook that polls Python's signal handlers (Ctrl-C).
using InterruptHook = bool (*)();
void set_interrupt_hook(InterruptHook hook) noexcept;
// Returns true when the installed hook reports a pending interrupt.
bool interrupt_requested() noexcept;

}  // namespace slide
