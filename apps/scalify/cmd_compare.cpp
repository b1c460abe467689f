// `scalify compare`: every recipe on one model, one corpus, one or more seeds, side by side (compare/compare.hpp).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/error.hpp"
#include "scalify/compare/compare.hpp"

namespace scalify::cli {

namespace {

// "KEY = VALUE" -> "KEY" (trimmed).
std::string key_of(const std::string& line) {
  std::string key = line.substr(0, line.find('='));
  key.erase(0, key.find_first_not_of(" \t"));
  key.erase(key.find_last_not_of(" \t") + 1);
  return key;
}

// Whether a flat TOML config file (already read and validated by --config) sets `key`.
bool file_sets(const std::string& path, const std::string& key) {
  std::istringstream in(io::read_input_file(path, "config", uint64_t(1) << 20));
  for (std::string line; std::getline(in, line);)
    if (line.find('=') != std::string::npos && key_of(line) == key) return true;
  return false;
}

}  // namespace

void add_compare_command(CLI::App& app, const std::string& command_line) {
  struct Opts {
    ConfigOptions config;
    std::string recipes = "seeds", out, resume, seeds;
    int speed_rounds = compare::SpeedConfig{}.rounds;
  };
  auto o = std::make_shared<Opts>();
  std::string lists;
  for (const std::string& n : compare::recipe_list_names()) lists.append(lists.empty() ? "" : ", ").append(n);
  auto* c = app.add_subcommand("compare", "Train one model under each recipe in turn and write a report (table, plots) against FP32");
  c->add_option("--recipes", o->recipes,
                "comma-separated presets, recipe .json files or named lists (" + lists +
                    "); default: seeds (every preset). "
                    "f32 (and unit_f32 for unit scaling, umup for u-μP) is added as the baseline when missing");
  o->config.add_to(c);
  c->add_option("--out", o->out, "report folder (default runs/compare)");
  c->add_option("--seeds", o->seeds,
                "train every recipe under several seeds (model initialisation and batch order): a count N (seeds from the config's "
                "seed on) or a list such as 1,5,9; each delta's interval then holds the seeds' spread (default: one seed)");
  c->add_option("--speed-rounds", o->speed_rounds,
                "rounds of interleaved speed timing after training (each recipe's steps timed in turn on one thread; "
                "default 5; 0: the training runs' own speeds)")
      ->transform(non_negative_integer());
  c->add_option("--resume", o->resume, "continue the comparison in this folder (finished recipes are not rerun)");
  c->callback([o, c, command_line] {
    compare::CompareConfig cc;
    const bool resume = c->count("--resume") > 0;
    platform::every_rank_agrees(platform::world(), [&] {  // each rank reads the same arguments and files
      if (resume) {
        if (o->resume.empty()) throw Error("compare: --resume needs a comparison folder");
        for (const char* opt : {"--recipes", "--config", "--data", "--steps", "--set", "--out", "--seeds", "--speed-rounds"})
          if (c->count(opt) > 0) throw Error(std::string("compare: --resume continues the comparison as it was started; drop ") + opt);
        cc = compare::comparison_config(o->resume);
      } else {
        o->config.apply(cc.base);
        // Enough evaluations for curves, unless the config file or --set chose eval_every.
        const bool eval_every_given =
            std::any_of(o->config.set.begin(), o->config.set.end(), [](const std::string& kv) { return key_of(kv) == "eval_every"; }) ||
            (!o->config.config.empty() && file_sets(o->config.config, "eval_every"));
        if (!eval_every_given) cc.base.eval_every = compare::default_eval_every(cc.base.steps);
        cc.recipes = compare::recipe_list(o->recipes);
        if (c->count("--seeds") > 0) cc.seeds = compare::seed_list(o->seeds, cc.base.seed);
        if (o->speed_rounds > 100) throw Error("compare: --speed-rounds must be 0 to 100");
        cc.speed.rounds = o->speed_rounds;
        if (!o->out.empty()) cc.out = o->out;
      }
    });
    const compare::CompareReport r = compare::compare(cc, resume, status_printer(), command_line);
    if (platform::world().root()) std::fprintf(stderr, "\n");
    std::printf("%s\nreport: %s/report.md\n", r.table.c_str(), r.dir.c_str());
    if (!r.plot_error.empty()) std::fprintf(stderr, "warning: no plots: %s\n", r.plot_error.c_str());
  });
}

}  // namespace scalify::cli
