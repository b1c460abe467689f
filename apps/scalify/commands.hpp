#pragma once
// Subcommands of the scalify CLI: each registers its options and its run function.
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "scalify/train/config.hpp"

namespace scalify::cli {

void add_formats_command(CLI::App& app);
void add_snr_command(CLI::App& app);
void add_scale_rules_command(CLI::App& app);
void add_unit_factors_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_train_commands(CLI::App& app);
void add_inspect_commands(CLI::App& app);
void add_compare_command(CLI::App& app, const std::string& command_line);

// For unsigned options: rejects a minus sign, which CLI11 would read into a uint64_t as 2^64 - 1.
inline CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& s) { return s.find('-') == std::string::npos ? std::string() : "must be a non-negative integer, got " + s; },
      "", "non-negative integer");
}

// --config, --data, --steps, --set: the train config keys that `train` and `compare` both take.
struct ConfigOptions {
  std::string config, data;
  int64_t steps = 0;
  std::vector<std::string> set;
  CLI::Option* steps_option = nullptr;  // counts whether --steps was given
  void add_to(CLI::App* command);
  // --config replaces c (when given and load_file), then --data, --steps and --set override keys;
  // the config's own validation judges the values.
  void apply(train::TrainConfig& c, bool load_file = true) const;
};

// A status line for long work: redrawn in place on a terminal, every 50th line otherwise.
std::function<void(const std::string&)> status_printer();

}  // namespace scalify::cli
