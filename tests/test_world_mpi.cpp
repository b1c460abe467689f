// The MPI world under `mpirun -np 2` (tests/CMakeLists.txt): exchanges cut into pieces give the
// bytes of whole ones, and check_ranks_agree names the item and the ranks that differ, whatever
// the lengths of the ranks' descriptions. Every rank runs every test.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "scalify/platform/world.hpp"

namespace scalify::platform {
namespace {

// What rank `from` sends rank `to` at byte i: known here, not computed by the code under test.
uint8_t sent(int from, int to, size_t i) { return uint8_t((from * 131 + to * 17 + i * 7 + i / 251) & 0xff); }

const World& mpi() {
  const World& w = world();
  if (w.size() != 2) ADD_FAILURE() << "run under mpirun -np 2 (size " << w.size() << ")";
  return w;
}

TEST(WorldMpi, AlltoallInPiecesGivesTheWholeExchange) {
  const World& w = mpi();
  const size_t bytes = 1000;
  std::vector<uint8_t> send(bytes * size_t(w.size()));
  for (int to = 0; to < w.size(); ++to)
    for (size_t i = 0; i < bytes; ++i) send[size_t(to) * bytes + i] = sent(w.rank(), to, i);
  for (size_t piece : {size_t(1), size_t(7), size_t(64), bytes - 1, bytes, size_t(1) << 30}) {
    std::vector<uint8_t> recv(send.size(), 0);
    mpi_alltoall(send.data(), bytes, recv.data(), piece);
    for (int from = 0; from < w.size(); ++from)
      for (size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(recv[size_t(from) * bytes + i], sent(from, w.rank(), i)) << "piece " << piece << ", from rank " << from << ", byte " << i;
  }
}

TEST(WorldMpi, AllgatherInPiecesGivesTheWholeExchange) {
  const World& w = mpi();
  const size_t bytes = 1000;
  std::vector<uint8_t> send(bytes);
  for (size_t i = 0; i < bytes; ++i) send[i] = sent(w.rank(), 0, i);
  for (size_t piece : {size_t(1), size_t(7), size_t(64), bytes - 1, bytes}) {
    std::vector<uint8_t> recv(bytes * size_t(w.size()), 0);
    mpi_allgather(send.data(), bytes, recv.data(), piece);
    for (int from = 0; from < w.size(); ++from)
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(recv[size_t(from) * bytes + i], sent(from, 0, i)) << "piece " << piece;
  }
}

TEST(WorldMpi, AgreeingRanksPass) {
  const World& w = mpi();
  EXPECT_NO_THROW(check_ranks_agree(w, {{"steps", "20", ""}, {"the corpus", "CRC-32C 0badf00d", ""}}));
  EXPECT_NO_THROW(check_ranks_agree(w, {}));
}

// The message every rank throws.
std::string disagreement(const World& w, const std::vector<Agreed>& items) {
  try {
    check_ranks_agree(w, items);
  } catch (const EveryRankError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(WorldMpi, DisagreementNamesTheItemAndBothValues) {
  const World& w = mpi();
  const std::string steps = w.rank() == 0 ? "20" : "30";
  EXPECT_EQ(disagreement(w, {{"seed", "1", ""}, {"steps", steps, "give every rank the same arguments"}, {"eval_every", steps, ""}}),
            "ranks disagree on steps: rank 0 has 20, rank 1 has 30; give every rank the same arguments");
}

TEST(WorldMpi, DescriptionsOfDifferentLengthsCannotTruncateTheExchange) {
  const World& w = mpi();
  const std::string longer(w.rank() == 0 ? 3 : 100000, 'x');
  EXPECT_EQ(disagreement(w, {{"a", "same", ""}, {"b", longer, ""}}),
            "ranks disagree on b: rank 0 has xxx, rank 1 has " + std::string(80, 'x') + "... (100000 characters)");
  // A long value is shown around its first difference, not from its start.
  const std::string recipe = std::string(5000, 'r') + (w.rank() == 0 ? "e4m3" : "e5m2") + std::string(5000, 'r');
  EXPECT_EQ(disagreement(w, {{"the recipe", recipe, ""}}),
            "ranks disagree on the recipe: rank 0 has ..." + std::string(19, 'r') + "e4m3" + std::string(57, 'r') +
                "... (10004 characters), rank 1 has ..." + std::string(19, 'r') + "e5m2" + std::string(57, 'r') + "... (10004 characters)");
  // One rank with an item more.
  std::vector<Agreed> items{{"a", "same", ""}};
  if (w.rank() == 1) items.push_back({"b", "more", ""});
  EXPECT_EQ(disagreement(w, items),
            "ranks disagree on what they must agree on: rank 0 checks '', rank 1 'b' (different scalify builds? "
            "give every rank the same one)");
}

TEST(WorldMpi, TimeoutIsAPositiveNumberOfSeconds) {
  ASSERT_EQ(unsetenv("SCALIFY_MPI_TIMEOUT"), 0);
  EXPECT_EQ(collective_timeout_s(), 300);
  ASSERT_EQ(setenv("SCALIFY_MPI_TIMEOUT", "2.5", 1), 0);
  EXPECT_EQ(collective_timeout_s(), 2.5);
  for (const char* bad : {"", "abc", "0", "-1", "5s", "inf", "nan"}) {
    ASSERT_EQ(setenv("SCALIFY_MPI_TIMEOUT", bad, 1), 0);
    EXPECT_THROW(collective_timeout_s(), Error) << bad;
  }
  unsetenv("SCALIFY_MPI_TIMEOUT");
}

}  // namespace
}  // namespace scalify::platform
