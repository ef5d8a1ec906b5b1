// The one borrowed view of CSR arrays that the data writer, the checks and the engine share.
#pragma once

#include <cstdint>

namespace slide {

// Borrowed compressed-sparse-row arrays of n rows; the view owns nothing and the arrays
// must outlive it. Row r holds indices[indptr[r] .. indptr[r+1]) and, when values is not
// null, the values at the same positions. Labels have no values.
struct CsrView {
  const int64_t* indptr = nullptr;  // n + 1 entries
  const int32_t* indices = nullptr; // nnz entries
  const float* values = nullptr;    // nnz entries, or null (labels)
  int64_t n = 0;                    // rows (0 when the user of the view tracks them itself)
  int64_t nnz = 0;                  // entries of indices (and values)
};

// One row of a CsrView: nnz indices and their values (values null for labels).
struct SparseRow {
  const int32_t* indices = nullptr;
  const float* values = nullptr;
  int64_t nnz = 0;
};

inline SparseRow csr_row(const CsrView& c, int64_t r) noexcept {
  const int64_t s = c.indptr[r];
  return SparseRow{c.indices + s, c.values ? c.values + s : nullptr, c.indptr[r + 1] - s};
}

}  // namespace slide
