#include "scalify/io/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "scalify/error.hpp"

namespace scalify::io {

namespace {
std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};
}  // namespace

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  auto check_type = [&](const struct stat& st) {
    if (S_ISDIR(st.st_mode)) throw FileError(what + ": '" + path + "' is a folder, not a file");
    if (!S_ISREG(st.st_mode)) throw FileError(what + ": '" + path + "' is not a regular file (a pipe, socket or device); give a file");
  };
  // Checked before opening (opening some devices has effects of its own), and again on the open
  // descriptor, so nothing swapped in between is read. O_NONBLOCK: opening a FIFO for reading
  // would otherwise wait for a writer.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw FileError(what + ": cannot open '" + path + "': " + std::strerror(errno));
  check_type(st);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw FileError(what + ": cannot open '" + path + "': " + std::strerror(errno));
  const Fd guard{fd};
  if (::fstat(fd, &st) != 0) throw FileError(what + ": cannot read '" + path + "': " + std::strerror(errno));
  check_type(st);
  if (uint64_t(st.st_size) > max_bytes)
    throw FileError(what + ": '" + path + "' is " + mib(uint64_t(st.st_size)) + ", more than the " + mib(max_bytes) +
                    " this reader accepts");
  std::string bytes(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FileError(what + ": cannot read '" + path + "': " + std::strerror(errno));
    if (n == 0) break;  // shrank while being read
    got += size_t(n);
  }
  bytes.resize(got);
  return bytes;
}

}  // namespace scalify::io
