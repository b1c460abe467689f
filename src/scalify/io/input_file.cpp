#include "scalify/io/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "scalify/error.hpp"
#include "scalify/platform/crc32c.hpp"

namespace scalify::io {

namespace {
std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// `path` opened for reading, a regular file or an error. Its type is checked before opening
// (opening some devices has effects of its own), and again on the open descriptor, so nothing
// swapped in between is read. O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
// writer.
Fd open_regular(const std::string& path, const std::string& what, struct stat& st) {
  auto check_type = [&] {
    if (S_ISDIR(st.st_mode)) throw FileError(what + ": '" + path + "' is a folder, not a file");
    if (!S_ISREG(st.st_mode)) throw FileError(what + ": '" + path + "' is not a regular file (a pipe, socket or device); give a file");
  };
  if (::stat(path.c_str(), &st) != 0) {
    const std::string message = what + ": cannot open '" + path + "': " + std::strerror(errno);
    if (errno == ENOENT) throw MissingFileError(message);
    throw FileError(message);
  }
  check_type();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw FileError(what + ": cannot open '" + path + "': " + std::strerror(errno));
  Fd guard{fd};
  if (::fstat(fd, &st) != 0) throw FileError(what + ": cannot read '" + path + "': " + std::strerror(errno));
  check_type();
  return guard;
}

// Up to bytes.size() bytes from fd; the string shrinks to what was there.
void read_into(int fd, std::string& bytes, const std::string& path, const std::string& what) {
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FileError(what + ": cannot read '" + path + "': " + std::strerror(errno));
    if (n == 0) break;  // shrank while being read
    got += size_t(n);
  }
  bytes.resize(got);
}
}  // namespace

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  struct stat st {};
  const Fd file = open_regular(path, what, st);
  if (uint64_t(st.st_size) > max_bytes)
    throw FileError(what + ": '" + path + "' is " + mib(uint64_t(st.st_size)) + ", more than the " + mib(max_bytes) +
                    " this reader accepts");
  std::string bytes(size_t(st.st_size), '\0');
  read_into(file.fd, bytes, path, what);
  return bytes;
}

uint32_t input_file_crc32c(const std::string& path, const std::string& what) {
  struct stat st {};
  const Fd file = open_regular(path, what, st);
  std::string chunk;
  uint32_t crc = 0;
  do {
    chunk.assign(size_t(1) << 20, '\0');
    read_into(file.fd, chunk, path, what);
    crc = platform::crc32c(chunk.data(), chunk.size(), crc);
  } while (chunk.size() == size_t(1) << 20);
  return crc;
}

std::string read_input_head(const std::string& path, const std::string& what, size_t n) {
  struct stat st {};
  const Fd file = open_regular(path, what, st);
  std::string bytes(std::min<size_t>(n, size_t(st.st_size)), '\0');
  read_into(file.fd, bytes, path, what);
  return bytes;
}

}  // namespace scalify::io
