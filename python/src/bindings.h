// The parts of kda._core, each bound by its own source.
#pragma once

#include <nanobind/nanobind.h>

namespace kda::python {

void BindKernels(nanobind::module_& m);       // kernels.cc
void BindModel(nanobind::module_& m);         // model.cc: Layer, Engine
void BindLayerKernels(nanobind::module_& m);  // layer_kernels.cc: short conv, gated RMSNorm

}  // namespace kda::python
