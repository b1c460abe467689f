// scalify._openmp_wait: the package imports it before the extension _scalify, whose loading
// starts libgomp, so that libgomp reads the spin count chosen here (platform/openmp_wait.hpp).
// It links no OpenMP itself.
#include <Python.h>

#include "scalify/platform/openmp_wait.hpp"

static PyModuleDef openmp_wait_module = {
    PyModuleDef_HEAD_INIT, "_openmp_wait", "OpenMP's wait, chosen before libgomp loads", -1, nullptr, nullptr, nullptr, nullptr, nullptr};

PyMODINIT_FUNC PyInit__openmp_wait() {
  scalify::platform::choose_openmp_wait();
  return PyModule_Create(&openmp_wait_module);
}
