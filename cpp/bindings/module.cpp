// Python module slide._core: type conversion and error mapping only; logic lives in cpp/src.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "slide/common.hpp"
#include "slide/cpu.hpp"

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

  bind_data(m);
  bind_hash(m);
  bind_network(m);
}
