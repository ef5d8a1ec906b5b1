// Hash families for LSH-selected active sets: SimHash, WTA and DWTA (see slide/hash.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SLIDE_HASH_X86 1
#endif

#include "slide/common.hpp"
#include "slide/cpu.hpp"
#include "slide/hash.hpp"
#include "slide/random.hpp"

namespace slide {

namespace {

constexpr int kMaxRangePow = 30;      // bucket ids live in uint32 with room for a sentinel
constexpr int kDefaultWtaRangePow = 18;

int log2_exact(int v) {
  int b = 0;
  while ((1 << b) < v) ++b;
  return b;
}

bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

// Folds a stream of 64-bit words into range_pow bits: chained SplitMix finalisers, top bits taken
// (the finaliser's high bits are its best mixed), so every output bit depends on every code bit.
inline uint32_t fold_bits(const uint64_t* words, int n_words, int range_pow) {
  uint64_t h = 0x2545F4914F6CDD1Dull;
  for (int i = 0; i < n_words; ++i) h = mix64(h ^ words[i]);
  return static_cast<uint32_t>(h >> (64 - range_pow));
}

// Folds a `bits`-bit code (bits <= 64) into range_pow < bits bits through a bijection of the
// bits-bit integers (xorshifts and odd multipliers mod 2^bits), then keeps the top range_pow
// bits: every id has exactly 2^(bits - range_pow) preimages, so uniform codes give uniform ids
// (a general-purpose hash of a short code would leave some ids with more preimages than others).
inline uint32_t fold_balanced(uint64_t code, int bits, int range_pow) {
  const uint64_t mask = bits == 64 ? ~uint64_t{0} : ((uint64_t{1} << bits) - 1);
  const int s = (bits + 1) / 2;
  uint64_t h = code;
  h ^= h >> s;
  h = (h * 0x9E3779B97F4A7C15ull) & mask;
  h ^= h >> s;
  h = (h * 0xD6E8FEB86659FD93ull) & mask;
  h ^= h >> s;
  h = (h * 0xBF58476D1CE4E5B9ull) & mask;
  return static_cast<uint32_t>(h >> (bits - range_pow));
}

// Reads `count` (<= 32) bits starting at bit `start` of a little-endian bit array.
inline uint64_t read_bits(const uint64_t* bits, int64_t start, int count) {
  const int64_t w = start >> 6;
  const int off = static_cast<int>(start & 63);
  uint64_t v = bits[w] >> off;
  if (off + count > 64) v |= bits[w + 1] << (64 - off);
  return count == 64 ? v : (v & ((uint64_t{1} << count) - 1));
}

// ---------------------------------------------------------------------------------------------
// SimHash: signed random projections (Charikar, STOC 2002) with sparse {-1, 0, +1} projections
// (Achlioptas, PODS 2001; Li, Hastie & Church, KDD 2006). The sign of <r, x> is one bit;
// P[bits equal] = 1 - angle(x, y) / pi.
//
// The ternary matrix is stored densely, in blocks of 64 projections laid out [dim][64], so the
// kernel keeps 64 accumulators in eight AVX registers and streams one contiguous 256-byte row
// per non-zero input coordinate: zero inputs (ReLU outputs) cost nothing, there are no gathers,
// and products with +-1 are exact, so the AVX2 and generic kernels give identical bits.
constexpr int kSimBlock = 64;

// The kernels walk the input's non-zero entries (idx, val; compacted once per vector): a
// per-coordinate zero test inside the block loop would mispredict on ReLU outputs.
uint64_t simhash_block_bits_generic(const int32_t* idx, const float* val, int nnz, const float* block) {
  // Two passes of 32 accumulators: 64 would not fit the 16 SSE registers and would spill.
  constexpr int kHalf = kSimBlock / 2;
  uint64_t bits = 0;
  for (int h = 0; h < 2; ++h) {
#if defined(__SSE2__)
    // SSE2 is part of x86-64: explicit registers keep the accumulators out of memory.
    __m128 a[kHalf / 4];
    for (auto& r : a) r = _mm_setzero_ps();
    for (int k = 0; k < nnz; ++k) {
      const __m128 v = _mm_set1_ps(val[k]);
      const float* row = block + static_cast<size_t>(idx[k]) * kSimBlock + h * kHalf;
      for (int r = 0; r < kHalf / 4; ++r) a[r] = _mm_add_ps(a[r], _mm_mul_ps(v, _mm_load_ps(row + 4 * r)));
    }
    for (int r = 0; r < kHalf / 4; ++r)
      bits |= static_cast<uint64_t>(_mm_movemask_ps(_mm_cmpgt_ps(a[r], _mm_setzero_ps()))) << (h * kHalf + 4 * r);
#else
    float acc[kHalf];
    for (int i = 0; i < kHalf; ++i) acc[i] = 0.0f;
    for (int k = 0; k < nnz; ++k) {
      const float v = val[k];
      const float* row = block + static_cast<size_t>(idx[k]) * kSimBlock + h * kHalf;
      for (int i = 0; i < kHalf; ++i) acc[i] += v * row[i];
    }
    for (int i = 0; i < kHalf; ++i) bits |= static_cast<uint64_t>(acc[i] > 0.0f) << (h * kHalf + i);
#endif
  }
  return bits;
}

#ifdef SLIDE_HASH_X86
// Bits of the positive lanes of a.
__attribute__((target("avx2,fma"))) inline uint64_t positive_lanes(__m256 a) {
  return static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ)));
}

__attribute__((target("avx2,fma"))) uint64_t simhash_block_bits_avx2(const int32_t* idx, const float* val,
                                                                        int nnz, const float* block) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps(), a4 = _mm256_setzero_ps(), a5 = _mm256_setzero_ps(),
         a6 = _mm256_setzero_ps(), a7 = _mm256_setzero_ps();
  for (int k = 0; k < nnz; ++k) {
    const __m256 b = _mm256_set1_ps(val[k]);
    const float* row = block + static_cast<size_t>(idx[k]) * kSimBlock;
    a0 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 0), a0);
    a1 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 8), a1);
    a2 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 16), a2);
    a3 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 24), a3);
    a4 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 32), a4);
    a5 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 40), a5);
    a6 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 48), a6);
    a7 = _mm256_fmadd_ps(b, _mm256_load_ps(row + 56), a7);
  }
  return positive_lanes(a0) | (positive_lanes(a1) << 8) | (positive_lanes(a2) << 16) |
         (positive_lanes(a3) << 24) | (positive_lanes(a4) << 32) | (positive_lanes(a5) << 40) |
         (positive_lanes(a6) << 48) | (positive_lanes(a7) << 56);
}
#endif

// 64-byte aligned float storage without raw new/delete.
struct AlignedFloats {
  std::vector<float> raw;
  float* data = nullptr;
  void resize(size_t n) {
    raw.assign(n + 16, 0.0f);
    auto p = reinterpret_cast<uintptr_t>(raw.data());
    data = reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
  }
};

class SimHash final : public HashFunction {
 public:
  SimHash(const LshParams& p, int dim, uint64_t seed) : K_(p.K) {
    L_ = p.L;
    dim_ = dim;
    range_pow_ = effective_range_pow(p);
    const int64_t nproj = static_cast<int64_t>(K_) * L_;
    n_blocks_ = static_cast<int>((nproj + kSimBlock - 1) / kSimBlock);
    proj_.resize(static_cast<size_t>(n_blocks_) * dim_ * kSimBlock);
    // Per table, a seeded random partition of the coordinates into max(K, 3) groups; projection
    // k of the table takes group k with random signs (density min(1/3, 1/K)). Disjoint supports
    // make a table's K bits independent for isotropic inputs, so buckets fill as uniform hashing
    // predicts; overlapping supports would correlate the bits and leave buckets unused.
    const int groups = std::max(K_, 3);
    std::vector<int32_t> perm(dim_);
    for (int t = 0; t < L_; ++t) {
      Rng rng(stream_seed(seed, 0x5348u, static_cast<uint64_t>(t)));
      for (int j = 0; j < dim_; ++j) perm[j] = j;
      for (int j = dim_ - 1; j > 0; --j) std::swap(perm[j], perm[rng.below(static_cast<uint64_t>(j) + 1)]);
      for (int k = 0; k < K_; ++k) {
        const int64_t r = static_cast<int64_t>(t) * K_ + k;
        float* base = proj_.data + static_cast<size_t>(r / kSimBlock) * dim_ * kSimBlock + r % kSimBlock;
        auto sign = [&rng] { return (rng.next() >> 63) ? 1.0f : -1.0f; };
        if (k < dim_) {
          for (int j = k; j < dim_; j += groups) base[static_cast<size_t>(perm[j]) * kSimBlock] = sign();
        } else {
          // Fewer coordinates than projections: supports must overlap; one random coordinate each.
          base[static_cast<size_t>(rng.below(static_cast<uint64_t>(dim_))) * kSimBlock] = sign();
        }
      }
    }
#ifdef SLIDE_HASH_X86
    const CpuFeatures& f = cpu_features();
    use_avx2_ = f.avx2 && f.fma;
#endif
  }

  void hash_dense(const float* x, uint32_t* buckets) const override {
    // Sign bits of all K*L projections, 64 per word (+1 spare word for read_bits).
    constexpr int kStackWords = 64;
    uint64_t stack_bits[kStackWords + 1];
    std::vector<uint64_t> heap_bits;
    uint64_t* bits = stack_bits;
    if (n_blocks_ + 1 > kStackWords + 1) {
      heap_bits.assign(static_cast<size_t>(n_blocks_) + 1, 0);
      bits = heap_bits.data();
    }
    bits[n_blocks_] = 0;
    constexpr int kStackDim = 1024;
    int32_t stack_idx[kStackDim];
    float stack_val[kStackDim];
    std::vector<int32_t> heap_idx;
    std::vector<float> heap_val;
    int32_t* idx = stack_idx;
    float* val = stack_val;
    if (dim_ > kStackDim) {
      heap_idx.resize(dim_);
      heap_val.resize(dim_);
      idx = heap_idx.data();
      val = heap_val.data();
    }
    int nnz = 0;
    for (int j = 0; j < dim_; ++j) {  // branch-free compaction
      idx[nnz] = j;
      val[nnz] = x[j];
      nnz += x[j] != 0.0f;
    }
    for (int b = 0; b < n_blocks_; ++b) {
      const float* block = proj_.data + static_cast<size_t>(b) * dim_ * kSimBlock;
#ifdef SLIDE_HASH_X86
      if (use_avx2_) {
        bits[b] = simhash_block_bits_avx2(idx, val, nnz, block);
        continue;
      }
#endif
      bits[b] = simhash_block_bits_generic(idx, val, nnz, block);
    }
    for (int t = 0; t < L_; ++t) {
      const uint64_t code = read_bits(bits, static_cast<int64_t>(t) * K_, K_);
      buckets[t] = range_pow_ == K_ ? static_cast<uint32_t>(code) : fold_balanced(code, K_, range_pow_);
    }
  }

 private:
  int K_;
  int n_blocks_ = 0;
  AlignedFloats proj_;
  bool use_avx2_ = false;
};

// ---------------------------------------------------------------------------------------------
// WTA: winner-take-all hashing (Yagnik, Strelow, Ross & Lin, ICCV 2011). Code c looks at
// bin_size coordinates of a random permutation and records the position of the largest.
// Permutations are cut into consecutive bins of bin_size, so the codes drawn from one
// permutation look at disjoint coordinates.
//
// DWTA: densified WTA (Chen & Shrivastava, "Densified Winner Take All (WTA) Hashing for Sparse
// Datasets", UAI 2018). Zero entries do not compete; a bin whose coordinates are all zero is
// empty and takes the code of the first non-empty bin on a seeded probe sequence, so inputs with
// only a few non-zeros still yield K informative codes per table. A vector with no non-zero entry
// in any bin (e.g. all zeros) hashes to bucket 0 in every table.
class WtaHash final : public HashFunction {
 public:
  WtaHash(const LshParams& p, int dim, uint64_t seed, bool densified)
      : K_(p.K), bin_(p.bin_size), bits_per_code_(log2_exact(p.bin_size)), densified_(densified) {
    L_ = p.L;
    dim_ = dim;
    range_pow_ = effective_range_pow(p);
    if (dim < bin_)
      throw InvalidArgument("lsh.bin_size=" + std::to_string(bin_) + " exceeds the input dimension " +
                            std::to_string(dim) + " (WTA/DWTA need dim >= bin_size)");
    n_codes_ = K_ * L_;
    // Each table draws its codes from its own permutations, consecutive bins of one permutation
    // first: a table's K codes then look at disjoint coordinates (while K * bin_size <= dim) and
    // are independent for i.i.d. inputs. Sharing a permutation across a table boundary would let
    // two codes of one table see the same coordinate, correlate them and skew the bucket sizes.
    const int bins_per_perm = dim_ / bin_;
    idx_.resize(static_cast<size_t>(n_codes_) * bin_);
    std::vector<int32_t> perm(dim_);
    for (int t = 0; t < L_; ++t) {
      for (int k = 0; k < K_; ++k) {
        const int b = k % bins_per_perm;
        if (b == 0) {
          Rng rng(stream_seed(seed, 0x575441u, static_cast<uint64_t>(t), static_cast<uint64_t>(k / bins_per_perm)));
          for (int j = 0; j < dim_; ++j) perm[j] = j;
          for (int j = dim_ - 1; j > 0; --j) std::swap(perm[j], perm[rng.below(static_cast<uint64_t>(j) + 1)]);
        }
        std::copy(perm.begin() + b * bin_, perm.begin() + (b + 1) * bin_,
                  idx_.begin() + static_cast<size_t>(t * K_ + k) * bin_);
      }
    }
    // Probe order for densification: a seeded sequence of other bins per empty bin.
    probes_.resize(static_cast<size_t>(n_codes_) * kProbes);
    for (int i = 0; i < n_codes_; ++i)
      for (int a = 0; a < kProbes; ++a)
        probes_[static_cast<size_t>(i) * kProbes + a] = static_cast<int32_t>(
            Rng(stream_seed(seed, 0x44454eu, static_cast<uint64_t>(i), static_cast<uint64_t>(a)))
                .below(static_cast<uint64_t>(n_codes_)));
#ifdef SLIDE_HASH_X86
    const CpuFeatures& f = cpu_features();
    use_avx2_ = f.avx2;
    // Lane-major copy of the bins for the AVX2 kernel: group g, step s holds the s-th coordinate
    // of codes 8g..8g+7 (the last group is padded with coordinate 0 and its extra lanes ignored).
    n_groups_ = (n_codes_ + 7) / 8;
    if (use_avx2_) {
      idx_t_.assign(static_cast<size_t>(n_groups_) * bin_ * 8, 0);
      for (int c = 0; c < n_codes_; ++c)
        for (int s = 0; s < bin_; ++s)
          idx_t_[(static_cast<size_t>(c / 8) * bin_ + s) * 8 + c % 8] = idx_[static_cast<size_t>(c) * bin_ + s];
    }
#endif
    words_per_table_ = (K_ * bits_per_code_ + 63) / 64;
  }

  void hash_dense(const float* x, uint32_t* buckets) const override {
    constexpr int kStackCodes = 4096;
    int16_t stack_codes[kStackCodes];
    std::vector<int16_t> heap_codes;
    int16_t* codes = stack_codes;
    if (n_codes_ > kStackCodes) {
      heap_codes.assign(static_cast<size_t>(n_codes_), 0);
      codes = heap_codes.data();
    }
    // codes[c] = argmax position, or -1 for an empty DWTA bin.
    int n_empty = 0;
#ifdef SLIDE_HASH_X86
    if (use_avx2_)
      n_empty = codes_avx2(x, codes);
    else
#endif
      n_empty = codes_generic(x, codes);
    if (n_empty == n_codes_) {
      std::fill(buckets, buckets + L_, 0u);
      return;
    }
    if (n_empty > 0) densify(codes);
    uint64_t words[8];  // K <= 32 codes of <= 8 bits: at most 4 words
    for (int t = 0; t < L_; ++t) {
      std::fill(words, words + words_per_table_, 0ull);
      const int16_t* tc = codes + t * K_;
      for (int k = 0; k < K_; ++k) {
        const int bit = k * bits_per_code_;
        words[bit >> 6] |= static_cast<uint64_t>(tc[k]) << (bit & 63);
        // bits_per_code divides 64 is not guaranteed (e.g. 3), so carry the spill-over.
        if ((bit & 63) + bits_per_code_ > 64) words[(bit >> 6) + 1] |= static_cast<uint64_t>(tc[k]) >> (64 - (bit & 63));
      }
      // Non-overlapping concatenation: each code owns its own bits, all 2^(K*b) ids reachable.
      const int code_bits = K_ * bits_per_code_;
      if (code_bits == range_pow_)
        buckets[t] = static_cast<uint32_t>(words[0]);
      else if (code_bits <= 64)
        buckets[t] = fold_balanced(words[0], code_bits, range_pow_);
      else  // more code bits than a word: 2^code_bits >> 2^range_pow, a chained mixer is balanced enough
        buckets[t] = fold_bits(words, words_per_table_, range_pow_);
    }
  }

 private:
  static constexpr int kProbes = 16;

  int codes_generic(const float* x, int16_t* codes) const {
    return densified_ ? codes_generic_t<true>(x, codes) : codes_generic_t<false>(x, codes);
  }

  template <bool kDensified>
  int codes_generic_t(const float* x, int16_t* codes) const {
    int n_empty = 0;
    for (int c = 0; c < n_codes_; ++c) {
      const int32_t* ix = idx_.data() + static_cast<size_t>(c) * bin_;
      // Branch-free argmax (first maximum wins); for DWTA zeros compete as -inf.
      const float ninf = -std::numeric_limits<float>::infinity();
      float best = x[ix[0]];
      bool any = best != 0.0f;
      if (kDensified && best == 0.0f) best = ninf;
      int best_pos = 0;
      for (int s = 1; s < bin_; ++s) {
        float v = x[ix[s]];
        any |= v != 0.0f;
        v = (kDensified && v == 0.0f) ? ninf : v;
        const bool gt = v > best;
        best = gt ? v : best;
        best_pos = gt ? s : best_pos;
      }
      const bool empty = kDensified && !any;
      codes[c] = static_cast<int16_t>(empty ? -1 : best_pos);
      n_empty += empty;
    }
    return n_empty;
  }

#ifdef SLIDE_HASH_X86
  // Eight codes at a time, one per lane: step s gathers the s-th coordinate of each code's bin,
  // so the argmax is a vertical compare-and-blend with no horizontal reduction.
  __attribute__((target("avx2"))) int codes_avx2(const float* x, int16_t* codes) const {
    int n_empty = 0;
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    const __m256 zero = _mm256_setzero_ps();
    alignas(32) int32_t pos_out[8];
    alignas(32) int32_t any_out[8];
    for (int g = 0; g < n_groups_; ++g) {
      const int32_t* ix = idx_t_.data() + static_cast<size_t>(g) * bin_ * 8;
      __m256 best = ninf;
      __m256i pos = _mm256_setzero_si256();
      __m256 any = _mm256_setzero_ps();
      for (int s = 0; s < bin_; ++s) {
        const __m256i vi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ix + s * 8));
        __m256 v = _mm256_i32gather_ps(x, vi, 4);
        if (densified_) {
          const __m256 isz = _mm256_cmp_ps(v, zero, _CMP_EQ_OQ);
          any = _mm256_or_ps(any, _mm256_xor_ps(isz, _mm256_castsi256_ps(_mm256_set1_epi32(-1))));
          v = _mm256_blendv_ps(v, ninf, isz);
        }
        // s == 0 always takes the lane (also for -inf / NaN values), later steps only when larger.
        const __m256 gt = s == 0 ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : _mm256_cmp_ps(v, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, v, gt);
        pos = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(pos), _mm256_castsi256_ps(_mm256_set1_epi32(s)), gt));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(pos_out), pos);
      _mm256_store_si256(reinterpret_cast<__m256i*>(any_out), _mm256_castps_si256(any));
      const int lanes = std::min(8, n_codes_ - g * 8);
      for (int l = 0; l < lanes; ++l) {
        const bool empty = densified_ && any_out[l] == 0;
        codes[g * 8 + l] = static_cast<int16_t>(empty ? -1 : pos_out[l]);
        n_empty += empty;
      }
    }
    return n_empty;
  }
#endif

  void densify(int16_t* codes) const {
    // Probing reads the original (pre-fill) codes only, so the result does not depend on the
    // order in which empty bins are filled.
    for (int c = 0; c < n_codes_; ++c) {
      if (codes[c] >= 0) continue;
      int16_t got = -1;
      const int32_t* pr = probes_.data() + static_cast<size_t>(c) * kProbes;
      for (int a = 0; a < kProbes && got < 0; ++a) {
        const int16_t v = codes[pr[a]];
        if (v >= 0 && v < bin_) got = v;
      }
      // Extremely sparse inputs may miss all probes: walk on from the last probe (wrapping).
      for (int i = 1; got < 0 && i <= n_codes_; ++i) {
        const int16_t v = codes[(pr[kProbes - 1] + i) % n_codes_];
        if (v >= 0 && v < bin_) got = v;
      }
      // Mark filled bins with the code + bin_ so later probes still see them as empty originally.
      codes[c] = static_cast<int16_t>(got + bin_);
    }
    for (int c = 0; c < n_codes_; ++c)
      if (codes[c] >= bin_) codes[c] = static_cast<int16_t>(codes[c] - bin_);
  }

  int K_, bin_, bits_per_code_;
  bool densified_;
  int n_codes_ = 0;
  int words_per_table_ = 1;
  std::vector<int32_t> idx_;
  std::vector<int32_t> probes_;
  std::vector<int32_t> idx_t_;
  int n_groups_ = 0;
  bool use_avx2_ = false;
};

}  // namespace

HashFamily parse_hash_family(const std::string& name) {
  if (name == "simhash") return HashFamily::SimHash;
  if (name == "wta") return HashFamily::WTA;
  if (name == "dwta") return HashFamily::DWTA;
  throw InvalidArgument("unknown hash family '" + name + "' (expected simhash, wta or dwta)");
}

BucketPolicy parse_bucket_policy(const std::string& name) {
  if (name == "fifo") return BucketPolicy::FIFO;
  if (name == "reservoir") return BucketPolicy::Reservoir;
  throw InvalidArgument("unknown bucket policy '" + name + "' (expected fifo or reservoir)");
}

Selection parse_selection(const std::string& name) {
  if (name == "vanilla") return Selection::Vanilla;
  if (name == "topk") return Selection::TopK;
  if (name == "threshold") return Selection::Threshold;
  throw InvalidArgument("unknown selection '" + name + "' (expected vanilla, topk or threshold)");
}

void validate_lsh_params(const LshParams& p) {
  auto bad = [](const std::string& field, long long v, const std::string& why) {
    throw InvalidArgument("lsh." + field + "=" + std::to_string(v) + ": " + why);
  };
  if (p.K < 1 || p.K > 32) bad("K", p.K, "must be in 1..32");
  if (p.L < 1 || p.L > 1024) bad("L", p.L, "must be in 1..1024");
  if (p.range_pow < 0 || p.range_pow > kMaxRangePow) bad("range_pow", p.range_pow, "must be in 0..30");
  if (p.bucket_capacity < 1) bad("bucket_capacity", p.bucket_capacity, "must be at least 1");
  if (p.family == HashFamily::SimHash) {
    if (p.range_pow > p.K) bad("range_pow", p.range_pow, "SimHash gives K=" + std::to_string(p.K) +
                                                             " bits per table; range_pow cannot exceed K");
  } else {
    if (!is_pow2(p.bin_size) || p.bin_size < 2 || p.bin_size > 256)
      bad("bin_size", p.bin_size, "must be a power of two in 2..256");
    const int bits = lsh_code_bits(p);
    if (p.range_pow > bits)
      bad("range_pow", p.range_pow,
          "K * log2(bin_size) = " + std::to_string(bits) + " code bits per table; range_pow cannot exceed it");
  }
}

int lsh_code_bits(const LshParams& p) {
  if (p.family == HashFamily::SimHash) return p.K;
  if (!is_pow2(p.bin_size) || p.bin_size < 2) throw InvalidArgument("lsh.bin_size: must be a power of two >= 2");
  return p.K * log2_exact(p.bin_size);
}

int effective_range_pow(const LshParams& p) {
  validate_lsh_params(p);
  if (p.range_pow > 0) return p.range_pow;
  if (p.family == HashFamily::SimHash) return std::min(p.K, kMaxRangePow);
  return std::min(p.K * log2_exact(p.bin_size), kDefaultWtaRangePow);
}

std::unique_ptr<HashFunction> HashFunction::create(const LshParams& p, int dim, uint64_t seed) {
  validate_lsh_params(p);
  if (dim < 1) throw InvalidArgument("hash input dimension must be at least 1, got " + std::to_string(dim));
  switch (p.family) {
    case HashFamily::SimHash: return std::make_unique<SimHash>(p, dim, seed);
    case HashFamily::WTA: return std::make_unique<WtaHash>(p, dim, seed, false);
    case HashFamily::DWTA: return std::make_unique<WtaHash>(p, dim, seed, true);
  }
  throw InvalidArgument("unknown hash family");
}

}  // namespace slide
