// slide._core.LshIndex: hash families, tables and active-set selection exposed for tests and tools.
// Type conversion only; the checks and the algorithms live in the core (slide/lsh_index.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "slide/common.hpp"
#include "slide/hash.hpp"
#include "slide/lsh_index.hpp"
#include "slide/random.hpp"

namespace py = pybind11;

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Converts obj to a C-contiguous float32 array of `ndim` dimensions; ValueError names the problem.
FloatArray to_float_array(py::handle obj, const char* name, int ndim) {
  py::array a = py::array::ensure(obj);
  if (!a) throw py::value_error(std::string(name) + " must be a numeric array");
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b')
    throw py::value_error(std::string(name) + " must be numeric, got dtype " + std::string(py::str(a.dtype())));
  if (a.ndim() != ndim)
    throw py::value_error(std::string(name) + " must have " + std::to_string(ndim) + " dimension(s), got " +
                          std::to_string(a.ndim()));
  FloatArray f = FloatArray::ensure(a);
  if (!f) throw py::value_error(std::string(name) + " cannot be converted to float32");
  return f;
}

// slide.LshIndex over the core's slide::LshIndex: converts arrays and names, releases the GIL.
class PyLshIndex {
 public:
  PyLshIndex(const std::string& family, int dim, int K, int L, int range_pow, int bucket_capacity,
             const std::string& policy, uint64_t seed, int bin_size)
      : family_(family), index_(params(family, K, L, range_pow, bucket_capacity, policy, bin_size), dim, seed) {}

  py::array_t<uint32_t> hash(py::handle x_obj) const {
    FloatArray x = to_float_array(x_obj, "x", 1);
    py::array_t<uint32_t> out(index_.params().L);
    index_.hash(x.data(), x.shape(0), out.mutable_data());
    return out;
  }

  py::array_t<uint32_t> hash_batch(py::handle X_obj, int threads) const {
    FloatArray X = to_float_array(X_obj, "X", 2);
    const int64_t n = X.shape(0), cols = X.shape(1);
    py::array_t<uint32_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(index_.params().L)});
    uint32_t* op = out.mutable_data();
    {
      py::gil_scoped_release release;
      index_.hash_batch(X.data(), n, cols, threads, op);
    }
    return out;
  }

  void build(py::handle W_obj, int threads) {
    FloatArray W = to_float_array(W_obj, "W", 2);
    py::gil_scoped_release release;
    index_.build(W.data(), W.shape(0), W.shape(1), threads);
  }

  py::array_t<int32_t> bucket(int t, int64_t id) const {
    const auto b = index_.bucket(t, id);
    py::array_t<int32_t> out(b.second);
    if (b.second > 0) std::copy(b.first, b.first + b.second, out.mutable_data());
    return out;
  }

  py::array_t<int32_t> query(py::handle x_obj, py::object forced_obj, const std::string& selection,
                             int threshold, int min_active, int max_active, uint64_t seed) {
    FloatArray x = to_float_array(x_obj, "x", 1);
    slide::SelectionParams sp;
    sp.mode = slide::parse_selection(selection);
    sp.threshold = threshold;
    sp.min_active = min_active;
    sp.max_active = max_active;
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> forced;
    if (!forced_obj.is_none()) {
      py::array f = py::array::ensure(forced_obj);
      if (!f || (f.dtype().kind() != 'i' && f.dtype().kind() != 'u') || f.ndim() != 1)
        throw py::value_error("forced must be a 1-d array of integer neuron ids");
      forced = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(f);
    }
    const std::vector<int32_t> active =
        index_.query(x.data(), x.shape(0), forced ? forced.data() : nullptr, forced ? forced.shape(0) : 0, sp, seed);
    py::array_t<int32_t> out(static_cast<py::ssize_t>(active.size()));
    std::copy(active.begin(), active.end(), out.mutable_data());
    return out;
  }

  double occupancy() const { return index_.occupancy(); }
  size_t memory_bytes() const { return index_.memory_bytes(); }
  int64_t num_items() const { return index_.num_items(); }
  int dim() const { return index_.dim(); }
  int K() const { return index_.params().K; }
  int L() const { return index_.params().L; }
  int range_pow() const { return index_.range_pow(); }
  int bucket_capacity() const { return index_.params().bucket_capacity; }
  int bin_size() const { return index_.params().bin_size; }
  const std::string& family() const { return family_; }

 private:
  static slide::LshParams params(const std::string& family, int K, int L, int range_pow, int bucket_capacity,
                                 const std::string& policy, int bin_size) {
    slide::LshParams p;
    p.family = slide::parse_hash_family(family);
    p.K = K;
    p.L = L;
    p.range_pow = range_pow;
    p.bucket_capacity = bucket_capacity;
    p.policy = slide::parse_bucket_policy(policy);
    p.bin_size = bin_size;
    return p;
  }

  std::string family_;
  slide::LshIndex index_;
};

}  // namespace

void bind_hash(py::module_& m) {
  py::class_<PyLshIndex>(m, "LshIndex",
                       "L locality-sensitive hash tables over the rows of a matrix, and active-set "
                       "queries against them.\n\nfamily: 'simhash' | 'wta' | 'dwta'; range_pow=0 picks "
                       "the family's default (SimHash: K bits; WTA/DWTA: min(K*log2(bin_size), 18)).\n"
                       "Methods are not safe to call concurrently on one index.")
      .def(py::init<const std::string&, int, int, int, int, int, const std::string&, uint64_t, int>(),
           py::arg("family"), py::arg("dim"), py::arg("K"), py::arg("L"), py::arg("range_pow") = 0,
           py::arg("bucket_capacity") = 128, py::arg("policy") = "fifo", py::arg("seed") = 0,
           py::arg("bin_size") = 8)
      .def("hash", &PyLshIndex::hash, py::arg("x"), "Bucket ids (uint32[L]) of a vector of length dim.")
      .def("hash_batch", &PyLshIndex::hash_batch, py::arg("X"), py::arg("threads") = 1,
           "Bucket ids (uint32[n, L]) of the rows of X.")
      .def("build", &PyLshIndex::build, py::arg("W"), py::arg("threads") = 1,
           "Rebuilds the tables from the rows of W (row i is item i); deterministic for the seed.")
      .def("bucket", &PyLshIndex::bucket, py::arg("table"), py::arg("id"), "Items in one bucket (int32[]).")
      .def("query", &PyLshIndex::query, py::arg("x"), py::arg("forced") = py::none(),
           py::arg("selection") = "vanilla", py::arg("threshold") = 2, py::arg("min_active") = 0,
           py::arg("max_active") = 0, py::arg("seed") = 0,
           "Active set (int32[]): forced ids first, then bucket candidates by `selection`, then random "
           "fill to min_active, cut to max_active (forced ids always kept).")
      .def("occupancy", &PyLshIndex::occupancy, "Mean fraction of the 2^range_pow buckets that are non-empty.")
      .def("memory_bytes", &PyLshIndex::memory_bytes, "Bytes held by the tables.")
      .def_property_readonly("num_items", &PyLshIndex::num_items)
      .def_property_readonly("dim", &PyLshIndex::dim)
      .def_property_readonly("K", &PyLshIndex::K)
      .def_property_readonly("L", &PyLshIndex::L)
      .def_property_readonly("range_pow", &PyLshIndex::range_pow)
      .def_property_readonly("bucket_capacity", &PyLshIndex::bucket_capacity)
      .def_property_readonly("bin_size", &PyLshIndex::bin_size)
      .def_property_readonly("family", &PyLshIndex::family);
  m.def(
      "lsh_code_bits",
      [](const std::string& family, int K, int bin_size) {
        slide::LshParams p{};
        p.family = slide::parse_hash_family(family);
        p.K = K;
        p.bin_size = bin_size;
        return slide::lsh_code_bits(p);
      },
      py::arg("family"), py::arg("K"), py::arg("bin_size"),
      "Bits of code per table (SimHash: K; WTA/DWTA: K*log2(bin_size)); range_pow may not exceed it.");
}
