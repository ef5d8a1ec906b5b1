// One layer's storage and initial weights (see slide/layer.hpp).
#include "slide/layer.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine_internal.hpp"
#include "slide/bf16.hpp"
#include "slide/random.hpp"
#include "slide/training_paths.hpp"

namespace slide {

void allocate_layer(Layer& L, const LayerSpec& spec, int index, int64_t in_dim, bool hugepages,
                    uint64_t hash_seed) {
  const bool hp = hugepages;
  L.spec = spec;
  L.index = index;
  L.in_dim = in_dim;
  L.out_dim = L.spec.size;
  L.sparse_input = index == 0;
  L.rows = L.sparse_input ? L.in_dim : L.out_dim;
  L.row_len = L.sparse_input ? L.out_dim : L.in_dim;
  const size_t w = static_cast<size_t>(L.rows) * static_cast<size_t>(L.row_len);
  L.bf16 = L.spec.precision == Precision::BF16;
  if (L.bf16) {
    L.weight16 = AlignedBuffer<uint16_t>(w, hp);
    L.weight16_m = AlignedBuffer<uint16_t>(w, hp);
    L.weight16_v = AlignedBuffer<uint16_t>(w, hp);
  } else {
    L.weight = AlignedBuffer<float>(w, hp);
    L.weight_m = AlignedBuffer<float>(w, hp);
    L.weight_v = AlignedBuffer<float>(w, hp);
  }
  L.bias = AlignedBuffer<float>(L.out_dim, hp);
  L.bias_m = AlignedBuffer<float>(L.out_dim, hp);
  L.bias_v = AlignedBuffer<float>(L.out_dim, hp);
  L.records = L.lsh() || L.out_dim <= kMaxRecordedWidth;
  if (L.records) {
    L.row_end = AlignedBuffer<int32_t>(L.rows, false);
  } else {
    L.weight_grad = AlignedBuffer<float>(w, hp);
    L.bias_grad = AlignedBuffer<float>(L.out_dim, hp);
    L.all_rows = !L.sparse_input;
    if (!L.all_rows) {
      L.row_touched = AlignedBuffer<uint8_t>(L.rows, false);
      L.touched_rows.reserve(L.rows);
    }
  }
  if (L.lsh()) {
    L.hash = HashFunction::create(L.spec.lsh, static_cast<int>(L.in_dim), hash_seed);
    L.tables = std::make_unique<LshTables>(L.spec.lsh, L.rows);
  }
}

namespace {

// `count` Glorot-normal values from rng into dst (Box-Muller, using both outputs of each pair).
void normal_block(Rng& rng, float std_dev, float* dst, int64_t count) {
  for (int64_t j = 0; j < count; j += 2) {
    const float u1 = 1.0f - rng.uniform(), u2 = rng.uniform();
    const float rad = std_dev * std::sqrt(-2.0f * std::log(u1));
    const float ang = 6.2831853071795864f * u2;
    dst[j] = rad * std::cos(ang);
    if (j + 1 < count) dst[j + 1] = rad * std::sin(ang);
  }
}

}  // namespace

void init_weights(Layer& L, uint64_t seed, int num_threads, int64_t shard_begin, int64_t full_out) {
  if (full_out < 0) full_out = L.out_dim;
  const float std_dev = std::sqrt(2.0f / static_cast<float>(L.in_dim + full_out));
  float* W = L.weight.data();
  const int64_t len = L.row_len;
  if (full_out == L.out_dim) {
    const int64_t blocks = (L.rows + kInitBlock - 1) / kInitBlock;
#pragma omp parallel num_threads(num_threads) if (L.rows * len > kParallelWork)
    {
      // bf16 layers draw the same float32 values and store them rounded.
      std::vector<float> block(L.bf16 ? static_cast<size_t>(kInitBlock * len) : 0);
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        Rng rng(stream_seed(seed, static_cast<uint64_t>(blk)));
        const int64_t begin = blk * kInitBlock * len;
        const int64_t end = std::min(L.rows, (blk + 1) * kInitBlock) * len;
        if (L.bf16) {
          normal_block(rng, std_dev, block.data(), end - begin);
          for (int64_t i = begin; i < end; ++i) L.weight16[i] = float_to_bf16(block[i - begin]);
        } else {
          normal_block(rng, std_dev, W + begin, end - begin);
        }
      }
    }
    return;
  }
  // A shard: each block of the whole layer's rows is drawn as the whole layer draws it, and
  // the shard's part copied out. Neuron rows: rows [shard_begin, +out_dim) of full_out. A
  // layer reading the sparse input keeps neurons as columns: columns of every feature row.
  const int64_t full_rows = L.sparse_input ? L.rows : full_out;
  const int64_t full_len = L.sparse_input ? full_out : len;
  const int64_t row0 = L.sparse_input ? 0 : shard_begin;
  const int64_t row1 = L.sparse_input ? L.rows : shard_begin + L.out_dim;
  const int64_t col0 = L.sparse_input ? shard_begin : 0;
  const int64_t blk0 = row0 / kInitBlock, blk1 = (row1 + kInitBlock - 1) / kInitBlock;
#pragma omp parallel num_threads(num_threads) if ((row1 - row0) * full_len > kParallelWork)
  {
    std::vector<float> block(static_cast<size_t>(kInitBlock * full_len));
#pragma omp for schedule(static)
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      Rng rng(stream_seed(seed, static_cast<uint64_t>(blk)));
      const int64_t b_begin = blk * kInitBlock, b_end = std::min(full_rows, (blk + 1) * kInitBlock);
      normal_block(rng, std_dev, block.data(), (b_end - b_begin) * full_len);
      for (int64_t r = std::max(b_begin, row0); r < std::min(b_end, row1); ++r) {
        const float* src = block.data() + (r - b_begin) * full_len + col0;
        if (L.bf16) {
          for (int64_t i = 0; i < len; ++i) L.weight16[(r - row0) * len + i] = float_to_bf16(src[i]);
        } else {
          std::copy(src, src + len, W + (r - row0) * len);
        }
      }
    }
  }
}

}  // namespace slide
