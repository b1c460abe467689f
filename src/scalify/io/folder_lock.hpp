#pragma once
// One process owns a folder it writes into (a run folder, a comparison): an advisory lock (flock)
// on the folder itself, held until the FolderLock is destroyed or the process ends. The kernel
// releases it however the process ends, SIGKILL included, so a dead owner never blocks the next
// one. The folder's `.lock` file holds the owner's PID and command, which a second writer's error
// names.
#include <string>

namespace scalify::io {

class FolderLock {
 public:
  // Locks `folder` (which must exist) for `command` ("train", "compare", ...), or throws an
  // Error naming the holder's PID and command when another process holds it.
  FolderLock(const std::string& folder, const std::string& command);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace scalify::io
