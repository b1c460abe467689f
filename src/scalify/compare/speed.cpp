#include "scalify/compare/speed.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "scalify/platform/world.hpp"
#include "scalify/train/pretrained.hpp"
#include "scalify/train/session.hpp"
#include "scalify/train/trainer.hpp"

namespace scalify::compare {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

SpeedReport time_interleaved(const train::TrainConfig& base, const std::vector<std::string>& recipes, const SpeedConfig& config,
                             const std::function<void(const std::string&)>& progress) {
  SpeedReport rep;
  rep.rounds = config.rounds;
  if (config.rounds <= 0 || recipes.empty()) return rep;
  const platform::World& world = platform::world();
  struct Threads {  // the timing's thread count, the process's own again after
    int before = omp_get_max_threads();
    explicit Threads(int n) {
      if (n > 0) omp_set_num_threads(n);
    }
    ~Threads() { omp_set_num_threads(before); }
  } threads(config.threads);
  const train::TrainConfig model = train::with_pretrained_model(base);  // a pretrained model's shape, read once
  const train::Corpus corpus = train::corpus_for(model);
  const double tokens_per_step = double(base.batch * base.accum * model.model.seq);
  // Per recipe and round: the turn's fastest step; and every timed step's CPU share.
  std::map<std::string, std::vector<double>> fastest, shares;
  std::vector<std::string> order = recipes;
  for (int round = 0; round < config.rounds; ++round) {
    for (size_t i = 0; i < order.size(); ++i) {
      const std::string& recipe = order[i];
      if (!rep.recipes[recipe].error.empty()) continue;
      if (progress)
        progress("speed, round " + std::to_string(round + 1) + "/" + std::to_string(config.rounds) + " [" + std::to_string(i + 1) + "/" +
                 std::to_string(order.size()) + "] " + recipe);
      train::TrainConfig c = base;
      c.recipe = recipe;
      try {
        const std::vector<train::StepTime> t = train::time_training_steps(c, corpus, config.warmup, config.steps, config.min_seconds);
        double best = INFINITY;
        for (const train::StepTime& s : t) {
          best = std::min(best, s.wall_s);
          shares[recipe].push_back(s.cpu_s / std::max(s.wall_s, 1e-9) / double(omp_get_max_threads()));
        }
        fastest[recipe].push_back(best);
      } catch (const std::exception& e) {
        // A recipe that cannot run (it diverged in training too) is not timed; an error on some
        // ranks only would leave the others waiting in a collective.
        if (world.size() > 1 && !dynamic_cast<const platform::EveryRankError*>(&e)) throw;
        rep.recipes[recipe].error = e.what();
      }
    }
    std::reverse(order.begin(), order.end());  // drift within a round cancels over two rounds
  }
  const std::vector<double>& f32 = fastest["f32"];
  for (const std::string& recipe : recipes) {
    RecipeSpeed& s = rep.recipes[recipe];
    const std::vector<double>& mine = fastest[recipe];
    if (!s.error.empty() || mine.empty()) continue;
    s.round_seconds = mine;
    const double best = *std::min_element(mine.begin(), mine.end());
    s.tokens_per_s = tokens_per_step / best;
    s.cpu_share = median(shares[recipe]);
    std::vector<double> ratio;
    for (size_t r = 0; r < mine.size() && f32.size() == mine.size(); ++r) ratio.push_back(f32[r] / mine[r]);
    if (!ratio.empty()) {
      s.vs_f32 = *std::min_element(f32.begin(), f32.end()) / best;
      s.vs_f32_low = *std::min_element(ratio.begin(), ratio.end());
      s.vs_f32_high = *std::max_element(ratio.begin(), ratio.end());
    }
  }
  return rep;
}

std::pair<double, double> middle_range(std::vector<double> v) {
  if (v.empty()) return {NAN, NAN};
  std::sort(v.begin(), v.end());
  const size_t odd = v.size() >= 4 ? 1 : 0;
  return {v[odd], v[v.size() - 1 - odd]};
}

}  // namespace scalify::compare
