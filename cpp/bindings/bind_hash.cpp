#include "bindings.hpp"

void bind_hash(pybind11::module_& m) {}
