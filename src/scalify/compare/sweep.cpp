#include "scalify/compare/sweep.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "scalify/compare/compare.hpp"
#include "scalify/compare/sweep_plots.hpp"
#include "scalify/error.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/folder_lock.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/io/number_text.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/train/trainer.hpp"

namespace scalify::compare {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Keys a sweep sets itself, or that are not numbers on a grid.
const std::set<std::string> kNotVaried = {"d_model", "layers", "heads", "kv_heads",   "seed",        "out",
                                          "data",    "recipe", "init",  "init_files", "init_weights"};

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);) out.push_back(trim(item));
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

// "2^k" -> k.
std::optional<int> power_of_two(const std::string& text) {
  if (!text.starts_with("2^")) return std::nullopt;
  const std::optional<int64_t> k = io::parse_number<int64_t>(text.substr(2));
  if (!k || *k < -1000 || *k > 1000) return std::nullopt;
  return int(*k);
}

std::string shortest(double x) {  // the shortest text that reads back as x
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "–";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string run_name(const std::string& recipe) {
  const std::string name = recipe.ends_with(".json") ? fs::path(recipe).stem().string() : recipe;
  if (name.empty() || name[0] == '.') throw Error("sweep: recipe file '" + recipe + "' needs a name that does not start with '.'");
  return name;
}

std::string shape_label(int64_t width, int64_t depth) { return "w" + std::to_string(width) + "_d" + std::to_string(depth); }

// A cell's run folder, relative to the sweep's folder.
std::string run_folder(const SweepConfig& c, const std::string& recipe, int64_t width, int64_t depth, size_t value, uint64_t seed) {
  return (fs::path("runs") / run_name(recipe) / shape_label(width, depth) /
          (c.grid.key + "=" + c.grid.values[value].label + (c.seeds.size() > 1 ? "_seed" + std::to_string(seed) : "")))
      .string();
}

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// What the sweep was asked, so a rerun can tell its own folder from another sweep's.
json sweep_json(const SweepConfig& c) {
  train::TrainConfig base = c.base;
  base.out.clear();  // the same sweep, whichever way its folder is spelt
  std::vector<std::string> values;
  for (const SweepValue& v : c.grid.values) values.push_back(v.text);
  return {{"key", c.grid.key},    {"values", values}, {"widths", c.widths},      {"depths", c.depths},
          {"recipes", c.recipes}, {"seeds", c.seeds}, {"config", base.to_toml()}};
}

struct RunOutcome {
  double val_loss = NAN;
  std::string status = "ok", note;
};

// The loss a run that learned nothing stays near: the larger of a uniform prediction's (ln vocab)
// and its first step's (before any update, in metrics.jsonl; one batch, so noisy). A standard
// model starts above ln vocab, a u-μP one (its 1/fan_in readout) just below it, where a barely
// moving run at a tiny learning rate must not count as diverged.
double untrained_loss(const train::TrainConfig& c) {
  const double uniform = std::log(double(c.model.vocab));
  const fs::path metrics = fs::path(c.out) / "metrics.jsonl";
  std::ifstream in;
  if (fs::is_regular_file(metrics)) in.open(metrics);
  for (std::string line; std::getline(in, line);) {
    const json j = io::try_parse_json(line);
    if (!j.is_discarded() && j.value("step", int64_t(-1)) == 0 && j.contains("loss") && j["loss"].is_number()) {
      const double loss = j["loss"].get<double>();
      if (std::isfinite(loss)) return std::max(loss, uniform);
    }
  }
  return uniform;
}

RunOutcome train_cell(const train::TrainConfig& c, bool resume, const train::Progress& progress) {
  RunOutcome o;
  try {
    const train::TrainResult r = train::train(c, resume, progress);
    o.val_loss = r.val_loss;
    if (r.skipped * 2 > r.steps) {
      o.status = "diverged";
      o.note = "skipped " + std::to_string(r.skipped) + " of " + std::to_string(r.steps) + " steps";
    }
  } catch (const train::Diverged& e) {
    o.status = "diverged";
    o.note = e.what();
  } catch (const Stopped&) {  // the caller stops the whole sweep (Python: Ctrl-C), the run left resumable
    throw;
  } catch (const std::exception& e) {  // a cell that cannot run is reported; the sweep goes on
    if (platform::world().size() > 1 && !dynamic_cast<const platform::EveryRankError*>(&e)) throw;
    o.status = "failed";
    o.note = e.what();
  }
  const double untrained = std::stod(platform::from_root(platform::world(), [&] { return shortest(untrained_loss(c)); }));
  if (o.status == "ok" && diverged_loss(o.val_loss, untrained)) {
    o.status = "diverged";
    o.note = std::isfinite(o.val_loss) ? "validation loss " + fixed(o.val_loss, 3) + " above the untrained model's " + fixed(untrained, 3)
                                       : "the validation loss is not finite";
  }
  return o;
}

// Trains (or reads back) one run of a cell. Finished: its cell.json, written after the run ends.
RunOutcome run_cell(const train::TrainConfig& c, const train::Progress& progress) {
  const fs::path run(c.out), outcome_file = run / "cell.json";
  const platform::World& world = platform::world();
  const std::string done = platform::from_root(
      world, [&] { return fs::exists(outcome_file) ? io::read_input_file(outcome_file.string(), "sweep", 1 << 20) : std::string(); });
  if (!done.empty()) {
    try {
      const json j = json::parse(done);
      RunOutcome o{j.at("val_loss").is_number() ? j.at("val_loss").get<double>() : NAN, j.at("status"), j.at("note")};
      if (o.status != "failed") return o;  // a failed cell (an error, not divergence) is tried again
    } catch (const json::exception& e) {
      throw Error("sweep: corrupt '" + outcome_file.string() + "' (" + e.what() + "); delete it to rerun that cell");
    }
  }
  // An interrupted run resumes from its checkpoint; anything else there starts over.
  const bool resume = platform::from_root(world, [&] {
                        if (fs::exists(run / "checkpoint.safetensors") && !fs::exists(run / "model.safetensors")) return std::string("1");
                        if (fs::exists(run)) {
                          const io::FolderLock owned(run.string(), "sweep");
                          fs::remove_all(run);
                        }
                        return std::string();
                      }) == "1";
  const RunOutcome o = train_cell(c, resume, progress);
  if (world.root()) {
    io::make_folder(run.string());
    io::write_text_atomically(outcome_file.string(),
                              json{{"val_loss", num(o.val_loss)}, {"status", o.status}, {"note", o.note}}.dump(2) + "\n");
  }
  return o;
}

std::string verdict_sentence(const TransferVerdict& v, const char* axis) { return std::string("across ") + axis + ": " + v.text; }

}  // namespace

SweepGrid parse_vary(const std::string& spec, const train::TrainConfig& base) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) throw Error("sweep: --vary '" + spec + "': give KEY=v1,v2,... or KEY=2^a:2^b");
  SweepGrid g;
  g.key = trim(spec.substr(0, eq));
  const std::string rhs = trim(spec.substr(eq + 1));
  const std::vector<std::string> keys = train::TrainConfig::keys();
  if (std::find(keys.begin(), keys.end(), g.key) == keys.end()) {
    std::string valid;
    for (const std::string& k : keys) valid += (valid.empty() ? "" : ", ") + k;
    throw Error("sweep: --vary: unknown key '" + g.key + "'; valid keys: " + valid);
  }
  if (kNotVaried.count(g.key))
    throw Error("sweep: --vary: '" + g.key + "' is not varied on a grid (widths: --widths, depths: --depths, seeds: --seeds)");
  if (const size_t colon = rhs.find(':'); colon != std::string::npos) {
    const std::string a = trim(rhs.substr(0, colon)), b = trim(rhs.substr(colon + 1));
    const std::optional<int> lo = power_of_two(a), hi = power_of_two(b);
    if (!lo || !hi) throw Error("sweep: --vary " + g.key + "='" + rhs + "': a range is 2^a:2^b with integer exponents");
    if (*lo > *hi) throw Error("sweep: --vary " + g.key + "='" + rhs + "' is an empty range (" + a + " is above " + b + ")");
    if (*hi - *lo > 63) throw Error("sweep: --vary " + g.key + "='" + rhs + "': at most 64 values");
    for (int k = *lo; k <= *hi; ++k) {
      const double x = std::ldexp(1.0, k);
      g.values.push_back({x, shortest(x), "2^" + std::to_string(k)});
    }
  } else {
    for (const std::string& item : split(rhs, ',')) {
      if (const std::optional<int> k = power_of_two(item)) {  // "2^-8" in a list: that power of two
        const double p = std::ldexp(1.0, *k);
        for (const SweepValue& v : g.values)
          if (v.x == p) throw Error("sweep: --vary " + g.key + ": " + item + " is given twice");
        g.values.push_back({p, shortest(p), item});
        continue;
      }
      const std::optional<double> x = io::parse_number<double>(item);
      if (!x || !std::isfinite(*x))
        throw Error("sweep: --vary " + g.key + ": '" + item + "' is not a number (give KEY=v1,v2,... or KEY=2^a:2^b)");
      for (const SweepValue& v : g.values)
        if (v.x == *x) throw Error("sweep: --vary " + g.key + ": " + item + " is given twice");
      g.values.push_back({*x, item, item});
    }
    std::sort(g.values.begin(), g.values.end(), [](const SweepValue& a, const SweepValue& b) { return a.x < b.x; });
  }
  if (g.values.size() < 2)
    throw Error("sweep: --vary " + g.key + ": give at least 2 values (a sweep of " + std::to_string(g.values.size()) + " shows no best)");
  for (const SweepValue& v : g.values) {  // the key's own rules: an integer key refuses 0.5, lr refuses -1, ...
    train::TrainConfig c = base;
    c.out = "sweep";  // the cells' folders are the sweep's; only the value is judged here
    try {
      c.set(g.key, v.text);
      if (g.key == "lr") c.min_lr = base.min_lr / base.lr * c.lr;
      c.validate();
    } catch (const std::exception& e) {
      throw Error("sweep: --vary " + g.key + "=" + v.text + ": " + e.what());
    }
  }
  return g;
}

std::vector<int64_t> parse_sizes(const std::string& spec, const std::string& what) {
  std::vector<int64_t> out;
  for (const std::string& item : split(spec, ',')) {
    const std::optional<int64_t> n = io::parse_number<int64_t>(item);
    if (!n || *n < 1) throw Error("sweep: " + what + ": '" + item + "' is not a positive integer");
    if (std::find(out.begin(), out.end(), *n) != out.end()) throw Error("sweep: " + what + ": " + item + " is given twice");
    out.push_back(*n);
  }
  if (out.empty()) throw Error("sweep: " + what + " is empty");
  std::sort(out.begin(), out.end());
  return out;
}

train::TrainConfig cell_config(const SweepConfig& config, const std::string& recipe, int64_t width, int64_t depth, size_t value,
                               uint64_t seed) {
  const train::TrainConfig& b = config.base;
  train::TrainConfig c = b;
  c.recipe = recipe;
  c.seed = seed;
  c.out = (fs::path(config.out) / run_folder(config, recipe, width, depth, value, seed)).string();
  const int64_t head_dim = b.model.d_model / b.model.heads;
  if (width % head_dim != 0)
    throw Error("sweep: width " + std::to_string(width) + " is not a multiple of the head dimension " + std::to_string(head_dim) +
                " (the config's d_model " + std::to_string(b.model.d_model) + " / heads " + std::to_string(b.model.heads) +
                "), which every width keeps");
  c.model.d_model = width;
  c.model.heads = int(width / head_dim);
  if (b.model.kv_heads > 0) {  // grouped-query attention keeps its group size
    const int group = b.model.heads / b.model.kv_heads;
    if (c.model.heads % group != 0)
      throw Error("sweep: width " + std::to_string(width) + " gives " + std::to_string(c.model.heads) +
                  " heads, not a multiple of the config's key/value group of " + std::to_string(group));
    c.model.kv_heads = c.model.heads / group;
  }
  if (b.model.mlp_hidden > 0) {  // a set MLP width keeps its ratio to d_model
    if (b.model.mlp_hidden * width % b.model.d_model != 0)
      throw Error("sweep: width " + std::to_string(width) + ": mlp_hidden " + std::to_string(b.model.mlp_hidden) + " x " +
                  std::to_string(width) + " / d_model " + std::to_string(b.model.d_model) + " is not an integer");
    c.model.mlp_hidden = b.model.mlp_hidden * width / b.model.d_model;
  }
  c.model.layers = int(depth);
  c.set(config.grid.key, config.grid.values.at(value).text);
  if (config.grid.key == "lr") c.min_lr = b.min_lr / b.lr * c.lr;  // min_lr follows lr
  return c;
}

bool diverged_loss(double loss, double untrained) { return !std::isfinite(loss) || loss > untrained; }

std::optional<size_t> best_value(const std::vector<double>& losses) {
  std::optional<size_t> best;
  for (size_t i = 0; i < losses.size(); ++i)
    if (std::isfinite(losses[i]) && (!best || losses[i] < losses[*best])) best = i;
  return best;
}

TransferVerdict transfer_verdict(const std::vector<std::optional<size_t>>& best) {
  std::vector<size_t> found;
  for (const std::optional<size_t>& b : best)
    if (b) found.push_back(*b);
  if (found.size() < 2) return {std::nullopt, "no verdict (fewer than two shapes with a best value)"};
  const auto [lo, hi] = std::minmax_element(found.begin(), found.end());
  const int64_t steps = int64_t(*hi - *lo);
  return {steps, steps <= 1 ? "transfers" : "moves by " + std::to_string(steps) + " steps"};
}

std::vector<SweepRecipeReport> summarise_sweep(const SweepConfig& config, const std::vector<SweepCell>& cells) {
  const std::vector<int64_t> widths = config.widths.empty() ? std::vector<int64_t>{config.base.model.d_model} : config.widths;
  const std::vector<int64_t> depths = config.depths.empty() ? std::vector<int64_t>{config.base.model.layers} : config.depths;
  const size_t n = config.grid.values.size();
  std::vector<SweepRecipeReport> out;
  for (const std::string& recipe : config.recipes) {
    SweepRecipeReport r;
    r.recipe = recipe;
    r.name = run_name(recipe);
    std::map<std::pair<int64_t, int64_t>, std::vector<const SweepCell*>> row;  // (width, depth) -> cell per value
    for (const SweepCell& c : cells)
      if (c.recipe == recipe && c.value < n) {
        auto& v = row[{c.width, c.depth}];
        v.resize(n, nullptr);
        v[c.value] = &c;
      }
    std::map<std::pair<int64_t, int64_t>, std::optional<size_t>> best;
    std::ostringstream md, csv;
    md << "| width | depth |";
    csv << "width,depth";
    for (const SweepValue& v : config.grid.values) md << " " << config.grid.key << " " << v.label << " |", csv << "," << v.text;
    csv << ",best\n";
    md << " best |\n|---:|---:|";
    for (size_t i = 0; i <= n; ++i) md << "---:|";
    md << "\n";
    for (int64_t d : depths)
      for (int64_t w : widths) {
        std::vector<double> losses(n, NAN);
        const auto it = row.find({w, d});
        for (size_t i = 0; i < n && it != row.end(); ++i)
          if (const SweepCell* c = it->second[i]; c && c->status == "ok") losses[i] = c->val_loss;
        const std::optional<size_t> b = best_value(losses);
        best[{w, d}] = b;
        md << "| " << w << " | " << d << " |";
        csv << w << "," << d;
        for (size_t i = 0; i < n; ++i) {
          const SweepCell* c = it == row.end() ? nullptr : it->second[i];
          const bool bad = !c || c->status != "ok" || !std::isfinite(losses[i]);
          const std::string shown = !c ? "not run" : c->status == "failed" ? "failed" : bad ? "diverged" : fixed(losses[i], 4);
          md << " " << (b == i ? "**" + shown + "**" : shown) << " |";
          csv << "," << (bad ? (c ? (c->status == "failed" ? "failed" : "diverged") : "") : fixed(losses[i], 6));
        }
        md << " " << (b ? config.grid.values[*b].label : "–") << " |\n";
        csv << "," << (b ? config.grid.values[*b].text : "") << "\n";
      }
    // Across widths: per depth, the widths' best values; the largest distance over depths.
    auto axis_verdict = [&](bool across_widths) {
      TransferVerdict worst{std::nullopt, ""};
      for (int64_t outer : across_widths ? depths : widths) {
        std::vector<std::optional<size_t>> b;
        for (int64_t inner : across_widths ? widths : depths)
          b.push_back(best.at(across_widths ? std::pair{inner, outer} : std::pair{outer, inner}));
        const TransferVerdict v = transfer_verdict(b);
        if (worst.text.empty() || (v.steps && (!worst.steps || *v.steps > *worst.steps))) worst = v;
      }
      return worst;
    };
    r.across_widths = widths.size() > 1 ? axis_verdict(true) : TransferVerdict{std::nullopt, "no verdict (one width)"};
    r.across_depths = depths.size() > 1 ? axis_verdict(false) : TransferVerdict{std::nullopt, "no verdict (one depth)"};
    r.table = md.str();
    r.csv = csv.str();
    out.push_back(std::move(r));
  }
  return out;
}

SweepReport sweep(const SweepConfig& given, const SweepStepProgress& progress, const SweepCellProgress& cell_done,
                  const std::string& command) {
  SweepConfig config = given;
  if (config.seeds.empty()) config.seeds = {config.base.seed};
  if (config.widths.empty()) config.widths = {config.base.model.d_model};
  if (config.depths.empty()) config.depths = {config.base.model.layers};
  const platform::World& world = platform::world();
  platform::every_rank_agrees(world, [&] {
    config.base.out = config.out;
    config.base.validate();
    if (config.recipes.empty()) throw Error("sweep: no recipes");
    if (!config.base.init.empty())
      throw Error("sweep: init (a pretrained model) has one shape; a sweep trains new models of each width and depth");
    if (config.grid.values.size() < 2) throw Error("sweep: the grid needs at least 2 values");
    std::set<std::string> names;
    for (std::string& r : config.recipes) {
      if (r.ends_with(".json")) r = fs::absolute(r).lexically_normal().string();
      if (!names.insert(run_name(r)).second) throw Error("sweep: two recipes would share the name '" + run_name(r) + "'");
    }
    for (const std::string& r : config.recipes)  // every cell's config is checked before the first trains
      for (int64_t w : config.widths)
        for (int64_t d : config.depths)
          for (size_t i = 0; i < config.grid.values.size(); ++i)
            train::with_recipe_defaults(cell_config(config, r, w, d, i, config.seeds[0])).validate();
  });
  const fs::path dir(config.out);
  std::unique_ptr<io::FolderLock> lock;
  platform::every_rank_agrees(world, [&] {
    if (!world.root()) return;
    io::make_folder(dir.string());
    lock = std::make_unique<io::FolderLock>(dir.string(), "sweep");
    const std::string asked = sweep_json(config).dump(2) + "\n";
    if (fs::exists(dir / "sweep.json")) {
      if (io::read_input_file((dir / "sweep.json").string(), "sweep", 1 << 20) != asked)
        throw Error("sweep: '" + config.out + "' holds another sweep (its sweep.json differs); choose another " +
                    for_surface("--out", "out folder"));
    } else {
      if (fs::exists(dir / "runs"))
        throw Error("sweep: '" + (dir / "runs").string() + "' already exists; choose another " + for_surface("--out", "out folder"));
      io::write_text_atomically((dir / "sweep.json").string(), asked);
    }
  });
  SweepReport rep;
  rep.dir = config.out;
  const size_t total = config.recipes.size() * config.depths.size() * config.widths.size() * config.grid.values.size();
  size_t index = 0;
  for (const std::string& recipe : config.recipes)
    for (int64_t d : config.depths)
      for (int64_t w : config.widths)
        for (size_t i = 0; i < config.grid.values.size(); ++i) {
          ++index;
          std::string where = "[";  // (built in steps: GCC 12 warns falsely on "[" + std::to_string(...))
          where.append(std::to_string(index)).append("/").append(std::to_string(total)).append("] ").append(run_name(recipe));
          where.append(" ").append(shape_label(w, d)).append(" ").append(config.grid.key).append("=").append(config.grid.values[i].label);
          SweepCell cell;
          cell.recipe = recipe;
          cell.width = w;
          cell.depth = d;
          cell.value = i;
          double sum = 0;
          for (uint64_t seed : config.seeds) {
            train::TrainConfig c = cell_config(config, recipe, w, d, i, seed);
            cell.runs.push_back(run_folder(config, recipe, w, d, i, seed));
            train::Progress step_progress;
            if (progress) step_progress = [&](const train::StepProgress& p) { progress(where + "  " + p.line()); };
            const RunOutcome o = run_cell(c, step_progress);
            sum += o.val_loss;
            if (o.status != "ok" && cell.status == "ok") {
              cell.status = o.status;
              cell.note = (config.seeds.size() > 1 ? "seed " + std::to_string(seed) + ": " : std::string()) + o.note;
            }
          }
          cell.val_loss = cell.status == "ok" ? sum / double(config.seeds.size()) : NAN;
          if (cell_done)
            cell_done(cell, index, total, where + ": " + (cell.status == "ok" ? "val loss " + fixed(cell.val_loss, 4) : cell.status));
          rep.cells.push_back(std::move(cell));
        }
  rep.recipes = summarise_sweep(config, rep.cells);
  if (!world.root()) return rep;
  std::ostringstream md, all;
  rep.plot_error = write_sweep_plots(config, rep.cells);
  for (const SweepRecipeReport& r : rep.recipes) {
    io::write_text_atomically((dir / (r.name + ".csv")).string(), r.csv);
    all << "### " << r.name << "\n\n"
        << r.table << "\n"
        << verdict_sentence(r.across_widths, "widths") << "; " << verdict_sentence(r.across_depths, "depths") << ".\n\n";
    for (const char* axis : {"widths", "depths"})
      if (fs::exists(dir / (r.name + "_" + axis + ".png")))
        all << "![" << r.name << ": validation loss against " << config.grid.key << ", one curve per "
            << (axis[0] == 'w' ? "width" : "depth") << "](" << r.name << "_" << axis << ".png)\n\n";
  }
  rep.table = all.str();
  const train::TrainConfig& b = config.base;
  md << "# Sweep of " << config.grid.key << "\n\nCommand:\n\n```\n"
     << (command.empty() ? "(library call)" : command) << "\n```\n\n"
     << "Grid: " << config.grid.key << " over " << config.grid.values.size() << " values";
  if (config.grid.key == "lr") md << " (min_lr follows lr: the config's min_lr / lr = " << shortest(b.min_lr / b.lr) << ")";
  md << "; widths (d_model)";
  for (int64_t w : config.widths) md << " " << w;
  md << ", head dimension " << b.model.d_model / b.model.heads << " (heads = width / head dimension); depths (layers)";
  for (int64_t d : config.depths) md << " " << d;
  md << ". Each run: " << b.steps << " steps of " << b.batch * b.accum << " windows of " << b.model.seq << " tokens, corpus "
     << (b.data.empty() ? "the default" : b.data) << ", " << config.seeds.size() << (config.seeds.size() > 1 ? " seeds (mean)" : " seed")
     << ".\n\n## Results\n\nFinal validation loss (nats per token); **bold**: the best value of each shape. A cell whose loss is not "
        "finite or above its untrained model's (the larger of its first step's loss, before any update, and ln vocab) is *diverged* and "
        "never the best; ties go to the "
        "lower value. Verdict: *transfers* when the best values of the widths "
        "(of each depth; and of the depths, of each width) lie within one grid step of each other, else *moves by N steps* "
        "(the largest distance).\n\n"
     << rep.table << (rep.plot_error.empty() ? "" : "(Plots missing: " + rep.plot_error + ".)\n\n")
     << "Each cell's run folder (config, metrics.jsonl, model, cell.json) is under `runs/<recipe>/w<width>_d<depth>/`.\n";
  io::write_text_atomically((dir / "report.md").string(), md.str());
  return rep;
}

}  // namespace scalify::compare
