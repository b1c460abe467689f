#pragma once
// The processes one run spans: MPI_COMM_WORLD when the process was started by mpirun (or another
// MPI launcher) in a build with MPI, else this process alone. Data parallelism (train/
// data_parallel.hpp) talks to the other ranks only through this interface; every call but abort
// is a collective that each rank makes in the same order.
//
// Under MPI no collective waits forever: a rank that has waited collective_timeout_s() for the
// others asks every rank where it is, prints which rank does not answer (stopped, hung) or waits
// elsewhere, and ends every rank (MPI_Abort). While it waits it sleeps between polls, leaving
// the core to others.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "scalify/error.hpp"

namespace scalify::platform {

class World {
 public:
  virtual ~World() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv (size() * bytes) gets every rank's `bytes` from send, in rank order.
  virtual void allgather(const void* send, size_t bytes, void* recv) const = 0;
  // send holds size() blocks of `bytes`; block r goes to rank r; recv gets block rank() of every
  // rank, in rank order (the exchange of a reduce-scatter).
  virtual void alltoall(const void* send, size_t bytes, void* recv) const = 0;
  // Elementwise maximum over the ranks, in place (exact: a maximum does not round).
  virtual void max(std::vector<double>& values) const = 0;
  // Rank `from`'s text, on every rank.
  virtual void broadcast(std::string& text, int from = 0) const = 0;
  // Ends every rank of the run at once (after a failure one rank alone saw); never returns.
  [[noreturn]] virtual void abort(int exit_code) const = 0;
  bool root() const { return rank() == 0; }
};

// An error every rank of the run raises alike (from every_rank_agrees, or from values the ranks
// share, such as the summed loss): each rank ends with it, rank 0 alone reporting it. Any other
// error on a rank of several ends the whole run at once (World::abort), since the others may
// wait for it in a collective.
class EveryRankError : public Error {
 public:
  using Error::Error;
};

// Runs fn on every rank (a collective): if it throws on any, every rank throws EveryRankError
// with the message of the lowest failing rank. On one process fn's own exception passes through.
void every_rank_agrees(const World& world, const std::function<void()>& fn);
// Rank 0's answer, on every rank: fn runs on rank 0 alone (what only it may look at, such as the
// run folder it owns), its error is every rank's (as every_rank_agrees), its text is broadcast.
std::string from_root(const World& world, const std::function<std::string()>& fn);

// What the ranks of one run must hold alike (the command, the kernels chosen, the config, the
// corpus): `what` names the item in an error, `value` is compared byte for byte and printed,
// `hint` says how to fix a difference.
struct Agreed {
  std::string what, value, hint;
};
// A collective: throws EveryRankError on every rank, naming the first item that differs and two
// ranks' values ("ranks disagree on steps: rank 0 has 20, rank 1 has 30"). The exchange is a
// fixed-size digest, then the descriptions padded to the longest, so a disagreement can never
// truncate the exchange itself.
void check_ranks_agree(const World& world, const std::vector<Agreed>& items);

// The seconds a rank waits in a collective before ending the run: the environment variable
// SCALIFY_MPI_TIMEOUT, default 300. It must exceed any work one rank does while the others wait
// (rank 0 writing a checkpoint); throws naming a value that is not a positive number.
double collective_timeout_s();

// The run's world. MPI is initialised on first use when the environment says an MPI launcher
// started the process (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK), and finalised at exit.
const World& world();
// This process alone: for work that is not the run's to share (a report evaluating one rank's copy).
const World& single_process();
// "1 process" or "2 processes (MPI)", and whether this build can run on several (for `info`).
std::string world_description();
bool built_with_mpi();

// The MPI world's exchanges with blocks cut into pieces of at most `piece` bytes (MPI counts are
// int: world() cuts at 1 GiB); tests pass a small piece to compare a cut exchange with a whole one.
// Only under an MPI launcher in a build with MPI (else they throw).
void mpi_allgather(const void* send, size_t bytes, void* recv, size_t piece);
void mpi_alltoall(const void* send, size_t bytes, void* recv, size_t piece);

}  // namespace scalify::platform
