#pragma once
// Scratch folders, a small deterministic text corpus and a tiny trainer config, shared by the
// trainer and compare tests.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "scalify/train/config.hpp"

namespace scalify::testing {

namespace fs = std::filesystem;

inline fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("scalify_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p;
}
inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
inline void spit(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// Some English-like text, deterministic, long enough for small batches.
inline fs::path text_corpus() {
  const fs::path p = scratch("corpus.txt");
  std::string t;
  const char* words[] = {"the", "model", "trains", "in", "low", "precision", "with", "scales", "that", "propagate", "through", "every", "op"};
  uint32_t s = 7;
  for (int i = 0; i < 12000; ++i) {
    s = s * 1664525u + 1013904223u;
    t += words[(s >> 16) % 13];
    t += (s >> 8) % 9 == 0 ? ".\n" : " ";
  }
  spit(p, t);
  return p;
}

inline train::TrainConfig tiny_run(const fs::path& data, const fs::path& out, const std::string& recipe) {
  train::TrainConfig c;
  c.data = data.string();
  c.out = out.string();
  c.recipe = recipe;
  c.steps = 8;
  c.batch = 4;
  c.model.seq = 16;
  c.model.d_model = 32;
  c.model.layers = 2;
  c.model.heads = 2;
  c.warmup = 2;
  c.eval_every = 3;
  c.eval_windows = 8;
  c.checkpoint_every = 3;
  c.stats_every = 2;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  return c;
}

}  // namespace scalify::testing
