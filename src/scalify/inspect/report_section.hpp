#pragma once
// The numerics section of `scalify compare`'s report: each finished recipe's exponent
// histograms and scale history (in its run folder's inspect/), and seed 003's post-training
// quantisation sweep of the f32 model.
#include <string>
#include <vector>

#include "scalify/inspect/scale_history.hpp"

namespace scalify::inspect {

struct RunToInspect {
  std::string name;     // the recipe's run folder name (for the report's links)
  std::string run_dir;  // its run folder (holding a final checkpoint)
  std::string verdict;  // the comparison's verdict on its loss ("" for a baseline)
};

// Markdown (with links relative to the report folder); a run that cannot be inspected gets a
// line saying why instead of failing the report. A recipe whose quantisers flush much of some
// operand is explained from its counters (underflow_reading).
std::string numerics_section(const std::vector<RunToInspect>& runs, const std::string& report_dir, const std::string& f32_run_dir);

// Where a run's quantisers lose values, read off its scale history: the operand (layer and role)
// with the largest mean underflow over the run, what share of its squared norm the flushed values
// carried, and how many operands, of which roles, lose more than 10 %; with the verdict on the
// run's loss. "" when no operand loses 5 % on average.
std::string underflow_reading(const std::string& name, const std::vector<ScaleSeries>& series, const std::string& verdict);

}  // namespace scalify::inspect
