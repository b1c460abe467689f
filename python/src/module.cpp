// scalify._scalify: the Python bindings (nanobind), one file per part (bindings.hpp). Arrays cross
// without a copy where their dtype and layout already fit (NumPy arrays, any DLPack tensor on the
// CPU); scalify::FileError becomes OSError and scalify::Error ValueError, with the same message;
// long calls release the GIL. The Python package (python/scalify/) wraps these with documented,
// keyword-friendly functions.
#include "bindings.hpp"
#include "scalify/error.hpp"

NB_MODULE(_scalify, m) {
  using namespace scalify::python;
  m.doc() = "Scalify's C++ core (see the scalify package for the documented API)";
  // Objects torch modules hold (a scalify.torch.Linear's layer) live until the interpreter's last
  // collection, after nanobind's leak check: its warnings would be false alarms at every exit.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const scalify::MissingFileError& e) {
      PyErr_SetString(PyExc_FileNotFoundError, e.what());
    } catch (const scalify::FileError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    } catch (const scalify::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  // Messages that advise name Python's keywords (resume=True), not the CLI's flags (error.hpp).
  scalify::set_message_surface(scalify::Surface::python);
  bind_formats(m);
  bind_recipes(m);
  bind_tensor(m);
  bind_ops(m);
  bind_training(m);
  bind_torch_linear(m);
  bind_scaled_pairs(m);
}
