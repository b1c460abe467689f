#pragma once
// `scalify sweep`: does a hyperparameter transfer? One train-config key is varied over a grid of
// values, on several model widths (d_model) and depths (layers), under each recipe; every cell is
// an ordinary run folder. The report folder holds
//   report.md             per recipe: a table of final validation loss per (shape, value), the best
//                         value of each shape marked, and the verdict across widths and depths
//   <recipe>.csv          the same table, one row per shape
//   <recipe>_widths.png   loss against the value, one curve per width (a panel per depth), best points marked
//   <recipe>_depths.png   the same, one curve per depth (a panel per width); only with several depths
//   sweep.json            what was asked: rerunning the same sweep in the same folder skips finished cells
//   runs/<recipe>/w<width>_d<depth>/<key>=<value>[_seed<N>]/  each cell's run folder, its outcome in cell.json
// Width: the head dimension stays the config's (d_model / heads), so heads = width / head dimension
// (kv_heads keeps its ratio to heads, a set mlp_hidden its ratio to d_model). Varying lr moves
// min_lr with it (the config's min_lr / lr ratio).
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scalify/train/config.hpp"

namespace scalify::compare {

// One value of the varied key: its number, the text the config is set with, its label in the report.
struct SweepValue {
  double x = 0;
  std::string text, label;
};

// --vary: "KEY=v1,v2,..." (numbers or powers of two such as 2^-8, at least 2, no repeats) or "KEY=2^a:2^b" (every power of two
// from 2^a to 2^b, integer a <= b). Values come back in ascending order (one grid step apart each).
// Throws naming the problem: an unknown or non-numeric key, a value that is not a number or that
// the key refuses, fewer than 2 values, an empty range.
struct SweepGrid {
  std::string key;
  std::vector<SweepValue> values;
};
SweepGrid parse_vary(const std::string& spec, const train::TrainConfig& base);
// --widths / --depths: comma-separated positive integers, no repeats. `what` names the option.
std::vector<int64_t> parse_sizes(const std::string& spec, const std::string& what);

struct SweepConfig {
  train::TrainConfig base;  // everything but the varied key, the shape, recipe, seed and out
  SweepGrid grid;
  std::vector<int64_t> widths, depths;  // empty: the config's d_model / layers alone
  std::vector<std::string> recipes;     // presets or recipe JSON files
  std::vector<uint64_t> seeds;          // each cell's loss: the mean over these; empty: base.seed alone
  std::string out = "runs/sweep";
};

// The config of one cell: base with the width (heads from the head dimension), depth and value set.
// Throws when the width is not a multiple of the head dimension (or of the kv-head group).
train::TrainConfig cell_config(const SweepConfig& config, const std::string& recipe, int64_t width, int64_t depth, size_t value,
                               uint64_t seed);

// A final loss a sweep cannot count: not finite, or above the untrained model's (the larger of the
// run's first step's loss, before any update, and ln vocab), so the run diverged.
bool diverged_loss(double loss, double untrained);
// The index of the lowest loss of one shape's row (a diverged cell's is NaN: never the best); ties
// go to the lower value. nullopt when every value diverged.
std::optional<size_t> best_value(const std::vector<double>& losses);
// Whether the best values of shapes that differ along one axis agree: the largest distance, in
// grid steps, between two of them (nullopt for a shape with none is left out). "transfers" when
// at most 1, "moves by N steps" beyond; "no verdict (...)" with fewer than two shapes to compare.
struct TransferVerdict {
  std::optional<int64_t> steps;  // nullopt: nothing to compare
  std::string text;
};
TransferVerdict transfer_verdict(const std::vector<std::optional<size_t>>& best);

// One cell's outcome (over its seeds).
struct SweepCell {
  std::string recipe;
  int64_t width = 0, depth = 0;
  size_t value = 0;           // index into the grid's values
  double val_loss = NAN;      // mean over seeds; NaN unless every seed finished
  std::string status = "ok";  // ok | diverged (any seed: not finite, or above its untrained loss) | failed
  std::string note;
  std::vector<std::string> runs;  // run folders, relative to the sweep's folder
};

struct SweepRecipeReport {
  std::string recipe, name;
  // across_widths: per depth, the best values of the widths compared; the largest distance wins.
  TransferVerdict across_widths, across_depths;
  std::string csv, table;  // the table as CSV and markdown
};

struct SweepReport {
  std::vector<SweepCell> cells;  // recipes x depths x widths x values, in that nesting
  std::vector<SweepRecipeReport> recipes;
  std::string dir, table;  // table: every recipe's, markdown
  std::string plot_error;  // why there are no PNGs ("" when there are)
};

// The tables and verdicts from the cells (recipe order as config.recipes).
std::vector<SweepRecipeReport> summarise_sweep(const SweepConfig& config, const std::vector<SweepCell>& cells);

// Runs the sweep into config.out: a new folder, or one holding this same sweep (its finished cells
// are read back; an interrupted cell resumes from its checkpoint). step: a line per training step
// ("[k/n] recipe w.. d.. key=value  step ..."); cell: each finished cell with its line
// ("[k/n] recipe w.. d.. key=value: val loss ..."). A callback that throws compare::Stopped
// (compare.hpp) stops the whole sweep, the cell then training left to resume on a rerun.
using SweepStepProgress = std::function<void(const std::string& line)>;
using SweepCellProgress = std::function<void(const SweepCell& cell, size_t k, size_t n, const std::string& line)>;
SweepReport sweep(const SweepConfig& config, const SweepStepProgress& step = {}, const SweepCellProgress& cell = {},
                  const std::string& command = "");

}  // namespace scalify::compare
