// One fully connected layer of a slide network: parameters, optimizer state and, for
// hash-sampled layers, the LSH tables over its neurons.
//
// Storage layout (row-major, one allocation per array, see memory.hpp):
//  - layer 0 reads the sparse input, so its weight is [input_dim, size]: a sample
//    touches only the rows of its non-zero features;
//  - every other layer stores [size, prev]: one row per neuron, the vector the hash
//    tables index and the unit of the sparse optimizer step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "slide/hash.hpp"
#include "slide/memory.hpp"

namespace slide {

// Softmax and Sigmoid are output-layer activations; they also choose the loss: softmax
// cross-entropy (target mass 1/|y|) or per-label binary cross-entropy (one sigmoid per label).
enum class Activation { ReLU, Linear, Softmax, Sigmoid };
enum class Sampling { Dense, Lsh };
// Storage of a layer's weights and their Adam moments (biases stay float32): bf16 halves
// their bytes; arithmetic stays float32 (see bf16.hpp and the bf16 kernels in simd.hpp).
enum class Precision { FP32, BF16 };

// One layer of a NetworkSpec (network_spec.hpp); no defaults of its own.
struct LayerSpec {
  int64_t size{};
  Activation activation{};
  Sampling sampling{};
  LshParams lsh;             // used when sampling == Lsh
  SelectionParams selection; // used when sampling == Lsh
  Precision precision{};
  // Sigmoid output layer with sampling == Lsh: the weight of each sampled negative in the
  // per-label binary loss (positives weigh 1). 0 = importance weights: the random fill stands
  // for every neuron outside the chosen ones, each in-batch negative for 1/q of its kind,
  // hash candidates for themselves (the loss then estimates the binary loss over all labels).
  float negative_weight{};
};

struct Layer {
  LayerSpec spec;
  int index = 0;
  int64_t in_dim = 0;    // features (layer 0) or previous layer size
  int64_t out_dim = 0;   // neurons
  bool sparse_input = false;  // layer 0
  int64_t rows = 0;      // rows of the weight matrix (in_dim for layer 0, out_dim otherwise)
  int64_t row_len = 0;   // floats per row

  // Persistent state (exposed to Python through Network::parameters()). A bf16 layer keeps
  // its weights and moments in weight16, weight16_m, weight16_v (bf16 bits) and leaves
  // weight, weight_m, weight_v empty.
  bool bf16 = false;
  // The neuron id of row 0 in the whole layer: the shard's first label on the output layer
  // of a label shard, else 0. bf16 rounding is keyed by it (bf16_row_key), so that a shard
  // rounds each row exactly as one process training the whole layer does.
  int64_t key_row0 = 0;
  AlignedBuffer<float> weight, weight_m, weight_v;
  AlignedBuffer<uint16_t> weight16, weight16_m, weight16_v;
  AlignedBuffer<float> bias, bias_m, bias_v;
  // How the batch gradient reaches the optimizer:
  //  - per-sample records (`records`: hash-sampled layers, dense layers up to 4096 wide): each
  //    sample stores its touched rows with their coefficients and one shared vector
  //    (gradient of row r = sum over samples of coef x vector). The optimizer pass groups
  //    the entries by row and forms each row's gradient in sample order: no gradient
  //    matrix, no write races, and results that do not depend on the number of threads;
  //  - otherwise gradient buffers the samples add into without locks (HOGWILD).
  bool records = false;
  AlignedBuffer<int32_t> row_end;        // records: per-row entry offsets (zero between batches)
  std::vector<int32_t> entry_sample;     // records: entries grouped by row; capacity reused
  std::vector<float> entry_coef;
  AlignedBuffer<float> weight_grad, bias_grad;  // HOGWILD buffers (all zero between batches)
  AlignedBuffer<uint8_t> row_touched;    // HOGWILD, sparse rows: markers
  // HOGWILD with every row updated each batch (dense layers after the first).
  bool all_rows = false;
  std::vector<int32_t> touched_rows;     // HOGWILD, sparse rows: concatenated per batch

  // LSH (sampling == Lsh only): the hash function of the layer input and the tables over
  // the weight rows, rebuilt on the network's schedule.
  std::unique_ptr<const HashFunction> hash;
  std::unique_ptr<LshTables> tables;

  bool lsh() const noexcept { return spec.sampling == Sampling::Lsh; }
  const uint16_t* row16(int64_t r) const noexcept { return weight16.data() + r * row_len; }
};

// Sets up layer `index` of a network for `spec` reading `in_dim` inputs: shapes, every
// array (zeroed; transparent hugepages asked for when `hugepages`), the gradient path
// (records or lock-free buffers, see training_paths.hpp) and, for a hash-sampled layer,
// its hash function (seeded by hash_seed) and empty tables. Weights are set by init_weights.
void allocate_layer(Layer& L, const LayerSpec& spec, int index, int64_t in_dim, bool hugepages,
                    uint64_t hash_seed);

// Glorot-normal weights (Glorot & Bengio, AISTATS 2010), std = sqrt(2 / (fan_in + fan_out)),
// biases left at zero. Each block of rows draws from its own stream of `seed`, so the result
// does not depend on num_threads. A shard of a layer of `full_out` neurons holding neurons
// [shard_begin, shard_begin + L.out_dim) gets exactly those neurons' weights of the whole
// layer (full_out = -1: L is the whole layer).
void init_weights(Layer& L, uint64_t seed, int num_threads, int64_t shard_begin = 0, int64_t full_out = -1);

}  // namespace slide
