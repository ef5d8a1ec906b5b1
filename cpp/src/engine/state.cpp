// What a checkpoint saves and restores: the persistent arrays (weights, biases, Adam
// moments), the hash tables and the rebuild schedule position; and the memory report.
#include <algorithm>
#include <mutex>
#include <string>

#include "engine_internal.hpp"
#include "slide/network.hpp"

namespace slide {

std::vector<ParameterArray> Network::parameters() {
  // The views may be written: what prediction derived from the weights is rebuilt.
  predict_cache_->invalidate();
  std::vector<ParameterArray> p;
  for (Layer& L : layers_) {
    const std::string base = "layers." + std::to_string(L.index) + ".";
    const std::vector<int64_t> ws{L.rows, L.row_len}, bs{L.out_dim};
    if (L.bf16) {
      p.push_back({base + "weight", nullptr, ws, L.weight16.data()});
      p.push_back({base + "bias", L.bias.data(), bs});
      p.push_back({base + "weight.adam_m", nullptr, ws, L.weight16_m.data()});
      p.push_back({base + "weight.adam_v", nullptr, ws, L.weight16_v.data()});
    } else {
      p.push_back({base + "weight", L.weight.data(), ws});
      p.push_back({base + "bias", L.bias.data(), bs});
      p.push_back({base + "weight.adam_m", L.weight_m.data(), ws});
      p.push_back({base + "weight.adam_v", L.weight_v.data(), ws});
    }
    p.push_back({base + "bias.adam_m", L.bias_m.data(), bs});
    p.push_back({base + "bias.adam_v", L.bias_v.data(), bs});
  }
  return p;
}

MemoryReport Network::memory_report() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  MemoryReport r;
  for (const Layer& L : layers_) {
    const std::string base = "layers." + std::to_string(L.index) + ".";
    r.weights += L.weight.bytes() + L.weight16.bytes() + L.bias.bytes();
    r.optimizer += L.weight_m.bytes() + L.weight_v.bytes() + L.weight16_m.bytes() + L.weight16_v.bytes() +
                   L.bias_m.bytes() + L.bias_v.bytes();
    r.gradients += L.weight_grad.bytes() + L.bias_grad.bytes() + L.row_touched.bytes() +
                   L.touched_rows.capacity() * sizeof(int32_t) + L.row_end.bytes() +
                   L.entry_sample.capacity() * sizeof(int32_t) + L.entry_coef.capacity() * sizeof(float);
    if (L.tables) r.tables += L.tables->memory_bytes();
    const std::pair<const char*, const AlignedBuffer<float>*> arrays[] = {
        {"weight", &L.weight},       {"weight.adam_m", &L.weight_m}, {"weight.adam_v", &L.weight_v},
        {"weight.grad", &L.weight_grad}, {"bias", &L.bias},          {"bias.adam_m", &L.bias_m},
        {"bias.adam_v", &L.bias_v},  {"bias.grad", &L.bias_grad}};
    for (const auto& a : arrays)
      if (a.second->hugepages()) r.hugepages.push_back(base + a.first);
    const std::pair<const char*, const AlignedBuffer<uint16_t>*> arrays16[] = {
        {"weight", &L.weight16}, {"weight.adam_m", &L.weight16_m}, {"weight.adam_v", &L.weight16_v}};
    for (const auto& a : arrays16)
      if (a.second->hugepages()) r.hugepages.push_back(base + a.first);
  }
  for (const auto& ws : workspaces_) {
    const size_t b = ws->bytes();
    r.scratch += b;
    r.scratch_per_thread = std::max(r.scratch_per_thread, b);
  }
  r.scratch += predict_cache_->bytes();
  r.scratch += shared_block_bytes(shared_.get());  // the shared-negatives trainer's batch block
  // Per-sample gradient records of the last batch: O(batch x active).
  for (const auto& rec : records_) r.gradients += rec->bytes();
  if (batch_) {
    r.scratch += batch_->bytes();
    r.activations = batch_->activation_bytes();
  }
  return r;
}

// ------------------------------------------------------------------ checkpoint access

namespace {
const Layer& lsh_layer(const std::vector<Layer>& layers, int layer) {
  if (layer < 0 || layer >= static_cast<int>(layers.size()))
    throw InvalidArgument("layer " + std::to_string(layer) + " out of range 0.." + std::to_string(layers.size() - 1));
  if (!layers[layer].lsh()) throw InvalidArgument("layer " + std::to_string(layer) + " does not sample by LSH");
  return layers[layer];
}
}  // namespace

LshTablesState Network::table_state(int layer) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return lsh_layer(layers_, layer).tables->export_state();
}

void Network::set_table_state(int layer, const LshTablesState& state) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  const Layer& L = lsh_layer(layers_, layer);
  // A spread rebuild in progress goes on hashing this layer's rows: its plan must be for them.
  if (state.pending_rows >= 0 && (state.pending_rows != L.rows || state.pending_stride != L.row_len))
    throw InvalidArgument("hash tables: the rebuild in progress is for " + std::to_string(state.pending_rows) +
                          " rows of " + std::to_string(state.pending_stride) + " values, but layer " +
                          std::to_string(layer) + " has " + std::to_string(L.rows) + " rows of " +
                          std::to_string(L.row_len));
  L.tables->import_state(state);  // replaces a spread rebuild in progress by the state's
  predict_cache_->invalidate();
}

void Network::set_next_rebuild(int64_t next) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (has_lsh_ ? next <= step_ : next != -1)
    throw InvalidArgument("next_rebuild: must be " +
                          (has_lsh_ ? "> step=" + std::to_string(step_) : std::string("-1 without LSH layers")) +
                          ", got " + std::to_string(next));
  next_rebuild_ = next;
}

}  // namespace slide
