#include "scalify/io/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "scalify/error.hpp"

namespace scalify::io {

namespace fs = std::filesystem;

namespace {
[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw FileError(what + " '" + path + "': " + std::strerror(errno));
}
void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path);
    }
    p += w;
    n -= size_t(w);
  }
}
// Whether the process that named a temporary file (its last component, after ".tmp.") has ended:
// only then is the file a leftover; a live writer's temporary is its own to remove.
bool owner_ended(const std::string& name, const std::string& prefix) {
  const std::string pid = name.substr(prefix.size());
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  return ::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH;
}
// An existing target must be a regular file (or a link to one): renaming over a device, FIFO or
// socket would replace it for every other user of the machine (/dev/null), and over a folder fails.
void check_target(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // none yet (or a dangling link, which rename replaces)
  if (S_ISDIR(st.st_mode)) throw FileError("cannot write '" + path + "': it is a folder");
  if (!S_ISREG(st.st_mode))
    throw FileError("cannot write '" + path + "': it exists and is not a regular file (a device, pipe or socket); give a file name");
}
bool die_during_write(const fs::path& target) {
  const char* env = std::getenv("SCALIFY_TEST_DIE_DURING_WRITE");
  return env && target.filename() == env;
}
}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& write) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  check_target(path);
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {  // leftovers of writers that died
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && owner_ended(name, prefix)) fs::remove(e.path(), ec);
  }
  const std::string tmp = (dir / (prefix + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail("cannot create", tmp);
  try {
    // The content streams to the temporary through a buffer of kBuffer bytes: a checkpoint of a
    // large model is gigabytes, and holding it whole doubled the training run's peak memory.
    // The fault-injection hook first counts the bytes (a dry run of `write`) to die at half of them.
    const bool die = die_during_write(target);
    size_t total = 0;
    if (die) write([&](const void*, size_t size) { total += size; });
    constexpr size_t kBuffer = size_t(4) << 20;
    std::vector<char> buffer;
    buffer.reserve(kBuffer);
    size_t written = 0;
    auto flush = [&] {
      write_all(fd, buffer.data(), buffer.size(), tmp);
      written += buffer.size();
      buffer.clear();
    };
    write([&](const void* data, size_t size) {
      const char* p = static_cast<const char*>(data);
      if (!die && buffer.empty() && size >= kBuffer) {  // a large piece needs no copy
        write_all(fd, p, size, tmp);
        written += size;
        return;
      }
      while (size > 0) {
        if (die && written + buffer.size() == total / 2) {  // before a byte past the half (total / 2 < total)
          flush();
          ::fsync(fd);
          ::raise(SIGKILL);
        }
        size_t take = std::min(size, kBuffer - buffer.size());
        if (die) take = std::min(take, total / 2 - (written + buffer.size()));
        buffer.insert(buffer.end(), p, p + take);
        p += take;
        size -= take;
        if (buffer.size() == kBuffer) flush();
      }
    });
    flush();
    if (::fsync(fd) != 0) fail("cannot flush", tmp);
    const int closed = ::close(fd);
    fd = -1;
    if (closed != 0) fail("cannot close", tmp);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail("cannot rename the new file onto", path);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // make the rename itself durable
    ::fsync(dfd);
    ::close(dfd);
  }
}

void refuse_to_overwrite(const std::string& out, const std::vector<std::string>& inputs, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  for (const std::string& in : inputs)
    if (fs::equivalent(out, in, ec))
      throw Error(what + ": the output '" + out + "' is '" + in + "', which this command reads or the run owns; write elsewhere");
}

void write_text_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](const ByteSink& out) { out(text.data(), text.size()); });
}

void make_folder(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_directory(path, ec))
    throw FileError("'" + path + "' exists and is not a folder");
  std::filesystem::create_directories(path, ec);
  if (ec) throw FileError("cannot create the folder '" + path + "': " + ec.message());
}

}  // namespace scalify::io
