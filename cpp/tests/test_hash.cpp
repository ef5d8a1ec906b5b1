// Hash families: code ranges, the range_pow rule, bucket occupancy, determinism.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "slide/bf16.hpp"
#include "slide/common.hpp"
#include "slide/hash.hpp"
#include "slide/random.hpp"

using namespace slide;

namespace {

LshParams params(HashFamily family, int K, int L, int range_pow = 0, int bin_size = 8) {
  LshParams p;
  p.family = family;
  p.K = K;
  p.L = L;
  p.range_pow = range_pow;
  p.bucket_capacity = 64;
  p.policy = BucketPolicy::FIFO;
  p.bin_size = bin_size;
  return p;
}

// n rows of dimension dim: dense Gaussian, or sparse (density `keep`) non-negative.
std::vector<float> random_rows(int64_t n, int dim, uint64_t seed, float keep = 1.0f) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n * dim));
  for (float& v : x) v = rng.uniform() < keep ? (keep < 1.0f ? rng.uniform() + 0.01f : rng.normal()) : 0.0f;
  return x;
}

// The tables of two builds are the same, bucket for bucket.
void check_same_tables(const LshTablesState& got, const LshTablesState& want) {
  CHECK(got.num_rows == want.num_rows);
  CHECK(got.table_offsets == want.table_offsets);
  CHECK(got.bucket_ids == want.bucket_ids);
  CHECK(got.bucket_offsets == want.bucket_offsets);
  CHECK(got.items == want.items);
}

}  // namespace

TEST_CASE("range_pow: derived once, bounded by the code bits") {
  CHECK(lsh_code_bits(params(HashFamily::SimHash, 9, 4)) == 9);
  CHECK(lsh_code_bits(params(HashFamily::WTA, 4, 4)) == 12);
  CHECK(lsh_code_bits(params(HashFamily::DWTA, 4, 4, 0, 16)) == 16);
  CHECK(effective_range_pow(params(HashFamily::SimHash, 9, 4)) == 9);
  CHECK(effective_range_pow(params(HashFamily::DWTA, 8, 4)) == 18);  // min(24, 18)
  CHECK(effective_range_pow(params(HashFamily::WTA, 3, 4, 5)) == 5);
  CHECK_THROWS_AS(validate_lsh_params(params(HashFamily::SimHash, 4, 4, 5)), InvalidArgument);
  CHECK_THROWS_AS(validate_lsh_params(params(HashFamily::WTA, 2, 4, 7)), InvalidArgument);
  CHECK_THROWS_AS(validate_lsh_params(params(HashFamily::WTA, 2, 4, 0, 6)), InvalidArgument);
}

TEST_CASE("every family gives bucket ids below 2^range_pow that depend only on the seed") {
  const int dim = 64;
  for (HashFamily f : {HashFamily::SimHash, HashFamily::WTA, HashFamily::DWTA}) {
    for (int range_pow : {0, 4, 6}) {
      const LshParams p = params(f, f == HashFamily::SimHash ? 6 : 3, 8, range_pow);
      auto h = HashFunction::create(p, dim, 7);
      auto h2 = HashFunction::create(p, dim, 7);
      const int bits = effective_range_pow(p);
      CHECK(h->range_pow() == bits);
      const std::vector<float> x = random_rows(200, dim, 3, f == HashFamily::DWTA ? 0.2f : 1.0f);
      std::vector<uint32_t> b(8), b2(8);
      for (int i = 0; i < 200; ++i) {
        h->hash_dense(x.data() + i * dim, b.data());
        h2->hash_dense(x.data() + i * dim, b2.data());
        CHECK(b == b2);
        for (uint32_t id : b) CHECK(id < (uint32_t(1) << bits));
      }
    }
  }
}

TEST_CASE("tables over random rows reach most buckets (codes are combined without overlap)") {
  // 64 buckets per table and 4000 rows: a hash that combined its codes with overlapping
  // shifts, or that left codes unused, would leave most buckets unreachable.
  const int dim = 32;
  const int64_t n = 4000;
  for (HashFamily f : {HashFamily::SimHash, HashFamily::WTA, HashFamily::DWTA}) {
    const LshParams p = params(f, f == HashFamily::SimHash ? 6 : 2, 4, 6);
    auto h = HashFunction::create(p, dim, 11);
    LshTables tables(p, n);
    const std::vector<float> w = random_rows(n, dim, 5, f == HashFamily::DWTA ? 0.3f : 1.0f);
    tables.build(*h, w.data(), n, dim, 1, 13);
    INFO("family " << static_cast<int>(f) << " occupancy " << tables.occupancy());
    CHECK(tables.occupancy() > 0.8);
    // every row sits in exactly one bucket of each table (capacity permitting)
    int64_t stored = 0;
    for (int t = 0; t < 4; ++t)
      for (uint32_t id = 0; id < 64; ++id) {
        const auto b = tables.bucket(t, id);
        CHECK(b.second <= p.bucket_capacity);
        stored += b.second;
      }
    CHECK(stored <= 4 * n);
    CHECK(stored > 4 * n / 2);
  }
}

TEST_CASE("DWTA gives sparse inputs codes and maps an all-zero input to bucket 0") {
  const int dim = 256;
  auto h = HashFunction::create(params(HashFamily::DWTA, 4, 6), dim, 1);
  std::vector<float> x(dim, 0.0f);
  std::vector<uint32_t> b(6);
  h->hash_dense(x.data(), b.data());
  for (uint32_t id : b) CHECK(id == 0);
  x[3] = 1.0f;
  x[200] = 2.0f;
  std::set<uint32_t> seen;
  Rng rng(2);
  for (int trial = 0; trial < 50; ++trial) {
    std::fill(x.begin(), x.end(), 0.0f);
    for (int k = 0; k < 5; ++k) x[rng.below(dim)] = rng.uniform() + 0.1f;
    h->hash_dense(x.data(), b.data());
    seen.insert(b.begin(), b.end());
  }
  CHECK(seen.size() > 20);  // five non-zeros out of 256 still spread over many buckets
}

TEST_CASE("a rebuild spread over several steps gives the tables of a build at once") {
  const int dim = 32;
  const int64_t n = 3000;  // 12 chunks of hashed rows
  const LshParams p = params(HashFamily::DWTA, 3, 6, 9);
  auto h = HashFunction::create(p, dim, 21);
  const std::vector<float> w = random_rows(n, dim, 8, 0.4f);
  LshTables once(p, n);
  once.build(*h, w.data(), n, dim, 2, 99);
  const LshTablesState want = once.export_state();
  for (int steps : {1, 2, 3, 5, 8, 40}) {
    LshTables spread(p, n);
    spread.build(*h, w.data(), n / 2, dim, 1, 7);  // older tables that keep serving meanwhile
    const LshTablesState before = spread.export_state();
    spread.begin_rebuild(*h, n, dim, steps, 99);
    CHECK(spread.rebuild_pending());
    int calls = 0;
    bool done = false;
    while (!done) {
      CHECK(spread.rebuild_steps_left() == steps - calls);
      done = spread.rebuild_step(*h, w.data(), 2);
      ++calls;
      if (!done) CHECK(spread.export_state().items == before.items);  // unchanged until the last step
    }
    INFO("steps " << steps);
    CHECK(calls == steps);
    CHECK_FALSE(spread.rebuild_pending());
    const LshTablesState got = spread.export_state();
    check_same_tables(got, want);
  }
  LshTables idle(p, n);
  CHECK_THROWS_AS(idle.rebuild_step(*h, w.data(), 1), InvalidArgument);
  CHECK_THROWS_AS(idle.begin_rebuild(*h, n, dim, 0, 1), InvalidArgument);
  idle.begin_rebuild(*h, n, dim, 4, 1);
  idle.cancel_rebuild();
  CHECK_FALSE(idle.rebuild_pending());
}

TEST_CASE("a spread rebuild exported in the middle resumes exactly from the import") {
  const int dim = 32;
  const int64_t n = 3000;
  const LshParams p = params(HashFamily::DWTA, 3, 6, 9);
  auto h = HashFunction::create(p, dim, 21);
  // the rows change between calls, as weights do in training: what was hashed must travel
  std::vector<std::vector<float>> rows;
  for (int k = 0; k < 8; ++k) rows.push_back(random_rows(n, dim, 30 + k, 0.4f));
  for (int cut = 0; cut < 8; ++cut) {
    INFO("state taken after " << cut << " of 8 calls");
    LshTables a(p, n), b(p, n);
    a.build(*h, rows[7].data(), n, dim, 1, 5);
    a.begin_rebuild(*h, n, dim, 8, 77);
    for (int k = 0; k < cut; ++k) CHECK_FALSE(a.rebuild_step(*h, rows[k].data(), 2));
    const LshTablesState mid = a.export_state();
    CHECK(mid.pending_rows == n);
    CHECK(mid.pending_done == cut);
    b.import_state(mid);
    CHECK(b.rebuild_pending());
    CHECK(b.rebuild_steps_left() == 8 - cut);
    check_same_tables(b.export_state(), mid);
    CHECK(b.export_state().pending_ids == mid.pending_ids);
    // 12 chunks of 256 rows hashed by the first 5 calls (12 k / 5 chunks after k), 6 tables
    const int64_t hashed = cut >= 5 ? n : std::min<int64_t>(n, 12 * cut / 5 * 256);
    CHECK(mid.pending_ids.size() == static_cast<size_t>(6 * hashed));
    for (int k = cut; k < 8; ++k) {
      const bool da = a.rebuild_step(*h, rows[k].data(), 2), db = b.rebuild_step(*h, rows[k].data(), 1);
      CHECK(da == db);
      CHECK(da == (k == 7));
    }
    check_same_tables(b.export_state(), a.export_state());
    CHECK(b.export_state().pending_rows == -1);
  }
  // a damaged plan is refused and leaves the tables as they were
  LshTables a(p, n), c(p, n);
  a.build(*h, rows[0].data(), n, dim, 1, 5);
  a.begin_rebuild(*h, n, dim, 8, 77);
  a.rebuild_step(*h, rows[0].data(), 1);
  const LshTablesState good = a.export_state();
  c.build(*h, rows[1].data(), n, dim, 1, 5);
  const LshTablesState before = c.export_state();
  for (int damage = 0; damage < 4; ++damage) {
    LshTablesState bad = good;
    if (damage == 0) bad.pending_ids.pop_back();
    if (damage == 1) bad.pending_done = bad.pending_steps;
    if (damage == 2) bad.pending_ids[5] = 1u << 20;
    if (damage == 3) bad.pending_rows = n + 1;
    CHECK_THROWS_AS(c.import_state(bad), InvalidArgument);
    CHECK_FALSE(c.rebuild_pending());
    check_same_tables(c.export_state(), before);
  }
}

TEST_CASE("an at-once build over built tables frees them first and gives the tables of a fresh build") {
  const int dim = 32;
  const int64_t n = 3000;
  const LshParams p = params(HashFamily::DWTA, 3, 6, 9);
  auto h = HashFunction::create(p, dim, 21);
  const std::vector<float> w = random_rows(n, dim, 8, 0.4f), other = random_rows(n, dim, 9, 0.4f);
  LshTables fresh(p, n);
  fresh.build(*h, w.data(), n, dim, 2, 99);
  LshTables reused(p, n);
  reused.build(*h, other.data(), n, dim, 2, 5);
  reused.build(*h, w.data(), n, dim, 2, 99);
  check_same_tables(reused.export_state(), fresh.export_state());
  // A build that fails its checks leaves the tables as they were.
  const LshTablesState before = reused.export_state();
  CHECK_THROWS_AS(reused.build(*h, static_cast<const float*>(nullptr), n, dim, 1, 1), InvalidArgument);
  CHECK_THROWS_AS(reused.build(*h, w.data(), n, dim - 1, 1, 1), InvalidArgument);
  check_same_tables(reused.export_state(), before);
  // The freed tables do not count any more: the memory is the new set's.
  CHECK(reused.memory_bytes() == fresh.memory_bytes());
}

TEST_CASE("a spread rebuild of bf16 rows gives the tables of a bf16 build at once and of the widened rows") {
  const int dim = 32;
  const int64_t n = 3000;
  for (HashFamily f : {HashFamily::DWTA, HashFamily::SimHash}) {
    const LshParams p = f == HashFamily::DWTA ? params(f, 3, 6, 9) : params(f, 9, 6);
    auto h = HashFunction::create(p, dim, 21);
    const std::vector<float> w = random_rows(n, dim, 8, f == HashFamily::DWTA ? 0.4f : 1.0f);
    std::vector<uint16_t> w16(w.size());
    std::vector<float> wide(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = float_to_bf16(w[i]);
      wide[i] = bf16_to_float(w16[i]);
    }
    LshTables once(p, n), widened(p, n);
    once.build(*h, w16.data(), n, dim, 2, 99);
    widened.build(*h, wide.data(), n, dim, 1, 99);
    const LshTablesState want = once.export_state(), want_wide = widened.export_state();
    CHECK(want.items == want_wide.items);
    CHECK(want.bucket_ids == want_wide.bucket_ids);
    CHECK(want.bucket_offsets == want_wide.bucket_offsets);
    for (int steps : {1, 3, 7}) {
      LshTables spread(p, n);
      spread.build(*h, w16.data(), n / 2, dim, 1, 7);
      spread.begin_rebuild(*h, n, dim, steps, 99);
      int calls = 1;
      while (!spread.rebuild_step(*h, w16.data(), 2)) ++calls;
      INFO("steps " << steps);
      CHECK(calls == steps);
      const LshTablesState got = spread.export_state();
      check_same_tables(got, want);
    }
    LshTables idle(p, n);
    idle.begin_rebuild(*h, n, dim, 2, 1);
    CHECK_THROWS_AS(idle.rebuild_step(*h, static_cast<const uint16_t*>(nullptr), 1), InvalidArgument);
  }
}
