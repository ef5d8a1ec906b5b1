// The network spec parser (no defaults, Python key spelling) and the phases of one sample's
// step: a label-sharded run of the phases gives the single-process result.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "slide/common.hpp"
#include "slide/network_spec.hpp"
#include "slide/random.hpp"
#include "slide/sample_step.hpp"

using namespace slide;

namespace {

SpecValue I(int64_t i) { return int_value(i); }
SpecValue F(double f) { return float_value(f); }
SpecValue S(const std::string& s) { return string_value(s); }
SpecValue B(bool b) { return bool_value(b); }

SpecDict top() {
  return {{"input_dim", I(100)}, {"lr", F(0.01)},   {"beta1", F(0.9)},       {"beta2", F(0.999)},
          {"eps", F(1e-8)},      {"weight_decay", F(0)}, {"dropout", F(0.25)}, {"threads", I(1)},
          {"seed", I(5)},        {"rebuild_first", I(50)}, {"rebuild_decay", F(0.1)}, {"hugepages", B(false)},
          {"recompute", B(false)}};
}

SpecDict layer(int64_t size, const char* activation, const char* sampling) {
  return {{"size", I(size)},        {"activation", S(activation)}, {"sampling", S(sampling)},
          {"family", S("dwta")},    {"K", I(3)},                   {"L", I(4)},
          {"range_pow", I(0)},      {"bucket_capacity", I(16)},    {"bucket_policy", S("fifo")},
          {"bin_size", I(8)},       {"selection", S("vanilla")},   {"threshold", I(2)},
          {"min_active", I(10)},    {"max_active", I(40)},         {"precision", S("fp32")}};
}

std::string error_of(const SpecDict& t, const std::vector<SpecDict>& layers) {
  try {
    parse_network_spec(t, true, layers);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the spec takes every value from its input and requires every key") {
  const std::vector<SpecDict> layers = {layer(16, "relu", "dense"), layer(200, "softmax", "lsh")};
  const NetworkSpec s = parse_network_spec(top(), true, layers);
  CHECK(s.lr == doctest::Approx(0.01));
  CHECK(s.dropout == doctest::Approx(0.25));
  CHECK(s.layers[1].selection.min_active == 10);
  CHECK(s.layers[1].lsh.bin_size == 8);
  const auto back = spec_to_dict(s);
  CHECK(back.second[1].at("range_pow").i == 9);  // derived: min(K * log2(8), 18)
  for (const auto& kv : top()) {
    SpecDict t = top();
    t.erase(kv.first);
    CHECK(error_of(t, layers) == spec_key_path(kv.first) + ": missing required key '" + kv.first + "'");
  }
  for (const auto& kv : layer(1, "relu", "dense")) {
    std::vector<SpecDict> l = layers;
    l[1].erase(kv.first);
    if (kv.first == "precision") {  // optional: fp32 when absent
      CHECK(parse_network_spec(top(), true, l).layers[1].precision == Precision::FP32);
      continue;
    }
    CHECK(error_of(top(), l).rfind(layer_key_path(1, kv.first) + ": missing required key", 0) == 0);
  }
  // bf16 storage: the first and the output layer only
  std::vector<SpecDict> three = {layer(16, "relu", "dense"), layer(16, "relu", "dense"), layer(200, "softmax", "lsh")};
  three[0]["precision"] = S("bf16");
  three[2]["precision"] = S("bf16");
  CHECK(parse_network_spec(top(), true, three).layers[2].precision == Precision::BF16);
  CHECK(spec_to_dict(parse_network_spec(top(), true, three)).second[0].at("precision").s == "bf16");
  three[1]["precision"] = S("bf16");
  CHECK(error_of(top(), three).rfind("layers.1.precision: bf16 is supported on the first layer", 0) == 0);
  three[1]["precision"] = S("fp16");
  CHECK(error_of(top(), three).rfind("layers.1.precision:", 0) == 0);
  CHECK(layer_key_path(1, "K") == "layers.1.lsh.K");
  CHECK(layer_key_path(0, "size") == "layers.0.size");
  CHECK(spec_key_path("lr") == "optimizer.lr");
  CHECK(spec_key_path("dropout") == "training.dropout");
  std::vector<SpecDict> bad = layers;
  bad[1]["K"] = I(0);
  CHECK(error_of(top(), bad).rfind("layers.1.lsh.K:", 0) == 0);
  bad = layers;
  bad[1]["range_pow"] = I(10);  // K * log2(8) = 9 bits
  CHECK(error_of(top(), bad).rfind("layers.1.lsh.range_pow:", 0) == 0);
  bad = layers;
  bad[1]["family"] = S("md5");
  CHECK(error_of(top(), bad).rfind("layers.1.lsh.family: must be one of", 0) == 0);
  SpecDict t = top();
  t["lr"] = S("fast");
  CHECK(error_of(t, layers).rfind("optimizer.lr: expected a number", 0) == 0);
  // sigmoid (per-label binary loss): output layer only, dense or hash-sampled
  const std::vector<SpecDict> binary = {layer(16, "relu", "dense"), layer(200, "sigmoid", "dense")};
  CHECK(parse_network_spec(top(), true, binary).layers[1].activation == Activation::Sigmoid);
  CHECK(spec_to_dict(parse_network_spec(top(), true, binary)).second[1].at("activation").s == "sigmoid");
  std::vector<SpecDict> sampled = {layer(16, "relu", "dense"), layer(200, "sigmoid", "lsh")};
  CHECK(parse_network_spec(top(), true, sampled).layers[1].negative_weight == 1.0f);  // optional key
  sampled[1]["negative_weight"] = F(0.0);
  CHECK(spec_to_dict(parse_network_spec(top(), true, sampled)).second[1].at("negative_weight").f == 0.0);
  sampled[1]["negative_weight"] = F(-1.0);
  CHECK(error_of(top(), sampled).rfind("layers.1.lsh.negative_weight: must be >= 0", 0) == 0);
  CHECK(error_of(top(), {layer(16, "sigmoid", "dense"), layer(200, "softmax", "dense")})
            .rfind("layers.0.activation: softmax and sigmoid are only allowed on the last", 0) == 0);
}

TEST_CASE("phases over two label ranges, with the combined softmax statistics, match one range") {
  std::vector<Layer> layers(2);
  LayerSpec hidden, out;
  hidden.size = 8;
  hidden.activation = Activation::ReLU;
  hidden.sampling = Sampling::Dense;
  out = hidden;
  out.size = 12;
  out.activation = Activation::Softmax;
  allocate_layer(layers[0], hidden, 0, 20, false, 1);
  allocate_layer(layers[1], out, 1, 8, false, 1);
  init_weights(layers[0], 1, 1);
  init_weights(layers[1], 2, 1);
  const std::vector<int32_t> feat = {1, 5, 17};
  const std::vector<float> val = {0.5f, 1.0f, -0.25f};
  const SparseRow x{feat.data(), val.data(), 3};
  const Kernels& kr = kernels();
  const Layer& o = layers[1];
  SelectionParams none{};

  auto run = [&](NeuronRange r, SampleWorkspace& ws, SoftmaxStats* local) {
    ws.labels = {2, 9};
    Rng rng(1);
    const LayerInput in = forward_hidden(layers, ws, kr, x, true, 0.0f, rng, nullptr);
    select_output(o, ws, in, true, none, nullptr, 0, r, rng);
    output_logits(o, ws, kr, in, true, r);
    *local = partial_softmax(ws);
    return in;
  };
  // One range: the whole layer.
  auto full = make_workspace(layers, true, false);
  SoftmaxStats fs;
  run({0, 12}, *full, &fs);
  const float loss = normalise_output(o, *full, fs, fs, {0, 12}, true, 0.5f);
  std::vector<float> dh(8, 0.0f);
  output_input_gradient(o, *full, kr, true, {0, 12}, dh.data());
  // Two shards, each with its own workspace; the stats and dh are what would be allreduced.
  auto a = make_workspace(layers, true, false), b = make_workspace(layers, true, false);
  SoftmaxStats sa, sb;
  run({0, 5}, *a, &sa);
  run({5, 12}, *b, &sb);
  const SoftmaxStats g = combine_softmax_stats(sa, sb);
  CHECK(g.max == fs.max);
  CHECK(g.sum == doctest::Approx(fs.sum));
  const float la = normalise_output(o, *a, sa, g, {0, 5}, true, 0.5f);
  const float lb = normalise_output(o, *b, sb, g, {5, 12}, true, 0.5f);
  CHECK(la + lb == doctest::Approx(loss));
  std::vector<float> dh2(8, 0.0f);
  output_input_gradient(o, *a, kr, true, {0, 5}, dh2.data());
  output_input_gradient(o, *b, kr, true, {5, 12}, dh2.data());
  for (int j = 0; j < 8; ++j) CHECK(dh2[j] == doctest::Approx(dh[j]).epsilon(1e-5));
  for (int i = 0; i < 12; ++i) {
    const float d = i < 5 ? a->delta[1][i] : b->delta[1][i - 5];
    CHECK(d == doctest::Approx(full->delta[1][i]).epsilon(1e-5));
  }
}
