#pragma once
// Speed that a busy host cannot invent: the recipes' training steps timed interleaved, in one
// process, on one thread. Each round builds every recipe's model in turn (the order reversed
// every other round) and times a few of its steps after a warm-up. A recipe's speed against f32
// is f32's fastest step over the recipe's fastest step, each the fastest of all rounds: a load
// that comes and goes, or a turn whose buffers landed badly (some turns run 20-40 % slower with
// the same code and inputs), only ever slows a step down, so the fastest is the most repeatable
// measure of what a step costs; the per-round ratios (f32's and the recipe's fastest step of the
// same round) give the range beside it and the busy-host warning. One thread, because a steady
// load does not slow every recipe alike when threads share cores with it: a thread waiting at a
// barrier for its preempted partner costs a recipe of many small parallel loops more than one of
// a few large GEMMs (measured, docs/BENCHMARKS.md: two threads beside one or two busy processes
// moved ratios by up to 20 %, one thread by at most 4.2 %). The ratio is thus each recipe's
// compute cost per step; the training runs' multi-threaded tokens/s are reported beside it.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "scalify/train/config.hpp"

namespace scalify::compare {

struct SpeedConfig {
  int rounds = 5;            // 0: no interleaved timing (the table shows the training runs' speeds)
  int64_t warmup = 2;        // untimed steps of each recipe's turn (caches, thread pools, buffers)
  int64_t steps = 4;         // timed steps of each turn (the fastest counts) ...
  double min_seconds = 0.5;  // ... and more until they add up to this (at most 10 x steps): small models' steps are short
  int threads = 1;           // OpenMP threads while timing (0: the process's own)
};

struct RecipeSpeed {
  double tokens_per_s = 0;                 // of the fastest step of all rounds
  double vs_f32 = 0;                       // f32's fastest step of all rounds over this recipe's
  double vs_f32_low = 0, vs_f32_high = 0;  // the per-round ratio's lowest and highest round
  std::vector<double> round_seconds;       // each round's fastest step (the rounds it ran in)
  double cpu_share = 0;                    // median over the timed steps of CPU seconds / (wall seconds x timing threads)
  std::string error;                       // why it could not be timed ("" when it was)
};

struct SpeedReport {
  std::map<std::string, RecipeSpeed> recipes;  // by recipe
  int rounds = 0;
};

// Times `recipes` (f32 among them: the ratios' reference) under `base` (its model, data, seed),
// calling progress with a line per turn. With several ranks (data parallelism) every rank takes
// part, as in training.
SpeedReport time_interleaved(const train::TrainConfig& base, const std::vector<std::string>& recipes, const SpeedConfig& config,
                             const std::function<void(const std::string&)>& progress);

// The lowest and highest of v, from 4 values on without the lowest and highest one: the spread
// over rounds that says a host was busy, since one odd round is not a busy host. NaN when empty.
std::pair<double, double> middle_range(std::vector<double> v);

}  // namespace scalify::compare
