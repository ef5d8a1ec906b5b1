// slide._core.Network: converts the spec dict (parsed by the core, network_spec.hpp) and
// numpy arrays, checks inputs while holding the GIL, then releases it for the engine.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <set>
#include <string>

#include "bindings.hpp"
#include "slide/common.hpp"
#include "slide/label_pools.hpp"
#include "slide/network.hpp"
#include "slide/simd.hpp"

namespace py = pybind11;

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& msg) { throw slide::InvalidArgument(key + ": " + msg); }

std::string type_name(const py::handle& h) { return py::str(py::type::handle_of(h).attr("__name__")); }

void reject_unknown(const py::dict& d, const std::set<std::string>& known, const std::string& prefix) {
  for (auto item : d) {
    std::string k = py::str(item.first);
    if (!known.count(k)) {
      std::string list;
      for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
      bad(prefix + k, "unknown key (known keys: " + list + ")");
    }
  }
}

// One Python value as the core's SpecValue: type conversion only (the core checks keys,
// types and ranges, and names the key in its messages).
slide::SpecValue spec_value(const py::handle& v) {
  slide::SpecValue out;
  out.type_name = type_name(v);
  out.repr = py::repr(v);
  if (py::isinstance<py::bool_>(v)) {
    out.kind = slide::SpecValue::Kind::Bool;
    out.b = v.cast<bool>();
  } else if (PyIndex_Check(v.ptr())) {
    py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow == 0) {
      out.kind = slide::SpecValue::Kind::Int;
      out.i = static_cast<int64_t>(x);
    }
  } else if (py::isinstance<py::str>(v)) {
    out.kind = slide::SpecValue::Kind::String;
    out.s = v.cast<std::string>();
  } else if (PyFloat_Check(v.ptr()) || py::hasattr(v, "__float__")) {
    out.kind = slide::SpecValue::Kind::Float;
    out.f = py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>();
  }
  return out;
}

slide::SpecDict spec_dict(const py::dict& d, const std::string& where) {
  slide::SpecDict out;
  for (auto item : d) {
    if (!py::isinstance<py::str>(item.first)) bad(where, "keys must be strings, got " + std::string(py::repr(item.first)));
    out[item.first.cast<std::string>()] = spec_value(item.second);
  }
  return out;
}

slide::NetworkSpec spec_from_dict(const py::dict& d) {
  std::vector<slide::SpecDict> layers;
  const bool has_layers = d.contains("layers");
  if (has_layers) {
    py::object list = d["layers"];
    if (!py::isinstance<py::list>(list) && !py::isinstance<py::tuple>(list))
      bad("layers", "expected a list of layer dicts, got " + type_name(list));
    int i = 0;
    for (py::handle h : list) {
      const std::string where = "layers." + std::to_string(i++);
      if (!py::isinstance<py::dict>(h)) bad(where, "expected a dict, got " + type_name(h));
      layers.push_back(spec_dict(py::reinterpret_borrow<py::dict>(h), where));
    }
  }
  slide::SpecDict top = spec_dict(d, "spec");
  top.erase("layers");
  return slide::parse_network_spec(top, has_layers, layers);
}

py::object py_value(const slide::SpecValue& v) {
  switch (v.kind) {
    case slide::SpecValue::Kind::Int: return py::int_(v.i);
    case slide::SpecValue::Kind::Float: return py::float_(v.f);
    case slide::SpecValue::Kind::Bool: return py::bool_(v.b);
    case slide::SpecValue::Kind::String: return py::str(v.s);
    default: return py::none();
  }
}

py::dict spec_to_py(const slide::NetworkSpec& spec) {
  const auto dicts = slide::spec_to_dict(spec);
  py::dict top;
  for (const auto& kv : dicts.first) top[py::str(kv.first)] = py_value(kv.second);
  py::list layers;
  for (const auto& l : dicts.second) {
    py::dict d;
    for (const auto& kv : l) d[py::str(kv.first)] = py_value(kv.second);
    layers.append(d);
  }
  top["layers"] = layers;
  return top;
}

const char* dtype_name_of(char kind, int size) {
  if (kind == 'i' && size == 8) return "int64";
  if (kind == 'i' && size == 4) return "int32";
  return "float32";
}

// A 1-D C-contiguous numpy array of exactly T (no silent conversion: a per-batch copy
// of the dataset would defeat passing the full CSR arrays).
template <class T>
const T* array_1d(const py::object& o, const char* name, int64_t* len) {
  const char* want = dtype_name_of(py::dtype::of<T>().kind(), static_cast<int>(sizeof(T)));
  if (!py::isinstance<py::array>(o)) bad(name, std::string("expected a numpy array of ") + want + ", got " + type_name(o));
  py::array a = py::reinterpret_borrow<py::array>(o);
  if (!py::isinstance<py::array_t<T>>(o))
    bad(name, std::string("expected dtype ") + want + ", got " + std::string(py::str(a.dtype())));
  if (a.ndim() != 1) bad(name, "expected a 1-D array, got " + std::to_string(a.ndim()) + " dimensions");
  if (!(a.flags() & py::array::c_style)) bad(name, "expected a contiguous array");
  *len = static_cast<int64_t>(a.shape(0));
  return static_cast<const T*>(a.data());
}

slide::CsrView csr(const py::object& indptr, const py::object& indices, const py::object* values, const char* p_name,
                   const char* i_name, const char* v_name) {
  slide::CsrView c;
  int64_t n_ptr = 0, n_idx = 0, n_val = 0;
  c.indptr = array_1d<int64_t>(indptr, p_name, &n_ptr);
  c.indices = array_1d<int32_t>(indices, i_name, &n_idx);
  if (values) {
    c.values = array_1d<float>(*values, v_name, &n_val);
    if (n_val != n_idx)
      bad(v_name, "has " + std::to_string(n_val) + " entries but " + i_name + " has " + std::to_string(n_idx));
  }
  if (n_ptr < 1) bad(p_name, "must have n + 1 >= 1 entries");
  c.n = n_ptr - 1;
  c.nnz = n_idx;
  return c;
}

// A copy of a 1-D numpy array of exactly dtype T (checkpoint arrays: a wrong dtype means a
// damaged file, so nothing is converted).
template <class T>
std::vector<T> vector_1d(const py::dict& d, const char* key, const char* dtype) {
  if (!d.contains(key)) bad(key, "missing from the hash table state");
  py::object o = d[key];
  if (!py::isinstance<py::array_t<T>>(o))
    bad(key, std::string("expected a numpy array of ") + dtype + ", got " +
                 (py::isinstance<py::array>(o) ? std::string(py::str(o.attr("dtype"))) : type_name(o)));
  auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(o);
  if (!a || a.ndim() != 1) bad(key, "expected a 1-D array");
  return std::vector<T>(a.data(), a.data() + a.shape(0));
}

// The vector's buffer handed to numpy without a copy (the array owns the moved vector).
template <class T>
py::array_t<T> move_to_numpy(std::vector<T>&& v) {
  auto* owner = new std::vector<T>(std::move(v));
  py::capsule free_owner(owner, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(static_cast<py::ssize_t>(owner->size()), owner->data(), free_owner);
}

py::dict index_info_dict(const slide::IndexInfo& info) {
  py::dict d;
  d["built"] = info.built;
  d["clusters"] = info.clusters;
  d["largest_cluster"] = info.largest_cluster;
  d["default_probe"] = info.default_probe;
  d["rows"] = info.rows;
  d["bytes"] = info.bytes;
  d["build_seconds"] = info.build_seconds;
  return d;
}

}  // namespace

void bind_network(py::module_& m) {
  using slide::Network;
  py::class_<Network>(m, "Network", R"doc(
The slide training engine (SLIDE, Chen et al., MLSys 2020).

Network(spec: dict). train_batch and rebuild_tables release the GIL and must not run
concurrently on one network (they serialise on a lock); predict_topk is const and may
run from several Python threads at once.)doc")
      .def(py::init([](const py::dict& spec, const py::object& shard) {
             slide::OutputShard s;
             if (!shard.is_none()) {
               if (!py::isinstance<py::tuple>(shard) || py::len(shard) != 2)
                 bad("shard", "expected a tuple (begin, end) of output neurons, got " + type_name(shard));
               py::tuple t = shard.cast<py::tuple>();
               s.begin = t[0].cast<int64_t>();
               s.end = t[1].cast<int64_t>();
             }
             return std::make_unique<Network>(spec_from_dict(spec), s);
           }),
           py::arg("spec"), py::arg("shard") = py::none(),
           "shard=(begin, end): hold only output neurons [begin, end) (label-sharded training).")
      .def(
          "train_batch",
          [](Network& net, const py::object& x_indptr, const py::object& x_indices, const py::object& x_values,
             const py::object& y_indptr, const py::object& y_indices, const py::object& rows, double lr) {
            slide::CsrView x = csr(x_indptr, x_indices, &x_values, "x_indptr", "x_indices", "x_values");
            slide::CsrView y = csr(y_indptr, y_indices, nullptr, "y_indptr", "y_indices", "");
            int64_t b = 0;
            const int64_t* r = array_1d<int64_t>(rows, "rows", &b);
            if (!(lr >= 0.0) || !std::isfinite(lr)) bad("lr", "must be >= 0 and finite, got " + std::to_string(lr));
            net.check_batch(x, &y, r, b);
            py::gil_scoped_release release;
            return net.train_batch(x, y, r, b, static_cast<float>(lr));
          },
          py::arg("x_indptr"), py::arg("x_indices"), py::arg("x_values"), py::arg("y_indptr"), py::arg("y_indices"),
          py::arg("rows"), py::arg("lr"),
          "Train one batch made of samples `rows` of the CSR arrays; returns the mean loss.")
      .def(
          "shard_forward",
          [](Network& net, const py::object& x_indptr, const py::object& x_indices, const py::object& x_values,
             const py::object& y_indptr, const py::object& y_indices, const py::object& rows) {
            slide::CsrView x = csr(x_indptr, x_indices, &x_values, "x_indptr", "x_indices", "x_values");
            slide::CsrView y = csr(y_indptr, y_indices, nullptr, "y_indptr", "y_indices", "");
            int64_t b = 0;
            const int64_t* r = array_1d<int64_t>(rows, "rows", &b);
            net.check_batch(x, &y, r, b);
            py::array_t<float> mx(b);
            py::array_t<double> sm(b);
            float* mp = mx.mutable_data();
            double* sp = sm.mutable_data();
            {
              py::gil_scoped_release release;
              net.shard_forward(x, y, r, b, mp, sp);
            }
            return py::make_tuple(mx, sm);
          },
          py::arg("x_indptr"), py::arg("x_indices"), py::arg("x_values"), py::arg("y_indptr"), py::arg("y_indices"),
          py::arg("rows"),
          "Label shard, phase 1 of a batch: returns each sample's softmax statistics (max float32 [b], sum "
          "float64 [b]) over this shard's active output neurons. The arrays must stay alive until shard_update.")
      .def(
          "shard_backward",
          [](Network& net, const py::array_t<float, py::array::c_style | py::array::forcecast>& mx,
             const py::array_t<double, py::array::c_style | py::array::forcecast>& sm) {
            const int64_t b = static_cast<int64_t>(mx.size());
            if (sm.size() != mx.size()) bad("sum", "must have as many entries as max");
            const int64_t D = net.shard_dh_dim();
            py::array_t<float> dh({b, std::max<int64_t>(D, 0)});
            float* dp = dh.mutable_data();
            double loss = 0.0;
            {
              py::gil_scoped_release release;
              loss = net.shard_backward(mx.data(), sm.data(), dp);
            }
            return py::make_tuple(loss, dh);
          },
          py::arg("max"), py::arg("sum"),
          "Label shard, phase 2: from the statistics combined over all shards, the output layer's gradient; "
          "returns (this shard's part of the summed losses, its part of dL/dh float32 [b, shard_dh_dim]).")
      .def(
          "shard_update",
          [](Network& net, const py::array_t<float, py::array::c_style | py::array::forcecast>& dh, double lr) {
            if (dh.ndim() != 2 || dh.shape(1) != net.shard_dh_dim())
              bad("dh", "expected float32 [b, " + std::to_string(net.shard_dh_dim()) + "]");
            py::gil_scoped_release release;
            net.shard_update(dh.data(), static_cast<float>(lr));
          },
          py::arg("dh"), py::arg("lr"),
          "Label shard, phase 3: given dL/dh summed over all shards, the hidden layers' gradients and the "
          "Adam step of every layer.")
      .def_property_readonly("shard_dh_dim", &Network::shard_dh_dim)
      .def_property_readonly("shard_begin", &Network::shard_begin)
      .def_property_readonly("shard_end", &Network::shard_end)
      .def(
          "predict_topk",
          [](const Network& net, const py::object& x_indptr, const py::object& x_indices, const py::object& x_values,
             int64_t k, const std::string& mode, bool with_stats, int64_t candidates, int64_t prior, int64_t probe) {
            if (mode != "exact" && mode != "lsh" && mode != "index")
              bad("mode", "must be 'exact', 'lsh' or 'index', got '" + mode + "'");
            if (probe < 0) bad("probe", "must be >= 0 (0 = auto), got " + std::to_string(probe));
            if (candidates < 0) bad("candidates", "must be >= 0 (0 = the layer's selection), got " + std::to_string(candidates));
            if (prior < 0) bad("prior", "must be >= 0, got " + std::to_string(prior));
            if (k < 1 || k > net.output_dim())
              bad("k", "must be in [1, " + std::to_string(net.output_dim()) + "], got " + std::to_string(k));
            slide::CsrView x = csr(x_indptr, x_indices, &x_values, "x_indptr", "x_indices", "x_values");
            net.check_batch(x, nullptr, nullptr, x.n);
            py::array_t<int32_t> labels({x.n, k});
            py::array_t<float> scores({x.n, k});
            int32_t* lp = labels.mutable_data();
            float* sp = scores.mutable_data();
            std::vector<slide::SoftmaxStats> stats(with_stats ? static_cast<size_t>(x.n) : 0);
            {
              py::gil_scoped_release release;
              if (mode == "index")
                net.predict_index(x, static_cast<int>(k), lp, sp, with_stats ? stats.data() : nullptr,
                                  slide::IndexQuery{probe});
              else
                net.predict_topk(x, static_cast<int>(k), mode == "lsh", lp, sp, with_stats ? stats.data() : nullptr,
                                 slide::LshQuery{candidates, prior});
            }
            if (!with_stats) return py::tuple(py::make_tuple(labels, scores));
            py::array_t<float> mx(x.n);
            py::array_t<double> sm(x.n);
            for (int64_t i = 0; i < x.n; ++i) {
              mx.mutable_data()[i] = stats[i].max;
              sm.mutable_data()[i] = stats[i].sum;
            }
            return py::tuple(py::make_tuple(labels, scores, mx, sm));
          },
          py::arg("x_indptr"), py::arg("x_indices"), py::arg("x_values"), py::arg("k"), py::arg("mode") = "exact",
          py::arg("with_stats") = false, py::arg("candidates") = 0, py::arg("prior") = 0, py::arg("probe") = 0,
          "Top-k labels (int32 [n,k]) and softmax scores (float32 [n,k]) per sample; with_stats adds the "
          "softmax statistics (max float32 [n], sum float64 [n]) of the scored neurons. mode 'lsh': "
          "candidates N > 0 scores the N hash candidates found in the most tables (no random fill; 0 = "
          "as in training); prior P also scores the P labels with the largest bias. mode 'index': the "
          "members of the `probe` best clusters of the inference index (0 = auto), built on first use.")
      .def(
          "all_logits",
          [](const Network& net, const py::object& x_indptr, const py::object& x_indices,
             const py::object& x_values) -> py::object {
            slide::CsrView x = csr(x_indptr, x_indices, &x_values, "x_indptr", "x_indices", "x_values");
            net.check_batch(x, nullptr, nullptr, x.n);
            py::array_t<float> z({x.n, net.output_dim()});
            bool done;
            {
              py::gil_scoped_release release;
              done = net.all_logits(x, z.mutable_data());
            }
            if (!done) return py::none();
            return z;
          },
          py::arg("x_indptr"), py::arg("x_indices"), py::arg("x_values"),
          "Every label's logit (float32 [n, labels]) by the batched dense path, or None on a network that "
          "does not predict by it (use label_logits).")
      .def(
          "label_logits",
          [](const Network& net, const py::object& x_indptr, const py::object& x_indices, const py::object& x_values,
             const py::object& cand_indptr, const py::object& cand) {
            slide::CsrView x = csr(x_indptr, x_indices, &x_values, "x_indptr", "x_indices", "x_values");
            net.check_batch(x, nullptr, nullptr, x.n);
            int64_t np1 = 0, nc = 0;
            const int64_t* cp = array_1d<int64_t>(cand_indptr, "cand_indptr", &np1);
            const int32_t* ci = array_1d<int32_t>(cand, "cand", &nc);
            if (np1 != x.n + 1) bad("cand_indptr", "expected " + std::to_string(x.n + 1) + " entries, got " + std::to_string(np1));
            if (cp[x.n] != nc) bad("cand_indptr", "its last entry must equal len(cand)=" + std::to_string(nc));
            py::array_t<float> z(nc);
            float* zp = z.mutable_data();
            {
              py::gil_scoped_release release;
              net.label_logits(x, cp, ci, zp);
            }
            return z;
          },
          py::arg("x_indptr"), py::arg("x_indices"), py::arg("x_values"), py::arg("cand_indptr"), py::arg("cand"),
          "The output layer's logits (float32, one per entry of cand) of the labels cand[cand_indptr[i]:"
          "cand_indptr[i+1]] of each row i of x: the pool a caller re-ranks.")
      .def(
          "index_info", [](const Network& net) { return index_info_dict(net.index_info()); },
          "The inference index as it stands: {built, clusters, largest_cluster, rows, bytes, build_seconds}.")
      .def(
          "build_index",
          [](const Network& net) {
            slide::IndexInfo info;
            {
              py::gil_scoped_release release;
              info = net.build_index();
            }
            return index_info_dict(info);
          },
          "Builds the inference index of mode 'index' now when it is missing or stale; returns index_info().")
      .def_property(
          "step", [](const Network& n) { return n.step(); },
          [](Network& n, const py::object& v) {
            if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()))
              bad("step", "expected an integer, got " + type_name(v));
            n.set_step(v.cast<int64_t>());
          },
          "Batches trained so far (Adam bias correction and the rebuild schedule follow it).")
      .def(
          "set_label_frequencies",
          [](Network& n, const py::object& freq) {
            int64_t len = 0;
            const float* f = array_1d<float>(freq, "freq", &len);
            n.set_label_frequencies(f, len);
          },
          py::arg("freq"),
          "Share of the training points that carry each label (float32 [output_dim], in [0, 1]); an "
          "empty array clears it. A hash-sampled output layer weights the batch's other labels by it "
          "when they serve as negatives. Network.fit sets it from the training data.")
      .def_property_readonly("has_label_frequencies", &Network::has_label_frequencies)
      .def(
          "rebuild_tables",
          [](Network& n) {
            py::gil_scoped_release release;
            n.rebuild_tables();
          },
          "Rebuild every LSH layer's hash tables from the current weights.")
      .def(
          "parameters",
          [](py::object self) {
            Network& n = self.cast<Network&>();
            py::dict d;
            for (const auto& p : n.parameters()) {
              std::vector<py::ssize_t> shape(p.shape.begin(), p.shape.end());
              if (p.data_bf16)
                d[py::str(p.name)] = py::array_t<uint16_t>(shape, p.data_bf16, self);
              else
                d[py::str(p.name)] = py::array_t<float>(shape, p.data, self);
            }
            return d;
          },
          "Writable numpy views (no copy) of every persistent array; each keeps the network alive. "
          "Arrays of bf16 layers are uint16 (the bfloat16 bits).")
      .def_property_readonly("bf16_isa", [](const Network&) { return std::string(slide::kernels().bf16_isa); },
                             "Kernels of bf16 layers: avx512_bf16 (AVX512_BF16 instructions) or generic (exact "
                             "fallback); SLIDE_ISA=avx512f forces the fallback.")
      .def(
          "memory_report",
          [](const Network& n) {
            slide::MemoryReport r = n.memory_report();
            py::dict d;
            d["weights"] = r.weights;
            d["optimizer"] = r.optimizer;
            d["gradients"] = r.gradients;
            d["tables"] = r.tables;
            d["scratch"] = r.scratch;
            d["scratch_per_thread"] = r.scratch_per_thread;
            d["activations"] = r.activations;
            d["total"] = r.weights + r.optimizer + r.gradients + r.tables + r.scratch;
            d["hugepages"] = r.hugepages;
            return d;
          },
          "Bytes per component and the arrays that got transparent hugepages.")
      .def_property_readonly(
          "spec", [](const Network& n) { return spec_to_py(n.spec()); },
          "The specification the engine runs, as a dict of the keys Network(spec) takes (range_pow "
          "resolved to the value the hash tables use).")
      .def_property_readonly("num_threads", &Network::num_threads)
      .def_property_readonly("seed", &Network::seed)
      .def_property_readonly("kernel_isa", [](const Network& n) { return std::string(n.kernel_isa()); })
      .def_property_readonly("input_dim", &Network::input_dim)
      .def_property_readonly("output_dim", &Network::output_dim)
      .def_property(
          "next_rebuild", &Network::next_rebuild,
          [](Network& n, const py::object& v) {
            if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()))
              bad("next_rebuild", "expected an integer, got " + type_name(v));
            n.set_next_rebuild(v.cast<int64_t>());
          },
          "Step at which the hash tables are rebuilt next (-1 without LSH layers). Setting it "
          "(after step) restores a saved schedule position.")
      .def_property(
          "profiling", &Network::profiling,
          [](Network& n, const py::object& v) {
            if (!py::isinstance<py::bool_>(v)) bad("profiling", "expected True or False, got " + type_name(v));
            n.set_profiling(v.cast<bool>());
          },
          "Phase profiler (off by default; no cost while off): while True, train_batch adds each phase's "
          "time and bytes moved, see profile().")
      .def(
          "profile",
          [](const Network& n) {
            const slide::ProfileReport r = n.profile();
            py::dict phases;
            for (int p = 0; p < slide::kPhases; ++p) {
              py::dict d;
              d["seconds"] = r.totals.seconds[p];
              d["thread_seconds"] = r.thread_seconds[p];
              d["bytes"] = r.totals.bytes[p];
              d["calls"] = r.totals.calls[p];
              phases[py::str(slide::phase_name(static_cast<slide::Phase>(p)))] = d;
            }
            py::dict d;
            d["enabled"] = r.enabled;
            d["phases"] = phases;
            d["batches"] = r.batches;
            d["samples"] = r.samples;
            d["batch_seconds"] = r.batch_seconds;
            d["longest_batch"] = r.longest_batch;
            d["longest_batch_step"] = r.longest_batch_step;
            d["threads"] = n.num_threads();
            return d;
          },
          "What the profiler counted since the last reset_profile(): per phase (hashing, selection, forward, "
          "softmax, backward, adam, rebuild, shuffle) wall seconds (per-sample phases: thread-seconds / "
          "threads), thread_seconds, modelled bytes moved and calls; batches, samples, batch_seconds (wall "
          "time in train_batch), longest_batch (seconds) and the step it became.")
      .def("reset_profile", &Network::reset_profile, "Clears the profiler's counters.")
      .def(
          "add_profile_time",
          [](Network& n, const std::string& phase, double seconds, double bytes) {
            for (int p = 0; p < slide::kPhases; ++p)
              if (phase == slide::phase_name(static_cast<slide::Phase>(p))) {
                n.add_profile_time(static_cast<slide::Phase>(p), seconds, bytes);
                return;
              }
            bad("phase", "unknown phase '" + phase + "'");
          },
          py::arg("phase"), py::arg("seconds"), py::arg("bytes") = 0.0,
          "Adds time spent outside the engine to a phase (e.g. 'shuffle' by a training loop); ignored while "
          "profiling is off.")
      .def_property(
          "rebuild_spread", &Network::rebuild_spread,
          [](Network& n, const py::object& v) {
            if (py::isinstance<py::bool_>(v) || !PyIndex_Check(v.ptr()))
              bad("rebuild_spread", "expected an integer, got " + type_name(v));
            n.set_rebuild_spread(v.cast<int64_t>());
          },
          "Batches over which a scheduled hash-table rebuild is spread: 0 = auto (layers of at least 2^17 "
          "neurons over min(64, rebuild_first / 2) batches, smaller ones at once), 1 = at once, n = over n "
          "batches (at most rebuild_first).")
      .def_property(
          "shared_negatives",
          [](const Network& n) -> py::object {
            const int m = n.shared_negatives();
            if (m < 0) return py::str("auto");
            return py::bool_(m == 1);
          },
          [](Network& n, const py::object& v) {
            if (py::isinstance<py::bool_>(v)) n.set_shared_negatives(v.cast<bool>() ? 1 : 0);
            else if (py::isinstance<py::str>(v) && v.cast<std::string>() == "auto") n.set_shared_negatives(-1);
            else bad("shared_negatives", "expected True, False or 'auto', got " + std::string(py::repr(v)));
          },
          "How a very wide LSH output layer scores the negatives its samples share (the batch's labels and "
          "the uniform fill): True = as one block per batch (matrix products), False = per sample, 'auto' "
          "(default) = the block from 65,536 output neurons. See uses_shared_negatives.")
      .def_property_readonly("uses_shared_negatives", &Network::uses_shared_negatives,
                             "Whether train_batch scores the shared negatives as a block now.")
      .def("rebuild_batches", &Network::rebuild_batches, py::arg("layer"),
           "Batches over which LSH layer `layer`'s next rebuild runs (1 = at once).")
      .def_property_readonly("rebuild_pending", &Network::rebuild_pending,
                             "True while a spread table rebuild is in progress.")
      .def(
          "table_state",
          [](const Network& n, int layer) {
            // Moved into the arrays, not copied: a checkpoint of a layer of 670K neurons holds
            // one copy of its tables (hundreds of MiB) while it is written, not two.
            slide::LshTablesState s = n.table_state(layer);
            py::dict d;
            d["num_rows"] = s.num_rows;
            d["table_offsets"] = move_to_numpy(std::move(s.table_offsets));
            d["bucket_ids"] = move_to_numpy(std::move(s.bucket_ids));
            d["bucket_offsets"] = move_to_numpy(std::move(s.bucket_offsets));
            d["items"] = move_to_numpy(std::move(s.items));
            if (s.pending_rows >= 0) {
              // a spread rebuild in progress: its plan and the bucket ids it has computed
              d["pending"] = move_to_numpy(std::vector<uint64_t>{
                  static_cast<uint64_t>(s.pending_rows), static_cast<uint64_t>(s.pending_stride), s.pending_seed,
                  static_cast<uint64_t>(s.pending_steps), static_cast<uint64_t>(s.pending_done)});
              d["pending_ids"] = move_to_numpy(std::move(s.pending_ids));
            }
            return d;
          },
          py::arg("layer"),
          "Copy of an LSH layer's hash tables: num_rows (int) and the arrays table_offsets "
          "(int64, L + 1), bucket_ids (uint32), bucket_offsets (int64) and items (int32); while a "
          "spread rebuild is in progress also pending (uint64: rows, stride, seed, steps, calls done) "
          "and pending_ids (uint32: the bucket ids it has computed, L x rows hashed so far).")
      .def(
          "set_table_state",
          [](Network& n, int layer, const py::dict& d) {
            reject_unknown(d, {"num_rows", "table_offsets", "bucket_ids", "bucket_offsets", "items", "pending",
                               "pending_ids"}, "");
            slide::LshTablesState s;
            if (!d.contains("num_rows")) bad("num_rows", "missing from the hash table state");
            const py::object rows = d["num_rows"];
            if (py::isinstance<py::bool_>(rows) || !PyIndex_Check(rows.ptr()))
              bad("num_rows", "expected an integer, got " + type_name(rows) + " " + std::string(py::repr(rows)));
            s.num_rows = rows.cast<int64_t>();
            s.table_offsets = vector_1d<int64_t>(d, "table_offsets", "int64");
            s.bucket_ids = vector_1d<uint32_t>(d, "bucket_ids", "uint32");
            s.bucket_offsets = vector_1d<int64_t>(d, "bucket_offsets", "int64");
            s.items = vector_1d<int32_t>(d, "items", "int32");
            if (d.contains("pending") != d.contains("pending_ids"))
              bad(d.contains("pending") ? "pending_ids" : "pending", "missing: pending and pending_ids go together");
            if (d.contains("pending")) {
              const std::vector<uint64_t> p = vector_1d<uint64_t>(d, "pending", "uint64");
              if (p.size() != 5)
                bad("pending", "expected 5 entries (rows, stride, seed, steps, done), got " + std::to_string(p.size()));
              for (int i : {0, 1, 3, 4})
                if (p[i] >= (uint64_t{1} << 62)) bad("pending", "entry " + std::to_string(i) + " is out of range");
              s.pending_rows = static_cast<int64_t>(p[0]);
              s.pending_stride = static_cast<int64_t>(p[1]);
              s.pending_seed = p[2];
              s.pending_steps = static_cast<int64_t>(p[3]);
              s.pending_done = static_cast<int64_t>(p[4]);
              s.pending_ids = vector_1d<uint32_t>(d, "pending_ids", "uint32");
            }
            py::gil_scoped_release release;
            n.set_table_state(layer, s);
          },
          py::arg("layer"), py::arg("state"),
          "Replace an LSH layer's hash tables with a state from table_state (validated: "
          "ValueError naming the array on a mismatch; the tables are then unchanged).");

  m.def(
      "label_pools",
      [](const py::object& q_indptr, const py::object& q_indices, const py::object& q_values,
         const py::object& ct_indptr, const py::object& ct_indices, const py::object& ct_values, int64_t num_labels,
         const py::object& top, int64_t pool, int threads) {
        const slide::CsrView q = csr(q_indptr, q_indices, &q_values, "q_indptr", "q_indices", "q_values");
        const slide::CsrView ct = csr(ct_indptr, ct_indices, &ct_values, "ct_indptr", "ct_indices", "ct_values");
        if (!py::isinstance<py::array_t<int32_t>>(top)) bad("top", "expected a numpy array of int32");
        py::array t = py::reinterpret_borrow<py::array>(top);
        if (t.ndim() != 2 || t.shape(0) != q.n || !(t.flags() & py::array::c_style))
          bad("top", "expected a contiguous (rows, width) array with " + std::to_string(q.n) + " rows");
        const int32_t* tp = static_cast<const int32_t*>(t.data());
        const int64_t width = static_cast<int64_t>(t.shape(1));
        slide::LabelPools res;
        {
          py::gil_scoped_release release;
          res = slide::label_pools(q, ct, num_labels, tp, width, pool, threads);
        }
        return py::make_tuple(move_to_numpy(std::move(res.indptr)), move_to_numpy(std::move(res.labels)),
                              move_to_numpy(std::move(res.scores)));
      },
      py::arg("q_indptr"), py::arg("q_indices"), py::arg("q_values"), py::arg("ct_indptr"), py::arg("ct_indices"),
      py::arg("ct_values"), py::arg("num_labels"), py::arg("top"), py::arg("pool"), py::arg("threads") = 0,
      "The label-centroid term's pools of a wide output layer (slide/label_pools.hpp): per row of the unit-length "
      "rows q, the union of its `pool` best labels by q times the feature-by-label matrix ct and its labels in "
      "top (rows x width, -1 = none); returns (indptr int64, labels int32 ascending per row, scores float32).");
}
