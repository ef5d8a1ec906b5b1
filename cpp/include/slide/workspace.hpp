// Per-thread and per-sample scratch of the training engine.
//
// A SampleWorkspace holds the state of one sample at a time on one thread: O(active) per
// layer, never O(neurons x batch). A SampleRecord holds what one sample of a batch
// contributes to the gradients of the recorded layers (see training_paths.hpp), until the
// optimizer step of the batch consumes it. Both are allocated once and reused, so the hot
// loop does not allocate once their capacities have grown to the working size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "slide/hash.hpp"
#include "slide/layer.hpp"
#include "slide/profile.hpp"

namespace slide {

struct SampleWorkspace {
  // Hidden layers: dense outputs (after activation and dropout), indexed by neuron.
  // Output layer: logits of the selected neurons, in selection order (a dense output layer:
  // by neuron id minus the start of the range).
  std::vector<std::vector<float>> out;
  std::vector<std::vector<float>> mask;   // dropout multipliers (hidden layers, training)
  // dL/dz: hidden layers dense by neuron, the output layer like its logits.
  std::vector<std::vector<float>> delta;
  std::vector<std::vector<int32_t>> active;  // LSH layers: the selected neurons
  std::vector<std::unique_ptr<ActiveSetSampler>> samplers;
  std::vector<uint32_t> buckets;
  std::vector<int32_t> labels;  // the sample's labels, sorted and unique
  std::vector<int32_t> forced;  // training: own labels, then the batch's other labels
  std::vector<float> forced_q;  // inclusion probability of each of those other labels
  int64_t filled = 0;           // output layer: neurons the random fill added (the last ones)
  std::vector<std::vector<int32_t>> touched;    // rows this thread marked in this batch (lock-free layers)
  std::vector<std::pair<float, int32_t>> heap;  // predict: top-k candidates
  std::vector<float> grad_row;                  // optimizer: one row's gradient
  std::vector<int32_t> adam_rows;               // optimizer: touched rows of one block
  // The profiler slot of the thread running this workspace (profile.hpp); null when off.
  PhaseCounters* prof = nullptr;

  size_t bytes() const;
};

// What one sample of the batch contributes to the gradients of the recorded layers:
// gradient of row rows[l][k] += coef[l][k] * vec[l] (vec: the layer input for a neuron
// row, the layer-0 output delta for a feature row).
struct SampleRecord {
  std::vector<std::vector<int32_t>> rows;
  std::vector<std::vector<float>> coef;
  std::vector<std::vector<float>> vec;
  std::vector<int32_t> labels;  // batched dense path: the sample's labels, sorted and unique

  explicit SampleRecord(size_t layers) : rows(layers), coef(layers), vec(layers) {}
  void clear();
  size_t bytes() const;
};

// A workspace sized for `layers`. training: room for deltas, masks and optimizer scratch;
// with_samplers: an active-set sampler per hash-sampled layer (O(neurons) each).
std::unique_ptr<SampleWorkspace> make_workspace(const std::vector<Layer>& layers, bool training,
                                                bool with_samplers);

}  // namespace slide
