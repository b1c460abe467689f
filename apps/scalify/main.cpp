// scalify: the command-line tool. `scalify --help` lists the subcommands.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "commands.hpp"
#include "scalify/error.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/report/system_info.hpp"

namespace {

// The first collective of every command under mpirun: the ranks run the same command (a `train`
// beside an `eval` would wait for it forever) with the same kernels (ranks on CPUs that choose
// others compute other bits, and drift apart).
void check_ranks_agree_on_process(const scalify::platform::World& world, const std::string& command) {
  std::vector<scalify::platform::Agreed> items{{"the command", "'" + command + "'", "every rank of a run runs the same command"}};
  for (const auto& [what, value] : scalify::report::bit_deciding_info())
    items.push_back({"'" + what + "' (scalify info)", value,
                     "the build and the kernels its CPU chooses decide a run's bits: give every rank the same build and the same choice "
                     "(mpirun -x SCALIFY_ISA=avx2 -x SCALIFY_GEMM=f32 -x DNNL_MAX_CPU_ISA=AVX2 makes every CPU with AVX2 choose alike; "
                     "docs/DATA_PARALLEL.md)"});
  scalify::platform::check_ranks_agree(world, items);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scalify: low-precision training with scale propagation"};
  app.require_subcommand(1);
  scalify::cli::add_formats_command(app);
  scalify::cli::add_snr_command(app);
  scalify::cli::add_scale_rules_command(app);
  scalify::cli::add_unit_factors_command(app);
  scalify::cli::add_info_command(app);
  scalify::cli::add_train_commands(app);
  scalify::cli::add_inspect_commands(app);
  scalify::cli::add_pretrained_commands(app);
  std::string command_line = "scalify";
  for (int i = 1; i < argc; ++i) command_line.append(" ").append(argv[i]);
  scalify::cli::add_compare_command(app, command_line);
  scalify::cli::add_sweep_command(app, command_line);
  // A first word that names no subcommand: say so (CLI11 would only report an unexpected argument).
  if (argc > 1 && argv[1][0] != '-') {
    std::string valid;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->check_name(argv[1]);
      valid.append(valid.empty() ? "" : ", ").append(sub->get_name());
    }
    if (!known) {
      std::fprintf(stderr, "scalify: error: unknown subcommand '%s'; valid subcommands: %s\n", argv[1], valid.c_str());
      return 2;
    }
  }
  int ranks = 1;
  bool root = true;
  std::string who = "scalify";
  try {
    // Under mpirun: MPI starts here. Rank 0 speaks for the run; the others print only errors.
    const scalify::platform::World& world = scalify::platform::world();
    ranks = world.size();
    root = world.root();
    // Data parallelism is train's, compare's and sweep's; any other command on several ranks would only
    // do the same work N times, each rank writing the same files.
    const std::string command = argc > 1 ? argv[1] : "";
    if (ranks > 1) check_ranks_agree_on_process(world, command);
    if (ranks > 1 && command != "train" && command != "compare" && command != "sweep" && command != "info" && !command.starts_with("-")) {
      if (world.root())
        std::fprintf(stderr, "scalify: error: '%s' runs on one process; only train, compare and sweep use several (mpirun -np %d)\n",
                     command.c_str(), ranks);
      return 2;
    }
    if (!root) {
      who = "scalify (rank " + std::to_string(world.rank()) + ")";
      if (!std::freopen("/dev/null", "w", stdout)) world.abort(2);
    }
  } catch (const scalify::platform::EveryRankError& e) {
    if (root) std::fprintf(stderr, "scalify: error: %s\n", e.what());
    return 2;
  } catch (const scalify::Error& e) {
    std::fprintf(stderr, "scalify: error: %s\n", e.what());
    return 2;
  }
  // An error on one rank ends them all (the others may wait in a collective for it); one seen
  // on every rank alike ends each the same way.
  auto fail = [&](int code, const char* kind, const std::string& message) {
    std::fprintf(stderr, "%s: %s: %s\n", who.c_str(), kind, message.c_str());
    if (ranks > 1) scalify::platform::world().abort(code);
    return code;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // Arguments only this rank refuses (an MPMD launch): the others wait in a collective for it.
    if (ranks > 1 && code != 0) scalify::platform::world().abort(code);
    return code;
  } catch (const scalify::platform::EveryRankError& e) {
    if (root) std::fprintf(stderr, "scalify: error: %s\n", e.what());
    return 2;
  } catch (const scalify::Error& e) {
    return fail(2, "error", e.what());
  } catch (const std::filesystem::filesystem_error& e) {  // the file system refused a path the user gave
    return fail(2, "error", "'" + e.path1().string() + "': " + e.code().message());
  } catch (const std::bad_alloc&) {
    return fail(2, "error", "out of memory (the work needs more memory than this process may use)");
  } catch (const std::exception& e) {
    return fail(3, "internal error", e.what());
  }
  return 0;
}
