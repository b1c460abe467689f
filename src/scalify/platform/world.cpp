#include "scalify/platform/world.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scalify/error.hpp"

#ifdef SCALIFY_HAVE_MPI
#include <mpi.h>

#include <cstdio>
#include <stdexcept>
#endif

namespace scalify::platform {

namespace {

class SingleProcess final : public World {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allgather(const void* send, size_t bytes, void* recv) const override { std::memmove(recv, send, bytes); }
  void alltoall(const void* send, size_t bytes, void* recv) const override { std::memmove(recv, send, bytes); }
  void max(std::vector<double>&) const override {}
  void broadcast(std::string&, int) const override {}
  [[noreturn]] void abort(int exit_code) const override { std::exit(exit_code); }
};

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

#ifdef SCALIFY_HAVE_MPI
// MPI counts in int: larger messages go in pieces of at most 1 GiB.
constexpr size_t kPiece = size_t(1) << 30;

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("MPI: ") + what + " failed");
}

class MpiWorld final : public World {
 public:
  MpiWorld() {
    int provided = 0;
    // Only the thread that trains calls MPI; OpenMP's workers never do.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allgather(const void* send, size_t bytes, void* recv) const override {
    if (bytes <= kPiece) {
      check(MPI_Allgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD), "allgather");
      return;
    }
    for (int r = 0; r < size_; ++r) {  // one broadcast per rank, in pieces
      auto* block = static_cast<char*>(recv) + size_t(r) * bytes;
      if (r == rank_) std::memmove(block, send, bytes);
      for (size_t o = 0; o < bytes; o += kPiece)
        check(MPI_Bcast(block + o, int(std::min(kPiece, bytes - o)), MPI_BYTE, r, MPI_COMM_WORLD), "broadcast");
    }
  }
  void alltoall(const void* send, size_t bytes, void* recv) const override {
    if (bytes > kPiece) throw std::runtime_error("MPI: an all-to-all block above 1 GiB");
    check(MPI_Alltoall(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD), "alltoall");
  }
  void max(std::vector<double>& values) const override {
    check(MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "allreduce max");
  }
  void broadcast(std::string& text, int from) const override {
    unsigned long long n = std::min<size_t>(text.size(), kPiece);  // a message, never near 1 GiB
    check(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, from, MPI_COMM_WORLD), "broadcast");
    text.resize(size_t(n));
    if (n) check(MPI_Bcast(text.data(), int(n), MPI_CHAR, from, MPI_COMM_WORLD), "broadcast");
  }
  [[noreturn]] void abort(int exit_code) const override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::exit(exit_code);
  }

 private:
  int rank_ = 0, size_ = 1;
};
#endif

}  // namespace

void every_rank_agrees(const World& world, const std::function<void()>& fn) {
  if (world.size() == 1) return fn();
  std::string error;
  try {
    fn();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "(an error without a message)";
  }
  // The lowest failing rank: the largest of size - rank over the failing ranks.
  std::vector<double> failing{error.empty() ? 0.0 : double(world.size() - world.rank())};
  world.max(failing);
  if (failing[0] == 0) return;
  world.broadcast(error, world.size() - int(failing[0]));
  throw EveryRankError(error);
}

std::string from_root(const World& world, const std::function<std::string()>& fn) {
  std::string text;
  every_rank_agrees(world, [&] {
    if (world.root()) text = fn();
  });
  world.broadcast(text);
  return text;
}

bool built_with_mpi() {
#ifdef SCALIFY_HAVE_MPI
  return true;
#else
  return false;
#endif
}

const World& single_process() {
  static const SingleProcess single;
  return single;
}

const World& world() {
#ifdef SCALIFY_HAVE_MPI
  if (launched_by_mpi()) {
    static const MpiWorld mpi;
    return mpi;
  }
#else
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!n) n = std::getenv("PMI_SIZE");
  if (launched_by_mpi() && n && std::string(n) != "1")
    throw Error("this scalify was built without MPI, so " + std::string(n) +
                " processes started by mpirun would each train alone: install libopenmpi-dev and rebuild");
#endif
  return single_process();
}

std::string world_description() {
  const int n = world().size();
  std::string s = n == 1 ? "1 process" : std::to_string(n) + " processes (MPI)";
  if (n == 1) s += built_with_mpi() ? " (built with MPI: mpirun -np N runs N)" : " (built without MPI)";
  return s;
}

}  // namespace scalify::platform
