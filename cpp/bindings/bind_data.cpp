// Dataset readers, writer and checks: argument conversion, GIL release and
// zero-copy hand-over of the parsed arrays to numpy.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "slide/common.hpp"
#include "slide/data.hpp"

namespace py = pybind11;

namespace {

// Owns parsed arrays on behalf of the numpy arrays that view them.
struct LoadedOwner {
  slide::LoadedData data;
};

template <class T, class A>
py::array_t<T> view(std::vector<T, A>& v, size_t size, const py::object& owner) {
  return py::array_t<T>({static_cast<py::ssize_t>(size)}, {static_cast<py::ssize_t>(sizeof(T))}, v.data(), owner);
}

using I64 = py::array_t<int64_t, py::array::c_style>;
using I32 = py::array_t<int32_t, py::array::c_style>;
using F32 = py::array_t<float, py::array::c_style>;

void require_length(const py::array& a, py::ssize_t n, const char* name) {
  if (a.ndim() != 1 || a.shape(0) != n) {
    throw slide::InvalidArgument(std::string(name) + " must be 1-D with " + std::to_string(n) + " entries");
  }
}

}  // namespace

void bind_data(pybind11::module_& m) {
  py::class_<LoadedOwner>(m, "_LoadedArrays");

  m.def(
      "read_dataset",
      [](const std::string& path, const std::string& format, int64_t num_features, int64_t num_labels,
         int num_threads) {
        slide::ReadOptions opt;
        opt.format = slide::parse_format_name(format);
        opt.num_features = num_features;
        opt.num_labels = num_labels;
        opt.num_threads = num_threads;
        auto owned = std::make_unique<LoadedOwner>();
        {
          py::gil_scoped_release release;
          owned->data = slide::read_dataset(path, opt);
        }
        slide::LoadedData& d = owned->data;
        py::dict out;
        out["format"] = slide::format_name(d.format);
        out["num_points"] = d.num_points;
        out["num_features"] = d.num_features;
        out["num_labels"] = d.num_labels;
        LoadedOwner* raw = owned.get();
        py::object owner = py::cast(std::move(owned));
        slide::LoadedData& r = raw->data;
        out["feature_indptr"] = view(r.features.indptr, r.features.indptr.size(), owner);
        out["feature_indices"] = view(r.features.indices, r.features.indices.size(), owner);
        out["feature_values"] = view(r.features.values, r.features.values.size(), owner);
        out["label_indptr"] = view(r.labels.indptr, r.labels.indptr.size(), owner);
        out["label_indices"] = view(r.labels.indices, r.labels.indices.size(), owner);
        return out;
      },
      py::arg("path"), py::arg("format") = "auto", py::arg("num_features") = -1, py::arg("num_labels") = -1,
      py::arg("num_threads") = 0,
      "Parse an XC or libsvm multilabel file into CSR arrays (dict). Raises DataError "
      "'<path>:<line>: <problem>' for malformed input and FileNotFoundError for a missing file.");

  m.def(
      "write_xc",
      [](const std::string& path, int64_t num_features, int64_t num_labels, const I64& feature_indptr,
         const I32& feature_indices, const F32& feature_values, const I64& label_indptr, const I32& label_indices,
         int num_threads) {
        const py::ssize_t rows = feature_indptr.size() - 1;
        if (rows < 0) throw slide::InvalidArgument("feature_indptr must not be empty");
        require_length(label_indptr, rows + 1, "label_indptr");
        require_length(feature_values, feature_indices.size(), "feature_values");
        const auto fc = slide::check_csr(rows, feature_indptr.data(), feature_indices.size(), feature_indices.data(),
                                         num_features, nullptr, num_threads);
        if (!fc.problem.empty()) throw slide::InvalidArgument("features: " + fc.problem);
        const auto lc = slide::check_csr(rows, label_indptr.data(), label_indices.size(), label_indices.data(),
                                         num_labels, nullptr, num_threads);
        if (!lc.problem.empty()) throw slide::InvalidArgument("labels: " + lc.problem);
        slide::CsrView f{feature_indptr.data(), feature_indices.data(), feature_values.data()};
        slide::CsrView l{label_indptr.data(), label_indices.data(), nullptr};
        py::gil_scoped_release release;
        slide::write_xc(path, rows, num_features, num_labels, f, l, num_threads);
      },
      py::arg("path"), py::arg("num_features"), py::arg("num_labels"), py::arg("feature_indptr"),
      py::arg("feature_indices"), py::arg("feature_values"), py::arg("label_indptr"), py::arg("label_indices"),
      py::arg("num_threads") = 0,
      "Write CSR arrays in the XC text format; float32 values use their shortest round-trip form.");

  m.def(
      "check_csr",
      [](const I64& indptr, const I32& indices, int64_t num_columns, py::object values, int num_threads) {
        const py::ssize_t rows = indptr.size() - 1;
        if (rows < 0) throw slide::InvalidArgument("indptr must not be empty");
        F32 vals;
        const float* vp = nullptr;
        if (!values.is_none()) {
          vals = values.cast<F32>();
          require_length(vals, indices.size(), "values");
          vp = vals.data();
        }
        slide::CsrCheck c;
        {
          py::gil_scoped_release release;
          c = slide::check_csr(rows, indptr.data(), indices.size(), indices.data(), num_columns, vp, num_threads);
        }
        return py::make_tuple(c.problem, c.sorted_unique);
      },
      py::arg("indptr"), py::arg("indices"), py::arg("num_columns"), py::arg("values") = py::none(),
      py::arg("num_threads") = 0,
      "Validate a CSR structure; returns (problem, sorted_unique) with problem '' when valid.");

  m.def(
      "fingerprint",
      [](const py::array& a, int num_threads) {
        if (!(a.flags() & py::array::c_style)) {
          throw slide::InvalidArgument("fingerprint needs a C-contiguous array");
        }
        const size_t bytes = static_cast<size_t>(a.nbytes());
        const void* ptr = a.data();
        py::gil_scoped_release release;
        return slide::fingerprint(ptr, bytes, num_threads);
      },
      py::arg("array"), py::arg("num_threads") = 0,
      "64-bit fingerprint of a C-contiguous array's bytes (detects changed cache files).");
}
