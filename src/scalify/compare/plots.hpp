#pragma once
// The comparison's pictures, drawn by gnuplot from each run's metrics.jsonl:
//   delta.png       first: every recipe's final delta against its baseline with its 95 % interval,
//                   coloured by verdict, beside 0 and the parity bound
//   loss_delta.png  each recipe's delta at every evaluation with its interval (a shaded band),
//                   a panel per recipe family (recipe_lists.hpp), one shared y-axis
//   loss.png        training loss (10-step means, lines) and validation loss (points), a panel per
//                   family with its baseline in black, shared axes cut to the part after warm-up
// Within a panel every recipe has its own colour and line style. Over several seeds the curves are
// the seeds' means and the intervals those of compare/noise.hpp's delta_over_seeds.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/compare/compare.hpp"

namespace scalify::compare {

// rows: the report's rows (one per recipe); runs: every (recipe, seed) run, whose folders are
// under dir/runs/. batch: the validation batch (for the intervals). "" or why there are no PNGs.
std::string write_comparison_plots(const std::string& dir, const std::vector<RecipeOutcome>& rows, const std::vector<RecipeOutcome>& runs,
                                   int64_t batch);

}  // namespace scalify::compare
