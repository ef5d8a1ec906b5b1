// slide._core.LshIndex: hash families, tables and active-set selection exposed for tests and tools.
// Type conversion and validation only; the algorithms live in cpp/src/hash.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "slide/common.hpp"
#include "slide/hash.hpp"
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

class LshIndex {
 public:
  LshIndex(const std::string& family, int dim, int K, int L, int range_pow, int bucket_capacity,
           const std::string& policy, uint64_t seed, int bin_size)
      : seed_(seed) {
    params_.family = slide::parse_hash_family(family);
    params_.K = K;
    params_.L = L;
    params_.range_pow = range_pow;
    params_.bucket_capacity = bucket_capacity;
    params_.policy = slide::parse_bucket_policy(policy);
    params_.bin_size = bin_size;
    family_ = family;
    hash_ = slide::HashFunction::create(params_, dim, seed);
    tables_ = std::make_unique<slide::LshTables>(params_, 0);
  }

  py::array_t<uint32_t> hash(py::handle x_obj) const {
    FloatArray x = to_float_array(x_obj, "x", 1);
    if (x.shape(0) != hash_->dim())
      throw py::value_error("x has length " + std::to_string(x.shape(0)) + ", expected dim=" +
                            std::to_string(hash_->dim()));
    py::array_t<uint32_t> out(hash_->num_tables());
    hash_->hash_dense(x.data(), out.mutable_data());
    return out;
  }

  py::array_t<uint32_t> hash_batch(py::handle X_obj, int threads) const {
    FloatArray X = to_float_array(X_obj, "X", 2);
    check_cols(X, "X");
    if (threads < 0) throw py::value_error("threads must be >= 0, got " + std::to_string(threads));
    const int64_t n = X.shape(0);
    const int L = hash_->num_tables();
    py::array_t<uint32_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(L)});
    const float* xp = X.data();
    uint32_t* op = out.mutable_data();
    const int dim = hash_->dim();
    const slide::HashFunction& h = *hash_;
    {
      py::gil_scoped_release release;
      const int nt = slide::resolve_threads(threads);
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; ++i) h.hash_dense(xp + i * dim, op + i * L);
    }
    return out;
  }

  void build(py::handle W_obj, int threads) {
    FloatArray W = to_float_array(W_obj, "W", 2);
    check_cols(W, "W");
    if (threads < 0) throw py::value_error("threads must be >= 0, got " + std::to_string(threads));
    const int64_t n = W.shape(0);
    if (n > 0x7FFFFFFF) throw py::value_error("W has too many rows for int32 item ids");
    auto tables = std::make_unique<slide::LshTables>(params_, n);
    {
      py::gil_scoped_release release;
      tables->build(*hash_, W.data(), n, hash_->dim(), threads, seed_);
    }
    tables_ = std::move(tables);
    sampler_ = std::make_unique<slide::ActiveSetSampler>(n);
  }

  py::array_t<int32_t> bucket(int t, int64_t id) const {
    if (t < 0 || t >= hash_->num_tables())
      throw py::value_error("table " + std::to_string(t) + " out of range 0.." +
                            std::to_string(hash_->num_tables() - 1));
    if (id < 0 || id >= (int64_t{1} << hash_->range_pow()))
      throw py::value_error("bucket id " + std::to_string(id) + " out of range 0..2^" +
                            std::to_string(hash_->range_pow()) + "-1");
    const auto b = tables_->bucket(t, static_cast<uint32_t>(id));
    py::array_t<int32_t> out(b.second);
    if (b.second > 0) std::copy(b.first, b.first + b.second, out.mutable_data());
    return out;
  }

  py::array_t<int32_t> query(py::handle x_obj, py::object forced_obj, const std::string& selection,
                             int threshold, int min_active, int max_active, uint64_t seed) {
    if (!sampler_) throw py::value_error("query() before build(): call build(W) first");
    FloatArray x = to_float_array(x_obj, "x", 1);
    if (x.shape(0) != hash_->dim())
      throw py::value_error("x has length " + std::to_string(x.shape(0)) + ", expected dim=" +
                            std::to_string(hash_->dim()));
    slide::SelectionParams sp;
    sp.mode = slide::parse_selection(selection);
    if (threshold < 1) throw py::value_error("threshold must be >= 1, got " + std::to_string(threshold));
    if (min_active < 0) throw py::value_error("min_active must be >= 0, got " + std::to_string(min_active));
    if (max_active < 0) throw py::value_error("max_active must be >= 0, got " + std::to_string(max_active));
    sp.threshold = threshold;
    sp.min_active = min_active;
    sp.max_active = max_active;
    std::vector<int32_t> forced;
    if (!forced_obj.is_none()) {
      py::array f = py::array::ensure(forced_obj);
      if (!f || (f.dtype().kind() != 'i' && f.dtype().kind() != 'u') || f.ndim() != 1)
        throw py::value_error("forced must be a 1-d array of integer neuron ids");
      auto fi = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(f);
      const int64_t n = tables_->num_items();
      for (py::ssize_t k = 0; k < fi.shape(0); ++k) {
        const int64_t v = fi.data()[k];
        if (v < 0 || v >= n)
          throw py::value_error("forced id " + std::to_string(v) + " out of range 0.." + std::to_string(n - 1));
        forced.push_back(static_cast<int32_t>(v));
      }
    }
    std::vector<uint32_t> buckets(hash_->num_tables());
    hash_->hash_dense(x.data(), buckets.data());
    slide::Rng rng(seed);
    std::vector<int32_t> active;
    sampler_->select(*tables_, buckets.data(), forced.data(), static_cast<int>(forced.size()), sp, rng, active);
    py::array_t<int32_t> out(static_cast<py::ssize_t>(active.size()));
    std::copy(active.begin(), active.end(), out.mutable_data());
    return out;
  }

  double occupancy() const { return tables_->occupancy(); }
  size_t memory_bytes() const { return tables_->memory_bytes(); }
  int64_t num_items() const { return tables_->num_items(); }
  int dim() const { return hash_->dim(); }
  int K() const { return params_.K; }
  int L() const { return params_.L; }
  int range_pow() const { return hash_->range_pow(); }
  int bucket_capacity() const { return params_.bucket_capacity; }
  int bin_size() const { return params_.bin_size; }
  const std::string& family() const { return family_; }

 private:
  void check_cols(const FloatArray& X, const char* name) const {
    if (X.shape(1) != hash_->dim())
      throw py::value_error(std::string(name) + " has " + std::to_string(X.shape(1)) + " columns, expected dim=" +
                            std::to_string(hash_->dim()));
  }

  slide::LshParams params_;
  uint64_t seed_;
  std::string family_;
  std::unique_ptr<slide::HashFunction> hash_;
  std::unique_ptr<slide::LshTables> tables_;
  std::unique_ptr<slide::ActiveSetSampler> sampler_;
};

}  // namespace

void bind_hash(py::module_& m) {
  py::class_<LshIndex>(m, "LshIndex",
                       "L locality-sensitive hash tables over the rows of a matrix, and active-set "
                       "queries against them.\n\nfamily: 'simhash' | 'wta' | 'dwta'; range_pow=0 picks "
                       "the family's default (SimHash: K bits; WTA/DWTA: min(K*log2(bin_size), 18)).\n"
                       "Methods are not safe to call concurrently on one index.")
      .def(py::init<const std::string&, int, int, int, int, int, const std::string&, uint64_t, int>(),
           py::arg("family"), py::arg("dim"), py::arg("K"), py::arg("L"), py::arg("range_pow") = 0,
           py::arg("bucket_capacity") = 128, py::arg("policy") = "fifo", py::arg("seed") = 0,
           py::arg("bin_size") = 8)
      .def("hash", &LshIndex::hash, py::arg("x"), "Bucket ids (uint32[L]) of a vector of length dim.")
      .def("hash_batch", &LshIndex::hash_batch, py::arg("X"), py::arg("threads") = 1,
           "Bucket ids (uint32[n, L]) of the rows of X.")
      .def("build", &LshIndex::build, py::arg("W"), py::arg("threads") = 1,
           "Rebuilds the tables from the rows of W (row i is item i); deterministic for the seed.")
      .def("bucket", &LshIndex::bucket, py::arg("table"), py::arg("id"), "Items in one bucket (int32[]).")
      .def("query", &LshIndex::query, py::arg("x"), py::arg("forced") = py::none(),
           py::arg("selection") = "vanilla", py::arg("threshold") = 2, py::arg("min_active") = 0,
           py::arg("max_active") = 0, py::arg("seed") = 0,
           "Active set (int32[]): forced ids first, then bucket candidates by `selection`, then random "
           "fill to min_active, cut to max_active (forced ids always kept).")
      .def("occupancy", &LshIndex::occupancy, "Mean fraction of the 2^range_pow buckets that are non-empty.")
      .def("memory_bytes", &LshIndex::memory_bytes, "Bytes held by the tables.")
      .def_property_readonly("num_items", &LshIndex::num_items)
      .def_property_readonly("dim", &LshIndex::dim)
      .def_property_readonly("K", &LshIndex::K)
      .def_property_readonly("L", &LshIndex::L)
      .def_property_readonly("range_pow", &LshIndex::range_pow)
      .def_property_readonly("bucket_capacity", &LshIndex::bucket_capacity)
      .def_property_readonly("bin_size", &LshIndex::bin_size)
      .def_property_readonly("family", &LshIndex::family);
}
