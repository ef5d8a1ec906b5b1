// Python module slide._core: type conversion and error mapping only; logic lives in cpp/src.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "slide/common.hpp"
#include "slide/cpu.hpp"
#include "slide/profile.hpp"
#include "slide/simd.hpp"

namespace py = pybind11;

namespace {
// Polled by long C++ loops (with the GIL released): reacquire it briefly and
// let Python run its signal handlers, so Ctrl-C stops training promptly.
bool python_interrupt_pending() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    PyErr_Clear();
    return true;
  }
  return false;
}
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "slide engine (C++ core)";

  static py::exception<slide::DataError> data_error(m, "DataError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const slide::DataError& e) {
      PyErr_SetString(data_error.ptr(), e.what());
    } catch (const slide::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const slide::FileNotFound& e) {
      PyErr_SetString(PyExc_FileNotFoundError, e.what());
    } catch (const slide::Interrupted& e) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    } catch (const slide::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  slide::set_interrupt_hook(&python_interrupt_pending);

  m.def("cpu_features", [] {
    const auto& f = slide::cpu_features();
    py::dict d;
    d["avx2"] = f.avx2;
    d["fma"] = f.fma;
    d["avx512f"] = f.avx512f;
    d["avx512bf16"] = f.avx512bf16;
    d["kernels"] = slide::kernel_isa();
    return d;
  }, "CPU features detected at run time and the kernel set in use.");
  m.def("default_threads", [] { return slide::resolve_threads(0); },
        "Number of threads used when a network asks for 0 (all cores).");

  m.def(
      "stream_triad",
      [](int64_t mib, int threads, int reps) {
        py::gil_scoped_release release;
        return slide::stream_triad(mib, threads, reps);
      },
      py::arg("mib") = 256, py::arg("threads") = 0, py::arg("reps") = 5,
      "Memory bandwidth in GB/s: a STREAM-like triad a = b + s c over three arrays of `mib` MiB, "
      "`threads` threads (0 = all cores), best of `reps` passes; counts 24 bytes per element.");

  // Test support: the batched matrix-product kernels of one instruction set, on numpy arrays.
  using Matrix = py::array_t<float, py::array::c_style | py::array::forcecast>;
  m.def(
      "_matmul",
      [](Matrix a, Matrix b, bool transpose_a, bool transpose_b, const std::string& isa) {
        const slide::CpuFeatures f = slide::cap_features(slide::cpu_features(), isa, true);
        if (a.ndim() != 2 || b.ndim() != 2) throw slide::InvalidArgument("a and b must be 2-d");
        if (transpose_a && transpose_b) throw slide::InvalidArgument("transpose_a and transpose_b: one at most");
        const int64_t m = transpose_a ? a.shape(1) : a.shape(0), k = transpose_a ? a.shape(0) : a.shape(1);
        const int64_t n = transpose_b ? b.shape(0) : b.shape(1);
        if ((transpose_b ? b.shape(1) : b.shape(0)) != k) throw slide::InvalidArgument("inner dimensions differ");
        py::array_t<float> c({m, n});
        const slide::Kernels& kr = slide::kernels_for(f);
        if (transpose_b)
          kr.matmul_bt(a.data(), k, b.data(), k, c.mutable_data(), n, m, n, k);
        else
          kr.matmul(a.data(), transpose_a ? 1 : k, transpose_a ? m : 1, b.data(), n, c.mutable_data(), n, m, n, k);
        return c;
      },
      py::arg("a"), py::arg("b"), py::arg("transpose_a") = false, py::arg("transpose_b") = false,
      py::arg("isa") = "generic", "op(a) @ op(b) with one instruction set's kernels (for tests).");

  bind_data(m);
  bind_hash(m);
  bind_network(m);
}
