#pragma once
// scalify::Error: the one exception type for bad user input (unknown names, NaN where a format
// has none, mismatched shapes, corrupt files). Messages name the input and what was expected.
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

}  // namespace scalify
