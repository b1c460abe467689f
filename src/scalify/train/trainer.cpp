#include "scalify/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scalify/autograd/data_precision.hpp"
#include "scalify/autograd/scaling.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/folder_lock.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/optim/grad_norm.hpp"
#include "scalify/platform/memory.hpp"
#include "scalify/quant/quantizer.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/train/ptq.hpp"
#include "scalify/train/session.hpp"

namespace scalify::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Bytes of training state per parameter, from the tensors themselves: master weights, gradients
// and the optimizer's moments, with their scales.
double state_bytes_per_parameter(const Session& s) {
  auto bytes = [](const ScaledTensor& t) {
    double b = 0;
    for (const Tensor& x : {t.data, t.scale})
      if (x.defined()) b += double(x.numel()) * dtype_size(x.dtype());
    return b;
  };
  double total = 0, count = 0;
  for (size_t i = 0; i < s.params.size(); ++i) {
    count += double(s.params[i].value().numel());
    total += bytes(s.params[i].scaled()) + bytes(s.params[i].scaled_grad()) + bytes(s.opt->first_moment(i)) +
             bytes(s.opt->second_moment(i));
  }
  return total / count;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double unigram_bits(const std::vector<uint8_t>& bytes) {
  std::vector<double> count(256, 0);
  for (uint8_t b : bytes) count[b] += 1;
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / double(bytes.size()) * std::log2(c / double(bytes.size()));
  return h;
}


// Keeps the metrics lines of steps <= step (a resumed run rewrites what followed its checkpoint).
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step")) throw Error("resume: corrupt metrics line in '" + path + "'");
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  io::write_file_atomically(path, [&](const io::ByteSink& out) { out(kept.data(), kept.size()); });
}

}  // namespace

std::string StepProgress::line() const {
  std::ostringstream out;
  out.precision(4);
  out << "step " << step << "/" << steps << "  loss " << loss << "  " << int64_t(tokens_per_s) << " tok/s  elapsed "
      << int64_t(elapsed_s) << "s  eta " << int64_t(eta_s) << "s";
  return out.str();
}

TrainResult train(const TrainConfig& config, bool resume, const Progress& progress, int64_t stop_after) {
  config.validate();
  struct RestoreStatistics {  // the loop switches the quantisers' counting per step; on again after
    ~RestoreStatistics() { quant::set_collect_statistics(true); }
  } restore_statistics;
  const fs::path dir(config.out);
  const std::string ckpt_path = (dir / "checkpoint.safetensors").string(), metrics_path = (dir / "metrics.jsonl").string(),
                    model_path = (dir / "model.safetensors").string();
  std::unique_ptr<Session> s;
  int64_t start = 0, skipped = 0;
  const Corpus corpus = corpus_for(config);  // bad data fails here, before the run folder exists
  // The run folder is this process's until it returns: a second writer is refused, by name.
  std::optional<io::FolderLock> lock;
  std::string started;
  auto check_appended_files = [&] {  // appended to (and read on resume): a pipe there would block
    for (const char* f : {"metrics.jsonl", "train.log"})
      if (fs::exists(dir / f) && !fs::is_regular_file(dir / f)) throw Error("'" + (dir / f).string() + "' is not a regular file");
  };
  if (resume) {
    if (!fs::is_directory(dir)) throw Error("resume: '" + config.out + "' is not a run folder");
    lock.emplace(dir.string(), "train --resume");
    check_appended_files();
    if (!fs::exists(ckpt_path))
      throw Error("resume: '" + config.out + "' holds no checkpoint.safetensors" +
                  (fs::exists(metrics_path) ? ": its run stopped before its first checkpoint, so it cannot be continued; start it "
                                              "again with `scalify train --config " + (dir / "config.toml").string() + "`"
                                            : ""));
    // The given config (the run's config.toml, possibly with overrides such as more steps);
    // loading checks that the checkpoint's tensors fit its model.
    const io::SafeTensors st = read_checkpoint(ckpt_path).first;
    // A run keeps its recipe: one given again (--recipe, or an edited JSON file) must be the same.
    if (st.metadata.count("recipe") && st.metadata.at("recipe") != quant::load_recipe(config.recipe).to_json())
      throw Error("resume: recipe '" + config.recipe + "' differs from the one '" + config.out + "' was trained with (recorded in its checkpoint); " +
                  "a run keeps its recipe: start a new run to train under another");
    s = load_session(st, config, ckpt_path);
    const json state = json::parse(st.metadata.at("scalify.state"));
    start = state.at("step").get<int64_t>();
    skipped = state.at("skipped").get<int64_t>();
    // Only a run killed between its last checkpoint and model.safetensors resumes at its last step.
    if (config.steps < start || (config.steps == start && fs::exists(model_path)))
      throw Error("resume: '" + config.out + "' is at step " + std::to_string(start) + " and --steps is " + std::to_string(config.steps) +
                  "; a resume trains further: give --steps above " + std::to_string(start));
    truncate_metrics(metrics_path, start - 1);
    started = "resume at step " + std::to_string(start);
    if (start < config.steps && fs::exists(model_path)) {  // a finished run trained further: no longer its final model
      fs::remove(model_path);
      started += " (model.safetensors of step " + std::to_string(start) + " removed until the run finishes)";
    }
  } else {
    s = make_session(config, nullptr);
    io::make_folder(dir.string());
    lock.emplace(dir.string(), "train");
    check_appended_files();
    if (fs::exists(ckpt_path) || fs::exists(model_path))
      throw Error("'" + config.out + "' already holds a run; use --resume to continue it or another --out");
    started = "new run";
    if (fs::exists(metrics_path)) {  // a run that stopped before its first checkpoint: nothing to continue
      fs::remove(metrics_path);
      started += " (the folder's earlier run stopped before its first checkpoint; its metrics.jsonl was discarded)";
    }
    const std::string recipe = s->recipe.to_json() + "\n";
    io::write_text_atomically((dir / "recipe.json").string(), recipe);
  }
  const TrainConfig& cfg = s->cfg;
  io::write_text_atomically((dir / "config.toml").string(), cfg.to_toml());  // what this run trains with, overrides included
  std::ofstream log((dir / "train.log").string(), std::ios::app), metrics(metrics_path, std::ios::app);
  if (!log || !metrics) throw Error("cannot write into the run folder '" + config.out + "'");
  log << started << ": recipe " << cfg.recipe << " (quantised: "
      << quant::quantized_layers(s->recipe) << (s->recipe.unit_scaled ? "; unit-scaled model" : "") << "), "
      << cfg.model.parameter_count() << " parameters, corpus " << corpus.source << " (" << corpus.files.size() << " text files, "
      << corpus.train.size() << " training / " << corpus.val.size() << " validation bytes)\n";
  for (const std::string& f : corpus.skipped) log << "skipped: " << f << "\n";
  log.flush();

  TrainResult r;
  r.run_dir = config.out;
  r.unigram_bits = unigram_bits(corpus.train);
  const int64_t T = cfg.model.seq, tokens_per_step = cfg.batch * T * cfg.accum;
  const int64_t end = stop_after > 0 ? std::min(cfg.steps, stop_after) : cfg.steps;
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  double last_loss = 0, statistics_total = 0, underflow_sum = 0, clipped_sum = 0;
  int64_t operand_stats = 0;
  std::vector<double> speeds;
  bool evaluated = false;
  for (int64_t step = start; step < end; ++step) {
    const auto t0 = clock::now();
    const double lr = learning_rate(cfg, step);
    const int64_t statistics_before = scale_statistics();
    s->opt->set_lr(lr);
    double loss_sum = 0;
    // Every stats_every steps, low-precision data storage is inspected: how many values each
    // op's output and gradient lost to underflow or saturation when rounded into it.
    const bool stats_step = (step + 1) % cfg.stats_every == 0;
    quant::set_collect_statistics(stats_step);  // the quantisers' underflow/clip counts: only when recorded
    std::optional<StorageCastRecorder> casts;
    if (stats_step && s->recipe.data_storage != DType::f32) casts.emplace();
    for (int64_t micro = 0; micro < cfg.accum; ++micro) {
      const Batch b = make_batch(corpus.train, train_starts(corpus.train.size(), cfg.batch, T, cfg.seed, uint64_t(step * cfg.accum + micro)), T);
      Var loss = s->forward_model().loss(b.ids, b.targets, s->options());
      loss_sum += loss.value().item();
      if (cfg.accum > 1) loss = loss * (1.0 / double(cfg.accum));
      if (s->scaler) loss = s->scaler->scale_loss(loss);
      loss.backward();
    }
    last_loss = loss_sum / double(cfg.accum);
    if (casts) {
      json d = json::object();
      for (const auto& [name, st] : casts->stats()) {
        d[name] = {{"values", st.values}, {"underflow", st.underflow_fraction()}, {"saturated", st.saturated_fraction()}};
        r.max_data_underflow = std::max(r.max_data_underflow, st.underflow_fraction());
        r.max_data_saturated = std::max(r.max_data_saturated, st.saturated_fraction());
      }
      metrics << json{{"step", step}, {"data_storage", d}}.dump() << "\n";
      casts.reset();
    }
    bool ok = !s->scaler || s->scaler->unscale(s->params);
    if (!s->scaler && !std::isfinite(last_loss))
      throw Diverged("training diverged: the loss is " + std::to_string(last_loss) + " at step " + std::to_string(step) + " (recipe " + cfg.recipe + ")", step);
    if (!std::isfinite(last_loss)) ++r.nonfinite_steps;
    double norm = 0;
    if (ok) {
      quant::cast_weight_gradients(s->params, s->recipe);
      norm = std::sqrt(optim::gradient_sum_squares(s->params));
      if (!std::isfinite(norm))
        throw Diverged("training diverged: non-finite gradient norm at step " + std::to_string(step) + " (recipe " + cfg.recipe + ")", step);
      if (r.state_bytes_per_parameter == 0) r.state_bytes_per_parameter = state_bytes_per_parameter(*s);
      // Clipping; the finite norm has already checked every gradient.
      s->opt->step(cfg.grad_clip > 0 && norm > cfg.grad_clip ? cfg.grad_clip / norm : 1.0, optim::Gradients::finite);
    } else {
      ++skipped;
    }
    const double secs = std::chrono::duration<double>(clock::now() - t0).count();
    r.peak_memory_mb = double(platform::peak_memory_bytes()) / (1024.0 * 1024.0);  // before this step's evaluation or checkpoint
    const double tps = double(tokens_per_step) / std::max(secs, 1e-9);
    const int64_t statistics = scale_statistics() - statistics_before;
    statistics_total += double(statistics);
    if (step > start) speeds.push_back(tps);  // the first step warms caches and thread pools
    json m = {{"step", step}, {"loss", last_loss}, {"lr", lr}, {"grad_norm", norm}, {"skipped", skipped},
              {"loss_scale", s->scaler ? s->scaler->scale() : 1.0}, {"scale_statistics", statistics},
              {"tokens_per_s", std::round(tps)}};
    metrics << m.dump() << "\n";
    if (!s->linears.empty() && stats_step) {
      json q = json::object();
      for (const auto& [layer, ql] : s->linears)
        for (const auto& [role, quantizer] : ql.quantizers()) {
          if (role.ends_with("_t")) continue;  // the transposed copies, used by block recipes only
          const quant::QuantStats& qs = quantizer->last();
          q[layer + "." + role] = {{"scale", qs.scale}, {"amax", qs.amax}, {"underflow", qs.underflow}, {"clipped", qs.clipped}};
          underflow_sum += qs.underflow;
          clipped_sum += qs.clipped;
          r.max_underflow = std::max(r.max_underflow, qs.underflow);
          ++operand_stats;
        }
      metrics << json{{"step", step}, {"quant", q}}.dump() << "\n";
    }
    const bool last = step + 1 == end;
    if ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps) {
      const EvalResult e = eval_session(*s, corpus.val);
      metrics << json{{"step", step}, {"val_loss", e.loss}, {"val_bpb", e.bits_per_byte}}.dump() << "\n";
      r.val_loss = e.loss;
      r.val_bpb = e.bits_per_byte;
      evaluated = true;
      log << "step " << step + 1 << ": val_loss " << e.loss << ", " << e.bits_per_byte << " bits per byte\n";
    }
    metrics.flush();
    if ((step + 1) % cfg.checkpoint_every == 0 || last) save_checkpoint(*s, ckpt_path, step + 1, skipped);
    if (progress) {
      StepProgress p{step + 1, cfg.steps, last_loss, tps, std::chrono::duration<double>(clock::now() - t_start).count(), 0};
      p.eta_s = p.elapsed_s / double(step + 1 - start) * double(end - step - 1);
      progress(p);
    }
  }
  if (end == start) last_loss = NAN;  // a run resumed only to write model.safetensors: no training loss here
  if (!evaluated && end == cfg.steps) {  // ... but its result is still the finished model's
    const EvalResult e = eval_session(*s, corpus.val);
    r.val_loss = e.loss;
    r.val_bpb = e.bits_per_byte;
  }
  r.tokens_per_s = median(speeds);
  r.scale_statistics_per_step = end > start ? statistics_total / double(end - start) : 0;
  r.mean_underflow = operand_stats ? underflow_sum / double(operand_stats) : 0;
  r.mean_clipped = operand_stats ? clipped_sum / double(operand_stats) : 0;
  r.steps = end;
  r.skipped = skipped;
  r.train_loss = last_loss;
  if (end == cfg.steps) save_checkpoint(*s, model_path, end, skipped);
  log << "stopped at step " << end << " of " << cfg.steps << "\n";
  return r;
}

}  // namespace scalify::train
