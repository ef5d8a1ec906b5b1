// Each binding file registers its part of slide._core.
#pragma once
#include <pybind11/pybind11.h>

void bind_data(pybind11::module_& m);     // bind_data.cpp: readers, cache, writer
void bind_hash(pybind11::module_& m);     // bind_hash.cpp: hash families and tables (for tests and tools)
void bind_network(pybind11::module_& m);  // bind_network.cpp: the training engine
