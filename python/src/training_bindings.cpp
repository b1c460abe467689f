// Training: the trainer (train), comparisons (compare), the trainer's GPT and batches, checkpoints
// and inspect.
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "scalify/compare/compare.hpp"
#include "scalify/compare/sweep.hpp"
#include "scalify/error.hpp"
#include "scalify/inspect/inspect.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/train/session.hpp"
#include "scalify/train/trainer.hpp"

namespace scalify::python {
namespace {

namespace fs = std::filesystem;
using namespace nb::literals;

nb::dict train_result(const train::TrainResult& r);

// Trains as `scalify train --set KEY=VALUE ...` does; progress(step, steps, loss) after every
// step, with the GIL held only for it. Ctrl-C stops the run between steps (KeyboardInterrupt): its
// files are as an interrupted CLI run leaves them, resumable from the last checkpoint.
// Python drives one process: under mpirun its ranks could not stop together (Ctrl-C, a Python
// error in a callback), so several ranks are refused; `mpirun scalify train` is the way there.
void refuse_several_ranks() {
  if (platform::world().size() > 1)
    throw Error("the Python package trains on one process; for several, run `mpirun -np N scalify train` (docs/DATA_PARALLEL.md)");
}

// Train config keys given as text (--set KEY=VALUE).
void apply_settings(train::TrainConfig& c, const std::map<std::string, std::string>& settings) {
  for (const auto& [k, v] : settings) {
    without_nul(k, "a config key");
    c.set(k, without_nul(v, "config key '" + k + "'"));
  }
}

// Where a new run's Recipe object goes for its config.toml to name: the run folder's recipe.json,
// which the trainer writes there for every new run anyway (the same text) and which stays with
// the run; never a path made from the recipe's name. One found there must be this recipe: another
// run's is refused, never overwritten.
std::string recipe_file_in_run(const std::string& out, const quant::Recipe& recipe) {
  const std::string file = (fs::absolute(out) / "recipe.json").lexically_normal().string();
  if (fs::exists(file)) {
    if (quant::load_recipe(file).to_json() != recipe.to_json())
      throw Error("train: '" + file + "' holds another recipe than '" + recipe.name +
                  "' (another run's); give another out, or delete it if that run is not wanted");
    return file;
  }
  io::make_folder(out);
  io::write_text_atomically(file, recipe.to_json() + "\n");
  return file;
}

// The config `scalify train` would train with: `settings` as --set KEY=VALUE; with resume, over
// the run's own config.toml as `scalify train --resume` does (train::resume_config). A Recipe
// object (`recipe`) is written into a new run's folder; on a resume it must be the run's.
train::TrainConfig train_config(const std::string& out, const std::map<std::string, std::string>& settings,
                                const std::optional<quant::Recipe>& recipe, bool resume) {
  without_nul(out, "out");
  auto apply = [&](train::TrainConfig& c) { apply_settings(c, settings); };
  if (resume) {
    train::TrainConfig c = train::resume_config(out, apply);
    if (recipe && recipe->to_json() != quant::load_recipe(c.recipe).to_json())
      throw Error("resume: recipe '" + recipe->name + "' differs from the one '" + out +
                  "' was trained with; a run keeps its recipe: start a new run to train under another");
    return c;
  }
  train::TrainConfig c;
  apply(c);
  c.out = out;
  if (recipe) {
    recipe->validate();
    c.validate();  // the other keys, before the run folder exists
    c.recipe = recipe_file_in_run(out, *recipe);
  }
  return c;
}

nb::dict train(const std::string& out, const std::map<std::string, std::string>& settings, const std::optional<quant::Recipe>& recipe,
               bool resume, std::function<void(int64_t, int64_t, double)> progress, bool save_initial) {
  refuse_several_ranks();
  const train::TrainConfig c = train_config(out, settings, recipe, resume);
  train::TrainResult r;
  {
    nb::gil_scoped_release release;
    r = train::train(
        c, resume,
        [&](const train::StepProgress& p) {
          nb::gil_scoped_acquire acquire;
          if (PyErr_CheckSignals() != 0) throw nb::python_error();
          if (progress) progress(p.step, p.steps, p.loss);
        },
        0, save_initial);
  }
  return train_result(r);
}

nb::dict train_result(const train::TrainResult& r) {
  nb::dict d;
  d["run_dir"] = r.run_dir;
  d["steps"] = r.steps;
  d["skipped"] = r.skipped;
  d["train_loss"] = r.train_loss;
  d["val_loss"] = r.val_loss;
  d["val_bpb"] = r.val_bpb;
  d["tokens_per_s"] = r.tokens_per_s;
  d["mean_underflow"] = r.mean_underflow;
  d["max_underflow"] = r.max_underflow;
  d["mean_clipped"] = r.mean_clipped;
  d["scale_statistics_per_step"] = r.scale_statistics_per_step;
  d["state_bytes_per_parameter"] = r.state_bytes_per_parameter;
  return d;
}

// `scalify compare` on `recipes` (a list spec: "seeds", "fp4", "f32,nvfp4", ...): one dict per
// recipe (its TrainResult's fields and the comparison's status, baseline and delta).
// progress(step, steps, loss, recipe=, seed=, run=, runs=, tokens_per_s=, eta_s=, line=) after
// every training step: train's three values first, so one callback can serve both.
nb::list run_compare(const std::map<std::string, std::string>& settings, const std::string& recipes, const std::string& out, bool resume,
                     const std::string& seeds, int speed_rounds, nb::object progress) {
  scalify::compare::CompareConfig c;
  refuse_several_ranks();
  without_nul(out, "compare: out");
  without_nul(recipes, "compare: recipes");
  if (resume) {
    c = scalify::compare::comparison_config(out);
  } else {
    apply_settings(c.base, settings);
    if (!settings.count("eval_every")) c.base.eval_every = scalify::compare::default_eval_every(c.base.steps);  // as the CLI
    c.recipes = scalify::compare::recipe_list(recipes);
    if (!seeds.empty()) c.seeds = scalify::compare::seed_list(seeds, c.base.seed);
    if (speed_rounds < 0 || speed_rounds > 100) throw scalify::Error("compare: speed_rounds must be 0 to 100");
    c.speed.rounds = speed_rounds;
  }
  c.out = out;
  scalify::compare::CompareReport rep;
  try {
    nb::gil_scoped_release release;
    rep = scalify::compare::compare(
        c, resume,
        [&](const std::string&) {
          nb::gil_scoped_acquire acquire;
          try {
            if (PyErr_CheckSignals() != 0) throw nb::python_error();
          } catch (const nb::python_error&) {  // Ctrl-C: the whole comparison stops
            throw scalify::compare::Stopped(std::current_exception());
          }
        },
        "python: scalify.compare",
        [&](const scalify::compare::CompareStep& s) {
          nb::gil_scoped_acquire acquire;
          try {
            if (!progress.is_none())
              progress(s.step.step, s.step.steps, s.step.loss, "recipe"_a = s.recipe, "seed"_a = s.seed, "run"_a = s.run, "runs"_a = s.runs,
                       "tokens_per_s"_a = s.step.tokens_per_s, "eta_s"_a = s.eta_s, "line"_a = s.line);
          } catch (const nb::python_error&) {  // the callback's own error: the whole comparison stops
            throw scalify::compare::Stopped(std::current_exception());
          }
        });
  } catch (const scalify::compare::Stopped& stopped) {  // the GIL held again: raised as itself
    std::rethrow_exception(stopped.cause);
  }
  nb::list rows;
  for (const scalify::compare::RecipeOutcome& o : rep.rows) {
    nb::dict d = train_result(o.result);
    d["recipe"] = o.recipe;
    d["status"] = o.status;
    d["note"] = o.note;
    d["baseline"] = o.baseline;
    d["seeds"] = o.seeds;
    d["val_delta"] = o.val_delta;
    d["val_delta_ci95"] = o.noise.half_width;
    d["window_ci95"] = o.noise.window_half_width;
    d["seed_ci95"] = o.noise.seed_half_width;
    d["verdict"] = o.verdict;
    if (o.speed.vs_f32 > 0) {  // the interleaved timing (one thread), beside the training run's tokens_per_s
      d["speed_vs_f32"] = o.speed.vs_f32;
      d["speed_vs_f32_low"] = o.speed.vs_f32_low;
      d["speed_vs_f32_high"] = o.speed.vs_f32_high;
    }
    d["seconds"] = o.seconds;
    d["peak_memory_mb"] = o.peak_memory_mb;
    rows.append(d);
  }
  return rows;
}

// `scalify sweep`: {"key", "values" (the grid's numbers, ascending), "labels", "cells" (one dict
// per cell: recipe, width, depth, value, label, val_loss, status, note, best), "verdicts" ({recipe:
// {across_widths, across_depths, widths_steps, depths_steps}}), "report" (report.md's path)}.
// widths / depths: "" for the config's. progress(k, n, val_loss, recipe=, width=, depth=,
// value=, status=, line=) after every cell.
nb::dict run_sweep(const std::map<std::string, std::string>& settings, const std::string& vary, const std::string& widths,
                   const std::string& depths, const std::string& recipes, const std::string& out, const std::string& seeds,
                   nb::object progress) {
  namespace cmp = scalify::compare;
  refuse_several_ranks();
  for (const auto& [text, what] : {std::pair{&out, "sweep: out"}, {&vary, "sweep: vary"}, {&recipes, "sweep: recipes"}})
    without_nul(*text, what);
  cmp::SweepConfig c;
  apply_settings(c.base, settings);
  c.grid = cmp::parse_vary(vary, c.base);
  if (!widths.empty()) c.widths = cmp::parse_sizes(widths, "widths");
  if (!depths.empty()) c.depths = cmp::parse_sizes(depths, "depths");
  c.recipes = cmp::recipe_list(recipes);
  if (!seeds.empty()) c.seeds = cmp::seed_list(seeds, c.base.seed);
  c.out = out;
  cmp::SweepReport rep;
  try {
    nb::gil_scoped_release release;
    rep = cmp::sweep(
        c,
        [&](const std::string&) {
          nb::gil_scoped_acquire acquire;
          try {
            if (PyErr_CheckSignals() != 0) throw nb::python_error();
          } catch (const nb::python_error&) {  // Ctrl-C: the whole sweep stops
            throw cmp::Stopped(std::current_exception());
          }
        },
        [&](const cmp::SweepCell& cell, size_t k, size_t n, const std::string& line) {
          nb::gil_scoped_acquire acquire;
          try {
            if (!progress.is_none())
              progress(k, n, cell.val_loss, "recipe"_a = cell.recipe, "width"_a = cell.width, "depth"_a = cell.depth,
                       "value"_a = c.grid.values[cell.value].x, "status"_a = cell.status, "line"_a = line);
          } catch (const nb::python_error&) {  // the callback's own error: the whole sweep stops
            throw cmp::Stopped(std::current_exception());
          }
        },
        "python: scalify.sweep");
  } catch (const cmp::Stopped& stopped) {  // the GIL held again: raised as itself
    std::rethrow_exception(stopped.cause);
  }
  nb::dict d;
  d["key"] = c.grid.key;
  nb::list values, labels, cells;
  for (const cmp::SweepValue& v : c.grid.values) values.append(v.x), labels.append(v.label);
  std::map<std::pair<std::string, std::pair<int64_t, int64_t>>, std::vector<double>> rows;  // for each shape's best
  for (const cmp::SweepCell& cell : rep.cells) {
    auto& row = rows[{cell.recipe, {cell.width, cell.depth}}];
    row.resize(c.grid.values.size(), NAN);
    if (cell.status == "ok") row[cell.value] = cell.val_loss;
  }
  for (const cmp::SweepCell& cell : rep.cells) {
    nb::dict r;
    r["recipe"] = cell.recipe;
    r["width"] = cell.width;
    r["depth"] = cell.depth;
    r["value"] = c.grid.values[cell.value].x;
    r["label"] = c.grid.values[cell.value].label;
    r["val_loss"] = cell.val_loss;
    r["status"] = cell.status;
    r["note"] = cell.note;
    r["best"] = cmp::best_value(rows.at({cell.recipe, {cell.width, cell.depth}})) == cell.value;
    cells.append(r);
  }
  nb::dict verdicts;
  for (const cmp::SweepRecipeReport& r : rep.recipes) {
    nb::dict v;
    v["across_widths"] = r.across_widths.text;
    v["across_depths"] = r.across_depths.text;
    v["widths_steps"] = r.across_widths.steps;
    v["depths_steps"] = r.across_depths.steps;
    verdicts[r.recipe.c_str()] = v;
  }
  d["values"] = values;
  d["labels"] = labels;
  d["cells"] = cells;
  d["verdicts"] = verdicts;
  d["report"] = (fs::path(out) / "report.md").string();
  return d;
}

// A safetensors file (a checkpoint, a quantised checkpoint): every tensor's values as float32
// (codes decoded: FP8 / FP4 codes as their format values, without their scales), and the metadata.
nb::tuple load_checkpoint(const std::string& path) {
  without_nul(path, "load_checkpoint: the path");
  const io::SafeTensors st = io::read_safetensors(path);
  nb::dict tensors;
  for (const auto& [name, t] : st.tensors) {
    std::vector<size_t> shape;
    for (int64_t d : t.shape()) shape.push_back(size_t(d));
    tensors[name.c_str()] = owned_array<float>(t.to_floats(), shape);
  }
  nb::dict meta;
  for (const auto& [k, v] : st.metadata) meta[k.c_str()] = v;
  return nb::make_tuple(tensors, meta);
}

// The trainer's GPT, built for a recipe from train config keys (d_model, layers, heads, seq, ...).
struct PyGpt {
  nn::Gpt model;
};

void bind_gpt(nb::module_& m) {
  nb::class_<PyGpt>(m, "Gpt", "The trainer's GPT (`nn::Gpt`), built from train config keys and a recipe")
      .def(
          "__init__",
          [](PyGpt* g, const std::map<std::string, std::string>& settings, const quant::Recipe& recipe) {
            train::TrainConfig c;
            apply_settings(c, settings);
            c.validate();
            recipe.validate();
            train::check_fits_in_memory(c, recipe, false);  // the CLI's refusal, not std::bad_alloc
            new (g) PyGpt{nn::Gpt(train::Session::model_config(c, recipe), c.seed, recipe)};
          },
          "settings"_a, "recipe"_a)
      .def(
          "parameters",
          [](const PyGpt& g) {
            nb::dict d;
            for (const auto& [name, v] : g.model.parameters()) d[name.c_str()] = v;
            return d;
          },
          nb::sig("def parameters(self) -> dict[str, Tensor]"),
          "Every parameter by name, in the model's order (Tensors that require gradients)")
      .def(
          "loss",
          [](const PyGpt& g, const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& ids,
             const nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>& targets) {
            const Tensor i = ids_from(ids), t = ids_from(targets);
            nb::gil_scoped_release release;
            return g.model.loss(i, t);
          },
          "ids"_a, "targets"_a, "Mean next-token cross-entropy of ids [B, T] against targets [B, T]");
  m.def(
      "training_batch",
      [](const std::map<std::string, std::string>& settings, uint64_t index) {
        train::TrainConfig c;
        apply_settings(c, settings);
        const train::Corpus corpus = train::corpus_for(c);
        const train::Batch b =
            train::make_batch(corpus.train, train::train_starts(corpus.train.size(), c.batch, c.model.seq, c.seed, index), c.model.seq);
        auto ints = [](const Tensor& t) {
          std::vector<int64_t> v;
          for (double x : t.to_vector()) v.push_back(int64_t(x));
          return owned_array<int64_t>(std::move(v), shape_to(t.shape()));
        };
        return nb::make_tuple(ints(b.ids), ints(b.targets));
      },
      "settings"_a, "index"_a,
      nb::sig("def training_batch(settings: collections.abc.Mapping[str, str], index: int) -> "
              "tuple[numpy.typing.NDArray[numpy.int64], numpy.typing.NDArray[numpy.int64]]"),
      "The ids and targets of the trainer's batch `index` for a config (its corpus, seed, batch, seq)");
}

// `scalify inspect` as data: one dict per tensor (name, kind, storage, scale_log2, rms, the
// counts against the range named in "range": the format's, or an optimizer moment's own layout)
// with its exponent histogram as (exponents, counts) arrays.
nb::dict run_inspect(const std::string& checkpoint, const std::string& format, bool initial, uint64_t batch, const std::string& data) {
  without_nul(checkpoint, "inspect: the checkpoint");
  without_nul(data, "inspect: data");
  inspect::InspectOptions o;
  o.format = parse_format(format);
  o.initial = initial;
  o.batch = batch;
  o.data = data;
  inspect::Inspection r;
  {
    nb::gil_scoped_release release;
    r = inspect::inspect_checkpoint(checkpoint, o);
  }
  nb::list tensors;
  for (const inspect::InspectedTensor& t : r.tensors) {
    nb::dict d;
    d["name"] = t.name;
    d["kind"] = inspect::kind_name(t.kind);
    d["storage"] = std::string(dtype_name(t.storage));
    d["scale_log2"] = t.scale_log2;
    d["rms"] = t.rms;
    d["range"] = t.range_name;
    const inspect::ExponentHistogram& h = t.histogram;
    for (const auto& [key, n] : {std::pair("count", h.count), std::pair("zeros", h.zeros), std::pair("nonfinite", h.nonfinite),
                                 std::pair("underflow", h.underflow), std::pair("subnormal", h.subnormal), std::pair("normal", h.normal),
                                 std::pair("clipped", h.clipped)})
      d[key] = n;
    std::vector<int64_t> exps, counts;
    for (int e = h.lowest(); e <= h.highest(); ++e) {
      exps.push_back(e);
      counts.push_back(h.at(e));
    }
    const size_t n = exps.size();
    d["exponents"] = owned_array<int64_t>(std::move(exps), {n});
    d["counts"] = owned_array<int64_t>(std::move(counts), {n});
    tensors.append(d);
  }
  nb::dict out;
  out["recipe"] = r.recipe;
  out["step"] = r.step;
  out["format"] = std::string(format_name(r.format));
  out["tensors"] = tensors;
  return out;
}

}  // namespace

void bind_training(nb::module_& m) {
  m.def("train", &train, "out"_a, "settings"_a, "recipe"_a = nb::none(), "resume"_a = false, "progress"_a = nb::none(),
        "save_initial"_a = false,
        nb::sig("def train(out: str, settings: collections.abc.Mapping[str, str], recipe: Recipe | None = None, resume: bool = False, "
                "progress: collections.abc.Callable[[int, int, float], None] | None = None, save_initial: bool = False) -> "
                "dict[str, typing.Any]"));
  m.def("compare", &run_compare, "settings"_a, "recipes"_a, "out"_a, "resume"_a = false, "seeds"_a = "", "speed_rounds"_a = 5,
        "progress"_a.none() = nb::none(),
        nb::sig("def compare(settings: collections.abc.Mapping[str, str], recipes: str, out: str, resume: bool = False, seeds: str = '', "
                "speed_rounds: int = 5, progress: collections.abc.Callable[..., None] | None = None) -> list[dict[str, typing.Any]]"));
  m.def("sweep", &run_sweep, "settings"_a, "vary"_a, "widths"_a, "depths"_a, "recipes"_a, "out"_a, "seeds"_a = "",
        "progress"_a.none() = nb::none(),
        nb::sig("def sweep(settings: collections.abc.Mapping[str, str], vary: str, widths: str, depths: str, recipes: str, out: str, "
                "seeds: str = '', progress: collections.abc.Callable[..., None] | None = None) -> dict[str, typing.Any]"));
  m.def("load_checkpoint", &load_checkpoint, "path"_a,
        nb::sig("def load_checkpoint(path: str) -> tuple[dict[str, numpy.typing.NDArray[numpy.float32]], dict[str, str]]"));
  m.def("inspect", &run_inspect, "checkpoint"_a, "format"_a = "e4m3", "initial"_a = false, "batch"_a = 0, "data"_a = "",
        nb::sig("def inspect(checkpoint: str, format: str = 'e4m3', initial: bool = False, batch: int = 0, data: str = '') -> "
                "dict[str, typing.Any]"));
  m.def("recipe_lists", &scalify::compare::recipe_list_names);
  bind_gpt(m);
}

}  // namespace scalify::python
