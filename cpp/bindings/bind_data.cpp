#include "bindings.hpp"

void bind_data(pybind11::module_& m) {}
