#include "scalify/io/folder_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "scalify/error.hpp"

namespace scalify::io {

FolderLock::FolderLock(const std::string& folder, const std::string& command) {
  const std::string path = (std::filesystem::path(folder) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0) throw Error("cannot lock the folder '" + folder + "': cannot open '" + path + "': " + std::strerror(errno));
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    char holder[128] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    if (err != EWOULDBLOCK) throw Error("cannot lock the folder '" + folder + "': " + std::strerror(err));
    std::string who(holder, size_t(std::max<ssize_t>(n, 0)));
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    throw Error("'" + folder + "' is in use by another scalify process (" + (who.empty() ? "PID unknown" : who) +
                "); wait for it to finish, or write elsewhere");
  }
  const std::string me = "PID " + std::to_string(::getpid()) + ", scalify " + command + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    // The lock itself holds; only the note for other processes is missing.
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace scalify::io
