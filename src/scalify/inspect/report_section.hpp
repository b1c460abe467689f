#pragma once
// The numerics section of `scalify compare`'s report: each finished recipe's exponent
// histograms and scale history (in its run folder's inspect/), and seed 003's post-training
// quantisation sweep of the f32 model.
#include <string>
#include <vector>

namespace scalify::inspect {

struct RunToInspect {
  std::string name;     // the recipe's run folder name (for the report's links)
  std::string run_dir;  // its run folder (holding a final checkpoint)
};

// Markdown (with links relative to the report folder); a run that cannot be inspected gets a
// line saying why instead of failing the report.
std::string numerics_section(const std::vector<RunToInspect>& runs, const std::string& report_dir, const std::string& f32_run_dir);

}  // namespace scalify::inspect
