// `scalify sweep`: one hyperparameter over a grid, on several widths and depths, under each recipe:
// does its best value transfer? (compare/sweep.hpp)
#include <cstdio>
#include <memory>
#include <string>

#include <unistd.h>

#include "commands.hpp"
#include "scalify/compare/compare.hpp"
#include "scalify/compare/sweep.hpp"
#include "scalify/error.hpp"
#include "scalify/platform/world.hpp"

namespace scalify::cli {

void add_sweep_command(CLI::App& app, const std::string& command_line) {
  struct Opts {
    ConfigOptions config;
    std::string vary, widths, depths, recipes = "f32", out = "runs/sweep", seeds;
  };
  auto o = std::make_shared<Opts>();
  auto* c = app.add_subcommand("sweep",
                               "Train a grid of one hyperparameter x model widths x depths x recipes and report whether the best "
                               "value transfers across widths and depths (table, verdict, plots)");
  c->add_option("--vary", o->vary,
                "the train-config key and its values: KEY=v1,v2,... (numbers or powers such as 2^-8) or KEY=2^a:2^b (every power of two "
                "from 2^a to 2^b), "
                "e.g. lr=2^-10:2^-4; at least 2 values. Varying lr moves min_lr with it (the config's min_lr/lr ratio)")
      ->required();
  c->add_option("--widths", o->widths,
                "comma-separated d_model values (default: the config's); heads = width / the config's head dimension "
                "(d_model / heads), so every width must be a multiple of it");
  c->add_option("--depths", o->depths, "comma-separated layer counts (default: the config's)");
  c->add_option("--recipes", o->recipes, "comma-separated presets, recipe .json files or compare's named lists (default f32)");
  o->config.add_to(c);
  c->add_option("--seeds", o->seeds, "each cell under several seeds, its loss their mean: a count N or a list such as 1,5,9");
  c->add_option("--out", o->out, "report folder (default runs/sweep); the same command again in the same folder skips the finished cells");
  c->callback([o, c, command_line] {
    compare::SweepConfig sc;
    platform::every_rank_agrees(platform::world(), [&] {
      o->config.apply(sc.base);
      sc.grid = compare::parse_vary(o->vary, sc.base);
      if (c->count("--widths") > 0) sc.widths = compare::parse_sizes(o->widths, "--widths");
      if (c->count("--depths") > 0) sc.depths = compare::parse_sizes(o->depths, "--depths");
      sc.recipes = compare::recipe_list(o->recipes);
      if (c->count("--seeds") > 0) sc.seeds = compare::seed_list(o->seeds, sc.base.seed);
      sc.out = o->out;
    });
    const bool tty = ::isatty(STDERR_FILENO);
    const compare::SweepReport r = compare::sweep(
        sc, status_printer(),
        [tty](const compare::SweepCell&, size_t, size_t, const std::string& line) {  // stays, where step lines are redrawn
          if (platform::world().root()) std::fprintf(stderr, tty ? "\r%-120s\n" : "%s\n", line.c_str());
        },
        command_line);
    std::printf("%s\nreport: %s/report.md\n", r.table.c_str(), r.dir.c_str());
    if (!r.plot_error.empty()) std::fprintf(stderr, "warning: no plots: %s\n", r.plot_error.c_str());
  });
}

}  // namespace scalify::cli
