// Active-set selection from LSH buckets (see slide/hash.hpp).
//
// SLIDE (Chen et al., MLSys 2020) takes the neurons found in the L buckets of a layer input as
// its active set; the paper's sampling strategies are vanilla (union of the buckets), top-K
// (neurons found in the most tables) and hard thresholding (found in at least m tables).
//
// Scratch is O(num_items) but touched only at the neurons a call visits: an epoch stamp per
// neuron marks "seen in this call", so a call costs O(candidates + active), never O(num_items).
#include <algorithm>
#include <string>
#include <vector>

#include "slide/common.hpp"
#include "slide/hash.hpp"

namespace slide {

namespace {
constexpr int32_t kForced = -1;  // count value of a forced neuron
constexpr int kPrefetch = 16;    // candidate visits between a slot's prefetch and its use
}

struct ActiveSetSampler::Impl {
  int64_t num_items = 0;
  int64_t filled = 0;  // random-fill neurons added by the last call
  int64_t visited = 0;  // bucket entries the last call visited
  int64_t n_candidates = 0;  // distinct neurons among them
  uint32_t epoch = 0;
  // Per neuron, stamp == epoch: seen in the current call; count: tables it was found in
  // (kForced for forced ones). Kept side by side so a visit touches one cache line.
  struct Slot {
    uint32_t stamp = 0;
    int32_t count = 0;
  };
  std::vector<Slot> slots;
  std::vector<int32_t> candidates;
  std::vector<int32_t> chosen;
  std::vector<int32_t> cand_count;
  std::vector<uint32_t> by_count_start;

  void next_epoch() {
    if (++epoch == 0) {  // wrapped: stale stamps could alias the new epoch
      for (Slot& sl : slots) sl.stamp = 0;
      epoch = 1;
    }
  }
  bool seen(int32_t i) const { return slots[i].stamp == epoch; }
  void mark(int32_t i, int32_t c) {
    slots[i].stamp = epoch;
    slots[i].count = c;
  }
};

ActiveSetSampler::ActiveSetSampler(int64_t num_items) : impl_(std::make_unique<Impl>()) {
  if (num_items < 0 || num_items > 0x7FFFFFFF)
    throw InvalidArgument("num_items=" + std::to_string(num_items) + " must be in 0..2^31-1");
  impl_->num_items = num_items;
  impl_->slots.assign(static_cast<size_t>(num_items), Impl::Slot{});
}

ActiveSetSampler::~ActiveSetSampler() = default;
ActiveSetSampler::ActiveSetSampler(ActiveSetSampler&&) noexcept = default;

void ActiveSetSampler::select(const LshTables& tables, const uint32_t* buckets, const int32_t* forced,
                              int n_forced, const SelectionParams& params, Rng& rng,
                              std::vector<int32_t>& active) {
  select(tables, buckets, forced, n_forced, params, rng, active, 0, impl_->num_items);
}

void ActiveSetSampler::select(const LshTables& tables, const uint32_t* buckets, const int32_t* forced,
                              int n_forced, const SelectionParams& params, Rng& rng,
                              std::vector<int32_t>& active, int64_t begin, int64_t end) {
  Impl& im = *impl_;
  if (tables.num_items() > im.num_items)
    throw InvalidArgument("tables hold " + std::to_string(tables.num_items()) +
                          " items, the sampler was made for " + std::to_string(im.num_items));
  if (begin < 0 || end < begin || end > im.num_items)
    throw InvalidArgument("neuron range [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") is not within 0.." + std::to_string(im.num_items));
  // Everything below counts within the range: the cap, the fill target and the fill draws.
  const int64_t n = end - begin;
  if (params.min_active < 0 || params.max_active < 0)
    throw InvalidArgument("min_active and max_active must be >= 0");
  if (params.mode == Selection::Threshold && params.threshold < 1)
    throw InvalidArgument("threshold=" + std::to_string(params.threshold) + " must be at least 1");
  im.next_epoch();
  active.clear();
  im.filled = 0;
  im.visited = 0;

  // 1. Forced neurons, in order, de-duplicated; always kept.
  for (int f = 0; f < n_forced; ++f) {
    const int32_t i = forced[f];
    if (i < begin || i >= end)
      throw InvalidArgument("forced neuron " + std::to_string(i) + " out of range " + std::to_string(begin) + ".." +
                            std::to_string(end - 1));
    if (im.seen(i)) continue;
    im.mark(i, kForced);
    active.push_back(i);
  }
  const int64_t n_kept_forced = static_cast<int64_t>(active.size());
  const int64_t cap = params.max_active > 0 ? params.max_active : n;
  int64_t room = std::max<int64_t>(0, cap - n_kept_forced);

  // 2. Candidates from the L buckets, with the number of tables each was found in.
  const int L = tables.num_tables();
  im.candidates.clear();
  int max_count = 0;
  if (buckets != nullptr) {
    for (int t = 0; t < L; ++t) {
      const auto b = tables.bucket(t, buckets[t]);
      im.visited += b.second;
      for (int k = 0; k < b.second; ++k) {
        // Slots of a large layer live outside the caches: request a few visits ahead.
        if (k + kPrefetch < b.second) __builtin_prefetch(&im.slots[b.first[k + kPrefetch]], 1);
        const int32_t i = b.first[k];
        if (i < begin || i >= end) continue;
        if (!im.seen(i)) {
          im.mark(i, 1);
          im.candidates.push_back(i);
          max_count = std::max(max_count, 1);
        } else if (im.slots[i].count != kForced) {
          max_count = std::max(max_count, ++im.slots[i].count);
        }
      }
    }
  }

  im.n_candidates = static_cast<int64_t>(im.candidates.size());

  // Keeps `want` of pool[first, end) chosen uniformly (partial Fisher-Yates, moved to the front
  // of that range) and appends them to active.
  auto take_random = [&](std::vector<int32_t>& pool, size_t first, size_t end, size_t want) {
    const size_t size = end - first;
    if (want >= size) {
      active.insert(active.end(), pool.begin() + first, pool.begin() + end);
      return;
    }
    for (size_t k = 0; k < want; ++k) {
      const size_t j = first + k + rng.below(size - k);
      std::swap(pool[first + k], pool[j]);
    }
    active.insert(active.end(), pool.begin() + first, pool.begin() + first + want);
  };

  if (params.mode == Selection::Vanilla) {
    // Union of the buckets; when it exceeds the cap, a uniform sample of it.
    take_random(im.candidates, 0, im.candidates.size(), static_cast<size_t>(room));
  } else {
    // Top-K / threshold: most frequent first (counting sort by count, stable in discovery order);
    // the count class that straddles the cap is sampled uniformly rather than by discovery order.
    const int min_count = params.mode == Selection::Threshold ? params.threshold : 1;
    // One gather of the counts; everything after works on local arrays.
    const size_t nc = im.candidates.size();
    im.cand_count.resize(nc);
    for (size_t k = 0; k < nc; ++k) im.cand_count[k] = im.slots[im.candidates[k]].count;
    std::vector<uint32_t>& pos = im.by_count_start;
    pos.assign(static_cast<size_t>(max_count) + 2, 0u);
    for (size_t k = 0; k < nc; ++k) ++pos[max_count - im.cand_count[k] + 1];
    for (size_t c = 1; c < pos.size(); ++c) pos[c] += pos[c - 1];
    im.chosen.resize(nc);
    // Scatter into classes ordered by decreasing count (pos is advanced, then restored).
    for (size_t k = 0; k < nc; ++k) im.chosen[pos[max_count - im.cand_count[k]]++] = im.candidates[k];
    for (size_t c = pos.size() - 1; c > 0; --c) pos[c] = pos[c - 1];
    pos[0] = 0;
    size_t taken_end = 0;  // chosen[0, taken_end) are in the active set (but see the straddle class)
    for (int c = max_count; c >= min_count && room > 0; --c) {
      const size_t a = pos[max_count - c], b = pos[max_count - c + 1];
      const size_t size = b - a;
      if (static_cast<int64_t>(size) <= room) {
        active.insert(active.end(), im.chosen.begin() + a, im.chosen.begin() + b);
        room -= static_cast<int64_t>(size);
        taken_end = b;
      } else {
        // The class that straddles the cap is sampled uniformly (shuffled in place: its first
        // `room` entries are taken), not cut in discovery order.
        take_random(im.chosen, a, b, static_cast<size_t>(room));
        taken_end = a + static_cast<size_t>(room);
        room = 0;
      }
    }
    // Candidates that made no cut leave the set, so that the random fill may draw them. Only
    // needed when a fill follows; the cut is a prefix of `chosen`.
    const int64_t fill_target = std::min<int64_t>(std::min<int64_t>(params.min_active, cap), n);
    if (static_cast<int64_t>(active.size()) < fill_target)
      for (size_t k = taken_end; k < nc; ++k) im.slots[im.chosen[k]].stamp = im.epoch - 1;
  }
  // Vanilla candidates left out by the cap stay marked: the cap is then reached, so no fill runs.

  // 3. Random fill up to min_active (never beyond the cap or the layer).
  const int64_t target = std::min<int64_t>(std::min<int64_t>(params.min_active, cap), n);
  int64_t have = static_cast<int64_t>(active.size());
  if (have < target) {
    const int64_t need = target - have;
    if (2 * (have + need) <= n) {
      // Rejection sampling: at most half the layer is marked, so each draw succeeds w.p. >= 1/2.
      while (have < target) {
        const int32_t i = static_cast<int32_t>(begin + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n))));
        if (im.seen(i)) continue;
        im.mark(i, kForced);
        active.push_back(i);
        ++have;
      }
    } else {
      // Dense fill (small layers): sample from the unmarked neurons directly.
      im.candidates.clear();
      for (int64_t i = begin; i < end; ++i)
        if (!im.seen(static_cast<int32_t>(i))) im.candidates.push_back(static_cast<int32_t>(i));
      const size_t before = active.size();
      take_random(im.candidates, 0, im.candidates.size(), static_cast<size_t>(need));
      for (size_t k = before; k < active.size(); ++k) im.mark(active[k], kForced);
    }
    im.filled = static_cast<int64_t>(active.size()) - (target - need);
  }
}

int64_t ActiveSetSampler::filled() const noexcept { return impl_->filled; }
int64_t ActiveSetSampler::visited() const noexcept { return impl_->visited; }
int64_t ActiveSetSampler::candidates() const noexcept { return impl_->n_candidates; }

}  // namespace slide
