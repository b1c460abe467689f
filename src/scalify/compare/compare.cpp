#include "scalify/compare/compare.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "scalify/compare/plots.hpp"
#include "scalify/error.hpp"
#include "scalify/inspect/report_section.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/folder_lock.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/io/number_text.hpp"
#include "scalify/platform/memory.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/report/system_info.hpp"

namespace scalify::compare {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string fixed(double v, int digits);

void write_text(const fs::path& path, const std::string& text) { io::write_text_atomically(path.string(), text); }

std::string read_text(const fs::path& path) { return io::read_input_file(path.string(), "compare", uint64_t(16) << 20); }

// The run folder's name: the preset name, or a JSON file's stem (not empty, not hidden, no
// "." or ".." that would point outside runs/).
std::string run_name(const std::string& recipe) {
  const std::string name = recipe.ends_with(".json") ? fs::path(recipe).stem().string() : recipe;
  if (name.empty() || name[0] == '.') throw Error("compare: recipe file '" + recipe + "' needs a name that does not start with '.'");
  return name;
}

// A run's folder under runs/: the recipe's name, with its seed when the comparison has several.
std::string run_folder(const std::string& recipe, uint64_t seed, bool several_seeds) {
  return several_seeds ? run_name(recipe) + "_seed" + std::to_string(seed) : run_name(recipe);
}

// A CSV field (RFC 4180): quoted, with quotes doubled.
std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}
// A number for the CSV: empty when not finite.
std::string csv_number(double v, int digits) { return std::isfinite(v) ? fixed(v, digits) : ""; }

double number_or_nan(const json& j) { return j.is_number() ? j.get<double>() : NAN; }

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }  // JSON has no NaN

json outcome_json(const RecipeOutcome& o) {
  const train::TrainResult& r = o.result;
  return {{"recipe", o.recipe},
          {"name", o.name},
          {"run", o.run},
          {"seeds", o.seeds},
          {"status", o.status},
          {"note", o.note},
          {"diverged_step", o.diverged_step},
          {"baseline", o.baseline},
          {"val_delta", num(o.val_delta)},
          {"val_delta_ci95", num(o.noise.half_width)},
          {"window_ci95", num(o.noise.window_half_width)},
          {"seed_ci95", num(o.noise.seed_half_width)},
          {"verdict", o.verdict},
          {"seconds", num(o.seconds)},
          {"peak_memory_mb", num(o.peak_memory_mb)},
          {"quantized_layers", o.quantized},
          {"unit_scaled", o.unit_scaled},
          {"umup", o.umup},
          {"steps", r.steps},
          {"skipped_steps", r.skipped},
          {"nonfinite_steps", r.nonfinite_steps},
          {"train_loss", num(r.train_loss)},
          {"val_loss", num(r.val_loss)},
          {"val_bpb", num(r.val_bpb)},
          {"tokens_per_s", num(r.tokens_per_s)},
          {"scale_statistics_per_step", num(r.scale_statistics_per_step)},
          {"mean_underflow", num(r.mean_underflow)},
          {"max_underflow", num(r.max_underflow)},
          {"mean_clipped", num(r.mean_clipped)},
          {"state_bytes_per_parameter", num(r.state_bytes_per_parameter)},
          {"val_windows", r.val_windows},
          {"cpu_share", num(r.cpu_share)},
          {"step_time_spread", num(r.step_time_spread)},
          {"val_batch_losses", r.val_batch_losses}};
}

// Reads JSON this module wrote (the text of `file`); anything else is an error naming the file.
template <class Fn>
auto read_json_text(const std::string& text, const fs::path& file, const char* advice, Fn&& use) {
  try {
    io::check_json_depth(text, "compare: '" + file.string() + "'");
    const json j = json::parse(text);
    return use(j);
  } catch (const json::exception& e) {
    throw Error("compare: corrupt '" + file.string() + "' (" + e.what() + ")" + advice);
  }
}
template <class Fn>
auto read_json_file(const fs::path& file, const char* advice, Fn&& use) {
  return read_json_text(read_text(file), file, advice, std::forward<Fn>(use));
}

RecipeOutcome outcome_from(const json& j) {
  RecipeOutcome o;
  o.recipe = j.at("recipe");
  o.name = j.at("name");
  o.run = j.value("run", o.name);  // older outcomes: one seed, the run folder is the name
  if (j.contains("seeds")) o.seeds = j.at("seeds").get<std::vector<uint64_t>>();
  o.status = j.at("status");
  o.note = j.at("note");
  o.diverged_step = j.at("diverged_step");
  o.seconds = number_or_nan(j.at("seconds"));
  o.peak_memory_mb = number_or_nan(j.at("peak_memory_mb"));
  o.quantized = j.at("quantized_layers");
  o.unit_scaled = j.at("unit_scaled");
  o.umup = j.value("umup", false);  // absent from reports written before u-μP
  train::TrainResult& r = o.result;
  r.steps = j.at("steps");
  r.skipped = j.at("skipped_steps");
  r.nonfinite_steps = j.at("nonfinite_steps");
  r.train_loss = number_or_nan(j.at("train_loss"));
  r.val_loss = number_or_nan(j.at("val_loss"));
  r.val_bpb = number_or_nan(j.at("val_bpb"));
  r.tokens_per_s = number_or_nan(j.at("tokens_per_s"));
  r.scale_statistics_per_step = number_or_nan(j.at("scale_statistics_per_step"));
  r.mean_underflow = number_or_nan(j.at("mean_underflow"));
  r.max_underflow = number_or_nan(j.at("max_underflow"));
  r.mean_clipped = number_or_nan(j.at("mean_clipped"));
  r.state_bytes_per_parameter = number_or_nan(j.at("state_bytes_per_parameter"));
  if (j.contains("cpu_share")) {  // absent from the outcomes of older builds
    r.cpu_share = number_or_nan(j.at("cpu_share"));
    r.step_time_spread = number_or_nan(j.at("step_time_spread"));
  }
  if (j.contains("val_batch_losses")) {  // absent from the outcomes of builds before the noise estimate
    r.val_windows = j.at("val_windows");
    for (const json& v : j.at("val_batch_losses")) r.val_batch_losses.push_back(number_or_nan(v));
  }
  return o;
}

std::string duration(double s) {
  const int64_t t = int64_t(std::max(0.0, s));
  return t >= 60 ? std::to_string(t / 60).append("m").append(std::to_string(t % 60)).append("s") : std::to_string(t).append("s");
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "–";
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

std::string signed_fixed(double v, int digits) { return std::isfinite(v) && v >= 0 ? "+" + fixed(v, digits) : fixed(v, digits); }

// Decimals for a delta and its interval: 3, or more for a half-width that would read as 0.000.
int delta_digits(double half_width) {
  int digits = 3;
  while (std::isfinite(half_width) && half_width > 0 && digits < 8 && half_width < 0.5 * std::pow(10.0, -digits)) ++digits;
  return digits;
}
// "Δ ± half-width".
std::string delta_text(double delta, double half_width) {
  const int digits = delta_digits(half_width);
  return signed_fixed(delta, digits) + (std::isfinite(half_width) ? " ± " + fixed(half_width, digits) : "");
}

std::string percent(double fraction) { return fixed(100.0 * fraction, 2) + "%"; }

// Trains one recipe into runs/<name>, resuming it from its checkpoint where one exists.
RecipeOutcome run_recipe(const CompareConfig& config, const std::string& recipe, uint64_t seed, bool resume,
                         const train::Progress& progress) {
  RecipeOutcome o;
  o.recipe = recipe;
  o.name = run_name(recipe);
  o.run = run_folder(recipe, seed, config.seeds.size() > 1);
  o.seeds = {seed};
  const quant::Recipe r = quant::load_recipe(recipe);
  o.quantized = quant::quantized_layers(r);
  o.unit_scaled = r.unit_scaled;
  o.umup = r.umup;
  train::TrainConfig c = config.base;
  c.recipe = recipe;
  c.seed = seed;
  c.out = (fs::path(config.out) / "runs" / o.run).string();
  // An interrupted run continues from its checkpoint; one with nothing to resume from (or one that
  // finished but whose outcome was never written) starts over.
  const fs::path run(c.out);
  const platform::World& world = platform::world();
  // Rank 0 looks at the folder, clearing one that cannot be resumed; "resume" tells every rank.
  const bool resume_run = platform::from_root(world, [&] {
                            if (resume && fs::exists(run / "checkpoint.safetensors") && !fs::exists(run / "model.safetensors"))
                              return std::string("resume");
                            if (fs::exists(run)) {  // only ever a folder of this comparison, and not while a process trains in it
                              const io::FolderLock owned(run.string(), "compare");
                              fs::remove_all(run);
                            }
                            return std::string();
                          }) == "resume";
  platform::reset_peak_memory();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    o.result = train::train(c, resume_run, progress);
    if (o.result.skipped * 2 > o.result.steps) {
      o.status = "diverged";
      o.note = "skipped " + std::to_string(o.result.skipped) + " of " + std::to_string(o.result.steps) + " steps (non-finite gradients)";
    }
    if (!std::isfinite(o.result.val_loss) && o.status == "ok") {
      o.status = "diverged";
      o.note = "the validation loss is not finite";
    }
  } catch (const train::Diverged& e) {
    o.status = "diverged";
    o.diverged_step = e.step + 1;  // 1-based, as the progress line and the plots count steps
    o.note = e.what();
    o.result.train_loss = o.result.val_loss = o.result.val_bpb = NAN;
  } catch (const Stopped&) {  // the caller stops everything: no row, the run left resumable
    throw;
  } catch (const std::exception& e) {  // a recipe that cannot run is a row; the comparison goes on
    // ... unless it failed on some ranks only: the others may wait for them in a collective.
    if (world.size() > 1 && !dynamic_cast<const platform::EveryRankError*>(&e)) throw;
    o.status = "failed";
    o.note = e.what();
    o.result.train_loss = o.result.val_loss = o.result.val_bpb = NAN;
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.peak_memory_mb = double(platform::peak_memory_bytes()) / (1024.0 * 1024.0);
  return o;
}

// One table row from a recipe's runs (one per seed, in seed order): the means of what they
// measured over the seeds that finished (the losses only when every seed did); the status and
// note of the first that did not.
RecipeOutcome summarise(const std::vector<const RecipeOutcome*>& seeds) {
  const auto first_ok = std::find_if(seeds.begin(), seeds.end(), [](const RecipeOutcome* o) { return o->status == "ok"; });
  RecipeOutcome row = **(first_ok != seeds.end() ? first_ok : seeds.begin());  // shapes (steps, windows) of a run that finished
  row.seeds.clear();
  row.note.clear();
  row.status = "ok";
  row.seconds = row.peak_memory_mb = 0;
  std::vector<const train::TrainResult*> ok;
  for (const RecipeOutcome* o : seeds) {
    row.seeds.push_back(o->seeds.at(0));
    row.seconds += o->seconds;
    row.peak_memory_mb = std::max(row.peak_memory_mb, o->peak_memory_mb);
    if (o->status == "ok") {
      ok.push_back(&o->result);
    } else if (row.status == "ok") {
      row.status = o->status;
      row.diverged_step = o->diverged_step;
      row.note = (seeds.size() > 1 ? "seed " + std::to_string(o->seeds.at(0)) + ": " : std::string()) + o->note;
    }
  }
  if (seeds.size() == 1) return row;
  train::TrainResult& r = row.result;
  if (ok.size() < seeds.size()) {  // a mean over the seeds that survived would flatter the recipe
    r.train_loss = r.val_loss = r.val_bpb = NAN;
    if (ok.empty()) return row;
  }
  const double n = double(ok.size());
  auto mean = [&](double train::TrainResult::*field) {
    double sum = 0;
    for (const train::TrainResult* x : ok) sum += x->*field;
    return sum / n;
  };
  std::vector<double train::TrainResult::*> fields = {
      &train::TrainResult::tokens_per_s,    &train::TrainResult::scale_statistics_per_step, &train::TrainResult::mean_underflow,
      &train::TrainResult::mean_clipped,    &train::TrainResult::state_bytes_per_parameter, &train::TrainResult::cpu_share,
      &train::TrainResult::step_time_spread};
  if (ok.size() == seeds.size())
    fields.insert(fields.end(), {&train::TrainResult::train_loss, &train::TrainResult::val_loss, &train::TrainResult::val_bpb});
  for (double train::TrainResult::*f : fields) r.*f = mean(f);
  r.max_underflow = 0;
  r.skipped = 0;
  for (const RecipeOutcome* o : seeds) {
    r.max_underflow = std::max(r.max_underflow, o->result.max_underflow);
    r.skipped = std::max(r.skipped, o->result.skipped);
  }
  r.val_batch_losses.assign(ok[0]->val_batch_losses.size(), 0.0);
  for (const train::TrainResult* x : ok)
    for (size_t k = 0; k < r.val_batch_losses.size() && k < x->val_batch_losses.size(); ++k)
      r.val_batch_losses[k] += x->val_batch_losses[k] / n;
  return row;
}

// Each outcome's delta against its baseline, seed by seed (`runs`: every run, by recipe and
// seed), with its interval and verdict.
void set_baselines(std::vector<RecipeOutcome>& outcomes, const std::vector<RecipeOutcome>& runs, int64_t batch) {
  std::map<std::pair<std::string, uint64_t>, const RecipeOutcome*> by_seed;
  for (const RecipeOutcome& r : runs) by_seed[{r.recipe, r.seeds.at(0)}] = &r;
  for (RecipeOutcome& o : outcomes) {
    o.baseline = o.umup ? "umup" : o.unit_scaled ? "unit_f32" : "f32";
    // Only complete pairs count: a seed the baseline (or the recipe) did not finish would leave
    // the others' mean and spread standing for a comparison that was not made.
    std::vector<std::vector<double>> mine, theirs;
    bool base_ok = true, mine_ok = true;
    double delta_sum = 0;
    for (uint64_t seed : o.seeds) {
      const auto r = by_seed.find({o.recipe, seed}), b = by_seed.find({o.baseline, seed});
      base_ok = base_ok && b != by_seed.end() && b->second->status == "ok";
      mine_ok = mine_ok && r != by_seed.end() && r->second->status == "ok";
      if (!base_ok || !mine_ok) continue;
      mine.push_back(r->second->result.val_batch_losses);
      theirs.push_back(b->second->result.val_batch_losses);
      delta_sum += r->second->result.val_loss - b->second->result.val_loss;
    }
    const bool paired = base_ok && mine_ok && !o.seeds.empty();
    o.noise = paired ? delta_over_seeds(mine, theirs, batch, o.result.val_windows) : DeltaInterval{};
    o.val_delta = paired ? delta_sum / double(mine.size()) : NAN;  // the mean of the seeds' deltas
    o.verdict = o.status != "ok"         ? o.status
                : o.recipe == o.baseline ? "baseline"
                : !base_ok               ? "no baseline"
                                         : verdict(o.val_delta, o.noise.half_width, kParityNats);
  }
}

// A row's speed cells: the training runs' tok/s and CPU use, and × f32 from the interleaved
// timing with its range over rounds when the comparison timed it, else from the training runs.
struct SpeedCells {
  std::string tokens, vs_f32, cpu;
};
SpeedCells speed_cells(const RecipeOutcome& o, double f32_training_speed) {
  const train::TrainResult& r = o.result;
  const RecipeSpeed& s = o.speed;
  const std::string ratio = s.vs_f32 > 0 ? fixed(s.vs_f32, 2) + " (" + fixed(s.vs_f32_low, 2) + "–" + fixed(s.vs_f32_high, 2) + ")"
                            : f32_training_speed > 0 && o.status == "ok" ? fixed(r.tokens_per_s / f32_training_speed, 2)
                                                                         : "–";
  return {fixed(r.tokens_per_s, 0), ratio, r.cpu_share > 0 ? percent(r.cpu_share) : "–"};
}

std::string markdown_table(const std::vector<RecipeOutcome>& rows, double f32_training_speed) {
  std::ostringstream t;
  t << "| recipe | status | val loss | Δ vs baseline (95 %) | of which windows / seeds | verdict | bits/byte | train loss | skipped | "
       "underflow (mean / max) | clipped | scale stats/step | tok/s | CPU use | speed ×f32 (range) | state B/param | peak MB |\n"
    << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const RecipeOutcome& o : rows) {
    const train::TrainResult& r = o.result;
    const std::string status =
        o.status == "diverged" && o.diverged_step >= 0 ? "diverged at step " + std::to_string(o.diverged_step) : o.status;
    const bool base = o.recipe == o.baseline;
    const SpeedCells speed = speed_cells(o, f32_training_speed);
    t << "| " << o.name << " | " << status << " | " << fixed(r.val_loss, 3) << " | "
      << (base ? "(baseline)" : delta_text(o.val_delta, o.noise.half_width) + (o.baseline != "f32" ? " vs " + o.baseline : "")) << " | "
      << (base || !std::isfinite(o.noise.half_width)
              ? ""
              : "± " + fixed(o.noise.window_half_width, delta_digits(o.noise.half_width)) + " / " +
                    (o.noise.seeds > 1 ? "± " + fixed(o.noise.seed_half_width, delta_digits(o.noise.half_width)) : "–"))
      << " | " << (base ? "" : o.verdict) << " | " << fixed(r.val_bpb, 3) << " | " << fixed(r.train_loss, 3) << " | " << r.skipped << " | "
      << percent(r.mean_underflow) << " / " << percent(r.max_underflow) << " | " << percent(r.mean_clipped) << " | "
      << fixed(r.scale_statistics_per_step, 1) << " | " << speed.tokens << " | " << speed.cpu << " | " << speed.vs_f32 << " | "
      << fixed(r.state_bytes_per_parameter, 2) << " | " << fixed(o.peak_memory_mb, 0) << " |\n";
  }
  return t.str();
}

std::string join(const std::vector<std::string>& v, const char* separator = ", ") {
  std::string out;
  for (const std::string& s : v) out.append(out.empty() ? "" : separator).append(s);
  return out.empty() ? "none" : out;
}

// Training runs timed while the host was busy: the recipes whose steps filled less than 75 % of
// their threads' cores (CPU time over wall time) or whose step times spread more than 1.5-fold
// (90th over 10th percentile). "" when none: then the tok/s column can be compared.
std::string training_speed_warning(const std::vector<RecipeOutcome>& rows, bool timed) {
  std::vector<std::string> busy;
  for (const RecipeOutcome& o : rows) {
    const train::TrainResult& r = o.result;
    if (o.status == "ok" && ((r.cpu_share > 0 && r.cpu_share < 0.75) || r.step_time_spread > 1.5))
      busy.push_back(o.name + " (CPU use " + percent(r.cpu_share) + ", step times spread " + fixed(r.step_time_spread, 1) + "x)");
  }
  if (busy.empty()) return "";
  return "**Warning: the host was busy** while these recipes trained, so their tok/s say more about the host than the recipe: " +
         join(busy) +
         (timed ? ". The interleaved speed ×f32 is meant to hold regardless; read that instead.\n\n"
                : ". Rerun on a quiet host (or compare CPU use) before reading the speeds.\n\n");
}

// The interleaved timing's own warning, from its round times: a recipe's per-round ratio to f32
// moving more than 20 %, f32's fastest step moving more than 25 % (both over the middle rounds,
// speed.hpp: middle_range), or steps filling under 75 % of the cores. "" when nothing does.
std::string timing_speed_warning(const SpeedReport& speed) {
  std::vector<std::string> why;
  const std::vector<double>& f32 = speed.recipes.count("f32") ? speed.recipes.at("f32").round_seconds : std::vector<double>{};
  const auto [f32_fast, f32_slow] = middle_range(f32);
  if (f32_slow / f32_fast > 1.25) why.push_back("f32's fastest step moved " + fixed(f32_slow / f32_fast, 2) + "x between rounds");
  const std::string middle = speed.rounds >= 4 ? " (its extreme rounds left out)" : "";
  for (const auto& [recipe, s] : speed.recipes) {
    if (!s.error.empty()) continue;
    std::vector<double> ratio;
    for (size_t r = 0; r < s.round_seconds.size() && s.round_seconds.size() == f32.size(); ++r)
      ratio.push_back(f32[r] / s.round_seconds[r]);
    const auto [low, high] = middle_range(ratio);
    if (high / low > 1.2) why.push_back(recipe + "'s ratio ranged " + fixed(low, 2) + "-" + fixed(high, 2) + middle);
    if (s.cpu_share > 0 && s.cpu_share < 0.75) why.push_back(recipe + "'s steps used " + fixed(100 * s.cpu_share, 0) + " % of the cores");
  }
  if (why.empty()) return "";
  return "**Warning: the host was busy** while the speeds were timed (" + join(why, "; ") +
         "), so the speed columns may say more about the host than the recipes. Rerun on a quiet host before reading them.\n\n";
}

// A few sentences read off the numbers.
std::string reading(const std::vector<RecipeOutcome>& rows, int64_t layers, size_t seeds) {
  std::map<std::string, std::vector<std::string>> by_verdict;
  std::vector<std::string> diverged, skipped, failed;
  for (const RecipeOutcome& o : rows) {
    if (o.status == "failed") failed.push_back(o.name + " (" + o.note + ")");
    if (o.status == "diverged")
      diverged.push_back(o.name + (o.diverged_step >= 0 ? " at step " + std::to_string(o.diverged_step) : "") + " (" + o.note + ")");
    if (o.result.skipped > 0) skipped.push_back(o.name + " " + std::to_string(o.result.skipped));
    if (o.status != "ok" || o.recipe == o.baseline) continue;
    by_verdict[o.verdict].push_back(o.name + " (" + delta_text(o.val_delta, o.noise.half_width) + ")");
  }
  std::ostringstream s;
  for (const RecipeOutcome& o : rows)
    if (o.recipe == o.baseline && o.status != "ok")
      s << "- **The baseline " << o.name << " " << o.status << "**: the recipes measured against it have no delta.\n";
  // Only the verdicts speak: each delta's 95 % interval against 0 and the parity bound.
  if (seeds > 1)
    s << "- Verdicts (the 95 % interval of each delta, mean over " << seeds
      << " seeds, each recipe paired with the baseline of its seed: the seeds' spread and the window-sampling error in quadrature):\n";
  else
    s << "- Verdicts (the 95 % interval of each delta from its window-sampling error, paired over the same validation batches; "
         "one seed, so seed-to-seed variation is not in it: `--seeds 3` measures it):\n";
  std::vector<std::string> verdicts = verdict_names(kParityNats);
  verdicts.push_back("no baseline");
  for (const std::string& v : verdicts)
    if (by_verdict.count(v)) s << "  - **" << v << "**: " << join(by_verdict[v]) << ".\n";
  s << "- **Diverged**: " << join(diverged) << ".\n";
  if (!failed.empty()) s << "- **Failed**: " << join(failed) << ".\n";
  s << "- **Skipped steps** (loss scaling found non-finite gradients): " << join(skipped) << ".\n";
  std::vector<std::string> stats;
  for (const RecipeOutcome& o : rows)
    if (o.status == "ok" && o.result.scale_statistics_per_step > 0)
      stats.push_back(o.name + " " + fixed(o.result.scale_statistics_per_step / double(layers), 2));
  s << "- **Scale statistics per step and layer** (amax or RMS reductions that set a scale; SCALIFY's claim is 2 per "
       "layer against 18 for per-tensor scaling): "
    << join(stats) << ".\n";
  return s.str();
}

// Histograms and scale histories of every recipe that finished (the first of its seeds' runs that
// did), with its verdict, and the PTQ sweep of f32's model.
std::string numerics(const CompareConfig& config, const std::vector<RecipeOutcome>& rows, const std::vector<RecipeOutcome>& runs) {
  const fs::path dir(config.out);
  std::vector<inspect::RunToInspect> inspected;
  std::string f32_run;
  for (const RecipeOutcome& row : rows) {
    const auto o =
        std::find_if(runs.begin(), runs.end(), [&](const RecipeOutcome& r) { return r.recipe == row.recipe && r.status == "ok"; });
    if (o == runs.end()) continue;  // runs: seeds outermost, so the first found is the first seed that finished
    inspected.push_back({o->name, (dir / "runs" / o->run).string(), row.recipe == row.baseline ? "" : row.verdict});
    if (o->recipe == "f32") f32_run = inspected.back().run_dir;
  }
  return inspect::numerics_section(inspected, config.out, f32_run);
}

std::string seed_text(const std::vector<uint64_t>& seeds) {
  std::string s;
  for (uint64_t x : seeds) s.append(s.empty() ? "" : ", ").append(std::to_string(x));
  return (seeds.size() > 1 ? "seeds " : "seed ") + s;
}

namespace {
// The u-μP recipes train unit-scaling's transformer (RMSNorm, SwiGLU of 4 d, no biases, an untied
// head: train::with_recipe_defaults), another parameter count than the base model's; 0 when no
// recipe is u-μP.
int64_t umup_parameter_count(const CompareConfig& config) {
  for (const std::string& r : config.recipes) {
    try {
      if (!quant::load_recipe(r).umup) continue;
      train::TrainConfig c = config.base;
      c.recipe = r;
      return train::with_recipe_defaults(c).model.parameter_count();
    } catch (const Error&) {  // its run failed on it and says why
    }
  }
  return 0;
}
}  // namespace

void write_report(const CompareConfig& config, CompareReport& rep, const std::string& command) {
  const fs::path dir(config.out);
  const auto f32 =
      std::find_if(rep.rows.begin(), rep.rows.end(), [](const RecipeOutcome& o) { return o.recipe == "f32" && o.status == "ok"; });
  const double f32_training_speed = f32 != rep.rows.end() ? f32->result.tokens_per_s : 0;
  rep.table = markdown_table(rep.rows, f32_training_speed);
  rep.plot_error = write_comparison_plots(dir.string(), rep.rows, rep.runs, config.base.batch);

  std::ostringstream csv;
  csv << "recipe,status,baseline,seeds,val_loss,val_delta,val_delta_ci95,window_ci95,seed_ci95,verdict,val_bpb,train_loss,steps,skipped_"
         "steps,nonfinite_steps,diverged_step,mean_underflow,max_underflow,mean_clipped,scale_statistics_per_step,tokens_per_s,speed_vs_"
         "f32,speed_vs_f32_low,speed_vs_f32_high,cpu_share,step_time_spread,state_bytes_per_parameter,peak_memory_mb,seconds,quantized_"
         "layers\n";
  json rows = json::array(), runs = json::array();
  for (const RecipeOutcome& o : rep.rows) {
    const train::TrainResult& r = o.result;
    const bool timed = o.speed.vs_f32 > 0;
    csv << csv_field(o.name) << "," << o.status << "," << o.baseline << "," << o.seeds.size() << "," << csv_number(r.val_loss, 5) << ","
        << csv_number(o.val_delta, 5) << "," << csv_number(o.noise.half_width, 5) << "," << csv_number(o.noise.window_half_width, 5) << ","
        << (o.noise.seeds > 1 ? csv_number(o.noise.seed_half_width, 5) : "") << "," << csv_field(o.verdict) << ","
        << csv_number(r.val_bpb, 5) << "," << csv_number(r.train_loss, 5) << "," << r.steps << "," << r.skipped << "," << r.nonfinite_steps
        << "," << o.diverged_step << "," << fixed(r.mean_underflow, 6) << "," << fixed(r.max_underflow, 6) << ","
        << fixed(r.mean_clipped, 6) << "," << csv_number(r.scale_statistics_per_step, 2) << "," << csv_number(r.tokens_per_s, 0) << ","
        << (timed                    ? csv_number(o.speed.vs_f32, 3)
            : f32_training_speed > 0 ? csv_number(r.tokens_per_s / f32_training_speed, 3)
                                     : "")
        << "," << (timed ? csv_number(o.speed.vs_f32_low, 3) : "") << "," << (timed ? csv_number(o.speed.vs_f32_high, 3) : "") << ","
        << csv_number(r.cpu_share, 3) << "," << csv_number(r.step_time_spread, 2) << "," << csv_number(r.state_bytes_per_parameter, 3)
        << "," << csv_number(o.peak_memory_mb, 1) << "," << csv_number(o.seconds, 1) << "," << csv_field(o.quantized) << "\n";
    json j = outcome_json(o);
    j["speed"] = {{"tokens_per_s", num(o.speed.tokens_per_s)},
                  {"vs_f32", num(o.speed.vs_f32)},
                  {"vs_f32_low", num(o.speed.vs_f32_low)},
                  {"vs_f32_high", num(o.speed.vs_f32_high)},
                  {"cpu_share", num(o.speed.cpu_share)},
                  {"round_seconds", o.speed.round_seconds},
                  {"error", o.speed.error}};
    rows.push_back(j);
  }
  for (const RecipeOutcome& o : rep.runs) runs.push_back(outcome_json(o));
  write_text(dir / "summary.csv", csv.str());
  const int64_t umup_parameters = umup_parameter_count(config);
  json summary = {{"config", config.base.to_toml()},
                  {"parameters", config.base.model.parameter_count()},
                  {"parity_nats", kParityNats},
                  {"seeds", config.seeds},
                  {"speed_rounds", config.speed.rounds},
                  {"recipes", rows},
                  {"runs", runs}};
  if (umup_parameters > 0) summary["umup_parameters"] = umup_parameters;
  write_text(dir / "summary.json", summary.dump(2) + "\n");

  const train::TrainConfig& b = config.base;
  const bool timed = config.speed.rounds > 0;
  std::ostringstream md;
  md << "# Scalify comparison\n\n"
     << "One model, one corpus, trained under each recipe in turn"
     << (config.seeds.size() > 1
             ? ", under each of " + std::to_string(config.seeds.size()) + " seeds (model initialisation and batch order)"
             : std::string(", one seed"))
     << ". Command:\n\n```\n"
     << (command.empty() ? "(library call)" : command) << "\n```\n\nModel: GPT, d_model " << b.model.d_model << ", " << b.model.layers
     << " layers, " << b.model.heads << " heads, context " << b.model.seq << " tokens, " << b.model.parameter_count() << " parameters"
     << (umup_parameters > 0 ? " (the u-μP recipes' transformer: " + std::to_string(umup_parameters) + ")" : std::string())
     << (b.model.unit_scaled ? ", unit-scaled" : "") << ". Training: " << b.steps << " steps of " << b.batch * b.accum
     << " windows, AdamW lr " << b.lr << ", " << seed_text(config.seeds)
     << ". Corpus: " << (b.data.empty() ? "the default (Debian's fortunes)" : b.data) << ". Validation: " << b.eval_windows
     << " held-out windows, every " << b.eval_every << " steps.\n\nMachine (`scalify info`):\n\n```\n"
     << report::system_info_text() << "```\n\n"
     << "## Results\n\n"
     << (fs::exists(dir / "delta.png") ? "![validation loss minus the baseline, with its interval](delta.png)\n\n" : "") << rep.table
     << "\n"
     << "Δ: validation loss minus the baseline's (f32; unit_f32 for the unit-scaled recipes)"
     << (config.seeds.size() > 1 ? ", each seed against the baseline of the same seed, mean over the seeds" : "")
     << "; ± its 95 % interval, of which the window-sampling error (the recipe and its baseline evaluated on the same "
     << std::max_element(rep.rows.begin(), rep.rows.end(),
                         [](const RecipeOutcome& a, const RecipeOutcome& c) { return a.result.val_windows < c.result.val_windows; })
            ->result.val_windows
     << " windows in batches of " << b.batch << ": the spread of their paired batch differences)"
     << (config.seeds.size() > 1 ? " and the seeds' spread (t over seeds − 1 degrees of freedom), combined in quadrature"
                                 : "; one seed, so seed-to-seed variation is not in it")
     << ". Verdict: *better than baseline* (the interval below 0), *not distinguishable from baseline* "
        "(it holds 0), *within +"
     << kParityNats << " of baseline* (above 0, at most +" << kParityNats << "), *inconclusive* (it holds +" << kParityNats
     << "), *worse* (above +" << kParityNats
     << "). Underflow: the fraction of non-zero values a quantiser flushed to zero; clipped: beyond the format's range; both "
        "averaged over every quantised operand's statistics (weights, activations, gradients of each block linear, every "
     << b.stats_every << " steps). "
     << "Tok/s and CPU use: the median training step of each run (CPU use: CPU seconds over wall seconds × threads). "
     << (timed ? "Speed ×f32: the recipes' training steps timed after training, interleaved in one process on one thread (" +
                     std::to_string(config.speed.rounds) + " rounds, the order reversed every other round; in each, " +
                     std::to_string(config.speed.warmup) + " untimed steps per recipe, then at least " +
                     std::to_string(config.speed.steps) + " timed ones adding up to " + fixed(config.speed.min_seconds, 1) +
                     " s): f32's fastest step of all rounds over the recipe's (interference only ever slows a step, so the "
                     "fastest is the most repeatable), and in brackets the lowest and highest per-round ratio; one thread, so "
                     "that a busy host slows every recipe alike: the ratio is the recipe's compute cost per step, which the "
                     "training runs' own speeds (recipes one after another, threads sharing cores with whatever else runs) "
                     "cannot give. "
               : std::string("Speed ×f32: the training runs' tok/s against f32's (recipes one after another: a busy host moves them). "))
     << "State B/param: master weights, gradients and AdamW moments (with scales) per parameter, "
        "measured on the tensors. Peak MB: the process's peak resident memory during the recipe.\n\n"
     << training_speed_warning(rep.rows, timed) << (timed ? timing_speed_warning(rep.speed) : "")
     << (fs::exists(dir / "loss_delta.png") ? "![validation loss minus the baseline over training](loss_delta.png)\n\n" : "")
     << (fs::exists(dir / "loss.png") ? "![loss](loss.png)\n\n" : "")
     << (rep.plot_error.empty() ? "" : "(Plots missing: " + rep.plot_error + ".)\n\n") << "## Reading\n\n"
     << reading(rep.rows, b.model.layers, config.seeds.size()) << "\n## What each recipe quantises\n\n";
  std::map<std::string, std::vector<std::string>> by_layers;
  for (const RecipeOutcome& o : rep.rows)
    by_layers[o.quantized + (o.unit_scaled ? "; unit-scaled model" : o.umup ? "; u-μP model" : "")].push_back(o.name);
  for (const auto& [what, names] : by_layers) md << "- " << join(names) << ": " << what << ".\n";
  md << "\n"
     << numerics(config, rep.rows, rep.runs)
     << "\nEach recipe's run folder (config, recipe.json, metrics.jsonl, checkpoints, inspect/) is under `runs/`"
     << (config.seeds.size() > 1 ? " (`<recipe>_seed<N>`; the numerics section inspects the first seed's)" : "") << ".\n";
  write_text(dir / "report.md", md.str());
}

}  // namespace

int64_t default_eval_every(int64_t steps) { return std::max<int64_t>(1, (steps + kEvalPoints - 1) / kEvalPoints); }

std::vector<uint64_t> seed_list(const std::string& spec, uint64_t first) {
  const std::string what = for_surface("--seeds", "seeds") + " '" + spec + "'";
  std::vector<uint64_t> seeds;
  if (spec.find(',') == std::string::npos) {
    const std::optional<uint64_t> n = io::parse_number<uint64_t>(spec);
    if (!n || *n < 1 || *n > 100) throw Error("compare: " + what + ": give a count from 1 to 100, or a comma-separated list of seeds");
    if (first > UINT64_MAX - (*n - 1)) throw Error("compare: " + what + ": seeds from " + std::to_string(first) + " on pass 2^64 - 1");
    for (uint64_t i = 0; i < *n; ++i) seeds.push_back(first + i);
    return seeds;
  }
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::optional<uint64_t> seed = io::parse_number<uint64_t>(item);
    if (!seed) throw Error("compare: " + what + ": '" + item + "' is not a seed (a decimal integer in [0, 2^64))");
    if (std::find(seeds.begin(), seeds.end(), *seed) != seeds.end()) throw Error("compare: " + what + ": seed " + item + " is given twice");
    seeds.push_back(*seed);
  }
  if (seeds.size() > 100) throw Error("compare: " + what + ": at most 100 seeds");
  return seeds;
}

CompareConfig comparison_config(const std::string& out) {
  const fs::path file = fs::path(out) / "compare.json";
  if (!fs::exists(file)) throw Error("compare: '" + out + "' holds no comparison (no compare.json)");
  CompareConfig c = read_json_file(file, "", [&](const json& j) {
    CompareConfig r;
    r.base = train::parse_config(j.at("config").get<std::string>(), file.string());
    // The keys the comparison was given (config.toml-style text sets them all): a fine-tune's
    // defaults (its model's seq, the fine-tuning lr) apply again on a resume. Comparisons from
    // before "given" was recorded gave everything but seq, which --init then took from the model.
    if (j.contains("given")) {
      r.base.given.clear();
      for (const std::string& key : j.at("given").get<std::vector<std::string>>()) r.base.given.insert(key);
    } else {
      r.base.given.erase("seq");
    }
    r.recipes = j.at("recipes").get<std::vector<std::string>>();
    if (j.contains("seeds")) r.seeds = j.at("seeds").get<std::vector<uint64_t>>();  // absent from older comparisons: one seed
    r.speed.rounds = j.value("speed_rounds", 0);                                    // older comparisons did not time interleaved
    return r;
  });
  c.out = out;
  return c;
}

CompareReport compare(const CompareConfig& given, bool resume, const CompareProgress& progress, const std::string& command,
                      const CompareSteps& steps) {
  CompareConfig config = given;
  config.base.out = config.out;  // each recipe's run folder is set below; this only validates
  if (config.seeds.empty()) config.seeds = {config.base.seed};
  const bool several_seeds = config.seeds.size() > 1;
  const platform::World& world = platform::world();
  std::set<std::string> folders;
  platform::every_rank_agrees(world, [&] {  // each rank checks the same input
    config.base.validate();
    if (config.recipes.empty()) throw Error("compare: no recipes");
    if (config.speed.rounds < 0 || config.speed.rounds > 100) throw Error("compare: speed rounds must be 0 to 100");
    for (std::string& r : config.recipes)  // compare.json must still find them from another directory
      if (r.ends_with(".json")) r = fs::absolute(r).lexically_normal().string();
    // f32 is every comparison's baseline (unit_f32 that of the unit-scaled recipes, umup the u-μP ones): added when missing.
    auto has = [&](const std::string& r) { return std::find(config.recipes.begin(), config.recipes.end(), r) != config.recipes.end(); };
    bool unit = false, umup = false;
    for (const std::string& r : config.recipes) {
      unit = unit || quant::load_recipe(r).unit_scaled;
      umup = umup || quant::load_recipe(r).umup;
    }
    if (umup && !has("umup")) config.recipes.insert(config.recipes.begin(), "umup");
    if (unit && !has("unit_f32")) config.recipes.insert(config.recipes.begin(), "unit_f32");
    if (!has("f32")) config.recipes.insert(config.recipes.begin(), "f32");
    std::set<std::string> names;
    for (const std::string& r : config.recipes)
      if (!names.insert(run_name(r)).second) throw Error("compare: two recipes would share the name '" + run_name(r) + "'");
    for (uint64_t seed : config.seeds)
      for (const std::string& r : config.recipes)
        if (!folders.insert(run_folder(r, seed, several_seeds)).second)
          throw Error("compare: two runs would share the folder 'runs/" + run_folder(r, seed, several_seeds) + "'");
  });

  const fs::path dir(config.out);
  // Rank 0 alone writes the comparison's folder (data parallelism: every rank trains each recipe).
  std::unique_ptr<io::FolderLock> lock;
  platform::every_rank_agrees(world, [&] {
    if (!world.root()) return;
    if (!resume) io::make_folder(dir.string());
    lock = std::make_unique<io::FolderLock>(dir.string(), resume ? "compare --resume" : "compare");  // one comparison writes here at a time
    if (!resume) {
      if (fs::exists(dir / "compare.json"))
        throw Error("compare: '" + config.out + "' already holds a comparison; " +
                    for_surface("use --resume to continue it or another --out", "use resume=True to continue it or another out folder"));
      for (const std::string& name : folders)  // never delete run folders this comparison did not make
        if (fs::exists(dir / "runs" / name))
          throw Error("compare: '" + (dir / "runs" / name).string() + "' already exists; choose another " +
                      for_surface("--out", "out folder"));
      io::make_folder((dir / "runs").string());
      write_text(dir / "compare.json", json{{"recipes", config.recipes},
                                            {"config", config.base.to_toml()},
                                            {"given", config.base.given},
                                            {"seeds", config.seeds},
                                            {"speed_rounds", config.speed.rounds}}
                                               .dump(2) +
                                           "\n");
    }
  });
  CompareReport rep;
  rep.dir = config.out;
  const auto t_start = std::chrono::steady_clock::now();
  double finished_seconds = 0;
  int finished_here = 0;
  const size_t total = config.recipes.size() * config.seeds.size();
  size_t index = 0;
  for (uint64_t seed : config.seeds)  // seeds outermost: the first seed's comparison is whole first
    for (const std::string& recipe : config.recipes) {
      ++index;
      const std::string folder = run_folder(recipe, seed, several_seeds);
      const fs::path outcome_file = dir / "runs" / folder / "outcome.json";
      const std::string done_before = platform::from_root(world, [&] {  // a finished run's outcome, read by rank 0
        return resume && fs::exists(outcome_file) ? read_text(outcome_file) : std::string();
      });
      if (!done_before.empty()) {
        RecipeOutcome done = read_json_text(done_before, outcome_file, "; delete it to rerun that recipe", outcome_from);
        if (done.seeds.empty()) done.seeds = {seed};
        if (done.status != "failed") {  // a failed recipe (an error, not divergence) is tried again
          rep.runs.push_back(std::move(done));
          continue;
        }
      }
      const size_t left = total - index;
      train::Progress step_progress;
      if (progress || steps)
        step_progress = [&, left](const train::StepProgress& p) {
          // Overall ETA: this run's, plus the mean time of the runs finished so far (or this
          // one's projected total) for each run still to come.
          const double per_run = finished_here ? finished_seconds / finished_here : p.elapsed_s + p.eta_s;
          const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
          const double eta = p.eta_s + per_run * double(left);
          const std::string line = "[" + std::to_string(index) + "/" + std::to_string(total) + "] " + run_name(recipe) +
                                   (several_seeds ? " seed " + std::to_string(seed) : "") + "  " + p.line() + " | all " +
                                   duration(elapsed) + ", eta " + duration(eta);
          if (progress) progress(line);
          if (steps) steps({size_t(index), total, run_name(recipe), seed, p, eta, line});
        };
      RecipeOutcome o = run_recipe(config, recipe, seed, resume, step_progress);
      finished_seconds += o.seconds;
      ++finished_here;
      if (world.root()) {
        io::make_folder(outcome_file.parent_path().string());  // a recipe that failed early has no run folder
        write_text(outcome_file, outcome_json(o).dump(2) + "\n");
      }
      rep.runs.push_back(std::move(o));
    }
  for (const std::string& recipe : config.recipes) {
    std::vector<const RecipeOutcome*> mine;
    for (uint64_t seed : config.seeds)
      for (const RecipeOutcome& o : rep.runs)
        if (o.recipe == recipe && o.seeds.at(0) == seed) mine.push_back(&o);
    rep.rows.push_back(summarise(mine));
  }
  set_baselines(rep.runs, rep.runs, config.base.batch);
  set_baselines(rep.rows, rep.runs, config.base.batch);
  // Speeds: every recipe that trained, timed interleaved under the first seed.
  std::vector<std::string> timed;
  for (const RecipeOutcome& o : rep.rows)
    if (o.status == "ok") timed.push_back(o.recipe);
  train::TrainConfig timing = config.base;
  timing.seed = config.seeds.at(0);
  rep.speed = time_interleaved(timing, timed, config.speed, progress);
  for (RecipeOutcome& o : rep.rows)
    if (rep.speed.recipes.count(o.recipe)) o.speed = rep.speed.recipes.at(o.recipe);
  if (world.root()) write_report(config, rep, command);
  return rep;
}

}  // namespace scalify::compare
