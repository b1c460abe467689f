#include "scalify/train/trainer.hpp"

#include <omp.h>
#include <time.h>

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
#include "scalify/io/json_text.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/optim/grad_norm.hpp"
#include "scalify/platform/memory.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/quant/quantizer.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/train/data_parallel.hpp"
#include "scalify/train/init_record.hpp"
#include "scalify/train/pretrained.hpp"
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
    total += bytes(s.params[i].scaled()) + bytes(s.params[i].scaled_grad()) + double(s.opt->state_bytes(i));
  }
  return total / count;
}

// The process's CPU time, all threads together.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double unigram_bits(const std::vector<int32_t>& bytes) {
  const int32_t top = bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
  std::vector<double> count(std::max<size_t>(256, size_t(top) + 1), 0);
  for (int32_t b : bytes) count[size_t(b)] += 1;
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
    const json j = io::try_parse_json(line);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
      throw Error("resume: corrupt metrics line in '" + path + "'");
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  io::write_file_atomically(path, [&](const io::ByteSink& out) { out(kept.data(), kept.size()); });
}

}  // namespace

std::string StepProgress::line() const {
  std::ostringstream out;
  out.precision(4);
  out << "step " << step << "/" << steps << "  loss " << loss << "  " << int64_t(tokens_per_s) << " tok/s  elapsed " << int64_t(elapsed_s)
      << "s  eta " << int64_t(eta_s) << "s";
  return out.str();
}

namespace {

// A run folder opened for training: owned by this process (its lock) until the run returns.
struct OpenRun {
  std::unique_ptr<io::FolderLock> lock;
  std::unique_ptr<Session> session;
  int64_t start = 0, skipped = 0;
  std::string how;  // the run log's first words: "new run ..." or "resume at step N ..."
};

// The files a run writes, checked before anything is written or removed. metrics.jsonl and
// train.log are appended to (and read on resume): a pipe there would block, and appending through a
// symbolic link would write wherever it points, so they must be regular files. The others are
// replaced by renaming (which replaces a link, not its target) or removed on a resume: a device,
// pipe or socket in their place must never be destroyed.
void check_run_files(const fs::path& dir) {
  for (const char* f : {"metrics.jsonl", "train.log"})
    if (fs::is_symlink(fs::symlink_status(dir / f)))
      throw Error("'" + (dir / f).string() + "' is a symbolic link; a run appends to its " + f + ", never through a link: remove it");
  for (const char* f : run_file_names()) {
    const fs::path p = dir / f;
    if (fs::exists(p) && !fs::is_regular_file(p))
      throw Error("'" + p.string() + "' exists and is not a regular file (a folder, device, pipe or socket); a run folder's " + f +
                  " is the run's own: move it away");
  }
}

OpenRun open_new_run(const TrainConfig& config, const fs::path& dir) {
  OpenRun run;
  run.session = make_session(config, nullptr);
  run.session->recipe.validate();  // before the folder exists
  io::make_folder(dir.string());
  run.lock = std::make_unique<io::FolderLock>(dir.string(), "train");
  check_run_files(dir);
  if (fs::exists(dir / "checkpoint.safetensors") || fs::exists(dir / "model.safetensors"))
    throw Error("'" + config.out + "' already holds a run; " +
                for_surface("use --resume to continue it or another --out", "use resume=True to continue it or another out folder"));
  run.how = "new run";
  if (fs::exists(dir / "metrics.jsonl")) {  // a run that stopped before its first checkpoint: nothing to continue
    fs::remove(dir / "metrics.jsonl");
    run.how += " (the folder's earlier run stopped before its first checkpoint; its metrics.jsonl was discarded)";
  }
  io::write_text_atomically((dir / "recipe.json").string(), run.session->recipe.to_json() + "\n");
  return run;
}

// A resumed run's session and counters from its checkpoint (what every rank reads).
void load_resumed_state(OpenRun& run, const TrainConfig& config, const std::string& ckpt_path) {
  // The given config (the run's config.toml, possibly with overrides such as more steps);
  // loading checks that the checkpoint's tensors fit its model.
  const io::SafeTensors st = read_checkpoint(ckpt_path).first;
  // A run keeps its recipe: one given again (--recipe, or an edited JSON file) must be the same.
  if (st.metadata.count("recipe") && st.metadata.at("recipe") != quant::load_recipe(config.recipe).to_json())
    throw Error("resume: recipe '" + config.recipe + "' differs from the one '" + config.out +
                "' was trained with (recorded in its checkpoint); " + "a run keeps its recipe: start a new run to train under another");
  run.session = load_session(st, config, ckpt_path);
  const json state = io::parse_json(st.metadata.at("scalify.state"), "checkpoint metadata 'scalify.state'");
  run.start = state.at("step").get<int64_t>();
  run.skipped = state.at("skipped").get<int64_t>();
}

OpenRun open_resumed_run(const TrainConfig& config, const fs::path& dir) {
  const std::string ckpt_path = (dir / "checkpoint.safetensors").string(), model_path = (dir / "model.safetensors").string();
  if (!fs::exists(dir)) throw MissingFileError("resume: '" + config.out + "' does not exist");
  if (!fs::is_directory(dir)) throw Error("resume: '" + config.out + "' is not a run folder");
  OpenRun run;
  run.lock = std::make_unique<io::FolderLock>(dir.string(), "train --resume");
  check_run_files(dir);
  if (!fs::exists(ckpt_path))
    throw Error("resume: '" + config.out + "' holds no checkpoint.safetensors" +
                (fs::exists(dir / "metrics.jsonl")
                     ? ": its run stopped before its first checkpoint, so it cannot be continued; start it "
                       "again " +
                           for_surface("with `scalify train --config " + (dir / "config.toml").string() + "`",
                                       "into a new out folder, with the settings of " + (dir / "config.toml").string())
                     : ""));
  load_resumed_state(run, config, ckpt_path);
  // Only a run killed between its last checkpoint and model.safetensors resumes at its last step.
  if (config.steps < run.start || (config.steps == run.start && fs::exists(model_path)))
    throw Error("resume: '" + config.out + "' is at step " + std::to_string(run.start) + " and " + for_surface("--steps is ", "steps is ") +
                std::to_string(config.steps) + "; a resume trains further: give " + for_surface("--steps", "steps=") + " above " +
                std::to_string(run.start));
  truncate_metrics((dir / "metrics.jsonl").string(), run.start - 1);
  run.how = "resume at step " + std::to_string(run.start);
  if (run.start < config.steps && fs::exists(model_path)) {  // a finished run trained further: no longer its final model
    fs::remove(model_path);
    run.how += " (model.safetensors of step " + std::to_string(run.start) + " removed until the run finishes)";
  }
  return run;
}

// The run folder opened by rank 0, which alone writes it; the other ranks build the same session
// (from the checkpoint on a resume) once rank 0 has found the folder sound.
OpenRun open_run(const TrainConfig& config, const fs::path& dir, bool resume, const platform::World& world) {
  OpenRun run;
  platform::every_rank_agrees(world, [&] {
    if (world.root()) run = resume ? open_resumed_run(config, dir) : open_new_run(config, dir);
  });
  platform::every_rank_agrees(world, [&] {
    if (world.root()) return;
    if (resume)
      load_resumed_state(run, config, (dir / "checkpoint.safetensors").string());
    else
      run.session = make_session(config, nullptr);
  });
  return run;
}

// The validation loss of the run's model at `step`: one that is not finite (or cannot be right) is
// the run's divergence, not a number to report.
EvalResult evaluate_run(const Session& s, const Corpus& corpus, int64_t step, const platform::World& world) {
  EvalResult e = eval_session(s, corpus, world);
  if (!std::isfinite(e.loss))
    throw Diverged("training diverged: the validation loss is not finite or cannot be right at step " + std::to_string(step) + " (recipe " +
                       s.cfg.recipe + ")",
                   step);
  return e;
}

// What one optimizer step did.
struct StepOutcome {
  double loss = 0, grad_norm = 0;
  bool applied = true;     // false: the loss scaler skipped the step (non-finite gradients)
  double state_bytes = 0;  // with measure_state: state_bytes_per_parameter before the update
};

// A step's forward and backward over this rank's micro-batches (gradients accumulated), the
// gradients summed over the ranks and the quantisers' step committed; the step's mean loss.
double forward_backward(Session& s, const Corpus& corpus, int64_t step, const std::vector<quant::Quantizer*>& quantizers,
                        const platform::World& world, AllreduceCost& cost) {
  const TrainConfig& cfg = s.cfg;
  const int64_t T = cfg.model.seq;
  const MicroBatches mine = rank_micro_batches(cfg.accum, world);
  std::vector<double> losses;
  for (int64_t micro = mine.first; micro < mine.first + mine.count; ++micro) {
    const quant::MicroBatchScope scope(micro);
    const Batch b =
        make_batch(corpus.train, train_starts(corpus.train.size(), cfg.batch, T, cfg.seed, uint64_t(step * cfg.accum + micro)), T);
    Var loss = s.forward_model().loss(b.ids, b.targets);
    losses.push_back(loss.value().item());
    if (cfg.accum > 1) loss = loss * (1.0 / double(cfg.accum));
    if (s.scaler) loss = s.scaler->scale_loss(loss);
    loss.backward();
  }
  cost = allreduce_gradients(s.names, s.params, s.recipe.gradient_allreduce, world);
  commit_quantizers(quantizers, world);
  return mean_loss(losses, world);
}

// The update after forward_backward: the loss scaler, the weight-gradient cast, clipping and
// AdamW. Throws Diverged on a non-finite loss or gradient norm that no loss scaler can skip.
StepOutcome update(Session& s, double loss, int64_t step, bool measure_state) {
  const TrainConfig& cfg = s.cfg;
  StepOutcome o;
  o.loss = loss;
  o.applied = !s.scaler || s.scaler->unscale(s.params);
  // A loss scaler skips a step whose gradients overflowed; a loss that is not finite (or cannot be
  // right) while the gradients were finite is no overflow it can skip.
  if (!std::isfinite(o.loss) && o.applied)
    throw Diverged(
        "training diverged: the loss is " + std::to_string(o.loss) + " at step " + std::to_string(step) + " (recipe " + cfg.recipe + ")",
        step);
  if (!o.applied) return o;
  quant::cast_weight_gradients(s.params, s.recipe);
  o.grad_norm = std::sqrt(optim::gradient_sum_squares(s.params));
  if (!std::isfinite(o.grad_norm))
    throw Diverged("training diverged: non-finite gradient norm at step " + std::to_string(step) + " (recipe " + cfg.recipe + ")", step);
  if (measure_state) o.state_bytes = state_bytes_per_parameter(s);  // gradients and moments as the update reads them
  // Clipping; the finite norm has already checked every gradient.
  s.opt->step(cfg.grad_clip > 0 && o.grad_norm > cfg.grad_clip ? cfg.grad_clip / o.grad_norm : 1.0, optim::Gradients::finite);
  return o;
}

// The run's statistics over its steps, which become the TrainResult's summary fields.
struct RunTotals {
  double scale_statistics = 0, underflow = 0, clipped = 0;
  int64_t operand_stats = 0;
  std::vector<double> speeds;  // tokens/s of every step but the process's first (the only one of a 1-step run: kept apart)
  // Of the same steps: wall seconds, and CPU seconds over (wall seconds x threads), the share of
  // the cores the step got (a busy host lowers it and spreads the wall times).
  std::vector<double> wall_seconds, cpu_shares;
  double first_speed = 0;
  double comm_bytes = 0, comm_seconds = 0, step_seconds = 0;  // the gradient all-reduce's, summed over steps
};

// metrics.jsonl's "data_storage" record: each op's values lost rounding into the data storage.
json data_storage_record(const StorageCastRecorder& casts) {
  json d = json::object();
  for (const auto& [name, st] : casts.stats())
    d[name] = {{"values", st.values},
               {"underflow", st.underflow_fraction()},
               {"subnormal", st.subnormal_fraction()},
               {"saturated", st.saturated_fraction()}};
  return d;
}

// metrics.jsonl's "quant" record: every quantised operand's last scale, amax, underflow, clipping.
json quant_record(const Session& s, TrainResult& r, RunTotals& totals) {
  json q = json::object();
  for (const auto& [layer, ql] : s.model.quantized_linears())
    for (const auto& [role, quantizer] : ql->quantizers()) {
      // The weight-gradient and transposed operands' own quantisers, where the recipe uses them
      // (block scaling, per-GEMM recipes); per-tensor recipes reuse the forward's.
      if (role.ends_with("_t") && quantizer->state().steps == 0) continue;
      const quant::QuantStats& qs = quantizer->last();
      q[layer + "." + role] = {{"scale", qs.scale},
                               {"amax", qs.amax},
                               {"underflow", qs.underflow},
                               {"underflow_energy", qs.underflow_energy},
                               {"clipped", qs.clipped}};
      totals.underflow += qs.underflow;
      totals.clipped += qs.clipped;
      r.max_underflow = std::max(r.max_underflow, qs.underflow);
      ++totals.operand_stats;
    }
  return q;
}

}  // namespace

TrainResult train(const TrainConfig& given, bool resume, const Progress& progress, int64_t stop_after, bool save_initial) {
  struct RestoreStatistics {  // the loop switches the quantisers' counting per step; on again after
    ~RestoreStatistics() { quant::set_collect_statistics(true); }
  } restore_statistics;
  const fs::path dir(given.out);
  const platform::World& world = platform::world();
  Corpus corpus;
  TrainConfig config;
  std::vector<platform::Agreed> run_items;
  platform::every_rank_agrees(world, [&] {  // bad input fails here, before the run folder exists
    // A new run records what it starts from; a resumed one checks that the files it reads again
    // are the ones it recorded.
    config = resume ? given : record_init(given);
    check_init_files(config, given.out);
    config = with_recipe_defaults(with_pretrained_model(config));
    config.validate();
    if (save_initial && resume)
      throw Error("train: " + for_surface("--save-initial", "save_initial=True") + " writes a new run's step 0; a resumed run is past it");
    rank_micro_batches(config.accum, world);
    corpus = corpus_for(config);
    if (world.size() > 1) run_items = run_description(config, corpus);
  });
  platform::check_ranks_agree(world, run_items);  // every rank trains the same run, or none does
  OpenRun run = open_run(config, dir, resume, world);
  Session& s = *run.session;
  if (world.size() > 1) platform::check_ranks_agree(world, {starting_parameters(s.params, run.start, s.cfg)});
  const std::vector<quant::Quantizer*> quantizers = model_quantizers(s.model);
  if (save_initial && world.root()) save_checkpoint(s, (dir / "initial.safetensors").string(), 0, 0);
  const TrainConfig& cfg = s.cfg;
  const int64_t start = run.start;
  int64_t skipped = run.skipped;
  // Rank 0 writes the folder; the other ranks' streams stay closed, so what they write goes nowhere.
  std::ofstream log, metrics;
  if (world.root()) {
    io::write_text_atomically((dir / "config.toml").string(), cfg.to_toml());  // what this run trains with, overrides included
    log.open((dir / "train.log").string(), std::ios::app);
    metrics.open((dir / "metrics.jsonl").string(), std::ios::app);
    if (!log || !metrics) throw Error("cannot write into the run folder '" + config.out + "'");
  }
  if (world.size() > 1)
    log << "data parallel: " << platform::world_description() << ", " << cfg.accum / world.size() << " micro-batch(es) of " << cfg.batch
        << " windows each per step (accum " << cfg.accum << "), gradients exchanged "
        << (s.recipe.gradient_allreduce ? "in " + std::string(format_name(*s.recipe.gradient_allreduce)) : std::string("in their storage"))
        << "\n";
  log << run.how << ": recipe " << cfg.recipe << " (quantised: " << quant::quantized_layers(s.recipe)
      << (s.recipe.unit_scaled ? "; unit-scaled model" : "") << (s.recipe.umup ? "; u-μP model" : "") << "), "
      << s.model.config().parameter_count() << " parameters, corpus " << corpus.source << " (" << corpus.files.size() << " files, "
      << corpus.train.size() << " training / " << corpus.val.size() << " validation " << corpus.unit()
      << (corpus.tokenizer.empty() ? "" : ", " + corpus.tokenizer) << ")\n";
  log << "learning rate: " << cfg.lr << " after " << cfg.warmup << " warmup steps, cosine to " << cfg.min_lr
      << (!cfg.init.empty() && !given.given.count("lr") ? " (the fine-tuning default for --init; set lr to choose)" : "") << "\n";
  if (s.model.config().umup) {  // the per-tensor factors of the lr (the blocks after h0 as h0)
    log << "u-μP learning-rate factors:";
    for (const std::string& n : s.names)
      if (!(n[0] == 'h' && n != "head" && !n.starts_with("h0."))) log << " " << n << " " << s.model.lr_multiplier(n);
    log << "; independent_weight_decay " << s.opt->config().weight_decay << " per step at the peak lr, every parameter; grad_clip "
        << cfg.grad_clip << (cfg.grad_clip == 0 ? " (off" : " (") << (given.given.count("grad_clip") ? ")" : ", u-μP's default)") << "\n";
  }
  log << "memory: at least " << std::lround(estimated_memory_bytes(cfg, s.recipe, true) / (1024.0 * 1024.0))
      << " MB estimated (training state, activations, attention)\n";
  for (const std::string& f : corpus.skipped) log << "skipped: " << f << "\n";
  log.flush();

  TrainResult r;
  r.run_dir = config.out;
  r.unigram_bits = unigram_bits(corpus.train);
  r.tokenized = !corpus.tokenizer.empty();
  const int64_t tokens_per_step = cfg.batch * cfg.model.seq * cfg.accum;
  const int64_t end = stop_after > 0 ? std::min(cfg.steps, stop_after) : cfg.steps;
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  double last_loss = 0;
  RunTotals totals;
  bool evaluated = false;
  for (int64_t step = start; step < end; ++step) {
    const auto t0 = clock::now();
    const double cpu0 = process_cpu_seconds();
    const double lr = learning_rate(cfg, step);
    const int64_t statistics_before = scale_statistics();
    s.opt->set_lr(lr);
    // Every stats_every steps, low-precision data storage is inspected: how many values each
    // op's output and gradient lost to underflow or saturation when rounded into it.
    const bool stats_step = (step + 1) % cfg.stats_every == 0;
    quant::set_collect_statistics(stats_step);  // the quantisers' underflow/clip counts: only when recorded
    std::optional<StorageCastRecorder> casts;
    if (stats_step && s.recipe.data_storage != DType::f32) casts.emplace();
    AllreduceCost comm;
    const double loss = forward_backward(s, corpus, step, quantizers, world, comm);
    totals.comm_bytes += comm.bytes_sent;
    totals.comm_seconds += comm.seconds;
    if (casts) {  // recorded before the update, which a divergence stops
      metrics << json{{"step", step}, {"data_storage", data_storage_record(*casts)}}.dump() << "\n";
      casts.reset();
    }
    const StepOutcome o = update(s, loss, step, r.state_bytes_per_parameter == 0);
    last_loss = o.loss;
    if (!std::isfinite(o.loss)) ++r.nonfinite_steps;
    if (o.applied && r.state_bytes_per_parameter == 0) r.state_bytes_per_parameter = o.state_bytes;
    if (!o.applied) ++skipped;
    const double secs = std::chrono::duration<double>(clock::now() - t0).count();
    const double tps = double(tokens_per_step) / std::max(secs, 1e-9);
    const int64_t statistics = scale_statistics() - statistics_before;
    totals.scale_statistics += double(statistics);
    totals.step_seconds += secs;
    if (step > start) {  // the first step warms caches and thread pools
      totals.speeds.push_back(tps);
      totals.wall_seconds.push_back(secs);
      totals.cpu_shares.push_back((process_cpu_seconds() - cpu0) / std::max(secs, 1e-9) / double(omp_get_max_threads()));
    } else {
      totals.first_speed = tps;
    }
    json line = {{"step", step},
                 {"loss", o.loss},
                 {"lr", lr},
                 {"grad_norm", o.grad_norm},
                 {"skipped", skipped},
                 {"loss_scale", s.scaler ? s.scaler->scale() : 1.0},
                 {"scale_statistics", statistics},
                 {"tokens_per_s", std::round(tps)}};
    if (world.size() > 1 || s.recipe.gradient_allreduce) {  // the gradient exchange: bytes this rank sent, and its time
      line["allreduce_bytes"] = comm.bytes_sent;
      line["allreduce_s"] = comm.seconds;
    }
    metrics << line.dump() << "\n";
    if (stats_step && !s.model.quantized_linears().empty())
      metrics << json{{"step", step}, {"quant", quant_record(s, r, totals)}}.dump() << "\n";
    if ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps) {
      const EvalResult e = evaluate_run(s, corpus, step, world);
      metrics << json{{"step", step}, {"val_loss", e.loss}, {"val_bpb", e.bits_per_byte}, {"val_batch_losses", e.batch_losses}}.dump()
              << "\n";
      r.val_loss = e.loss;
      r.val_bpb = e.bits_per_byte;
      r.val_batch_losses = e.batch_losses;
      r.val_windows = int64_t(e.windows);
      evaluated = true;
      log << "step " << step + 1 << ": val_loss " << e.loss << ", " << e.bits_per_byte << " bits per byte\n";
    }
    metrics.flush();
    if ((step + 1) % cfg.checkpoint_every == 0 || step + 1 == end) {
      check_parameters_agree(s.names, s.params, step + 1, world);
      if (world.root()) save_checkpoint(s, (dir / "checkpoint.safetensors").string(), step + 1, skipped);
    }
    if (progress) {
      StepProgress p{step + 1, cfg.steps, o.loss, tps, std::chrono::duration<double>(clock::now() - t_start).count(), 0};
      p.eta_s = p.elapsed_s / double(step + 1 - start) * double(end - step - 1);
      progress(p);
    }
  }
  if (end == start) last_loss = NAN;     // a run resumed only to write model.safetensors: no training loss here
  if (!evaluated && end == cfg.steps) {  // ... but its result is still the finished model's
    const EvalResult e = evaluate_run(s, corpus, end, world);
    r.val_loss = e.loss;
    r.val_bpb = e.bits_per_byte;
    r.val_batch_losses = e.batch_losses;
    r.val_windows = int64_t(e.windows);
  }
  r.tokens_per_s = totals.speeds.empty() ? totals.first_speed : median(totals.speeds);  // a 1-step run: its one step
  if (!totals.cpu_shares.empty()) r.cpu_share = median(totals.cpu_shares);
  if (totals.wall_seconds.size() >= 5) {
    std::vector<double> w = totals.wall_seconds;
    std::sort(w.begin(), w.end());
    r.step_time_spread = w[w.size() * 9 / 10] / std::max(w[w.size() / 10], 1e-9);
  }
  r.scale_statistics_per_step = end > start ? totals.scale_statistics / double(end - start) : 0;
  r.mean_underflow = totals.operand_stats ? totals.underflow / double(totals.operand_stats) : 0;
  r.mean_clipped = totals.operand_stats ? totals.clipped / double(totals.operand_stats) : 0;
  r.steps = end;
  r.skipped = skipped;
  r.train_loss = last_loss;
  r.world_size = world.size();
  if (end > start) r.allreduce_bytes_per_step = totals.comm_bytes / double(end - start);
  if (totals.step_seconds > 0) r.allreduce_share = totals.comm_seconds / totals.step_seconds;
  if (end == cfg.steps) {
    check_parameters_agree(s.names, s.params, end, world);
    if (world.root()) save_checkpoint(s, (dir / "model.safetensors").string(), end, skipped, CheckpointContents::model);
  }
  // The process's peak resident memory (VmHWM) now that the last evaluation and both files are
  // written (a checkpoint streams to disk: io/atomic_file.hpp).
  r.peak_memory_mb = double(platform::peak_memory_bytes()) / (1024.0 * 1024.0);
  log << "peak memory: " << std::lround(r.peak_memory_mb) << " MB\n";
  log << "stopped at step " << end << " of " << cfg.steps << "\n";
  return r;
}

std::vector<StepTime> time_training_steps(const TrainConfig& given, const Corpus& corpus, int64_t warmup, int64_t steps,
                                          double min_seconds) {
  struct RestoreStatistics {
    ~RestoreStatistics() { quant::set_collect_statistics(true); }
  } restore_statistics;
  quant::set_collect_statistics(false);  // as on the steps between train()'s statistics steps
  const platform::World& world = platform::world();
  TrainConfig config = with_recipe_defaults(with_pretrained_model(given));
  config.validate();
  std::unique_ptr<Session> s = make_session(config, nullptr);
  const std::vector<quant::Quantizer*> quantizers = model_quantizers(s->model);
  std::vector<StepTime> times;
  double timed = 0;
  for (int64_t step = 0;; ++step) {
    if (step >= warmup + steps) {  // more while the timed steps fall short of min_seconds; rank 0 decides for every rank
      const bool more = timed < min_seconds && step < warmup + 10 * steps;
      if (platform::from_root(world, [&] { return std::string(more ? "more" : ""); }) != "more") break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = process_cpu_seconds();
    s->opt->set_lr(learning_rate(config, step));
    AllreduceCost comm;
    update(*s, forward_backward(*s, corpus, step, quantizers, world, comm), step, false);
    if (step < warmup) continue;
    times.push_back({std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), process_cpu_seconds() - cpu0});
    timed += times.back().wall_s;
  }
  return times;
}

}  // namespace scalify::train
