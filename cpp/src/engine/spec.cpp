// NetworkSpec: the one parser from key/value pairs, its validation and its inverse
// (see slide/network_spec.hpp).
#include <climits>
#include <cmath>
#include <initializer_list>
#include <string>

#include "slide/common.hpp"
#include "slide/hash.hpp"
#include "slide/network_spec.hpp"
#include "slide/training_paths.hpp"

namespace slide {

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& msg) { throw InvalidArgument(key + ": " + msg); }

// Where each spec key lives in the Python configuration.
const char* section_of(const std::string& key) {
  for (const char* k : {"lr", "beta1", "beta2", "eps", "weight_decay"})
    if (key == k) return "optimizer.";
  for (const char* k : {"dropout", "threads", "seed", "rebuild_first", "rebuild_decay", "hugepages", "recompute"})
    if (key == k) return "training.";
  return "";
}

bool is_lsh_key(const std::string& key) {
  for (const char* k : {"family", "K", "L", "range_pow", "bucket_capacity", "bucket_policy", "bin_size", "selection",
                        "threshold", "min_active", "max_active", "negative_weight"})
    if (key == k) return true;
  return false;
}

const std::initializer_list<const char*> kTopKeys = {"input_dim", "layers", "lr", "beta1", "beta2", "eps",
                                                     "weight_decay", "dropout", "threads", "seed", "rebuild_first",
                                                     "rebuild_decay", "hugepages", "recompute"};
const std::initializer_list<const char*> kLayerKeys = {"size", "activation", "sampling", "family", "K", "L",
                                                       "range_pow", "bucket_capacity", "bucket_policy", "bin_size",
                                                       "selection", "threshold", "min_active", "max_active",
                                                       "precision", "negative_weight"};

// Reads the required keys of one dict; `path` maps a key to its Python spelling.
class Reader {
 public:
  Reader(const SpecDict& d, std::initializer_list<const char*> known, std::string (*path)(int, const std::string&),
         int layer)
      : d_(d), path_(path), layer_(layer) {
    for (const auto& item : d) {
      bool ok = false;
      for (const char* k : known) ok = ok || item.first == k;
      if (ok) continue;
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      bad(where(item.first), "unknown key (known keys: " + list + ")");
    }
  }
  std::string where(const std::string& key) const { return path_(layer_, key); }
  const SpecValue& get(const char* key) const {
    auto it = d_.find(key);
    if (it == d_.end()) bad(where(key), std::string("missing required key '") + key + "'");
    return it->second;
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    const SpecValue& v = get(key);
    if (v.kind != SpecValue::Kind::Int) bad(where(key), "expected an integer, got " + v.type_name + " " + v.repr);
    if (v.i < lo || v.i > hi)
      bad(where(key), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v.i));
    return v.i;
  }
  double number(const char* key) const {
    const SpecValue& v = get(key);
    if (v.kind == SpecValue::Kind::Int) return static_cast<double>(v.i);
    if (v.kind != SpecValue::Kind::Float) bad(where(key), "expected a number, got " + v.type_name + " " + v.repr);
    return v.f;
  }
  // An optional key (one that only some layers use, added after saved specs existed).
  double number_or(const char* key, double fallback) const {
    return d_.find(key) == d_.end() ? fallback : number(key);
  }
  bool boolean(const char* key) const {
    const SpecValue& v = get(key);
    if (v.kind != SpecValue::Kind::Bool) bad(where(key), "expected true or false, got " + v.repr);
    return v.b;
  }
  // Index of the value among `choices`.
  int choice(const char* key, std::initializer_list<const char*> choices) const {
    const SpecValue& v = get(key);
    std::string list;
    for (const char* c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
    if (v.kind != SpecValue::Kind::String) bad(where(key), "expected one of " + list + ", got " + v.repr);
    int i = 0;
    for (const char* c : choices) {
      if (v.s == c) return i;
      ++i;
    }
    bad(where(key), "must be one of " + list + "; got '" + v.s + "'");
  }

 private:
  const SpecDict& d_;
  std::string (*path_)(int, const std::string&);
  int layer_;
};

std::string top_path(int, const std::string& key) { return spec_key_path(key); }

}  // namespace

std::string spec_key_path(const std::string& key) { return section_of(key) + key; }

std::string layer_key_path(int l, const std::string& key) {
  return "layers." + std::to_string(l) + "." + (is_lsh_key(key) ? "lsh." : "") + key;
}

NetworkSpec parse_network_spec(const SpecDict& top, bool has_layers, const std::vector<SpecDict>& layers) {
  const Reader r(top, kTopKeys, &top_path, -1);
  NetworkSpec s;
  s.input_dim = r.integer("input_dim", INT64_MIN, INT64_MAX);
  if (!has_layers) bad("layers", "missing required key 'layers'");
  for (size_t i = 0; i < layers.size(); ++i) {
    const Reader lr(layers[i], kLayerKeys, &layer_key_path, static_cast<int>(i));
    LayerSpec l;
    l.size = lr.integer("size", INT64_MIN, INT64_MAX);
    static const Activation acts[] = {Activation::ReLU, Activation::Linear, Activation::Softmax,
                                      Activation::Sigmoid};
    l.activation = acts[lr.choice("activation", {"relu", "linear", "softmax", "sigmoid"})];
    l.sampling = lr.choice("sampling", {"dense", "lsh"}) == 1 ? Sampling::Lsh : Sampling::Dense;
    static const HashFamily families[] = {HashFamily::SimHash, HashFamily::WTA, HashFamily::DWTA};
    l.lsh.family = families[lr.choice("family", {"simhash", "wta", "dwta"})];
    l.lsh.K = static_cast<int>(lr.integer("K", INT32_MIN, INT32_MAX));
    l.lsh.L = static_cast<int>(lr.integer("L", INT32_MIN, INT32_MAX));
    l.lsh.range_pow = static_cast<int>(lr.integer("range_pow", INT32_MIN, INT32_MAX));
    l.lsh.bucket_capacity = static_cast<int>(lr.integer("bucket_capacity", INT32_MIN, INT32_MAX));
    l.lsh.bin_size = static_cast<int>(lr.integer("bin_size", INT32_MIN, INT32_MAX));
    l.lsh.policy = lr.choice("bucket_policy", {"fifo", "reservoir"}) == 1 ? BucketPolicy::Reservoir : BucketPolicy::FIFO;
    static const Selection modes[] = {Selection::Vanilla, Selection::TopK, Selection::Threshold};
    l.selection.mode = modes[lr.choice("selection", {"vanilla", "topk", "threshold"})];
    l.selection.threshold = static_cast<int>(lr.integer("threshold", INT32_MIN, INT32_MAX));
    l.selection.min_active = static_cast<int>(lr.integer("min_active", INT32_MIN, INT32_MAX));
    l.selection.max_active = static_cast<int>(lr.integer("max_active", INT32_MIN, INT32_MAX));
    // The one optional key: specs written before bf16 storage existed mean fp32.
    if (layers[i].count("precision"))
      l.precision = lr.choice("precision", {"fp32", "bf16"}) == 1 ? Precision::BF16 : Precision::FP32;
    // Optional (default 1: every sampled negative weighs as much as a positive); only a
    // sigmoid output layer with sampling lsh reads it.
    l.negative_weight = static_cast<float>(lr.number_or("negative_weight", 1.0));
    s.layers.push_back(l);
  }
  s.lr = static_cast<float>(r.number("lr"));
  s.adam.beta1 = static_cast<float>(r.number("beta1"));
  s.adam.beta2 = static_cast<float>(r.number("beta2"));
  s.adam.eps = static_cast<float>(r.number("eps"));
  s.adam.weight_decay = static_cast<float>(r.number("weight_decay"));
  s.dropout = static_cast<float>(r.number("dropout"));
  s.threads = static_cast<int>(r.integer("threads", INT32_MIN, INT32_MAX));
  s.seed = static_cast<uint64_t>(r.integer("seed", 0, INT64_MAX));
  s.rebuild_first = r.integer("rebuild_first", INT64_MIN, INT64_MAX);
  s.rebuild_decay = r.number("rebuild_decay");
  s.hugepages = r.boolean("hugepages");
  s.recompute = r.boolean("recompute");
  s.validate();
  return s;
}

std::pair<SpecDict, std::vector<SpecDict>> spec_to_dict(const NetworkSpec& s) {
  SpecDict top;
  top["input_dim"] = int_value(s.input_dim);
  top["lr"] = float_value(s.lr);
  top["beta1"] = float_value(s.adam.beta1);
  top["beta2"] = float_value(s.adam.beta2);
  top["eps"] = float_value(s.adam.eps);
  top["weight_decay"] = float_value(s.adam.weight_decay);
  top["dropout"] = float_value(s.dropout);
  top["threads"] = int_value(s.threads);
  top["seed"] = int_value(static_cast<int64_t>(s.seed));
  top["rebuild_first"] = int_value(s.rebuild_first);
  top["rebuild_decay"] = float_value(s.rebuild_decay);
  top["hugepages"] = bool_value(s.hugepages);
  top["recompute"] = bool_value(s.recompute);
  std::vector<SpecDict> layers;
  for (const LayerSpec& l : s.layers) {
    SpecDict d;
    static const char* acts[] = {"relu", "linear", "softmax", "sigmoid"};
    static const char* families[] = {"simhash", "wta", "dwta"};
    static const char* modes[] = {"vanilla", "topk", "threshold"};
    d["size"] = int_value(l.size);
    d["activation"] = string_value(acts[static_cast<int>(l.activation)]);
    d["sampling"] = string_value(l.sampling == Sampling::Lsh ? "lsh" : "dense");
    d["family"] = string_value(families[static_cast<int>(l.lsh.family)]);
    d["K"] = int_value(l.lsh.K);
    d["L"] = int_value(l.lsh.L);
    // The value the tables use: a derived 0 comes back resolved (only meaningful, and only
    // checked, for hash-sampled layers).
    d["range_pow"] = int_value(l.sampling == Sampling::Lsh ? effective_range_pow(l.lsh) : l.lsh.range_pow);
    d["bucket_capacity"] = int_value(l.lsh.bucket_capacity);
    d["bucket_policy"] = string_value(l.lsh.policy == BucketPolicy::Reservoir ? "reservoir" : "fifo");
    d["bin_size"] = int_value(l.lsh.bin_size);
    d["selection"] = string_value(modes[static_cast<int>(l.selection.mode)]);
    d["threshold"] = int_value(l.selection.threshold);
    d["min_active"] = int_value(l.selection.min_active);
    d["max_active"] = int_value(l.selection.max_active);
    d["precision"] = string_value(l.precision == Precision::BF16 ? "bf16" : "fp32");
    d["negative_weight"] = float_value(l.negative_weight);
    layers.push_back(d);
  }
  return {top, layers};
}

void NetworkSpec::validate() const {
  auto bad = [](const std::string& k, const std::string& msg) { throw InvalidArgument(k + ": " + msg); };
  if (input_dim < 1) bad("input_dim", "must be >= 1, got " + std::to_string(input_dim));
  if (input_dim > INT32_MAX) bad("input_dim", "must fit in int32, got " + std::to_string(input_dim));
  if (layers.empty()) bad("layers", "at least one layer (the output layer) is needed");
  for (size_t i = 0; i < layers.size(); ++i) {
    const int l = static_cast<int>(i);
    const LayerSpec& s = layers[i];
    const bool last = i + 1 == layers.size();
    if (s.size < 1 || s.size > INT32_MAX) bad(layer_key_path(l, "size"), "must be in [1, 2^31), got " + std::to_string(s.size));
    const bool output_act = s.activation == Activation::Softmax || s.activation == Activation::Sigmoid;
    if (output_act && !last)
      bad(layer_key_path(l, "activation"), "softmax and sigmoid are only allowed on the last (output) layer");
    if (last && !output_act)
      bad(layer_key_path(l, "activation"), "the output layer must use softmax or sigmoid");
    if (s.precision == Precision::BF16 && i != 0 && !last)
      bad(layer_key_path(l, "precision"),
          "bf16 is supported on the first layer (the one reading the sparse input) and on the output layer; "
          "layer " + std::to_string(l) + " is a middle hidden layer, set precision: fp32 there");
    if (!(s.negative_weight >= 0.0f) || !std::isfinite(s.negative_weight))
      bad(layer_key_path(l, "negative_weight"),
          "must be >= 0 (0 = importance weights), got " + std::to_string(s.negative_weight));
    if (s.sampling == Sampling::Lsh) {
      if (i == 0) bad(layer_key_path(l, "sampling"), "lsh is not allowed on layer 0 (its input is the sparse feature vector)");
      if (s.lsh.K < 1 || s.lsh.K > 32) bad(layer_key_path(l, "K"), "must be in [1, 32], got " + std::to_string(s.lsh.K));
      if (s.lsh.L < 1 || s.lsh.L > 1024) bad(layer_key_path(l, "L"), "must be in [1, 1024], got " + std::to_string(s.lsh.L));
      if (s.lsh.range_pow < 0 || s.lsh.range_pow > 30)
        bad(layer_key_path(l, "range_pow"), "must be in [0, 30], got " + std::to_string(s.lsh.range_pow));
      if (s.lsh.bucket_capacity < 1)
        bad(layer_key_path(l, "bucket_capacity"), "must be >= 1, got " + std::to_string(s.lsh.bucket_capacity));
      if (s.lsh.family != HashFamily::SimHash && (s.lsh.bin_size < 2 || s.lsh.bin_size > 256 ||
                                                  (s.lsh.bin_size & (s.lsh.bin_size - 1)) != 0))
        bad(layer_key_path(l, "bin_size"), "must be a power of two in [2, 256], got " + std::to_string(s.lsh.bin_size));
      const int bits = lsh_code_bits(s.lsh);
      if (s.lsh.range_pow > bits)
        bad(layer_key_path(l, "range_pow"),
            std::string(s.lsh.family == HashFamily::SimHash ? "simhash gives K=" : "wta/dwta give K*log2(bin_size)=") +
                std::to_string(bits) + " bits per table, range_pow=" + std::to_string(s.lsh.range_pow) +
                " cannot exceed it");
      validate_lsh_params(s.lsh);  // the hash unit's own checks (all passed above)
      if (s.lsh.family != HashFamily::SimHash && s.lsh.bin_size > (i == 0 ? input_dim : layers[i - 1].size))
        bad(layer_key_path(l, "bin_size"), std::to_string(s.lsh.bin_size) + " exceeds the layer's input dimension " +
                                    std::to_string(layers[i - 1].size));
      if (s.selection.threshold < 1) bad(layer_key_path(l, "threshold"), "must be >= 1, got " + std::to_string(s.selection.threshold));
      if (s.selection.min_active < 0) bad(layer_key_path(l, "min_active"), "must be >= 0");
      if (s.selection.max_active < 0) bad(layer_key_path(l, "max_active"), "must be >= 0");
      if (s.selection.max_active > 0 && s.selection.min_active > s.selection.max_active)
        bad(layer_key_path(l, "min_active"), std::to_string(s.selection.min_active) + " is larger than max_active=" +
                                      std::to_string(s.selection.max_active));
    }
  }
  if (recompute) {
    // Only the batched dense path keeps a batch's activations (training_paths.hpp); the
    // per-sample path keeps one sample's, O(active), so there is nothing to recompute.
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i].sampling == Sampling::Lsh)
        bad("training.recompute", "needs a network without hash-sampled layers (it applies to the batched dense "
                                  "path, which keeps a whole batch's activations), but " +
                                      layer_key_path(static_cast<int>(i), "sampling") +
                                      " is lsh; hash-sampled networks train sample by sample with O(active) "
                                      "state, so set training.recompute: false");
    if (layers[0].size > kMaxRecordedWidth)
      bad("training.recompute", "needs a first layer of at most " + std::to_string(kMaxRecordedWidth) +
                                    " neurons (wider ones train sample by sample, keeping no batch activations), "
                                    "got layers.0.size=" + std::to_string(layers[0].size));
  }
  if (!(adam.beta1 >= 0.0f && adam.beta1 < 1.0f)) bad("optimizer.betas", "beta1 must be in [0, 1), got " + std::to_string(adam.beta1));
  if (!(adam.beta2 >= 0.0f && adam.beta2 < 1.0f)) bad("optimizer.betas", "beta2 must be in [0, 1), got " + std::to_string(adam.beta2));
  if (!(adam.eps > 0.0f)) bad("optimizer.eps", "must be > 0, got " + std::to_string(adam.eps));
  if (!(adam.weight_decay >= 0.0f) || !std::isfinite(adam.weight_decay))
    bad("optimizer.weight_decay", "must be >= 0, got " + std::to_string(adam.weight_decay));
  if (!(lr > 0.0f) || !std::isfinite(lr)) bad("optimizer.lr", "must be > 0, got " + std::to_string(lr));
  if (!(dropout >= 0.0f && dropout < 1.0f)) bad("training.dropout", "must be in [0, 1), got " + std::to_string(dropout));
  if (threads < 0) bad("training.threads", "must be >= 0 (0 = all cores), got " + std::to_string(threads));
  if (rebuild_first < 1) bad("training.rebuild_first", "must be >= 1, got " + std::to_string(rebuild_first));
  if (!(rebuild_decay >= 0.0) || !std::isfinite(rebuild_decay))
    bad("training.rebuild_decay", "must be >= 0, got " + std::to_string(rebuild_decay));
}

SpecValue int_value(int64_t i) {
  SpecValue v;
  v.kind = SpecValue::Kind::Int;
  v.i = i;
  v.type_name = "int";
  v.repr = std::to_string(i);
  return v;
}
SpecValue float_value(double f) {
  SpecValue v;
  v.kind = SpecValue::Kind::Float;
  v.f = f;
  v.type_name = "float";
  v.repr = std::to_string(f);
  return v;
}
SpecValue bool_value(bool b) {
  SpecValue v;
  v.kind = SpecValue::Kind::Bool;
  v.b = b;
  v.type_name = "bool";
  v.repr = b ? "True" : "False";
  return v;
}
SpecValue string_value(const std::string& s) {
  SpecValue v;
  v.kind = SpecValue::Kind::String;
  v.s = s;
  v.type_name = "str";
  v.repr = "'" + s + "'";
  return v;
}

}  // namespace slide
