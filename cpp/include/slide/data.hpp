// Sparse multi-label datasets: CSR storage, parallel text readers, XC writer.
//
// Two text formats are read:
//   * Extreme Classification Repository (XC): a header line "N D L", then one
//     line per point, "l1,l2,... f:v f:v ...", 0-based label and feature ids.
//   * libsvm multilabel: the same data lines without the header, feature ids
//     1-based (stored 0-based).
// A point without labels is a line that starts with a space (or whose first
// token is already a feature "f:v"). CRLF line ends and trailing spaces are
// accepted; blank lines after the last data line are ignored.
//
// Every malformed input throws DataError whose message is
// "<path>:<line>: <what is wrong>" with a 1-based line number; a file that
// cannot be opened throws FileNotFound. No input makes the reader crash.
// All functions here are reentrant: they share no state, so several may run
// at once from different threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "slide/csr.hpp"

namespace slide {

// Allocator whose value-construction leaves trivially constructible elements
// uninitialised, so resizing a large output array does not touch (and commit)
// its pages before the data is written: this keeps the reader's peak memory
// close to the size of its result.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() noexcept = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(noexcept(::new (static_cast<void*>(p)) U)) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A growable array whose resize() does not zero the new elements.
template <class T>
using Buffer = std::vector<T, DefaultInitAllocator<T>>;

enum class DataFormat { kAuto, kXC, kLibSVM };

// "auto", "xc" or "libsvm"; anything else throws InvalidArgument.
DataFormat parse_format_name(const std::string& name);
const char* format_name(DataFormat format) noexcept;

// Compressed sparse rows. `values` is empty for label matrices (all ones).
struct CsrArrays {
  Buffer<int64_t> indptr;   // num_points + 1 entries, indptr[0] == 0
  Buffer<int32_t> indices;  // strictly increasing within each row
  Buffer<float> values;     // finite float32, one per index (features only)
};

struct ReadOptions {
  DataFormat format = DataFormat::kAuto;  // kAuto: XC when line 1 is three integers and has no ':'
  // Width of the feature / label space. -1: the XC header's value, or for
  // libsvm the largest id seen + 1. When given it overrides the header and
  // every id must be below it.
  int64_t num_features = -1;
  int64_t num_labels = -1;
  int num_threads = 0;  // 0: all hardware threads
};

struct LoadedData {
  DataFormat format = DataFormat::kXC;  // the format actually parsed
  int64_t num_points = 0;
  int64_t num_features = 0;
  int64_t num_labels = 0;
  CsrArrays features;  // num_points x num_features, float32 values
  CsrArrays labels;    // num_points x num_labels, values empty
};

// Reads a dataset file in parallel (the file is split into chunks at line
// boundaries, one thread per chunk). Duplicate feature or label ids within a
// line are rejected with DataError (summing or keeping one would silently
// change the data). Polls interrupt_requested() from worker threads and throws
// Interrupted, so a caller from Python must have released the GIL. The file is
// read with pread(), never mapped: one that shrinks or changes while it is read
// (size or mtime differ afterwards) raises DataError naming it, never SIGBUS.
LoadedData read_dataset(const std::string& path, const ReadOptions& options);

// Same parser over text already in memory; `name` stands for the path in messages.
LoadedData parse_dataset(std::string_view text, const std::string& name, const ReadOptions& options);

// Writes the XC text format (num_points rows; the views' n and nnz are not used). Values
// use the shortest decimal form that reads back to the same float32, so
// read_dataset(write_xc(d)) reproduces d exactly.
// Throws InvalidArgument for a non-finite value, Error when the file cannot be
// written. The CSR must already be valid (see check_csr).
void write_xc(const std::string& path, int64_t num_points, int64_t num_features, int64_t num_labels,
              CsrView features, CsrView labels, int num_threads);

// Result of check_csr: `problem` is empty for a valid matrix.
struct CsrCheck {
  std::string problem;        // e.g. "row 3: column index 12 >= 10"
  bool sorted_unique = true;  // every row strictly increasing (meaningful when problem is empty)
};

// Validates a CSR structure in parallel: indptr[0] == 0, non-decreasing,
// indptr[rows] == nnz, 0 <= index < num_columns. Also reports whether each
// row's indices are strictly increasing. Optionally checks values are finite.
CsrCheck check_csr(int64_t rows, const int64_t* indptr, int64_t nnz, const int32_t* indices,
                   int64_t num_columns, const float* values, int num_threads);

// A 64-bit content fingerprint of a byte range (parallel; not cryptographic),
// used to reject cache files whose bytes changed after they were written.
uint64_t fingerprint(const void* data, size_t bytes, int num_threads);

}  // namespace slide
