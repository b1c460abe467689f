#pragma once
// scalify::Error: the one exception type for bad user input (unknown names, NaN where a format
// has none, mismatched shapes, corrupt files). Messages name the input and what was expected.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace scalify {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The operating system refused a named file or folder: it cannot be opened, read, written,
// created or locked, or it is not the kind of file asked for. (Python's OSError.)
class FileError : public Error {
 public:
  using Error::Error;
};

// The named file or folder does not exist (Python's FileNotFoundError).
class MissingFileError : public FileError {
 public:
  using FileError::FileError;
};

// Throws `message` as the same kind of error as `e` (a file error stays one): for a caller that
// adds its context to an error it passes on.
[[noreturn]] inline void rethrow_as(const Error& e, const std::string& message) {
  if (dynamic_cast<const MissingFileError*>(&e)) throw MissingFileError(message);
  if (dynamic_cast<const FileError*>(&e)) throw FileError(message);
  throw Error(message);
}

// Whom the library's messages advise: the CLI's users (flags: "use --resume") or Python's
// (keywords: "use resume=True"). The Python module says so once, at import; a message that names
// an option gives both spellings through for_surface(), so each surface reads its own and the
// choice between them is made here only.
enum class Surface : uint8_t { cli, python };
inline Surface g_message_surface = Surface::cli;
inline void set_message_surface(Surface s) { g_message_surface = s; }
inline std::string for_surface(const std::string& cli, const std::string& python) {
  return g_message_surface == Surface::python ? python : cli;
}

}  // namespace scalify
