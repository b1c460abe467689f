#pragma once
// Scratch folders, a small deterministic text corpus and a tiny trainer config, shared by the
// trainer and compare tests.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "scalify/train/config.hpp"

namespace scalify::testing {

namespace fs = std::filesystem;

// This process's scratch folder, removed when the process exits (a fine-tune of the real model
// leaves gigabytes) unless SCALIFY_KEEP_SCRATCH is set. A forked child exits without removing it.
inline const fs::path& scratch_root() {
  struct Root {
    pid_t owner = ::getpid();
    fs::path path = fs::temp_directory_path() / ("scalify_test_" + std::to_string(owner));
    ~Root() {
      std::error_code ignored;
      if (::getpid() == owner && !std::getenv("SCALIFY_KEEP_SCRATCH")) fs::remove_all(path, ignored);
    }
  };
  static const Root root;
  return root.path;
}

inline fs::path scratch(const std::string& name) {
  const fs::path p = scratch_root() / name;
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

// A PNG: the signature, then an IHDR chunk with a non-zero width and height.
inline bool valid_png(const fs::path& p, uint32_t* width, uint32_t* height) {
  const std::string b = slurp(p);
  if (b.size() < 33 || b.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || b.compare(12, 4, "IHDR") != 0) return false;
  auto be32 = [&](size_t at) {
    return uint32_t(uint8_t(b[at])) << 24 | uint32_t(uint8_t(b[at + 1])) << 16 | uint32_t(uint8_t(b[at + 2])) << 8 | uint8_t(b[at + 3]);
  };
  *width = be32(16);
  *height = be32(20);
  return *width > 0 && *height > 0;
}

// Some English-like text, deterministic, long enough for small batches.
inline fs::path text_corpus() {
  const fs::path p = scratch("corpus.txt");
  std::string t;
  const char* words[] = {"the",    "model", "trains",    "in",      "low",   "precision", "with",
                         "scales", "that",  "propagate", "through", "every", "op"};
  uint32_t s = 7;
  for (int i = 0; i < 12000; ++i) {
    s = s * 1664525u + 1013904223u;
    t += words[(s >> 16) % 13];
    t += (s >> 8) % 9 == 0 ? ".\n" : " ";
  }
  spit(p, t);
  return p;
}

// A run's metrics.jsonl records without tokens_per_s and allreduce_s (the fields the machine's load changes);
// with evaluations false, without the validation records as well.
inline std::vector<std::string> metrics_records(const fs::path& run, bool evaluations = true) {
  std::vector<std::string> lines;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string l; std::getline(in, l);) {
    nlohmann::json j = nlohmann::json::parse(l);
    if (!evaluations && j.contains("val_loss")) continue;
    j.erase("tokens_per_s");
    j.erase("allreduce_s");
    lines.push_back(j.dump());
  }
  return lines;
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
