// `scalify info`: what this machine and build run — put it in bug reports and beside benchmarks.
#include <cstdio>

#include "commands.hpp"
#include "scalify/report/system_info.hpp"

namespace scalify::cli {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print the version, CPU features, the kernel ISA and GEMM paths chosen, and the thread count");
  cmd->callback([] { std::fputs(report::system_info_text().c_str(), stdout); });
}

}  // namespace scalify::cli
