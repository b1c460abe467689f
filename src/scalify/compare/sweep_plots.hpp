#pragma once
// A sweep's pictures (compare/sweep.hpp), drawn by gnuplot: per recipe, <name>_widths.png (the
// final validation loss against the varied value, one curve per width, a panel per depth) and,
// with several depths, <name>_depths.png (one curve per depth, a panel per width). x is on a log
// axis when every value is positive; each curve's best point is circled; diverged cells leave a gap.
#include <string>
#include <vector>

#include "scalify/compare/sweep.hpp"

namespace scalify::compare {

// "" or why there are no PNGs.
std::string write_sweep_plots(const SweepConfig& config, const std::vector<SweepCell>& cells);

}  // namespace scalify::compare
