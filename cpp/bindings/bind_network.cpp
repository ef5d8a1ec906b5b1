#include "bindings.hpp"

void bind_network(pybind11::module_& m) {}
