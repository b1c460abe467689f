#include "scalify/platform/world.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scalify/error.hpp"
#include "scalify/platform/crc32c.hpp"

#ifdef SCALIFY_HAVE_MPI
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>
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
// The roll call's tags, on the world's own copy of MPI_COMM_WORLD.
constexpr int kWhereAreYou = 1, kHere = 2;
// The receive that listens for a roll call, pending for the process's life: not the world's
// member, since the exit handler that cancels it runs after the world is destroyed.
MPI_Request question = MPI_REQUEST_NULL;

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("MPI: ") + what + " failed");
}

// `bytes` bytes every `stride` bytes: one piece of every rank's block.
class StridedPiece {
 public:
  StridedPiece(size_t bytes, size_t stride) {
    MPI_Datatype piece;
    check(MPI_Type_contiguous(int(bytes), MPI_BYTE, &piece), "type");
    check(MPI_Type_create_resized(piece, 0, MPI_Aint(stride), &type), "type");
    check(MPI_Type_commit(&type), "type");
    MPI_Type_free(&piece);
  }
  ~StridedPiece() { MPI_Type_free(&type); }
  StridedPiece(const StridedPiece&) = delete;
  StridedPiece& operator=(const StridedPiece&) = delete;
  MPI_Datatype type;
};

std::string ordinal(long long n) {
  const char* suffix = (n % 100 >= 11 && n % 100 <= 13) ? "th" : n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
  return std::to_string(n) + suffix;
}

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

class MpiWorld final : public World {
 public:
  explicit MpiWorld(double timeout_s) : timeout_(timeout_s) {
    int provided = 0;
    // Only the thread that trains calls MPI; OpenMP's workers never do.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_dup(MPI_COMM_WORLD, &roll_call_);
    answers_.resize(size_t(size_));
    listen();
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      MPI_Cancel(&question);  // the roll call's listening receive
      MPI_Wait(&question, MPI_STATUS_IGNORE);
      MPI_Finalize();
    });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allgather(const void* send, size_t bytes, void* recv) const override { allgather_in_pieces(send, bytes, recv, kPiece); }
  void alltoall(const void* send, size_t bytes, void* recv) const override { alltoall_in_pieces(send, bytes, recv, kPiece); }
  void allgather_in_pieces(const void* send, size_t bytes, void* recv, size_t piece) const {
    MPI_Request request;
    if (bytes <= piece) {
      check(MPI_Iallgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD, &request), "all-gather");
      return wait(request, "all-gather");
    }
    for (int r = 0; r < size_; ++r) {  // one broadcast per rank, in pieces
      auto* block = static_cast<char*>(recv) + size_t(r) * bytes;
      if (r == rank_) std::memmove(block, send, bytes);
      for (size_t o = 0; o < bytes; o += piece) {
        check(MPI_Ibcast(block + o, int(std::min(piece, bytes - o)), MPI_BYTE, r, MPI_COMM_WORLD, &request), "broadcast");
        wait(request, "all-gather");
      }
    }
  }
  void alltoall_in_pieces(const void* send, size_t bytes, void* recv, size_t piece) const {
    MPI_Request request;
    if (bytes <= piece) {
      check(MPI_Ialltoall(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD, &request), "all-to-all");
      return wait(request, "all-to-all");
    }
    for (size_t o = 0; o < bytes; o += piece) {  // piece o..o+n of every block at once
      const StridedPiece t(std::min(piece, bytes - o), bytes);
      check(MPI_Ialltoall(static_cast<const char*>(send) + o, 1, t.type, static_cast<char*>(recv) + o, 1, t.type, MPI_COMM_WORLD, &request),
            "all-to-all");
      wait(request, "all-to-all");
    }
  }
  void max(std::vector<double>& values) const override {
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &request), "all-reduce");
    wait(request, "all-reduce");
  }
  void broadcast(std::string& text, int from) const override {
    unsigned long long n = std::min<size_t>(text.size(), kPiece);  // a message, never near 1 GiB
    MPI_Request request;
    check(MPI_Ibcast(&n, 1, MPI_UNSIGNED_LONG_LONG, from, MPI_COMM_WORLD, &request), "broadcast");
    wait(request, "broadcast");
    text.resize(size_t(n));
    if (!n) return;
    check(MPI_Ibcast(text.data(), int(n), MPI_CHAR, from, MPI_COMM_WORLD, &request), "broadcast");
    wait(request, "broadcast");
  }
  [[noreturn]] void abort(int exit_code) const override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::exit(exit_code);
  }

 private:
  using clock = std::chrono::steady_clock;

  // Completes a collective: polls, answering roll calls, spinning for the first millisecond (most
  // waits are shorter), then sleeping longer and longer between polls, up to a millisecond (which
  // bounds what a late peer costs); past the timeout, ends the run.
  void wait(MPI_Request& request, const char* what) const {
    ++waits_;
    const auto start = clock::now();
    auto pause = std::chrono::microseconds(25);
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      answer_roll_call();
      const auto waited = clock::now() - start;
      if (waited > std::chrono::duration<double>(timeout_)) time_out(what);
      if (waited > std::chrono::milliseconds(1)) {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    }
  }
  // Waits for the next "where are you?" from any rank.
  void listen() const { check(MPI_Irecv(&asked_, 1, MPI_LONG_LONG, MPI_ANY_SOURCE, kWhereAreYou, roll_call_, &question), "roll call"); }
  // Answers a rank that asked where this one is: the number of its current wait.
  void answer_roll_call() const {
    int asked = 0;
    MPI_Status status;
    check(MPI_Test(&question, &asked, &status), "roll call");
    if (!asked) return;
    answers_[size_t(status.MPI_SOURCE)] = waits_;  // the send reads it later: one slot per asking rank
    MPI_Request reply;
    check(MPI_Isend(&answers_[size_t(status.MPI_SOURCE)], 1, MPI_LONG_LONG, status.MPI_SOURCE, kHere, roll_call_, &reply), "roll call");
    MPI_Request_free(&reply);
    listen();
  }
  // Asks every rank where it is, waits a while for the answers (a waiting rank answers within a
  // millisecond; the grace is for a loaded machine), prints who is missing and ends every rank.
  [[noreturn]] void time_out(const char* what) const {
    std::vector<long long> where(size_t(size_), -1);
    std::vector<MPI_Request> answers(size_t(size_), MPI_REQUEST_NULL);
    const long long mine = waits_;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      check(MPI_Irecv(&where[size_t(r)], 1, MPI_LONG_LONG, r, kHere, roll_call_, &answers[size_t(r)]), "roll call");
      MPI_Request ask;
      check(MPI_Isend(&mine, 1, MPI_LONG_LONG, r, kWhereAreYou, roll_call_, &ask), "roll call");
      MPI_Request_free(&ask);
    }
    const auto until = clock::now() + std::chrono::duration<double>(std::min(timeout_, 10.0));
    for (int all = 0; !all && clock::now() < until;) {
      check(MPI_Testall(size_, answers.data(), &all, MPI_STATUSES_IGNORE), "roll call");
      answer_roll_call();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string silent, elsewhere;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      int answered = 0;
      MPI_Test(&answers[size_t(r)], &answered, MPI_STATUS_IGNORE);
      if (!answered)
        silent += (silent.empty() ? "" : ", ") + std::to_string(r);
      else if (where[size_t(r)] != mine)
        elsewhere += (elsewhere.empty() ? "rank " : "; rank ") + std::to_string(r) + " in its " + ordinal(where[size_t(r)]);
    }
    std::string m = "rank " + std::to_string(rank_) + " waited " + seconds_text(timeout_) + " s for the other ranks in its " +
                    ordinal(mine) + " collective (" + what + "): ";
    if (!silent.empty())
      m += (silent.find(',') == std::string::npos ? "rank " + silent + " does" : "ranks " + silent + " do") +
           " not answer (stopped, hung, or busy outside MPI that long)";
    else if (!elsewhere.empty())
      m += "the ranks wait in different collectives (" + elsewhere + "): they took different paths";
    else
      m += "every rank waits in it, so the exchange itself is stuck (the network between the machines?)";
    m += "; every rank stops (SCALIFY_MPI_TIMEOUT sets the wait in seconds)";
    std::fprintf(stderr, "scalify (rank %d): error: %s\n", rank_, m.c_str());
    abort(2);
  }

  int rank_ = 0, size_ = 1;
  double timeout_;
  MPI_Comm roll_call_ = MPI_COMM_NULL;
  mutable long long asked_ = 0, waits_ = 0;
  mutable std::vector<long long> answers_;
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

double collective_timeout_s() {
  const char* v = std::getenv("SCALIFY_MPI_TIMEOUT");
  if (!v) return 300;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s > 0) || !std::isfinite(s))
    throw Error("SCALIFY_MPI_TIMEOUT='" + std::string(v) +
                "': give the seconds a rank waits for the others in a collective before the run ends (a number above 0; default 300)");
  return s;
}

void mpi_allgather(const void* send, size_t bytes, void* recv, size_t piece) {
#ifdef SCALIFY_HAVE_MPI
  if (launched_by_mpi()) return static_cast<const MpiWorld&>(world()).allgather_in_pieces(send, bytes, recv, piece);
#endif
  (void)send, (void)bytes, (void)recv, (void)piece;
  throw Error("mpi_allgather: not under an MPI launcher in a build with MPI");
}

void mpi_alltoall(const void* send, size_t bytes, void* recv, size_t piece) {
#ifdef SCALIFY_HAVE_MPI
  if (launched_by_mpi()) return static_cast<const MpiWorld&>(world()).alltoall_in_pieces(send, bytes, recv, piece);
#endif
  (void)send, (void)bytes, (void)recv, (void)piece;
  throw Error("mpi_alltoall: not under an MPI launcher in a build with MPI");
}

namespace {

// One rank's items as (what, value) pairs, from their exchanged form (what \0 value \0, repeated).
std::vector<std::pair<std::string, std::string>> parse_items(const char* text, size_t bytes) {
  std::vector<std::pair<std::string, std::string>> items;
  std::vector<std::string> fields;
  for (size_t at = 0; at < bytes;) {
    const size_t end = std::find(text + at, text + bytes, '\0') - text;
    fields.emplace_back(text + at, end - at);
    at = end + 1;
  }
  for (size_t i = 0; i + 1 < fields.size(); i += 2) items.emplace_back(fields[i], fields[i + 1]);
  return items;
}

// Two values that differ, each shown around the first character where they do (a recipe's JSON,
// a path): at most 80 characters of each, with its length when it is cut.
std::pair<std::string, std::string> where_they_differ(const std::string& a, const std::string& b) {
  constexpr size_t kShown = 80, kBefore = 20;
  const size_t at = size_t(std::mismatch(a.begin(), a.begin() + std::min(a.size(), b.size()), b.begin()).first - a.begin());
  auto around = [&](const std::string& v) {
    if (v.size() <= kShown) return v;
    const size_t from = at > kBefore ? std::min(at - kBefore, v.size() - kShown) : 0;
    return (from > 0 ? "..." : "") + v.substr(from, kShown) + (from + kShown < v.size() ? "..." : "") + " (" + std::to_string(v.size()) +
           " characters)";
  };
  return {around(a), around(b)};
}

}  // namespace

void check_ranks_agree(const World& world, const std::vector<Agreed>& items) {
  if (world.size() == 1) return;
  std::string mine;
  for (const Agreed& item : items) mine.append(item.what).append(1, '\0').append(item.value).append(1, '\0');
  // First a digest of a fixed size: equal digests are the usual answer.
  struct Digest {
    uint64_t bytes;
    uint32_t crc, pad;
  };
  const Digest digest{mine.size(), crc32c(mine.data(), mine.size()), 0};
  std::vector<Digest> digests(size_t(world.size()));
  world.allgather(&digest, sizeof digest, digests.data());
  size_t longest = 0;
  bool same = true;
  for (const Digest& d : digests) {
    longest = std::max<size_t>(longest, d.bytes);
    same = same && d.bytes == digests[0].bytes && d.crc == digests[0].crc;
  }
  if (same) return;
  // Then every rank's items, each padded to the longest (every rank knows every length now).
  mine.resize(longest, '\0');
  std::string all(longest * size_t(world.size()), '\0');
  world.allgather(mine.data(), longest, all.data());
  std::vector<std::vector<std::pair<std::string, std::string>>> ranks;
  for (size_t r = 0; r < size_t(world.size()); ++r) ranks.push_back(parse_items(all.data() + r * longest, digests[r].bytes));
  // The first item where a rank differs from rank 0, and the first rank that differs there.
  for (size_t i = 0;; ++i) {
    for (size_t r = 1; r < ranks.size(); ++r) {
      const bool past0 = i >= ranks[0].size(), pastr = i >= ranks[r].size();
      if (past0 && pastr) continue;
      if (past0 || pastr || ranks[r][i].first != ranks[0][i].first)
        throw EveryRankError("ranks disagree on what they must agree on: rank 0 checks '" + (past0 ? "" : ranks[0][i].first) + "', rank " +
                             std::to_string(r) + " '" + (pastr ? "" : ranks[r][i].first) +
                             "' (different scalify builds? give every rank the same one)");
      if (ranks[r][i].second == ranks[0][i].second) continue;
      size_t others = 0;
      for (size_t q = r + 1; q < ranks.size(); ++q) others += i < ranks[q].size() && ranks[q][i].second != ranks[0][i].second;
      const std::string& hint = i < items.size() ? items[i].hint : "";
      const auto [theirs0, theirs] = where_they_differ(ranks[0][i].second, ranks[r][i].second);
      throw EveryRankError("ranks disagree on " + ranks[0][i].first + ": rank 0 has " + theirs0 + ", rank " + std::to_string(r) + " has " +
                           theirs + (others ? " (and " + std::to_string(others) + " more ranks differ from rank 0)" : "") +
                           (hint.empty() ? "" : "; " + hint));
    }
    if (i >= ranks[0].size()) break;
  }
  throw EveryRankError("ranks disagree on their items, yet each item is alike (a bug: please report it)");
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
    static const MpiWorld mpi(collective_timeout_s());
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
