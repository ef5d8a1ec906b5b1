// A checked stand-alone LSH index (see slide/lsh_index.hpp).
#include "slide/lsh_index.hpp"

#include <string>

#include "slide/common.hpp"
#include "slide/random.hpp"

namespace slide {

LshIndex::LshIndex(const LshParams& params, int dim, uint64_t seed) : params_(params), seed_(seed) {
  hash_ = HashFunction::create(params_, dim, seed);
  tables_ = std::make_unique<LshTables>(params_, 0);
}

void LshIndex::check_len(int64_t len, const char* name, const char* what) const {
  if (len != hash_->dim())
    throw InvalidArgument(std::string(name) + " has " + (what[0] ? std::to_string(len) + " " + what : "length " +
                          std::to_string(len)) + ", expected dim=" + std::to_string(hash_->dim()));
}

void LshIndex::hash(const float* x, int64_t len, uint32_t* buckets) const {
  check_len(len, "x", "");
  hash_->hash_dense(x, buckets);
}

void LshIndex::hash_batch(const float* X, int64_t n, int64_t cols, int num_threads, uint32_t* buckets) const {
  check_len(cols, "X", "columns");
  if (num_threads < 0) throw InvalidArgument("threads must be >= 0, got " + std::to_string(num_threads));
  const int L = hash_->num_tables();
  const int dim = hash_->dim();
  const HashFunction& h = *hash_;
  const int nt = resolve_threads(num_threads);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; ++i) h.hash_dense(X + i * dim, buckets + i * L);
}

void LshIndex::build(const float* W, int64_t n, int64_t cols, int num_threads) {
  check_len(cols, "W", "columns");
  if (num_threads < 0) throw InvalidArgument("threads must be >= 0, got " + std::to_string(num_threads));
  if (n > 0x7FFFFFFF) throw InvalidArgument("W has too many rows for int32 item ids");
  auto tables = std::make_unique<LshTables>(params_, n);
  tables->build(*hash_, W, n, hash_->dim(), num_threads, seed_);
  tables_ = std::move(tables);
  sampler_ = std::make_unique<ActiveSetSampler>(n);
}

std::pair<const int32_t*, int> LshIndex::bucket(int table, int64_t id) const {
  if (table < 0 || table >= hash_->num_tables())
    throw InvalidArgument("table " + std::to_string(table) + " out of range 0.." +
                          std::to_string(hash_->num_tables() - 1));
  if (id < 0 || id >= (int64_t{1} << hash_->range_pow()))
    throw InvalidArgument("bucket id " + std::to_string(id) + " out of range 0..2^" +
                          std::to_string(hash_->range_pow()) + "-1");
  return tables_->bucket(table, static_cast<uint32_t>(id));
}

std::vector<int32_t> LshIndex::query(const float* x, int64_t len, const int64_t* forced, int64_t n_forced,
                                     const SelectionParams& sel, uint64_t seed) {
  if (!sampler_) throw InvalidArgument("query() before build(): call build(W) first");
  check_len(len, "x", "");
  if (sel.threshold < 1) throw InvalidArgument("threshold must be >= 1, got " + std::to_string(sel.threshold));
  if (sel.min_active < 0) throw InvalidArgument("min_active must be >= 0, got " + std::to_string(sel.min_active));
  if (sel.max_active < 0) throw InvalidArgument("max_active must be >= 0, got " + std::to_string(sel.max_active));
  std::vector<int32_t> ids;
  const int64_t n = tables_->num_items();
  for (int64_t k = 0; k < n_forced; ++k) {
    const int64_t v = forced[k];
    if (v < 0 || v >= n)
      throw InvalidArgument("forced id " + std::to_string(v) + " out of range 0.." + std::to_string(n - 1));
    ids.push_back(static_cast<int32_t>(v));
  }
  std::vector<uint32_t> buckets(hash_->num_tables());
  hash_->hash_dense(x, buckets.data());
  Rng rng(seed);
  std::vector<int32_t> active;
  sampler_->select(*tables_, buckets.data(), ids.data(), static_cast<int>(ids.size()), sel, rng, active);
  return active;
}

}  // namespace slide
