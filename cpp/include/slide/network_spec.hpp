// The specification of a network, and the one parser that builds it from key/value pairs.
//
// The engine has no defaults of its own: every field comes from the caller's resolved
// configuration (the Python package's slide.Config, through slide/network.py::_engine_spec),
// and parse_network_spec requires every key. Errors name the key as the Python
// configuration spells it ("layers.1.lsh.K", "optimizer.lr", "training.dropout"), so a
// user sees one spelling whichever layer found the problem.
//
// The key/value form (SpecDict) is what a binding produces by converting types only:
//   top level: input_dim, layers (a list of layer dicts), lr, beta1, beta2, eps, weight_decay,
//              dropout, threads, seed, rebuild_first, rebuild_decay, hugepages, recompute
//   per layer: size, activation, sampling, family, K, L, range_pow, bucket_capacity,
//              bucket_policy, bin_size, selection, threshold, min_active, max_active, precision,
//              negative_weight (precision and negative_weight are optional: absent precision means
//              fp32, as in specs older than bf16 storage; negative_weight defaults to 1 and only a
//              sigmoid lsh output layer reads it)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slide/layer.hpp"
#include "slide/optimizer.hpp"

namespace slide {

struct NetworkSpec {
  int64_t input_dim{};
  std::vector<LayerSpec> layers;  // the last one is the softmax output layer
  AdamParams adam;
  float lr{};             // learning rate of the configuration (train_batch takes its own)
  float dropout{};        // on hidden layer outputs, training only
  int threads{};          // 0 = all cores
  uint64_t seed{};
  int64_t rebuild_first{};  // first table rebuild after this many batches
  double rebuild_decay{};   // later gaps grow by exp(rebuild_decay) each time
  bool hugepages{};
  // Batched dense path only: keep the hidden outputs of chosen layers (checkpoints) and
  // recompute the others, and every dropout mask, in the backward pass (same bits as
  // storing them). Network() rejects it for networks that do not train on that path.
  bool recompute{};
  // Throws InvalidArgument naming the offending key in the Python spelling
  // (e.g. "layers.1.sampling", "layers.1.lsh.K", "optimizer.lr").
  void validate() const;
};

// One value of the key/value form, as the caller had it.
struct SpecValue {
  enum class Kind { Int, Float, Bool, String, Other };
  Kind kind = Kind::Other;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::string type_name;  // the caller's type name, for messages ("str", "NoneType")
  std::string repr;       // the caller's spelling of the value, for messages
};
using SpecDict = std::map<std::string, SpecValue>;

// Values as a caller of parse_network_spec would pass them (type names and spellings as Python's).
SpecValue int_value(int64_t i);
SpecValue float_value(double f);
SpecValue bool_value(bool b);
SpecValue string_value(const std::string& s);

// Builds and validates a NetworkSpec from `top` and the layer dicts. Every key listed above
// is required (except a layer's precision); unknown keys, wrong types (an integer field takes Int only; a number field
// Int or Float; bool fields Bool only) and unknown choices throw InvalidArgument naming
// the key. has_layers = false reports a missing "layers".
NetworkSpec parse_network_spec(const SpecDict& top, bool has_layers, const std::vector<SpecDict>& layers);

// The spec as key/value pairs (the inverse of parse_network_spec); range_pow is reported
// as the value the hash tables use (effective_range_pow), so a derived 0 comes back resolved.
std::pair<SpecDict, std::vector<SpecDict>> spec_to_dict(const NetworkSpec& spec);

// The Python spelling of a top-level spec key ("lr" -> "optimizer.lr") or of layer l's key
// ("K" -> "layers.1.lsh.K").
std::string spec_key_path(const std::string& key);
std::string layer_key_path(int l, const std::string& key);

}  // namespace slide
