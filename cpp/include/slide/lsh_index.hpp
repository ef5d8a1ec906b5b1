// A stand-alone LSH index over the rows of a matrix (hash function, tables, active-set
// sampler), for tests and tools: the same parts a hash-sampled layer uses, with every input
// checked. Errors throw InvalidArgument naming the argument.
//
// Thread safety: const methods may run from several threads at once; build() and query()
// must not run concurrently with anything else on the same index.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "slide/hash.hpp"

namespace slide {

class LshIndex {
 public:
  // Throws InvalidArgument for parameters validate_lsh_params rejects or dim < 1.
  LshIndex(const LshParams& params, int dim, uint64_t seed);

  // Bucket ids (L of them) of x, which has `len` entries; len must equal dim().
  void hash(const float* x, int64_t len, uint32_t* buckets) const;
  // Bucket ids [n x L] of the n rows of X (`cols` floats each, cols == dim()), in parallel
  // over num_threads (0 = all cores, >= 0).
  void hash_batch(const float* X, int64_t n, int64_t cols, int num_threads, uint32_t* buckets) const;
  // Rebuilds the tables from the n rows of W (row i is item i, cols == dim(), n < 2^31).
  void build(const float* W, int64_t n, int64_t cols, int num_threads);
  // Items in bucket `id` of table `table` (both checked against L and 2^range_pow).
  std::pair<const int32_t*, int> bucket(int table, int64_t id) const;
  // Active set for x (len == dim()): the forced ids (each in 0..num_items-1) first, then
  // bucket candidates by sel.mode, a random fill to sel.min_active from stream `seed`, cut
  // at sel.max_active. Requires build() first; sel.threshold >= 1, min/max_active >= 0.
  std::vector<int32_t> query(const float* x, int64_t len, const int64_t* forced, int64_t n_forced,
                             const SelectionParams& sel, uint64_t seed);

  double occupancy() const { return tables_->occupancy(); }
  size_t memory_bytes() const { return tables_->memory_bytes(); }
  int64_t num_items() const { return tables_->num_items(); }
  int dim() const { return hash_->dim(); }
  int range_pow() const { return hash_->range_pow(); }
  const LshParams& params() const { return params_; }

 private:
  void check_len(int64_t len, const char* name, const char* what) const;

  LshParams params_;
  uint64_t seed_;
  std::unique_ptr<HashFunction> hash_;
  std::unique_ptr<LshTables> tables_;
  std::unique_ptr<ActiveSetSampler> sampler_;
};

}  // namespace slide
