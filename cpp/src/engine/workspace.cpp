// Per-thread scratch of the engine (see slide/workspace.hpp).
#include "slide/workspace.hpp"

#include <algorithm>

namespace slide {

size_t SampleWorkspace::bytes() const {
  size_t b = buckets.capacity() * sizeof(uint32_t) + labels.capacity() * sizeof(int32_t) +
             heap.capacity() * sizeof(heap[0]) + grad_row.capacity() * sizeof(float) +
             adam_rows.capacity() * sizeof(int32_t) + input16.capacity() * sizeof(uint16_t);
  for (auto& v : out) b += v.capacity() * sizeof(float);
  for (auto& v : mask) b += v.capacity() * sizeof(float);
  for (auto& v : delta) b += v.capacity() * sizeof(float);
  for (auto& v : active) b += v.capacity() * sizeof(int32_t);
  for (auto& v : touched) b += v.capacity() * sizeof(int32_t);
  return b;
}

void SampleRecord::clear() {
  for (auto& v : rows) v.clear();
  for (auto& v : coef) v.clear();
  for (auto& v : vec) v.clear();
  labels.clear();
}

size_t SampleRecord::bytes() const {
  size_t b = labels.capacity() * sizeof(int32_t);
  for (auto& v : rows) b += v.capacity() * sizeof(int32_t);
  for (auto& v : coef) b += v.capacity() * sizeof(float);
  for (auto& v : vec) b += v.capacity() * sizeof(float);
  return b;
}

std::unique_ptr<SampleWorkspace> make_workspace(const std::vector<Layer>& layers, bool training,
                                                bool with_samplers) {
  auto ws = std::make_unique<SampleWorkspace>();
  const size_t n = layers.size();
  ws->out.resize(n);
  ws->mask.resize(n);
  ws->delta.resize(n);
  ws->active.resize(n);
  ws->samplers.resize(n);
  ws->touched.resize(n);
  int max_tables = 0;
  for (size_t l = 0; l < n; ++l) {
    const Layer& L = layers[l];
    const bool last = l + 1 == n;
    int64_t width = L.out_dim;
    if (last && L.lsh()) {
      const auto& s = L.spec.selection;
      width = std::min<int64_t>(L.out_dim, std::max<int64_t>({s.max_active, s.min_active, 64}) + 64);
    }
    ws->out[l].reserve(width);
    if (training) {
      ws->delta[l].reserve(width);
      if (!last) ws->mask[l].reserve(width);
    }
    if (L.lsh()) {
      ws->active[l].reserve(width);
      max_tables = std::max(max_tables, L.spec.lsh.L);
      if (with_samplers) ws->samplers[l] = std::make_unique<ActiveSetSampler>(L.out_dim);
    }
  }
  ws->buckets.resize(max_tables);
  if (layers.back().bf16) ws->input16.resize(static_cast<size_t>(layers.back().row_len));
  if (training) {
    int64_t max_len = 0;
    for (const Layer& L : layers) max_len = std::max(max_len, L.row_len);
    ws->grad_row.assign(max_len, 0.0f);
    ws->adam_rows.reserve(4096);
  }
  return ws;
}

}  // namespace slide
