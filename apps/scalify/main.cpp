// scalify: the command-line tool. `scalify --help` lists the subcommands.
#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "scalify/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"scalify: low-precision training with scale propagation"};
  app.require_subcommand(1);
  scalify::cli::add_formats_command(app);
  scalify::cli::add_snr_command(app);
  scalify::cli::add_scale_rules_command(app);
  scalify::cli::add_unit_factors_command(app);
  scalify::cli::add_info_command(app);
  scalify::cli::add_train_commands(app);
  std::string command_line = "scalify";
  for (int i = 1; i < argc; ++i) command_line.append(" ").append(argv[i]);
  scalify::cli::add_compare_command(app, command_line);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const scalify::Error& e) {
    std::fprintf(stderr, "scalify: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scalify: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
