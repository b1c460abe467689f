#pragma once
// `scalify compare`: one model, one corpus, trained under each recipe in turn (under each of
// several seeds with --seeds), then compared with FP32 in a report folder:
//   report.md       the table (each delta with its 95 % interval and a verdict), the plots, the
//                   command, `scalify info`, a reading generated from the verdicts, and the
//                   numerics section
//   summary.csv     one row per recipe (summary.json: the same, every seed's run, the configuration)
//   delta.png       each recipe's final delta with its interval, coloured by verdict
//   loss_delta.png  each recipe's delta over steps with its interval, a panel per recipe family
//   loss.png        training (lines) and validation (points) loss, a panel per family
//   compare.json    what was asked (recipes, config, seeds, speed rounds), so --resume can continue
//   runs/<recipe>/  each recipe's own run folder (runs/<recipe>_seed<N>/ with several seeds)
// A recipe that diverges is reported as such, with its step, and the comparison goes on. Speeds
// are timed afterwards, the recipes interleaved (compare/speed.hpp).
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "scalify/compare/noise.hpp"
#include "scalify/compare/recipe_lists.hpp"
#include "scalify/compare/speed.hpp"
#include "scalify/train/config.hpp"
#include "scalify/train/trainer.hpp"

namespace scalify::compare {

// Validation loss within this many nats of the baseline counts as parity (seed 000's claim).
constexpr double kParityNats = 0.05;

// Evaluations a comparison makes over a run when the config does not say (enough points for the
// plots to show curves): eval_every for `steps`.
constexpr int64_t kEvalPoints = 10;
int64_t default_eval_every(int64_t steps);

struct CompareConfig {
  train::TrainConfig base;           // model, data, steps, seed, ... (recipe and out are set per recipe)
  std::vector<std::string> recipes;  // preset names or recipe JSON files, in order
  std::string out = "runs/compare";
  std::vector<uint64_t> seeds;  // each recipe runs under each (model init and batch order); empty: base.seed alone
  SpeedConfig speed;            // the interleaved timing after training
};

// --seeds: "N" (a count: N seeds from `first` on) or a comma-separated list of seeds ("1,5,9").
// Throws naming what is wrong (not a number, a repeated seed, none, more than 100).
std::vector<uint64_t> seed_list(const std::string& spec, uint64_t first);

// One recipe's outcome: of one run (one seed), or a table row over every seed.
struct RecipeOutcome {
  std::string recipe;           // as given (preset name or JSON file)
  std::string name;             // its name in the report (the preset name, or the JSON file's stem)
  std::string run;              // its run folder under runs/ (a row's: its first seed's)
  std::vector<uint64_t> seeds;  // the seeds it covers
  std::string status = "ok";    // ok | diverged | failed (a row: ok when every seed is; else the first other status)
  std::string note;             // why it diverged or failed
  int64_t diverged_step = -1;
  // A row's: the mean over the seeds (max_underflow and skipped steps: the largest;
  // val_batch_losses: each batch's mean); with several seeds, the losses are NaN unless every
  // seed finished.
  train::TrainResult result;
  std::string baseline;  // the recipe its delta is taken against: unit_f32 for unit scaling, umup for u-μP, else f32
  // Validation loss minus the baseline's of the same seed, mean over the seeds; NaN unless the
  // recipe and its baseline finished under every seed.
  double val_delta = NAN;
  DeltaInterval noise;  // its 95 % interval: window sampling and seed spread (compare/noise.hpp)
  std::string verdict;  // the stated rule on that interval (noise.hpp: verdict)
  double seconds = 0, peak_memory_mb = 0;
  std::string quantized;  // quant::quantized_layers
  bool unit_scaled = false;
  bool umup = false;  // a u-μP recipe (its baseline is umup)
  RecipeSpeed speed;  // a row's interleaved timing (compare/speed.hpp)
};

struct CompareReport {
  std::vector<RecipeOutcome> rows;  // one per recipe, over every seed
  std::vector<RecipeOutcome> runs;  // one per recipe and seed, seeds outermost
  SpeedReport speed;
  std::string dir, table;  // table: markdown
  std::string plot_error;  // why there are no PNGs ("" when there are)
};

// Called with one line per step: the recipe, its step, and the overall ETA.
using CompareProgress = std::function<void(const std::string& line)>;
// The same step as values, for callers that read them rather than print them (Python's progress).
struct CompareStep {
  size_t run = 0, runs = 0;  // this recipe run (1-based) of the comparison's runs (recipes x seeds)
  std::string recipe;        // its run name
  uint64_t seed = 0;
  train::StepProgress step;  // its step of its steps, loss, tokens/s, ...
  double eta_s = 0;          // the whole comparison's
  std::string line;          // the progress line
};
using CompareSteps = std::function<void(const CompareStep& step)>;
// What a progress callback throws to stop the whole comparison (Python: Ctrl-C, an error in the
// caller's own callback), where an error in one recipe's run makes that recipe a failed row:
// compare lets it through, the recipe then training left as an interrupted run that a resume
// continues. `cause`: the caller's own exception, for it to rethrow.
class Stopped : public std::runtime_error {
 public:
  explicit Stopped(std::exception_ptr cause) : std::runtime_error("compare: stopped by its caller"), cause(std::move(cause)) {}
  std::exception_ptr cause;
};

// Runs the comparison into config.out, which must not hold one yet; or, with resume, continues
// the one in config.out from its compare.json (finished recipes are read back, an interrupted
// one resumes from its checkpoint). `command` is quoted in the report. `steps`: each training step
// as values (after `progress` has its line).
CompareReport compare(const CompareConfig& config, bool resume, const CompareProgress& progress = {}, const std::string& command = "",
                      const CompareSteps& steps = {});
// The configuration a comparison folder was started with.
CompareConfig comparison_config(const std::string& out);

}  // namespace scalify::compare
