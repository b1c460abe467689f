// `scalify unit-factors`: estimates alpha = 1/std(f(x)) and beta = 1/std(f'(x) g) of elementwise
// activations from large Gaussian samples (as the Unit Scaling paper did) and prints them beside
// Table A.2.
#include <cmath>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "scalify/unit/factors.hpp"

namespace scalify::cli {

void add_unit_factors_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("unit-factors", "Estimate unit-scaling factors of activations and compare with Table A.2");
  auto samples = std::make_shared<int64_t>(int64_t(1) << 22);
  auto seed = std::make_shared<uint64_t>(1);
  cmd->add_option("--samples", *samples, "Gaussian samples per activation")
      ->capture_default_str()
      ->transform(integer())
      ->check(CLI::Range(int64_t(1000), int64_t(1) << 28));
  cmd->add_option("--seed", *seed, "Random seed (>= 0)")->capture_default_str()->transform(non_negative_integer());
  cmd->callback([samples, seed] {
    std::printf("%-8s %9s %9s %7s   %9s %9s %7s\n", "op", "alpha", "table", "diff", "beta", "table", "diff");
    for (const unit::ActivationFactors& f : unit::table_a2_activations()) {
      const unit::Estimate e = unit::estimate_factors(f.op, *samples, *seed);
      std::printf("%-8s %9.4f %9.4f %6.2f%%   %9.4f %9.4f %6.2f%%\n", std::string(f.name).c_str(), e.alpha, f.alpha,
                  100 * (e.alpha / f.alpha - 1), e.beta, f.beta, 100 * (e.beta / f.beta - 1));
    }
  });
}

}  // namespace scalify::cli
