#pragma once
// How far a validation-loss difference between two recipes can move by which windows happened to
// be evaluated: both models are evaluated on the same windows, in the same batches, so the
// difference of their batch means is paired, and its spread over the batches gives the
// difference's standard error (the batch-means estimate; windows of one batch are consecutive
// text, batches far apart). It is the window-sampling error of one run; over several seeds
// (delta_over_seeds), the spread of the seeds' deltas adds the seed-to-seed variation.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace scalify::compare {

struct PairedDelta {
  double delta = 0;       // recipe minus baseline, over all windows
  double se = 0;          // its standard error
  double half_width = 0;  // of the two-sided 95 % interval: t(0.975, df) * se
  int df = 0;             // batches - 1
};
// From each model's batch means (in batch order; batches of `batch` windows, the last one the
// rest of `windows`). NaN everywhere when the two lists differ in length or hold fewer than 2.
PairedDelta paired_delta(const std::vector<double>& recipe, const std::vector<double>& baseline, int64_t batch, int64_t windows);

// A delta over one or more seeds (each seed's recipe paired with the baseline of the same seed;
// every seed evaluated on the same windows): the mean of the seeds' deltas and its 95 % interval,
// whose half-width is two half-widths in quadrature: the window-sampling error of the
// seed-averaged batch means (paired_delta), and the seeds' spread, t(0.975, seeds - 1) sd / sqrt(seeds)
// (0 with one seed: then seed-to-seed variation is not measured).
struct DeltaInterval {
  double delta = NAN, half_width = NAN;  // NaN until formed
  double window_half_width = NAN, seed_half_width = NAN;
  int seeds = 0;
};
// recipe[s] and baseline[s]: seed s's batch means (paired_delta's arguments). NaN where any
// seed's pair gives no paired_delta, or with no seeds.
DeltaInterval delta_over_seeds(const std::vector<std::vector<double>>& recipe, const std::vector<std::vector<double>>& baseline,
                               int64_t batch, int64_t windows);

// Student's t quantile at 0.975 for df degrees of freedom (the published table; 1.96 beyond 120).
double t975(int df);

// The stated rule, on the 95 % interval [delta - half_width, delta + half_width] and the parity
// bound b (kParityNats): "better than baseline" (interval below 0), "not distinguishable from
// baseline" (it holds 0), "within +b of baseline" (above 0, at most b), "worse" (above b),
// "inconclusive" (it holds b); "no noise estimate" when it cannot be formed.
std::string verdict(double delta, double half_width, double bound);
// Every verdict verdict() can give, best first.
std::vector<std::string> verdict_names(double bound);

}  // namespace scalify::compare
