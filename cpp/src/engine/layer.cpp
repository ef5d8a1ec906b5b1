// One layer's storage and initial weights (see slide/layer.hpp).
#include "slide/layer.hpp"

#include <algorithm>
#include <cmath>

#include "engine_internal.hpp"
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
  L.weight = AlignedBuffer<float>(w, hp);
  L.weight_m = AlignedBuffer<float>(w, hp);
  L.weight_v = AlignedBuffer<float>(w, hp);
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

void init_weights(Layer& L, uint64_t seed, int num_threads) {
  const float std_dev = std::sqrt(2.0f / static_cast<float>(L.in_dim + L.out_dim));
  const int64_t blocks = (L.rows + kInitBlock - 1) / kInitBlock;
  float* W = L.weight.data();
  const int64_t len = L.row_len;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (L.rows * len > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    Rng rng(stream_seed(seed, static_cast<uint64_t>(blk)));
    const int64_t begin = blk * kInitBlock * len;
    const int64_t end = std::min(L.rows, (blk + 1) * kInitBlock) * len;
    // Box-Muller, using both outputs of each pair of uniforms.
    for (int64_t j = begin; j < end; j += 2) {
      const float u1 = 1.0f - rng.uniform(), u2 = rng.uniform();
      const float rad = std_dev * std::sqrt(-2.0f * std::log(u1));
      const float ang = 6.2831853071795864f * u2;
      W[j] = rad * std::cos(ang);
      if (j + 1 < end) W[j + 1] = rad * std::sin(ang);
    }
  }
}

}  // namespace slide
