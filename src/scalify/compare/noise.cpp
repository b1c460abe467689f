#include "scalify/compare/noise.hpp"

#include <cmath>
#include <cstdio>
#include <iterator>

namespace scalify::compare {

double t975(int df) {
  // Student's t, two-sided 95 %, df = 1 .. 30, then 40, 60, 120 (standard tables).
  static const double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
                                  2.120,  2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df < 1) return NAN;
  if (df <= int(std::size(kTable))) return kTable[df - 1];
  return df <= 40 ? 2.021 : df <= 60 ? 2.000 : df <= 120 ? 1.980 : 1.960;  // the next tabled df above, conservatively
}

PairedDelta paired_delta(const std::vector<double>& recipe, const std::vector<double>& baseline, int64_t batch, int64_t windows) {
  const size_t K = recipe.size();
  if (K < 2 || baseline.size() != K || batch < 1 || windows < 1 || int64_t(K) != (windows + batch - 1) / batch) return {NAN, NAN, NAN, 0};
  // Batch k holds n_k windows: Δ = Σ n_k d_k / N, SE² = K/(K-1) Σ (n_k/N)² (d_k - Δ)².
  const double N = double(windows);
  auto n = [&](size_t k) { return double(k + 1 < K ? batch : windows - batch * int64_t(K - 1)); };
  double delta = 0;
  for (size_t k = 0; k < K; ++k) delta += n(k) * (recipe[k] - baseline[k]) / N;
  double var = 0;
  for (size_t k = 0; k < K; ++k) {
    const double w = n(k) / N, dev = recipe[k] - baseline[k] - delta;
    var += w * w * dev * dev;
  }
  var *= double(K) / double(K - 1);
  PairedDelta d{delta, std::sqrt(var), 0, int(K) - 1};
  d.half_width = t975(d.df) * d.se;
  return d;
}

DeltaInterval delta_over_seeds(const std::vector<std::vector<double>>& recipe, const std::vector<std::vector<double>>& baseline,
                               int64_t batch, int64_t windows) {
  const size_t n = recipe.size();
  DeltaInterval d{NAN, NAN, NAN, NAN, int(n)};
  if (n == 0 || baseline.size() != n) return d;
  std::vector<double> deltas;
  std::vector<double> mean_recipe(recipe[0].size(), 0.0), mean_baseline(recipe[0].size(), 0.0);
  for (size_t s = 0; s < n; ++s) {
    const PairedDelta p = paired_delta(recipe[s], baseline[s], batch, windows);
    if (!std::isfinite(p.delta) || recipe[s].size() != mean_recipe.size()) return d;
    deltas.push_back(p.delta);
    for (size_t k = 0; k < mean_recipe.size(); ++k) {
      mean_recipe[k] += recipe[s][k] / double(n);
      mean_baseline[k] += baseline[s][k] / double(n);
    }
  }
  double mean = 0;
  for (double x : deltas) mean += x / double(n);
  double ss = 0;
  for (double x : deltas) ss += (x - mean) * (x - mean);
  d.delta = mean;
  d.window_half_width = paired_delta(mean_recipe, mean_baseline, batch, windows).half_width;
  d.seed_half_width = n > 1 ? t975(int(n) - 1) * std::sqrt(ss / double(n - 1) / double(n)) : 0.0;
  d.half_width = std::hypot(d.window_half_width, d.seed_half_width);
  return d;
}

std::vector<std::string> verdict_names(double bound) {
  char within[48];
  std::snprintf(within, sizeof within, "within +%g of baseline", bound);
  return {"better than baseline", "not distinguishable from baseline", within, "inconclusive", "worse", "no noise estimate"};
}

std::string verdict(double delta, double half_width, double bound) {
  const std::vector<std::string> name = verdict_names(bound);
  if (!std::isfinite(delta) || !std::isfinite(half_width)) return name[5];
  const double lo = delta - half_width, hi = delta + half_width;
  if (hi < 0) return name[0];
  if (lo <= 0) return name[1];
  if (hi <= bound) return name[2];
  if (lo > bound) return name[4];
  return name[3];
}

}  // namespace scalify::compare
