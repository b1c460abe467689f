// `scalify scale-rules`: the scale-propagation rule of every op, as the markdown table that
// docs/SCALE_RULES.md holds (a test keeps the two identical).
#include <cstdio>

#include "commands.hpp"
#include "scalify/scaled/scaled_ops.hpp"

namespace scalify::cli {

void add_scale_rules_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("scale-rules", "Print the scale-propagation rule of every op (markdown)");
  cmd->callback([] { std::fputs(scaled::scale_rules_markdown().c_str(), stdout); });
}

}  // namespace scalify::cli
