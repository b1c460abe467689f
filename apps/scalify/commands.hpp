#pragma once
// Subcommands of the scalify CLI: each registers its options and its run function.
#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "scalify/io/number_text.hpp"
#include "scalify/train/config.hpp"

namespace scalify::cli {

void add_formats_command(CLI::App& app);
void add_snr_command(CLI::App& app);
void add_scale_rules_command(CLI::App& app);
void add_unit_factors_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_train_commands(CLI::App& app);
void add_inspect_commands(CLI::App& app);
void add_pretrained_commands(CLI::App& app);
void add_compare_command(CLI::App& app, const std::string& command_line);
void add_sweep_command(CLI::App& app, const std::string& command_line);

// Number options take plain decimal text only (io/number_text.hpp), parsed here and handed to
// CLI11 rewritten as the number it is (use with ->transform): CLI11 alone reads "0x10" as 16 and
// "010" as 8, trims " 3", clamps values past 2^64 and wraps "-1" into a uint64_t as 2^64 - 1.
template <class T>
CLI::Validator decimal(const char* what) {
  return CLI::Validator(
      [what](std::string& s) {
        const std::optional<T> v = io::parse_number<T>(s);
        if (!v) return std::string("must be ") + what + ", got '" + s + "'";
        if constexpr (std::is_integral_v<T>) s = std::to_string(*v);
        return std::string();
      },
      "", what);
}
inline CLI::Validator non_negative_integer() { return decimal<uint64_t>("a decimal integer in [0, 2^64)"); }
inline CLI::Validator integer() { return decimal<int64_t>("a decimal integer within 64 bits"); }
inline CLI::Validator finite_number() { return decimal<double>("a finite decimal number"); }

// --config, --data, --steps, --set: the train config keys that `train` and `compare` both take.
struct ConfigOptions {
  std::string config, data, init;
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
