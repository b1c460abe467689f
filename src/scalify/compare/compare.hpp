#pragma once
// `scalify compare`: one model, one corpus, one seed, trained under each recipe in turn, then
// compared with FP32 in a report folder:
//   report.md       the table (each delta with its window-sampling error and a verdict), the plots,
//                   the command, `scalify info` and a reading generated from the verdicts
//   summary.csv     one row per recipe (summary.json: the same, plus the configuration)
//   loss.png        training (lines) and validation (points) loss of every recipe, FP32 emphasised
//   loss_delta.png  each recipe's validation loss minus its baseline's, over steps
//   compare.json    what was asked (recipes, config), so --resume can continue
//   runs/<recipe>/  each recipe's own run folder (metrics, checkpoint) and its outcome.json
// A recipe that diverges is reported as such, with its step, and the comparison goes on.
#include <functional>
#include <string>
#include <vector>

#include "scalify/compare/noise.hpp"
#include "scalify/train/config.hpp"
#include "scalify/train/trainer.hpp"

namespace scalify::compare {

// Validation loss within this many nats of the baseline counts as parity (seed 000's claim).
constexpr double kParityNats = 0.05;

struct CompareConfig {
  train::TrainConfig base;           // model, data, steps, seed, ... (recipe and out are set per recipe)
  std::vector<std::string> recipes;  // preset names or recipe JSON files, in order
  std::string out = "runs/compare";
};

// Named lists: "seeds" (every preset, the default), "fp8", "fp16", "fp4",
// "scalify", "unit", "per_tensor"; or comma-separated preset names / recipe JSON files. Lists
// may be mixed ("f32,fp8"). Throws naming an unknown entry.
std::vector<std::string> recipe_list(const std::string& spec);
std::vector<std::string> recipe_list_names();

struct RecipeOutcome {
  std::string recipe;         // as given (preset name or JSON file)
  std::string name;           // its run folder's name under runs/
  std::string status = "ok";  // ok | diverged | failed
  std::string note;           // why it diverged or failed
  int64_t diverged_step = -1;
  train::TrainResult result;
  std::string baseline;  // the recipe its delta is taken against: unit_f32 for unit scaling, else f32
  double val_delta = 0;  // validation loss minus the baseline's (NaN when there is none)
  PairedDelta noise;     // the delta's window-sampling error (compare/noise.hpp)
  std::string verdict;   // the stated rule on the delta's 95 % interval (noise.hpp: verdict)
  double seconds = 0, peak_memory_mb = 0;
  std::string quantized;  // quant::quantized_layers
  bool unit_scaled = false;
};

struct CompareReport {
  std::vector<RecipeOutcome> rows;
  std::string dir, table;  // table: markdown
  std::string plot_error;  // why there are no PNGs ("" when there are)
};

// Called with one line per step: the recipe, its step, and the overall ETA.
using CompareProgress = std::function<void(const std::string& line)>;

// Runs the comparison into config.out, which must not hold one yet; or, with resume, continues
// the one in config.out from its compare.json (finished recipes are read back, an interrupted
// one resumes from its checkpoint). `command` is quoted in the report.
CompareReport compare(const CompareConfig& config, bool resume, const CompareProgress& progress = {}, const std::string& command = "");
// The configuration a comparison folder was started with.
CompareConfig comparison_config(const std::string& out);

}  // namespace scalify::compare
