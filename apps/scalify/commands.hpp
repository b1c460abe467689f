#pragma once
// Subcommands of the scalify CLI: each registers its options and its run function.
#include <CLI/CLI.hpp>

namespace scalify::cli {

void add_formats_command(CLI::App& app);
void add_snr_command(CLI::App& app);
void add_scale_rules_command(CLI::App& app);
void add_unit_factors_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_train_commands(CLI::App& app);

}  // namespace scalify::cli
