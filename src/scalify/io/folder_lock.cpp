#include "scalify/io/folder_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "scalify/error.hpp"
#include "scalify/io/input_file.hpp"

namespace scalify::io {

namespace {
// The holder's note ("PID 123, scalify train"); a holder that has just locked may not have written
// it yet, so an empty note is read again a few times.
std::string holder_of(const std::string& note_path) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    try {
      const std::string text = read_input_file(note_path, "lock", 4096);
      const std::string line = text.substr(0, text.find('\n'));
      if (!line.empty()) return line;
    } catch (const Error&) {  // no note (yet), or not a regular file
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "PID unknown";
}
}  // namespace

FolderLock::FolderLock(const std::string& folder, const std::string& command) {
  // The lock is on the folder itself, not on a file in it that could be deleted and made anew
  // while its lock is held; .lock only carries the note for other processes.
  fd_ = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) throw FileError("cannot lock the folder '" + folder + "': " + std::strerror(errno));
  const std::string note = (std::filesystem::path(folder) / ".lock").string();
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd_);
    if (err != EWOULDBLOCK) throw FileError("cannot lock the folder '" + folder + "': " + std::strerror(err));
    throw FileError("'" + folder + "' is in use by another scalify process (" + holder_of(note) +
                    "); wait for it to finish, or write elsewhere");
  }
  // Best effort: without the note the lock still holds; other processes then say "PID unknown".
  const int nfd = ::open(note.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (nfd >= 0) {
    std::ostringstream me;
    me << "PID " << ::getpid() << ", scalify " << command << "\n";
    const std::string text = me.str();
    if (::write(nfd, text.data(), text.size()) != ssize_t(text.size())) {
      // a short note is still a note
    }
    ::close(nfd);
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace scalify::io
