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

#include "scalify/error.hpp"
#include "scalify/inspect/report_section.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/folder_lock.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/platform/memory.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/report/gnuplot.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/report/system_info.hpp"

namespace scalify::compare {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string fixed(double v, int digits);

const std::map<std::string, std::vector<std::string>>& named_lists() {
  static const std::map<std::string, std::vector<std::string>> lists = {
      {"seeds", quant::preset_names()},
      {"fp8",
       {"scalify_fp8_3", "scalify_fp8_4", "unit_fp8", "current", "delayed", "fp8_amax", "fp8_cscale", "mxfp8", "blockwise",
        "fp8_unscaled"}},
      {"fp16", {"scalify_fp16_1", "scalify_fp16_2", "unit_fp16", "f16_loss_scaled", "fp16_unscaled"}},
      {"scalify", {"scalify_fp16_1", "scalify_fp16_2", "scalify_fp8_3", "scalify_fp8_4"}},
      {"unit", {"unit_f32", "unit_fp16", "unit_fp8"}},
      {"per_tensor", {"current", "delayed", "fp8_amax", "fp8_cscale"}},
      {"allreduce", {"f32_allreduce_f16", "f32_allreduce_e4m3", "f32_allreduce_e5m2"}},
      {"fp4",
       {"nvfp4", "nvfp4_no_hadamard", "nvfp4_no_sr", "nvfp4_1x16_weights", "nvfp4_no_tensor_scale", "nvfp4_all_layers", "mxfp4",
        "mxfp4_rceil"}},
  };
  return lists;
}

void write_text(const fs::path& path, const std::string& text) { io::write_text_atomically(path.string(), text); }

std::string read_text(const fs::path& path) { return io::read_input_file(path.string(), "compare", uint64_t(16) << 20); }

// The run folder's name: the preset name, or a JSON file's stem (not empty, not hidden, no
// "." or ".." that would point outside runs/).
std::string run_name(const std::string& recipe) {
  const std::string name = recipe.ends_with(".json") ? fs::path(recipe).stem().string() : recipe;
  if (name.empty() || name[0] == '.') throw Error("compare: recipe file '" + recipe + "' needs a name that does not start with '.'");
  return name;
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
          {"status", o.status},
          {"note", o.note},
          {"diverged_step", o.diverged_step},
          {"baseline", o.baseline},
          {"val_delta", num(o.val_delta)},
          {"seconds", num(o.seconds)},
          {"peak_memory_mb", num(o.peak_memory_mb)},
          {"quantized_layers", o.quantized},
          {"unit_scaled", o.unit_scaled},
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
  o.status = j.at("status");
  o.note = j.at("note");
  o.diverged_step = j.at("diverged_step");
  o.seconds = number_or_nan(j.at("seconds"));
  o.peak_memory_mb = number_or_nan(j.at("peak_memory_mb"));
  o.quantized = j.at("quantized_layers");
  o.unit_scaled = j.at("unit_scaled");
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

std::string percent(double fraction) { return fixed(100.0 * fraction, 2) + "%"; }

// Trains one recipe into runs/<name>, resuming it from its checkpoint where one exists.
RecipeOutcome run_recipe(const CompareConfig& config, const std::string& recipe, bool resume, const train::Progress& progress) {
  RecipeOutcome o;
  o.recipe = recipe;
  o.name = run_name(recipe);
  const quant::Recipe r = quant::load_recipe(recipe);
  o.quantized = quant::quantized_layers(r);
  o.unit_scaled = r.unit_scaled;
  train::TrainConfig c = config.base;
  c.recipe = recipe;
  c.out = (fs::path(config.out) / "runs" / o.name).string();
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

void set_baselines(std::vector<RecipeOutcome>& rows, int64_t batch) {
  std::map<std::string, const train::TrainResult*> ok;
  for (const RecipeOutcome& o : rows)
    if (o.status == "ok") ok[o.recipe] = &o.result;
  for (RecipeOutcome& o : rows) {
    o.baseline = o.unit_scaled ? "unit_f32" : "f32";
    const train::TrainResult* base = ok.count(o.baseline) ? ok[o.baseline] : nullptr;
    o.val_delta = base ? o.result.val_loss - base->val_loss : NAN;
    o.noise =
        base ? paired_delta(o.result.val_batch_losses, base->val_batch_losses, batch, o.result.val_windows) : PairedDelta{NAN, NAN, NAN, 0};
    o.verdict = o.status != "ok" ? o.status : o.recipe == o.baseline ? "baseline" : !base ? "no baseline" : verdict(o.noise, kParityNats);
  }
}

// Metrics of one run: smoothed training loss and validation loss over steps.
struct Curves {
  std::vector<std::pair<int64_t, double>> train, val;
};
Curves read_curves(const fs::path& run_dir) {
  Curves c;
  std::ifstream in;
  if (fs::is_regular_file(run_dir / "metrics.jsonl")) in.open(run_dir / "metrics.jsonl");  // a pipe there would block
  std::string line;
  const int64_t window = 10;  // training loss as the mean of each 10-step bucket
  double sum = 0;
  int64_t n = 0, last = 0;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>() + 1;
    if (j.contains("val_loss")) c.val.push_back({step, number_or_nan(j["val_loss"])});
    if (j.contains("loss") && j["loss"].is_number() && std::isfinite(j["loss"].get<double>())) {
      last = step;
      sum += j["loss"].get<double>();
      if (++n == window || step % window == 0) {
        c.train.push_back({step, sum / double(n)});
        sum = 0;
        n = 0;
      }
    }
  }
  if (n > 0) c.train.push_back({last, sum / double(n)});  // a last, partial bucket
  return c;
}

// loss.png and loss_delta.png; "" or why not.
std::string write_plots(const fs::path& dir, const std::vector<RecipeOutcome>& rows) {
  static const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  std::map<std::string, Curves> curves;
  for (const RecipeOutcome& o : rows) curves[o.name] = read_curves(dir / "runs" / o.name);
  const std::string train_dat = report::gnuplot_quote((dir / "train.dat").string()),
                    val_dat = report::gnuplot_quote((dir / "val.dat").string()),
                    delta_dat = report::gnuplot_quote((dir / "delta.dat").string());
  std::ostringstream train, val, delta, loss_plot, delta_plot;
  int blocks = 0, delta_blocks = 0;
  size_t colour = 0;
  for (const RecipeOutcome& o : rows) {
    const Curves& c = curves[o.name];
    if (c.train.empty()) continue;
    const bool emphasis = o.recipe == "f32";
    const std::string style = emphasis
                                  ? "lw 4 lc rgb 'black'"
                                  : "lw 1.5 lc rgb '" + std::string(colours[colour % 10]) + "' dt " + std::to_string(1 + colour / 10 % 4);
    if (!emphasis) ++colour;
    for (const auto& [s, l] : c.train) train << s << " " << l << "\n";
    for (const auto& [s, l] : c.val) val << s << " " << (std::isfinite(l) ? fixed(l, 6) : "NaN") << "\n";
    if (c.val.empty()) val << "0 NaN\n";  // keeps the blocks aligned with train.dat
    train << "\n\n";
    val << "\n\n";
    const std::string title = report::gnuplot_quote(o.name + (o.status == "ok" ? "" : " (" + o.status + ")"));
    loss_plot << (blocks ? ", \\\n  " : "") << train_dat << " index " << blocks << " with lines " << style << " title " << title << ", "
              << val_dat << " index " << blocks << " with points pt 7 ps 0.8 " << style << " notitle";
    ++blocks;
    // Delta: validation points matched by step with the baseline's.
    const auto base = std::find_if(rows.begin(), rows.end(), [&](const RecipeOutcome& b) { return b.recipe == o.baseline; });
    if (base == rows.end() || base->recipe == o.recipe || base->status != "ok") continue;
    std::ostringstream d;
    for (const auto& [s, l] : c.val)
      for (const auto& [bs, bl] : curves[base->name].val)
        if (bs == s && std::isfinite(l) && std::isfinite(bl)) d << s << " " << fixed(l - bl, 6) << "\n";
    if (d.str().empty()) continue;
    delta << d.str() << "\n\n";
    delta_plot << ", \\\n  " << delta_dat << " index " << delta_blocks++ << " with linespoints pt 7 ps 0.8 " << style << " title " << title;
  }
  if (blocks == 0) return "no recipe has a training curve";
  // The loss axis: from the lowest curve up to the untrained loss (about ln 256 = 5.5), or higher
  // when every curve is higher (a diverged comparison).
  double lowest = INFINITY;
  for (const auto& [name, c] : curves)
    for (const auto& [step, l] : c.train) lowest = std::min(lowest, l);
  const double loss_top = std::max(6.0, lowest * 1.5);
  write_text(dir / "train.dat", train.str());
  write_text(dir / "val.dat", val.str());
  write_text(dir / "delta.dat", delta.str());
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 1280,720 font ',11'\nset grid\nset key outside right\nset xlabel 'step'\n"
     << "set output " << report::gnuplot_quote((dir / "loss.png").string()) << "\n"
     << "set title 'Training loss (lines, 10-step means) and validation loss (points)'\n"
     << "set ylabel 'loss (nats per byte)'\nset yrange [*:" << loss_top << "]\nplot " << loss_plot.str() << "\n"
     << "set output " << report::gnuplot_quote((dir / "loss_delta.png").string()) << "\n"
     << "set title 'Validation loss minus the baseline''s (f32; unit_f32 for unit scaling)'\n"
     << "set ylabel 'delta loss (nats)'\nset yrange [-0.2<*:*<1]\n"
     << "plot 0 with lines lw 4 lc rgb 'black' title 'baseline', " << kParityNats
     << " with lines dt 2 lw 2 lc rgb 'black' title 'parity bound (+" << kParityNats << ")'" << delta_plot.str() << "\n";
  write_text(dir / "plots.gp", gp.str());
  return report::run_gnuplot((dir / "plots.gp").string());
}

std::string markdown_table(const std::vector<RecipeOutcome>& rows, double f32_speed) {
  std::ostringstream t;
  t << "| recipe | status | val loss | Δ vs baseline (95 %) | verdict | bits/byte | train loss | skipped | underflow (mean / max) | "
       "clipped | scale stats/step | tok/s | speed ×f32 | CPU use | state B/param | peak MB |\n"
    << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const RecipeOutcome& o : rows) {
    const train::TrainResult& r = o.result;
    const std::string status =
        o.status == "diverged" && o.diverged_step >= 0 ? "diverged at step " + std::to_string(o.diverged_step) : o.status;
    t << "| " << o.name << " | " << status << " | " << fixed(r.val_loss, 3) << " | "
      << (o.recipe == o.baseline
              ? "(baseline)"
              : signed_fixed(o.val_delta, 3) + (std::isfinite(o.noise.half_width) ? " ± " + fixed(o.noise.half_width, 3) : "") +
                    (o.baseline != "f32" ? " vs " + o.baseline : ""))
      << " | " << (o.recipe == o.baseline ? "" : o.verdict) << " | " << fixed(r.val_bpb, 3) << " | " << fixed(r.train_loss, 3) << " | "
      << r.skipped << " | " << percent(r.mean_underflow) << " / " << percent(r.max_underflow) << " | " << percent(r.mean_clipped) << " | "
      << fixed(r.scale_statistics_per_step, 1) << " | " << fixed(r.tokens_per_s, 0) << " | "
      << (f32_speed > 0 ? fixed(r.tokens_per_s / f32_speed, 2) : "–") << " | " << (r.cpu_share > 0 ? percent(r.cpu_share) : "–") << " | "
      << fixed(r.state_bytes_per_parameter, 2) << " | " << fixed(o.peak_memory_mb, 0) << " |\n";
  }
  return t.str();
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out.append(out.empty() ? "" : ", ").append(s);
  return out.empty() ? "none" : out;
}

// Speeds measured while the host was busy: the recipes whose steps filled less than 75 % of their
// threads' cores (CPU time over wall time) or whose step times spread more than 1.5-fold (90th
// over 10th percentile). "" when none: then the speed columns can be compared.
std::string busy_host_warning(const std::vector<RecipeOutcome>& rows) {
  std::vector<std::string> busy;
  for (const RecipeOutcome& o : rows) {
    const train::TrainResult& r = o.result;
    if (o.status == "ok" && ((r.cpu_share > 0 && r.cpu_share < 0.75) || r.step_time_spread > 1.5))
      busy.push_back(o.name + " (CPU use " + percent(r.cpu_share) + ", step times spread " + fixed(r.step_time_spread, 1) + "x)");
  }
  if (busy.empty()) return "";
  return "**Warning: the host was busy** while these recipes trained, so their tok/s and speed ×f32 say more about the "
         "host than the recipe: " +
         join(busy) + ". Rerun on a quiet host (or compare CPU use) before reading the speeds.\n\n";
}

// A few sentences read off the numbers.
std::string reading(const std::vector<RecipeOutcome>& rows, int64_t layers) {
  std::map<std::string, std::vector<std::string>> by_verdict;
  std::vector<std::string> diverged, skipped, failed;
  for (const RecipeOutcome& o : rows) {
    if (o.status == "failed") failed.push_back(o.name + " (" + o.note + ")");
    if (o.status == "diverged")
      diverged.push_back(o.name + (o.diverged_step >= 0 ? " at step " + std::to_string(o.diverged_step) : "") + " (" + o.note + ")");
    if (o.result.skipped > 0) skipped.push_back(o.name + " " + std::to_string(o.result.skipped));
    if (o.status != "ok" || o.recipe == o.baseline) continue;
    by_verdict[o.verdict].push_back(o.name + " (" + signed_fixed(o.val_delta, 3) +
                                    (std::isfinite(o.noise.half_width) ? " ± " + fixed(o.noise.half_width, 3) : "") + ")");
  }
  std::ostringstream s;
  for (const RecipeOutcome& o : rows)
    if (o.recipe == o.baseline && o.status != "ok")
      s << "- **The baseline " << o.name << " " << o.status << "**: the recipes measured against it have no delta.\n";
  // Only the verdicts speak: each delta's 95 % interval against 0 and the parity bound.
  s << "- Verdicts (the 95 % interval of each delta from its window-sampling error, paired over the same validation batches; "
       "the run's seed-to-seed variation is not in it):\n";
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

// Histograms and scale histories of every recipe that finished, and the PTQ sweep of f32's model.
std::string numerics(const CompareConfig& config, const std::vector<RecipeOutcome>& rows) {
  const fs::path dir(config.out);
  std::vector<inspect::RunToInspect> runs;
  std::string f32_run;
  for (const RecipeOutcome& o : rows) {
    if (o.status != "ok") continue;
    runs.push_back({o.name, (dir / "runs" / o.name).string()});
    if (o.recipe == "f32") f32_run = runs.back().run_dir;
  }
  return inspect::numerics_section(runs, config.out, f32_run);
}

void write_report(const CompareConfig& config, CompareReport& rep, const std::string& command) {
  const fs::path dir(config.out);
  const auto f32 =
      std::find_if(rep.rows.begin(), rep.rows.end(), [](const RecipeOutcome& o) { return o.recipe == "f32" && o.status == "ok"; });
  const double f32_speed = f32 != rep.rows.end() ? f32->result.tokens_per_s : 0;
  rep.table = markdown_table(rep.rows, f32_speed);
  rep.plot_error = write_plots(dir, rep.rows);

  std::ostringstream csv;
  csv << "recipe,status,baseline,val_loss,val_delta,val_delta_ci95,verdict,val_bpb,train_loss,steps,skipped_steps,nonfinite_steps,diverged_"
         "step,"
         "mean_underflow,max_underflow,mean_clipped,scale_statistics_per_step,tokens_per_s,speed_vs_f32,cpu_share,step_time_spread,state_"
         "bytes_per_parameter,"
         "peak_memory_mb,seconds,quantized_layers\n";
  json rows = json::array();
  for (const RecipeOutcome& o : rep.rows) {
    const train::TrainResult& r = o.result;
    csv << csv_field(o.name) << "," << o.status << "," << o.baseline << "," << csv_number(r.val_loss, 5) << ","
        << csv_number(o.val_delta, 5) << "," << csv_number(o.noise.half_width, 5) << "," << csv_field(o.verdict) << ","
        << csv_number(r.val_bpb, 5) << "," << csv_number(r.train_loss, 5) << "," << r.steps << "," << r.skipped << "," << r.nonfinite_steps
        << "," << o.diverged_step << "," << fixed(r.mean_underflow, 6) << "," << fixed(r.max_underflow, 6) << ","
        << fixed(r.mean_clipped, 6) << "," << csv_number(r.scale_statistics_per_step, 2) << "," << csv_number(r.tokens_per_s, 0) << ","
        << (f32_speed > 0 ? csv_number(r.tokens_per_s / f32_speed, 3) : "") << "," << csv_number(r.cpu_share, 3) << ","
        << csv_number(r.step_time_spread, 2) << "," << csv_number(r.state_bytes_per_parameter, 3) << "," << csv_number(o.peak_memory_mb, 1)
        << "," << csv_number(o.seconds, 1) << "," << csv_field(o.quantized) << "\n";
    rows.push_back(outcome_json(o));
  }
  write_text(dir / "summary.csv", csv.str());
  const json summary = {{"config", config.base.to_toml()},
                        {"parameters", config.base.model.parameter_count()},
                        {"parity_nats", kParityNats},
                        {"recipes", rows}};
  write_text(dir / "summary.json", summary.dump(2) + "\n");

  const train::TrainConfig& b = config.base;
  std::ostringstream md;
  md << "# Scalify comparison\n\n"
     << "One model, one corpus, one seed, trained under each recipe in turn. Command:\n\n```\n"
     << (command.empty() ? "(library call)" : command) << "\n```\n\nModel: GPT, d_model " << b.model.d_model << ", " << b.model.layers
     << " layers, " << b.model.heads << " heads, context " << b.model.seq << " bytes, " << b.model.parameter_count() << " parameters"
     << (b.model.unit_scaled ? ", unit-scaled" : "") << ". Training: " << b.steps << " steps of " << b.batch * b.accum
     << " windows, AdamW lr " << b.lr << ", seed " << b.seed
     << ". Corpus: " << (b.data.empty() ? "the default (Debian's fortunes)" : b.data) << ". Validation: " << b.eval_windows
     << " held-out windows.\n\nMachine (`scalify info`):\n\n```\n"
     << report::system_info_text() << "```\n\n"
     << "## Results\n\n"
     << rep.table << "\n"
     << "Δ: validation loss minus the baseline's (f32; unit_f32 for the unit-scaled recipes). Underflow: the fraction of non-zero "
        "values a quantiser flushed to zero; clipped: beyond the format's range; both averaged over every quantised operand's "
        "statistics (weights, activations, gradients of each block linear, every "
     << b.stats_every
     << " steps). State B/param: master weights, gradients and AdamW moments (with scales) per parameter, "
        "measured on the tensors. Peak MB: the process's peak resident memory during the recipe.\n\n"
     << busy_host_warning(rep.rows)
     << (rep.plot_error.empty() ? "![loss](loss.png)\n\n![validation loss minus the baseline](loss_delta.png)\n\n"
                                : "(No plots: " + rep.plot_error + ".)\n\n")
     << "## Reading\n\n"
     << reading(rep.rows, b.model.layers) << "\n## What each recipe quantises\n\n";
  std::map<std::string, std::vector<std::string>> by_layers;
  for (const RecipeOutcome& o : rep.rows) by_layers[o.quantized + (o.unit_scaled ? "; unit-scaled model" : "")].push_back(o.name);
  for (const auto& [what, names] : by_layers) md << "- " << join(names) << ": " << what << ".\n";
  md << "\n"
     << numerics(config, rep.rows)
     << "\nEach recipe's run folder (config, recipe.json, metrics.jsonl, checkpoints, inspect/) is under `runs/`.\n";
  write_text(dir / "report.md", md.str());
}

}  // namespace

std::vector<std::string> recipe_list_names() {
  std::vector<std::string> names;
  for (const auto& [name, list] : named_lists()) names.push_back(name);
  return names;
}

std::vector<std::string> recipe_list(const std::string& spec) {
  std::vector<std::string> out;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const auto named = named_lists().find(item);
    const std::vector<std::string> add = named != named_lists().end() ? named->second : std::vector<std::string>{item};
    for (const std::string& r : add) {
      try {
        quant::load_recipe(r);
      } catch (const Error& e) {
        throw Error("compare: recipe '" + r + "': " + e.what() + "; named lists: " + join(recipe_list_names()));
      }
      if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
    }
  }
  if (out.empty()) throw Error("compare: no recipes in '" + spec + "'");
  return out;
}

CompareConfig comparison_config(const std::string& out) {
  const fs::path file = fs::path(out) / "compare.json";
  if (!fs::exists(file)) throw Error("compare: '" + out + "' holds no comparison (no compare.json)");
  CompareConfig c = read_json_file(file, "", [&](const json& j) {
    CompareConfig r;
    r.base = train::parse_config(j.at("config").get<std::string>(), file.string());
    r.recipes = j.at("recipes").get<std::vector<std::string>>();
    return r;
  });
  c.out = out;
  return c;
}

CompareReport compare(const CompareConfig& given, bool resume, const CompareProgress& progress, const std::string& command) {
  CompareConfig config = given;
  config.base.out = config.out;  // each recipe's run folder is set below; this only validates
  const platform::World& world = platform::world();
  std::set<std::string> names;
  platform::every_rank_agrees(world, [&] {  // each rank checks the same input
    config.base.validate();
    if (config.recipes.empty()) throw Error("compare: no recipes");
    for (std::string& r : config.recipes)  // compare.json must still find them from another directory
      if (r.ends_with(".json")) r = fs::absolute(r).lexically_normal().string();
    // f32 is every comparison's baseline (unit_f32 that of the unit-scaled recipes): added when missing.
    auto has = [&](const std::string& r) { return std::find(config.recipes.begin(), config.recipes.end(), r) != config.recipes.end(); };
    bool unit = false;
    for (const std::string& r : config.recipes) unit = unit || quant::load_recipe(r).unit_scaled;
    if (unit && !has("unit_f32")) config.recipes.insert(config.recipes.begin(), "unit_f32");
    if (!has("f32")) config.recipes.insert(config.recipes.begin(), "f32");
    for (const std::string& r : config.recipes)
      if (!names.insert(run_name(r)).second) throw Error("compare: two recipes would share the run folder '" + run_name(r) + "'");
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
        throw Error("compare: '" + config.out + "' already holds a comparison; use --resume to continue it or another --out");
      for (const std::string& name : names)  // never delete run folders this comparison did not make
        if (fs::exists(dir / "runs" / name))
          throw Error("compare: '" + (dir / "runs" / name).string() + "' already exists; choose another --out");
      io::make_folder((dir / "runs").string());
      write_text(dir / "compare.json", json{{"recipes", config.recipes}, {"config", config.base.to_toml()}}.dump(2) + "\n");
    }
  });
  CompareReport rep;
  rep.dir = config.out;
  const auto t_start = std::chrono::steady_clock::now();
  double finished_seconds = 0;
  int finished_here = 0;
  for (size_t i = 0; i < config.recipes.size(); ++i) {
    const std::string& recipe = config.recipes[i];
    const fs::path outcome_file = dir / "runs" / run_name(recipe) / "outcome.json";
    const std::string done_before = platform::from_root(world, [&] {  // a finished recipe's outcome, read by rank 0
      return resume && fs::exists(outcome_file) ? read_text(outcome_file) : std::string();
    });
    if (!done_before.empty()) {
      RecipeOutcome done = read_json_text(done_before, outcome_file, "; delete it to rerun that recipe", outcome_from);
      if (done.status != "failed") {  // a failed recipe (an error, not divergence) is tried again
        rep.rows.push_back(std::move(done));
        continue;
      }
    }
    const size_t left = config.recipes.size() - i - 1;
    train::Progress step_progress;
    if (progress)
      step_progress = [&, i, left](const train::StepProgress& p) {
        // Overall ETA: this recipe's, plus the mean time of the recipes finished so far (or this
        // one's projected total) for each recipe still to come.
        const double per_recipe = finished_here ? finished_seconds / finished_here : p.elapsed_s + p.eta_s;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        progress("[" + std::to_string(i + 1) + "/" + std::to_string(config.recipes.size()) + "] " + run_name(recipe) + "  " + p.line() +
                 " | all " + duration(elapsed) + ", eta " + duration(p.eta_s + per_recipe * double(left)));
      };
    RecipeOutcome o = run_recipe(config, recipe, resume, step_progress);
    finished_seconds += o.seconds;
    ++finished_here;
    if (world.root()) {
      io::make_folder(outcome_file.parent_path().string());  // a recipe that failed early has no run folder
      write_text(outcome_file, outcome_json(o).dump(2) + "\n");
    }
    rep.rows.push_back(std::move(o));
  }
  set_baselines(rep.rows, config.base.batch);
  if (world.root()) write_report(config, rep, command);
  return rep;
}

}  // namespace scalify::compare
