// kda._core: the C++ library for Python (nanobind). kda::Error (bad input)
// becomes ValueError, kda::DTypeError (an argument's element type) TypeError;
// device problems are TypeError where the bindings check them.
#include <nanobind/nanobind.h>

#include <exception>

#include "kda/base/error.h"
#include "python/src/bindings.h"

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  nb::register_exception_translator([](const std::exception_ptr& p, void* /*payload*/) {
    try {
      std::rethrow_exception(p);
    } catch (const kda::DTypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const kda::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  kda::python::BindKernels(m);
  kda::python::BindModel(m);
  kda::python::BindLayerKernels(m);
}
