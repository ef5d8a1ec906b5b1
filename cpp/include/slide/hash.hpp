// Locality-sensitive hashing of neurons: hash families, tables and active-set selection.
//
// A wide layer keeps L tables over its neurons' weight vectors. For a layer input x,
// each table maps x to one bucket (K codes combined into a range_pow-bit id); the
// neurons found in those buckets are the candidates for the active set.
//
//  - SimHash: signed random projections (Charikar, STOC 2002); sparse projections
//    with entries in {-1, 0, +1} as in very sparse random projections (Li et al., KDD 2006).
//  - WTA: winner-take-all hashing (Yagnik et al., ICCV 2011): the argmax position
//    among a few permuted coordinates.
//  - DWTA: densified WTA (Chen & Shrivastava, 2018): WTA over the non-zero entries,
//    empty bins filled from other bins so that sparse inputs still get K codes.
//
// Thread safety: HashFunction and LshTables queries are const and may run from many
// threads at once; build() must not run concurrently with queries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slide/random.hpp"

namespace slide {

enum class HashFamily { SimHash, WTA, DWTA };
enum class BucketPolicy { FIFO, Reservoir };
enum class Selection { Vanilla, TopK, Threshold };

HashFamily parse_hash_family(const std::string& name);        // throws InvalidArgument
BucketPolicy parse_bucket_policy(const std::string& name);    // throws InvalidArgument
Selection parse_selection(const std::string& name);           // throws InvalidArgument

// No field has a default of its own: a network takes every value from its resolved
// configuration (network_spec.hpp), a direct user sets each one.
struct LshParams {
  HashFamily family{};
  int K{};                // codes combined per table
  int L{};                // tables
  int range_pow{};        // bits per bucket id; 0 = derived from family and K (see effective_range_pow)
  int bucket_capacity{};  // neurons kept per bucket
  BucketPolicy policy{};
  int bin_size{};         // WTA/DWTA: coordinates per code (power of two, 2..256); log2(bin_size) bits per code
};

// Bits of code a table's K codes carry: K for SimHash, K * log2(bin_size) for WTA/DWTA.
// range_pow may not exceed it. Throws InvalidArgument for a bin_size that is not a power of two.
int lsh_code_bits(const LshParams& p);

// The range_pow actually used for these parameters (resolves 0 to the family's natural size):
// SimHash: min(K, 30) bits; WTA/DWTA: min(K * log2(bin_size), 18) bits. An explicit range_pow
// may not exceed the bits the codes carry (K for SimHash, K * log2(bin_size) for WTA/DWTA);
// when it is smaller, the codes are folded through a bijective mixer and its top bits kept
// (every id equally likely for uniform codes) instead of truncated. Throws like validate_lsh_params.
int effective_range_pow(const LshParams& p);

// Throws InvalidArgument naming the field when the parameters are out of range
// (K in 1..32, L in 1..1024, range_pow in 0..30, bucket_capacity >= 1, bin_size a power of two).
void validate_lsh_params(const LshParams& p);

// Maps a dense vector of dimension `dim` to L bucket ids, each < 2^range_pow, using all bits.
class HashFunction {
 public:
  virtual ~HashFunction() = default;
  // Creates the family's function; seeds fully determine it.
  static std::unique_ptr<HashFunction> create(const LshParams& p, int dim, uint64_t seed);
  // buckets must hold L entries. For DWTA, zero entries of x count as empty; an x with no
  // non-zero entry maps to bucket 0 in every table. WTA/DWTA require dim >= bin_size.
  // Results are identical whichever kernel set (AVX2 or generic) the CPU selects.
  virtual void hash_dense(const float* x, uint32_t* buckets) const = 0;
  int num_tables() const noexcept { return L_; }
  int range_pow() const noexcept { return range_pow_; }
  int dim() const noexcept { return dim_; }

 protected:
  int L_ = 0, range_pow_ = 0, dim_ = 0;
};

// The contents of LshTables in a portable form, for checkpoints: table t's occupied buckets
// are bucket_ids[table_offsets[t] .. table_offsets[t+1]) (increasing), and bucket j holds
// items[bucket_offsets[j] .. bucket_offsets[j+1]) in stored order.
struct LshTablesState {
  int64_t num_rows = -1;                // rows hashed by the last build; -1 = never built
  std::vector<int64_t> table_offsets;   // L + 1 entries
  std::vector<uint32_t> bucket_ids;     // occupied buckets of all tables
  std::vector<int64_t> bucket_offsets;  // bucket_ids.size() + 1 entries
  std::vector<int32_t> items;           // bucket members (row ids < num_rows)
  // A spread rebuild in progress (LshTables::begin_rebuild .. rebuild_step), so that a
  // checkpoint taken in the middle of one resumes it exactly: pending_rows = -1 when none.
  // pending_ids holds the bucket ids of the rows its first pending_done calls hashed,
  // table-major (L x rows hashed so far); the new tables those calls built are rebuilt from them.
  int64_t pending_rows = -1, pending_stride = 0;
  uint64_t pending_seed = 0;
  int64_t pending_steps = 0, pending_done = 0;
  std::vector<uint32_t> pending_ids;
};

// L tables of fixed-capacity buckets over num_items neurons. Memory is proportional to
// num_items x L (occupied slots), not 2^range_pow x capacity x L.
class LshTables {
 public:
  LshTables(const LshParams& p, int64_t num_items);
  ~LshTables();
  LshTables(LshTables&&) noexcept;
  LshTables& operator=(LshTables&&) noexcept;

  // Rebuilds all tables from scratch: row i of `rows` (row-major, `stride` floats apart,
  // `dim` used) is hashed and inserted. Parallel over `num_threads`; deterministic for a seed.
  // Each table inserts the items in its own seeded random order; a full bucket then keeps the
  // last bucket_capacity inserted (FIFO) or a uniform sample of them (Reservoir), so neither
  // policy favours low or high item ids. Requires num_rows <= num_items, stride >= h.dim() and
  // h made from the same LshParams (InvalidArgument otherwise, the tables unchanged). Once the
  // arguments pass, the current tables are freed before the new ones are built (so that a wide
  // layer never holds two sets): a build that fails after that (an interrupt) leaves every
  // bucket empty until the next build.
  void build(const HashFunction& h, const float* rows, int64_t num_rows, int64_t stride,
             int num_threads, uint64_t seed);
  // The same from rows stored as bfloat16 bits (bf16.hpp), each widened exactly to float32
  // before it is hashed: the tables are those build() makes from the widened matrix.
  void build(const HashFunction& h, const uint16_t* rows_bf16, int64_t num_rows, int64_t stride,
             int num_threads, uint64_t seed);
  // The same rebuild spread over `steps` calls of rebuild_step (steps >= 1), so that no single
  // call stalls its caller for the whole build. The current tables keep answering bucket()
  // until the call that completes the rebuild swaps the new ones in. The first share of the
  // steps hashes the rows in order (each call the rows of its share, as `rows` holds them at
  // that call), the rest build the tables (a share of them per call). When the rows do not
  // change between the calls, the result is exactly build(h, rows, num_rows, stride, nt, seed)
  // whatever `steps`. Checks its arguments as build() does; cancels a rebuild in progress.
  void begin_rebuild(const HashFunction& h, int64_t num_rows, int64_t stride, int steps, uint64_t seed);
  // One share of the rebuild begun last (`rows`, `h` as for build, the same h as begin_rebuild);
  // returns true when this call completed it (the new tables are in place). InvalidArgument
  // when no rebuild is in progress.
  bool rebuild_step(const HashFunction& h, const float* rows, int num_threads);
  // The same from rows stored as bfloat16 bits, widened exactly as build(h, rows_bf16, ...) does:
  // with unchanged rows the result is exactly that build's, whatever `steps`.
  bool rebuild_step(const HashFunction& h, const uint16_t* rows_bf16, int num_threads);
  bool rebuild_pending() const noexcept;
  // Calls left until the rebuild in progress completes (0 when none).
  int rebuild_steps_left() const noexcept;
  // Drops a rebuild in progress (the current tables stay).
  void cancel_rebuild() noexcept;
  // Neurons in bucket `id` of table `t` (pointer and count), valid until the next build().
  // Unoccupied ids (and any id before the first build) give count 0; t out of range throws.
  std::pair<const int32_t*, int> bucket(int t, uint32_t id) const;
  int num_tables() const noexcept;
  int64_t num_items() const noexcept;
  size_t memory_bytes() const noexcept;
  // Fraction of 2^range_pow buckets that are non-empty, averaged over tables (diagnostics).
  double occupancy() const;
  // A copy of the tables' contents; import_state(export_state()) restores tables whose
  // every bucket() answer is identical.
  LshTablesState export_state() const;
  // Replaces the contents with `s` after checking it fits these tables: L + 1 monotone
  // table offsets, bucket ids increasing within a table and < 2^range_pow, non-empty buckets
  // of at most bucket_capacity items, item ids in 0..num_rows-1 and at most once per table,
  // num_rows in -1..num_items; a pending rebuild with 0 <= done < steps, its row count in
  // 0..num_items and L x (rows hashed by `done` calls) ids < 2^range_pow. Throws
  // InvalidArgument naming the array and index otherwise, leaving the tables unchanged.
  void import_state(const LshTablesState& s);

 private:
  bool rebuild_step_from(const HashFunction& h, const float* rows, const uint16_t* rows_bf16, int num_threads);
  void build_from(const HashFunction& h, const float* rows, const uint16_t* rows_bf16, int64_t num_rows,
                  int64_t stride, int num_threads, uint64_t seed);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// No defaults of its own either (see LshParams).
struct SelectionParams {
  Selection mode{};
  int threshold{};   // Threshold: minimum number of tables a neuron must appear in
  int min_active{};  // random neurons fill up to this many
  int max_active{};  // cut to this many (forced neurons always kept); 0 = no limit
};

// Builds active sets. One per thread (holds O(num_items) scratch, reused across calls).
class ActiveSetSampler {
 public:
  explicit ActiveSetSampler(int64_t num_items);
  ~ActiveSetSampler();
  ActiveSetSampler(ActiveSetSampler&&) noexcept;
  // active = forced neurons (e.g. true labels, in order, de-duplicated), then neurons from the
  // L buckets chosen per params.mode, then uniformly random neurons up to min_active,
  // truncated to max_active. No duplicates. `rng` drives reservoir/random choices.
  void select(const LshTables& tables, const uint32_t* buckets, const int32_t* forced, int n_forced,
              const SelectionParams& params, Rng& rng, std::vector<int32_t>& active);
  // The same within the neurons [begin, end) only (a shard of a layer): forced neurons must
  // lie in it, bucket candidates outside it are skipped, the cap and the fill count within
  // it and the fill is drawn from it. [0, num_items) gives exactly the call above.
  void select(const LshTables& tables, const uint32_t* buckets, const int32_t* forced, int n_forced,
              const SelectionParams& params, Rng& rng, std::vector<int32_t>& active, int64_t begin,
              int64_t end);
  // How many neurons the last select() added by the random fill: they are the last entries of
  // `active`, drawn uniformly from the neurons not chosen before them.
  int64_t filled() const noexcept;
  // Bucket entries the last select() visited and the distinct candidates among them (profile).
  int64_t visited() const noexcept;
  int64_t candidates() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slide
