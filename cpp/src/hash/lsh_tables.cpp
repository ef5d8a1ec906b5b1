// LSH tables with fixed-capacity buckets (see slide/hash.hpp).
//
// Each table is stored compactly: the items sorted by bucket id (CSR-like), with an offsets
// array over the occupied buckets only. Lookup is direct when 2^range_pow is small compared
// with the item count, and through an open-addressing map sized to the occupied buckets
// otherwise, so memory stays proportional to num_items x L whatever range_pow is.
#if defined(__GLIBC__) || defined(__linux__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "slide/bf16.hpp"
#include "slide/common.hpp"
#include "slide/hash.hpp"
#include "slide/memory.hpp"
#include "slide/random.hpp"

namespace slide {

namespace {

constexpr uint32_t kEmptySlot = 0xFFFFFFFFu;  // bucket ids are < 2^30

struct Table {
  bool direct = true;                  // offsets indexed by bucket id (size 2^range_pow + 1)
  std::vector<uint32_t> offsets;       // direct: per id; map: per occupied bucket (+1)
  std::vector<int32_t> items;          // bucket members, bucket after bucket
  std::vector<uint32_t> slot_key;      // map: bucket id per slot, kEmptySlot when free
  std::vector<uint32_t> slot_index;    // map: index into offsets per slot
  uint32_t mask = 0;
  int64_t occupied = 0;

  size_t bytes() const noexcept {
    return offsets.capacity() * sizeof(uint32_t) + items.capacity() * sizeof(int32_t) +
           slot_key.capacity() * sizeof(uint32_t) + slot_index.capacity() * sizeof(uint32_t);
  }
};

inline uint32_t slot_of(uint32_t id, uint32_t mask) {
  return static_cast<uint32_t>(mix64(id) >> 32) & mask;
}

// Per-thread scratch for building one table.
struct BuildScratch {
  std::vector<uint32_t> key, key_tmp;
  std::vector<int32_t> item, item_tmp;
  std::vector<uint32_t> count;
  std::vector<uint32_t> run_keys, run_offsets;
};

// Stable LSD radix sort of (key, item) pairs by key (range_pow bits, 11-bit digits).
void radix_sort(BuildScratch& s, int64_t n, int range_pow) {
  constexpr int kDigit = 11;
  for (int shift = 0; shift < range_pow; shift += kDigit) {
    const int bits = std::min(kDigit, range_pow - shift);
    const uint32_t dmask = (1u << bits) - 1;
    s.count.assign(static_cast<size_t>(dmask) + 2, 0);
    for (int64_t i = 0; i < n; ++i) ++s.count[((s.key[i] >> shift) & dmask) + 1];
    for (size_t d = 1; d < s.count.size(); ++d) s.count[d] += s.count[d - 1];
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t pos = s.count[(s.key[i] >> shift) & dmask]++;
      s.key_tmp[pos] = s.key[i];
      s.item_tmp[pos] = s.item[i];
    }
    s.key.swap(s.key_tmp);
    s.item.swap(s.item_tmp);
  }
}

}  // namespace

// Share of a spread rebuild's steps that hash rows (the rest build tables): on the
// amazon-670k shape (670,091 rows of 128, DWTA K=8 L=50, 1 thread) hashing the rows took 3.5 s
// and building the 50 tables 1.8 s, so about this share keeps the steps even.
constexpr double kHashShare = 0.65;
constexpr int64_t kHashChunk = 256;  // rows hashed (and transposed) together

// A rebuild in progress (begin_rebuild .. the rebuild_step that completes it).
struct PendingBuild {
  bool active = false;
  int64_t num_rows = 0, stride = 0;
  uint64_t seed = 0;
  int steps = 1, done = 0;        // calls planned and made
  int hash_steps = 1;             // the first hash_steps calls hash rows (all of them when steps == 1)
  // Bucket ids, table-major: ids[t * num_rows + i]. Zero pages from the allocator, faulted in
  // by the steps that hash into them, so beginning a rebuild costs nothing.
  AlignedBuffer<uint32_t> ids;
  std::vector<Table> tables;      // the new tables, built table by table
};

// The share of a spread rebuild that call k (0-based) makes: chunks [c0, c1) of rows to hash,
// then tables [t0, t1) to build (steps == 1: all of both at once).
struct CallShare {
  int64_t c0 = 0, c1 = 0;
  int t0 = 0, t1 = 0;
};
inline int hash_steps_for(int steps) {
  return steps == 1 ? 1 : std::min(steps - 1, std::max(1, static_cast<int>(std::lround(steps * kHashShare))));
}
inline CallShare call_share(int64_t num_rows, int L, int steps, int hash_steps, int k) {
  const int64_t n_chunks = (num_rows + kHashChunk - 1) / kHashChunk;
  CallShare s;
  if (steps == 1) {
    s.c1 = n_chunks;
    s.t1 = L;
  } else if (k < hash_steps) {
    s.c0 = n_chunks * k / hash_steps;
    s.c1 = n_chunks * (k + 1) / hash_steps;
  } else {
    const int table_steps = steps - hash_steps, j = k - hash_steps;
    s.t0 = static_cast<int>(static_cast<int64_t>(L) * j / table_steps);
    s.t1 = static_cast<int>(static_cast<int64_t>(L) * (j + 1) / table_steps);
  }
  return s;
}
// Rows hashed and tables built by the first `done` calls of a spread rebuild.
inline std::pair<int64_t, int> work_done(int64_t num_rows, int L, int steps, int hash_steps, int done) {
  if (done <= 0) return {0, 0};
  const CallShare last = call_share(num_rows, L, steps, hash_steps, done - 1);
  if (done <= hash_steps && steps > 1) return {std::min(num_rows, last.c1 * kHashChunk), 0};
  return {num_rows, last.t1};
}

struct LshTables::Impl {
  LshParams params;
  int range_pow = 0;
  int64_t num_items = 0;
  int64_t built_rows = -1;  // rows of the last build (-1 before the first)
  std::vector<Table> tables;
  PendingBuild pending;

  // Builds table `tab` (number t) from the bucket ids of all rows (col[i] for row i).
  void build_table(int t, Table& tab, const uint32_t* col, int64_t n, uint64_t seed, BuildScratch& s) {
    const int cap = params.bucket_capacity;
    s.key.resize(n);
    s.key_tmp.resize(n);
    s.item.resize(n);
    s.item_tmp.resize(n);
    // Items are inserted in a seeded random order per table, so that FIFO ("keep the newest")
    // does not systematically favour high neuron ids, and different tables drop different items.
    for (int64_t i = 0; i < n; ++i) s.item[i] = static_cast<int32_t>(i);
    Rng rng(stream_seed(seed, 0x4c534854u, static_cast<uint64_t>(t)));
    for (int64_t i = n - 1; i > 0; --i) std::swap(s.item[i], s.item[rng.below(static_cast<uint64_t>(i) + 1)]);
    for (int64_t i = 0; i < n; ++i) s.key[i] = col[s.item[i]];
    radix_sort(s, n, range_pow);  // stable: within a bucket, insertion order is kept

    tab = Table{};
    s.run_keys.clear();
    s.run_offsets.clear();
    std::vector<int32_t>& out = tab.items;
    out.reserve(static_cast<size_t>(n));
    Rng res_rng(stream_seed(seed, 0x52455356u, static_cast<uint64_t>(t)));
    for (int64_t a = 0; a < n;) {
      int64_t b = a + 1;
      while (b < n && s.key[b] == s.key[a]) ++b;
      const int64_t m = b - a;
      s.run_keys.push_back(s.key[a]);
      s.run_offsets.push_back(static_cast<uint32_t>(out.size()));
      if (m <= cap) {
        out.insert(out.end(), s.item.begin() + a, s.item.begin() + b);
      } else if (params.policy == BucketPolicy::FIFO) {
        // The bucket keeps the `cap` most recently inserted items.
        out.insert(out.end(), s.item.begin() + (b - cap), s.item.begin() + b);
      } else {
        // Reservoir sampling (Vitter's Algorithm R): a uniform sample of `cap` of the m inserted.
        const size_t base = out.size();
        out.insert(out.end(), s.item.begin() + a, s.item.begin() + a + cap);
        for (int64_t i = cap; i < m; ++i) {
          const uint64_t j = res_rng.below(static_cast<uint64_t>(i) + 1);
          if (j < static_cast<uint64_t>(cap)) out[base + j] = s.item[a + i];
        }
      }
      a = b;
    }
    out.shrink_to_fit();
    index_table(tab, s.run_keys.data(), s.run_offsets.data(), s.run_keys.size(), n);
  }

  // Builds the lookup structure of `tab`, whose items are already stored: occupied bucket r
  // (of `runs`, increasing ids run_keys[r]) starts at items[run_offsets[r]]. `n` is the
  // number of rows the table was built from (it decides direct versus map lookup).
  void index_table(Table& tab, const uint32_t* run_keys, const uint32_t* run_offsets, size_t runs, int64_t n) const {
    const std::vector<int32_t>& out = tab.items;
    tab.occupied = static_cast<int64_t>(runs);
    const uint64_t n_ids = uint64_t{1} << range_pow;
    // Direct indexing costs 4 bytes per possible id: take it only while that stays O(num_items).
    tab.direct = n_ids <= 2 * static_cast<uint64_t>(n) + 1024;
    if (tab.direct) {
      tab.offsets.assign(n_ids + 1, 0);
      size_t r = 0;
      for (uint64_t id = 0; id <= n_ids; ++id) {
        while (r < runs && run_keys[r] < id) ++r;
        tab.offsets[id] = r < runs ? run_offsets[r] : static_cast<uint32_t>(out.size());
      }
    } else {
      tab.offsets.assign(run_offsets, run_offsets + runs);
      tab.offsets.push_back(static_cast<uint32_t>(out.size()));
      size_t slots = 16;
      while (slots < 2 * runs) slots <<= 1;
      tab.mask = static_cast<uint32_t>(slots - 1);
      tab.slot_key.assign(slots, kEmptySlot);
      tab.slot_index.assign(slots, 0);
      for (size_t r = 0; r < runs; ++r) {
        uint32_t p = slot_of(run_keys[r], tab.mask);
        while (tab.slot_key[p] != kEmptySlot) p = (p + 1) & tab.mask;
        tab.slot_key[p] = run_keys[r];
        tab.slot_index[p] = static_cast<uint32_t>(r);
      }
    }
  }
};

LshTables::LshTables(const LshParams& p, int64_t num_items) : impl_(std::make_unique<Impl>()) {
  validate_lsh_params(p);
  if (num_items < 0 || num_items > 0x7FFFFFFF)
    throw InvalidArgument("num_items=" + std::to_string(num_items) + " must be in 0..2^31-1");
  impl_->params = p;
  impl_->range_pow = effective_range_pow(p);
  impl_->num_items = num_items;
  impl_->tables.resize(p.L);
}

LshTables::~LshTables() = default;
LshTables::LshTables(LshTables&&) noexcept = default;
LshTables& LshTables::operator=(LshTables&&) noexcept = default;

void LshTables::build(const HashFunction& h, const float* rows, int64_t num_rows, int64_t stride,
                      int num_threads, uint64_t seed) {
  build_from(h, rows, nullptr, num_rows, stride, num_threads, seed);
}

void LshTables::build(const HashFunction& h, const uint16_t* rows_bf16, int64_t num_rows, int64_t stride,
                      int num_threads, uint64_t seed) {
  build_from(h, nullptr, rows_bf16, num_rows, stride, num_threads, seed);
}

void LshTables::build_from(const HashFunction& h, const float* rows, const uint16_t* rows_bf16, int64_t num_rows,
                           int64_t stride, int num_threads, uint64_t seed) {
  if (num_rows > 0 && rows == nullptr && rows_bf16 == nullptr) throw InvalidArgument("rows is null");
  begin_rebuild(h, num_rows, stride, 1, seed);
  // Nothing reads the tables during an at-once build: free the current ones first, so that a
  // wide layer never holds two sets (hundreds of MiB at 670K neurons, x 2 at its peak).
  Impl& im = *impl_;
  std::vector<Table>(static_cast<size_t>(im.params.L)).swap(im.tables);  // (assign() would keep the capacities)
  im.built_rows = -1;
#ifdef __GLIBC__
  malloc_trim(0);  // their pages, in the arenas of the threads that built them (see rebuild_step_from)
#endif
  rebuild_step_from(h, rows, rows_bf16, num_threads);
}

void LshTables::begin_rebuild(const HashFunction& h, int64_t num_rows, int64_t stride, int steps, uint64_t seed) {
  Impl& im = *impl_;
  const int L = im.params.L;
  if (h.num_tables() != L || h.range_pow() != im.range_pow)
    throw InvalidArgument("hash function gives " + std::to_string(h.num_tables()) + " tables of " +
                          std::to_string(h.range_pow()) + " bits, the tables expect " + std::to_string(L) +
                          " of " + std::to_string(im.range_pow));
  if (num_rows < 0 || num_rows > im.num_items)
    throw InvalidArgument("num_rows=" + std::to_string(num_rows) + " must be in 0..num_items=" +
                          std::to_string(im.num_items));
  if (stride < h.dim())
    throw InvalidArgument("row stride " + std::to_string(stride) + " is smaller than the hash dimension " +
                          std::to_string(h.dim()));
  if (steps < 1) throw InvalidArgument("steps=" + std::to_string(steps) + " must be >= 1");
  PendingBuild& pb = im.pending;
  pb.active = true;
  pb.num_rows = num_rows;
  pb.stride = stride;
  pb.seed = seed;
  pb.steps = steps;
  pb.done = 0;
  pb.hash_steps = hash_steps_for(steps);
  // Bucket ids stored table-major so that building a table reads one contiguous column.
  pb.ids = AlignedBuffer<uint32_t>(static_cast<size_t>(num_rows) * L);
  pb.tables.assign(static_cast<size_t>(L), Table{});
}

bool LshTables::rebuild_step(const HashFunction& h, const float* rows, int num_threads) {
  return rebuild_step_from(h, rows, nullptr, num_threads);
}

bool LshTables::rebuild_step(const HashFunction& h, const uint16_t* rows_bf16, int num_threads) {
  return rebuild_step_from(h, nullptr, rows_bf16, num_threads);
}

bool LshTables::rebuild_step_from(const HashFunction& h, const float* rows, const uint16_t* rows_bf16,
                                  int num_threads) {
  Impl& im = *impl_;
  PendingBuild& pb = im.pending;
  if (!pb.active) throw InvalidArgument("rebuild_step: no rebuild in progress (begin_rebuild first)");
  const int L = im.params.L;
  const int64_t num_rows = pb.num_rows, stride = pb.stride;
  if (num_rows > 0 && rows == nullptr && rows_bf16 == nullptr) throw InvalidArgument("rows is null");
  const int nt = resolve_threads(num_threads);
  // This call's share: chunks of rows to hash, then tables to build (steps == 1: all of both).
  const CallShare share = call_share(num_rows, L, pb.steps, pb.hash_steps, pb.done);
  const int64_t c0 = share.c0, c1 = share.c1;
  const int t0 = share.t0, t1 = share.t1;
  ExceptionCatcher catcher;
  if (c1 > c0) {
    // Rows are hashed in chunks and each chunk is transposed into the columns while in cache.
#pragma omp parallel num_threads(nt)
    {
      std::vector<uint32_t> buf(static_cast<size_t>(kHashChunk) * L);
      // bf16 rows are widened exactly (one row at a time) before hashing: the ids are those of
      // the float32 matrix the bf16 bits stand for.
      std::vector<float> wide(rows_bf16 ? static_cast<size_t>(h.dim()) : 0);
#pragma omp for schedule(static)
      for (int64_t c = c0; c < c1; ++c) {
        catcher.run([&] {
          const int64_t r0 = c * kHashChunk, r1 = std::min(num_rows, r0 + kHashChunk);
          for (int64_t i = r0; i < r1; ++i) {
            const float* row = rows ? rows + i * stride : nullptr;
            if (rows_bf16) {
              const uint16_t* r16 = rows_bf16 + i * stride;
              for (size_t j = 0; j < wide.size(); ++j) wide[j] = bf16_to_float(r16[j]);
              row = wide.data();
            }
            h.hash_dense(row, buf.data() + (i - r0) * L);
          }
          for (int t = 0; t < L; ++t) {
            uint32_t* col = pb.ids.data() + static_cast<size_t>(t) * num_rows;
            for (int64_t i = r0; i < r1; ++i) col[i] = buf[(i - r0) * L + t];
          }
        });
      }
    }
    catcher.rethrow();
  }
  if (t1 > t0) {
    // Tables are independent and seeded by (seed, table): the result does not depend on nt
    // nor on which call builds which table.
#pragma omp parallel num_threads(std::max(1, std::min(nt, t1 - t0)))
    {
      BuildScratch scratch;
#pragma omp for schedule(dynamic, 1)
      for (int t = t0; t < t1; ++t)
        catcher.run([&] {
          im.build_table(t, pb.tables[t], pb.ids.data() + static_cast<size_t>(t) * num_rows, num_rows, pb.seed,
                         scratch);
        });
    }
    catcher.rethrow();
  }
  if (++pb.done < pb.steps) return false;
  im.tables.swap(pb.tables);
  im.built_rows = num_rows;
  cancel_rebuild();  // frees the old tables and the bucket ids
#ifdef __GLIBC__
  // The tables were built by the team's threads, each allocating from its own malloc arena; the
  // freed old tables and bucket ids stay mapped in those arenas, and the next build, whose
  // tables land on other threads, does not reuse them: RSS grew by a set of tables per rebuild
  // (+179 MiB after one rebuild of 670,091 rows, L = 50). Hand the free pages back.
  malloc_trim(0);
#endif
  return true;
}

bool LshTables::rebuild_pending() const noexcept { return impl_->pending.active; }

int LshTables::rebuild_steps_left() const noexcept {
  const PendingBuild& pb = impl_->pending;
  return pb.active ? pb.steps - pb.done : 0;
}

void LshTables::cancel_rebuild() noexcept {
  PendingBuild& pb = impl_->pending;
  pb.active = false;
  pb.done = 0;
  pb.ids = AlignedBuffer<uint32_t>();
  std::vector<Table>().swap(pb.tables);
}

std::pair<const int32_t*, int> LshTables::bucket(int t, uint32_t id) const {
  const Impl& im = *impl_;
  if (t < 0 || t >= im.params.L)
    throw InvalidArgument("table " + std::to_string(t) + " out of range 0.." + std::to_string(im.params.L - 1));
  const Table& tab = im.tables[t];
  if (tab.offsets.empty() || id >= (uint32_t{1} << im.range_pow)) return {nullptr, 0};
  uint32_t r;
  if (tab.direct) {
    r = id;
  } else {
    uint32_t p = slot_of(id, tab.mask);
    for (;;) {
      const uint32_t k = tab.slot_key[p];
      if (k == id) break;
      if (k == kEmptySlot) return {nullptr, 0};
      p = (p + 1) & tab.mask;
    }
    r = tab.slot_index[p];
  }
  const uint32_t a = tab.offsets[r], b = tab.offsets[r + 1];
  return {tab.items.data() + a, static_cast<int>(b - a)};
}

int LshTables::num_tables() const noexcept { return impl_->params.L; }
int64_t LshTables::num_items() const noexcept { return impl_->num_items; }

size_t LshTables::memory_bytes() const noexcept {
  size_t total = sizeof(Impl) + impl_->tables.capacity() * sizeof(Table);
  for (const Table& t : impl_->tables) total += t.bytes();
  // A spread rebuild in progress holds the bucket ids and the new tables besides the old.
  const PendingBuild& pb = impl_->pending;
  total += pb.ids.bytes() + pb.tables.capacity() * sizeof(Table);
  for (const Table& t : pb.tables) total += t.bytes();
  return total;
}

double LshTables::occupancy() const {
  const Impl& im = *impl_;
  const double n_ids = static_cast<double>(uint64_t{1} << im.range_pow);
  double sum = 0;
  for (const Table& t : im.tables) sum += static_cast<double>(t.occupied) / n_ids;
  return im.tables.empty() ? 0.0 : sum / static_cast<double>(im.tables.size());
}

LshTablesState LshTables::export_state() const {
  const Impl& im = *impl_;
  LshTablesState s;
  s.num_rows = im.built_rows;
  // Exact sizes up front: the state of a wide layer is large, and growing vectors would
  // hold up to twice it.
  size_t n_buckets = 0, n_items = 0;
  for (const Table& tab : im.tables) {
    n_items += tab.items.size();
    if (tab.direct) {
      for (size_t id = 0; id + 1 < tab.offsets.size(); ++id) n_buckets += tab.offsets[id + 1] != tab.offsets[id];
    } else {
      n_buckets += static_cast<size_t>(tab.occupied);
    }
  }
  s.table_offsets.reserve(im.tables.size() + 1);
  s.bucket_ids.reserve(n_buckets);
  s.bucket_offsets.reserve(n_buckets + 1);
  s.items.reserve(n_items);
  s.table_offsets.push_back(0);
  for (const Table& tab : im.tables) {
    if (tab.direct) {
      // Occupied ids are those with a non-empty range, in increasing id order.
      for (size_t id = 0; id + 1 < tab.offsets.size(); ++id) {
        if (tab.offsets[id + 1] == tab.offsets[id]) continue;
        s.bucket_ids.push_back(static_cast<uint32_t>(id));
        s.bucket_offsets.push_back(static_cast<int64_t>(s.items.size()) + tab.offsets[id]);
      }
    } else {
      // Map tables store their runs in increasing id order; recover each run's id from the slots.
      std::vector<uint32_t> keys(static_cast<size_t>(tab.occupied));
      for (size_t p = 0; p < tab.slot_key.size(); ++p)
        if (tab.slot_key[p] != kEmptySlot) keys[tab.slot_index[p]] = tab.slot_key[p];
      for (size_t r = 0; r < keys.size(); ++r) {
        s.bucket_ids.push_back(keys[r]);
        s.bucket_offsets.push_back(static_cast<int64_t>(s.items.size()) + tab.offsets[r]);
      }
    }
    s.items.insert(s.items.end(), tab.items.begin(), tab.items.end());
    s.table_offsets.push_back(static_cast<int64_t>(s.bucket_ids.size()));
  }
  s.bucket_offsets.push_back(static_cast<int64_t>(s.items.size()));
  const PendingBuild& pb = im.pending;
  if (pb.active) {
    s.pending_rows = pb.num_rows;
    s.pending_stride = pb.stride;
    s.pending_seed = pb.seed;
    s.pending_steps = pb.steps;
    s.pending_done = pb.done;
    const int64_t hashed = work_done(pb.num_rows, im.params.L, pb.steps, pb.hash_steps, pb.done).first;
    s.pending_ids.resize(static_cast<size_t>(hashed) * im.params.L);
    for (int t = 0; t < im.params.L; ++t)
      std::copy_n(pb.ids.data() + static_cast<size_t>(t) * pb.num_rows, hashed,
                  s.pending_ids.begin() + static_cast<size_t>(t) * hashed);
  }
  return s;
}

void LshTables::import_state(const LshTablesState& s) {
  Impl& im = *impl_;
  const int L = im.params.L;
  auto bad = [](const std::string& what) { throw InvalidArgument("hash tables: " + what); };
  auto str = [](int64_t v) { return std::to_string(v); };
  if (s.num_rows < -1 || s.num_rows > im.num_items)
    bad("num_rows=" + str(s.num_rows) + " must be in -1.." + str(im.num_items));
  if (s.table_offsets.size() != static_cast<size_t>(L) + 1)
    bad("table_offsets has " + str(static_cast<int64_t>(s.table_offsets.size())) + " entries, expected L + 1 = " +
        str(L + 1));
  const int64_t n_buckets = static_cast<int64_t>(s.bucket_ids.size());
  const int64_t n_items = static_cast<int64_t>(s.items.size());
  if (s.bucket_offsets.size() != s.bucket_ids.size() + 1)
    bad("bucket_offsets has " + str(static_cast<int64_t>(s.bucket_offsets.size())) + " entries, expected " +
        str(n_buckets + 1) + " (one more than bucket_ids)");
  if (s.table_offsets[0] != 0) bad("table_offsets[0]=" + str(s.table_offsets[0]) + " must be 0");
  if (s.table_offsets[L] != n_buckets)
    bad("table_offsets[" + str(L) + "]=" + str(s.table_offsets[L]) + " must equal the " + str(n_buckets) +
        " bucket ids");
  for (int t = 0; t < L; ++t)
    if (s.table_offsets[t + 1] < s.table_offsets[t])
      bad("table_offsets[" + str(t + 1) + "]=" + str(s.table_offsets[t + 1]) + " is below table_offsets[" + str(t) +
          "]=" + str(s.table_offsets[t]));
  if (s.bucket_offsets[0] != 0) bad("bucket_offsets[0]=" + str(s.bucket_offsets[0]) + " must be 0");
  if (s.bucket_offsets[n_buckets] != n_items)
    bad("bucket_offsets[" + str(n_buckets) + "]=" + str(s.bucket_offsets[n_buckets]) + " must equal the " +
        str(n_items) + " items");
  const int cap = im.params.bucket_capacity;
  for (int64_t j = 0; j < n_buckets; ++j) {
    // Compared before subtracting: offsets[j] is known to be in range, offsets[j + 1] is not.
    if (s.bucket_offsets[j + 1] <= s.bucket_offsets[j] || s.bucket_offsets[j + 1] - s.bucket_offsets[j] > cap)
      bad("bucket_offsets[" + str(j + 1) + "]=" + str(s.bucket_offsets[j + 1]) + " after " +
          str(s.bucket_offsets[j]) + ": bucket " + str(j) + " must hold 1.." + str(cap) + " items");
  }
  const uint64_t n_ids = uint64_t{1} << im.range_pow;
  if (s.num_rows < 0 && (n_buckets != 0 || n_items != 0)) bad("num_rows=-1 (never built) but buckets are stored");
  // Per table: ids increasing and in range, items in range and not repeated.
  std::vector<int64_t> seen(static_cast<size_t>(std::max<int64_t>(s.num_rows, 0)), -1);
  for (int t = 0; t < L; ++t) {
    for (int64_t j = s.table_offsets[t]; j < s.table_offsets[t + 1]; ++j) {
      if (s.bucket_ids[j] >= n_ids)
        bad("bucket_ids[" + str(j) + "]=" + str(s.bucket_ids[j]) + " is not below 2^" + str(im.range_pow));
      if (j > s.table_offsets[t] && s.bucket_ids[j] <= s.bucket_ids[j - 1])
        bad("bucket_ids[" + str(j) + "]=" + str(s.bucket_ids[j]) + " does not increase within table " + str(t));
      for (int64_t i = s.bucket_offsets[j]; i < s.bucket_offsets[j + 1]; ++i) {
        const int32_t v = s.items[i];
        if (v < 0 || v >= s.num_rows)
          bad("items[" + str(i) + "]=" + str(v) + " is out of range 0.." + str(s.num_rows - 1));
        if (seen[v] == t) bad("items[" + str(i) + "]=" + str(v) + " appears twice in table " + str(t));
        seen[v] = t;
      }
    }
  }

  // A spread rebuild in progress: its plan and the ids of the rows it has hashed.
  const bool pending = s.pending_rows >= 0;
  int64_t hashed = 0;
  int built = 0;
  if (!pending && (s.pending_rows != -1 || !s.pending_ids.empty()))
    bad("pending_rows=" + str(s.pending_rows) + " must be -1 (no rebuild in progress) or in 0.." + str(im.num_items) +
        (s.pending_ids.empty() ? "" : ", with pending_ids stored"));
  if (pending) {
    if (s.pending_rows > im.num_items)
      bad("pending_rows=" + str(s.pending_rows) + " must be in 0.." + str(im.num_items));
    if (s.pending_steps < 1 || s.pending_steps > (int64_t{1} << 30))
      bad("pending_steps=" + str(s.pending_steps) + " must be in 1..2^30");
    if (s.pending_done < 0 || s.pending_done >= s.pending_steps)
      bad("pending_done=" + str(s.pending_done) + " must be in 0.." + str(s.pending_steps - 1));
    if (s.pending_stride < 1) bad("pending_stride=" + str(s.pending_stride) + " must be >= 1");
    const int steps = static_cast<int>(s.pending_steps);
    std::tie(hashed, built) =
        work_done(s.pending_rows, L, steps, hash_steps_for(steps), static_cast<int>(s.pending_done));
    if (s.pending_ids.size() != static_cast<size_t>(hashed) * L)
      bad("pending_ids has " + str(static_cast<int64_t>(s.pending_ids.size())) + " entries, expected L x " +
          str(hashed) + " rows hashed = " + str(hashed * L));
    for (size_t j = 0; j < s.pending_ids.size(); ++j)
      if (s.pending_ids[j] >= n_ids)
        bad("pending_ids[" + str(static_cast<int64_t>(j)) + "]=" + str(s.pending_ids[j]) + " is not below 2^" +
            str(im.range_pow));
  }

  std::vector<Table> tables(static_cast<size_t>(L));
  if (s.num_rows >= 0) {
    std::vector<uint32_t> run_offsets;
    for (int t = 0; t < L; ++t) {
      const int64_t b0 = s.table_offsets[t], b1 = s.table_offsets[t + 1];
      const int64_t i0 = s.bucket_offsets[b0], i1 = s.bucket_offsets[b1];
      Table& tab = tables[t];
      tab.items.assign(s.items.begin() + i0, s.items.begin() + i1);
      run_offsets.clear();
      for (int64_t j = b0; j < b1; ++j) run_offsets.push_back(static_cast<uint32_t>(s.bucket_offsets[j] - i0));
      im.index_table(tab, s.bucket_ids.data() + b0, run_offsets.data(), run_offsets.size(), s.num_rows);
    }
  }
  im.tables.swap(tables);
  im.built_rows = s.num_rows;
  cancel_rebuild();
  if (!pending) return;
  PendingBuild& pb = im.pending;
  pb.num_rows = s.pending_rows;
  pb.stride = s.pending_stride;
  pb.seed = s.pending_seed;
  pb.steps = static_cast<int>(s.pending_steps);
  pb.done = static_cast<int>(s.pending_done);
  pb.hash_steps = hash_steps_for(pb.steps);
  pb.ids = AlignedBuffer<uint32_t>(static_cast<size_t>(pb.num_rows) * L);
  for (int t = 0; t < L; ++t)
    std::copy_n(s.pending_ids.begin() + static_cast<size_t>(t) * hashed, hashed,
                pb.ids.data() + static_cast<size_t>(t) * pb.num_rows);
  pb.tables.assign(static_cast<size_t>(L), Table{});
  // The tables its calls had built: rebuilt from the same ids and seed, so they are the same.
  BuildScratch scratch;
  for (int t = 0; t < built; ++t)
    im.build_table(t, pb.tables[t], pb.ids.data() + static_cast<size_t>(t) * pb.num_rows, pb.num_rows, pb.seed,
                   scratch);
  pb.active = true;
}

}  // namespace slide
