// One sample's training step, as phases that can be called one by one.
//
// The single-process trainer (Network::train_batch) runs, for every sample of a batch:
//
//   1. forward_hidden          hidden layers, input -> h (the output layer's input)
//   2. select_output           the output neurons to score, within a range [begin, end)
//   3. output_logits           z = W h + b for the selected neurons
//      add_sampling_log_weights (negatives.hpp; hash-sampled output layers in training)
//   4. partial_softmax         (max, sum exp(z - max)) of the selected logits
//      normalise_output        dL/dz and the loss, from the (max, sum) over all ranges
//   5. output_backward         the output layer's weight gradient (records or buffers)
//   6. output_input_gradient   dL/dh contribution of the selected neurons
//      backward_hidden         the hidden layers' gradients, from dL/dh
//   and once per batch
//   7. the fused sparse Adam update (optimizer.hpp: adam_step_recorded / adam_step_buffered).
//
// A trainer that shards the output layer by label range across processes calls the same
// phases with its own range and exchanges between them: after 4a, the (max, sum) pairs
// (combine_softmax_stats is the reduction); after 6, dL/dh (a sum). Phases 1 and the hidden
// part of 6 are replicated. With range = [0, output size) and the local stats passed as the
// global ones, the phases compute exactly what the trainer computes (same bits).
//
// All phases work on one sample in one SampleWorkspace (per thread, workspace.hpp); none
// allocates once the workspace has grown. Sampled ranges: a range is a set of consecutive
// neuron ids; the random fill of a hash-sampled layer is drawn from the range only.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "slide/csr.hpp"
#include "slide/layer.hpp"
#include "slide/random.hpp"
#include "slide/simd.hpp"
#include "slide/workspace.hpp"

namespace slide {

// Consecutive output neurons [begin, end).
struct NeuronRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const noexcept { return end - begin; }
};

// Softmax statistics of a set of logits: their maximum and sum of exp(z - max).
struct SoftmaxStats {
  float max = -INFINITY;
  double sum = 0.0;
};

// The statistics of the union of two disjoint sets of logits (associative, commutative).
SoftmaxStats combine_softmax_stats(const SoftmaxStats& a, const SoftmaxStats& b) noexcept;

// What the output layer reads: the last hidden layer's output (`dense`, in_dim floats) or,
// when the output layer is the network's only layer, the sample's features (`sparse`).
struct LayerInput {
  const float* dense = nullptr;
  SparseRow sparse;
};

// 1. Forward through the hidden layers (all but the last) of one sample: ws.out[l] holds
// layer l's output after activation and (when dropout > 0) inverted dropout, with
// multipliers in ws.mask[l] (one uniform per unit drawn from rng). Hash-sampled hidden
// layers compute only their selected neurons when use_lsh (the rest output 0), drawing the
// random fill from a copy of *shared_fill when given (else from rng); otherwise all neurons.
// Returns the output layer's input.
LayerInput forward_hidden(const std::vector<Layer>& layers, SampleWorkspace& ws, const Kernels& kr,
                          const SparseRow& x, bool use_lsh, float dropout, Rng& rng, const Rng* shared_fill);

// 2. Selects the output neurons in `range` to score. Hash-sampled layer (out.lsh()) with
// use_lsh: hashes in.dense, then ws.active = the forced neurons (in order; each must lie in
// the range), then hash candidates in the range per `sel`, then a random fill from the range
// drawn from rng up to sel.min_active, cut at sel.max_active (forced ones always kept); no
// duplicates; ws.filled = neurons the fill added (the last ones). Otherwise every neuron of
// the range is selected: ws.active is left empty and position i stands for neuron begin + i.
void select_output(const Layer& out, SampleWorkspace& ws, const LayerInput& in, bool use_lsh,
                   const SelectionParams& sel, const int32_t* forced, int n_forced, NeuronRange range, Rng& rng);

// 3. Logits of the selected neurons into ws.out.back() (selection order): w_j . h + b_j.
void output_logits(const Layer& out, SampleWorkspace& ws, const Kernels& kr, const LayerInput& in,
                   bool use_lsh, NeuronRange range);

// 4a. Statistics of the logits in ws.out.back(); stores exp(z - max) in ws.delta.back().
SoftmaxStats partial_softmax(SampleWorkspace& ws);

// 4b. Turns ws.delta.back() (from partial_softmax with `local`) into dL/dz of the softmax
// cross-entropy over all ranges, given their combined statistics `global`, divided by the
// batch size (inv_b = 1 / b): softmax - target, target mass 1/|labels| on each of the
// sample's labels (ws.labels, sorted, unique). Returns the part of the sample's loss from
// the labels inside `range` (the parts of all ranges sum to the loss). Throws Error when a
// label of the range is missing from the selection (an internal invariant).
// A sigmoid output layer gets the per-label binary cross-entropy instead, `local` and
// `global` unused: dL/dz = (sigmoid(z) - y) / b over the range, or for a hash-sampled
// selection over the selected neurons, each negative weighted by layer.spec.negative_weight
// (0: by the neurons it stands for; see negatives.hpp). Its logits must not carry the
// sampled-softmax log-weights.
float normalise_output(const Layer& out, SampleWorkspace& ws, const SoftmaxStats& local, const SoftmaxStats& global,
                       NeuronRange range, bool use_lsh, float inv_b);

// 5. The output layer's weight (and bias) gradient from ws.delta.back(): appended to `rec`
// (recorded layer: rows, coefficients and the input vector) or added into its lock-free
// buffers (rows marked in ws.touched). Neurons with zero delta are skipped.
void output_backward(Layer& out, SampleWorkspace& ws, SampleRecord& rec, const Kernels& kr, const LayerInput& in,
                     bool use_lsh, NeuronRange range);

// 6a. Adds the selected neurons' contribution sum_j delta_j w_j to dh (in_dim floats; the
// caller zeroes it). Nothing for an output layer that reads the sparse input.
void output_input_gradient(const Layer& out, const SampleWorkspace& ws, const Kernels& kr, bool use_lsh,
                           NeuronRange range, float* dh);

// 6b. Backward through the hidden layers, last first: ws.delta[nl - 2] must hold dL/dh (the
// output layer's input gradient, before the activation); the hidden layers' gradients go to
// `rec` or their lock-free buffers like output_backward's.
void backward_hidden(std::vector<Layer>& layers, SampleWorkspace& ws, SampleRecord& rec, const Kernels& kr,
                     const SparseRow& x, float dropout);

}  // namespace slide
