#include "scalify/report/gnuplot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace scalify::report {

std::string run_gnuplot(const std::string& script_path) {
  const std::string log = script_path + ".log";
  // The log is replaced, never written through: a link in its place is removed (not its target),
  // and a FIFO or device is refused (opening one would block, or write to it).
  struct stat st {};
  if (::lstat(log.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      ::unlink(log.c_str());
    else if (!S_ISREG(st.st_mode))
      return "cannot write '" + log + "': it exists and is not a regular file";
  }
  posix_spawn_file_actions_t io;
  posix_spawn_file_actions_init(&io);
  posix_spawn_file_actions_addopen(&io, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&io, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK, 0644);
  posix_spawn_file_actions_adddup2(&io, 1, 2);
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, "gnuplot", &io, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&io);
  if (err != 0) return std::string("cannot run gnuplot (").append(std::strerror(err)).append("); install gnuplot-nox");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return std::string("waiting for gnuplot failed: ").append(std::strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return "gnuplot is not installed (install gnuplot-nox)";
  return "gnuplot failed (exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + "); see " + log;
}

std::string gnuplot_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, (unsigned char)c < 0x20 ? '?' : c);  // no line breaks
  return out + "'";
}

}  // namespace scalify::report
