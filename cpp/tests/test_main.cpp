// The C++ unit tests of the slide core (doctest): build with -DSLIDE_BUILD_TESTS=ON, run ctest.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
