// `scalify inspect` (exponent histograms of every tensor, scale evolution of a run) and
// `scalify quantize` (FP8 post-training quantisation of a checkpoint, or the seed 003 sweep).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "scalify/error.hpp"
#include "scalify/inspect/inspect.hpp"
#include "scalify/inspect/scale_history.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/train/pretrained_ptq.hpp"
#include "scalify/train/ptq.hpp"

namespace scalify::cli {

namespace fs = std::filesystem;

namespace {

// Checked before the work, so a long run does not end in this error.
void check_out_folder(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) throw Error("--out '" + out + "' exists and is not a folder");
}

void report_missing_picture(const std::string& why) {
  if (!why.empty()) std::fprintf(stderr, "scalify: warning: no picture: %s (the CSV files are written)\n", why.c_str());
}

// A whole number in [lo, hi] from an option's text; errors name the option.
int parse_int_in(const std::string& option, const std::string& text, int lo, int hi) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
    throw Error("quantize: " + option + " takes a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + text +
                "'");
  return int(v);
}

void run_inspect(const std::string& target, std::string out, const std::string& format, const inspect::InspectOptions& given) {
  inspect::InspectOptions o = given;
  o.format = parse_format(format);
  const bool run_folder = fs::is_directory(target);
  if (out.empty()) out = run_folder ? (fs::path(target) / (o.initial ? "inspect_init" : "inspect")).string() : "inspect";
  check_out_folder(out);
  // Everything is read before anything is written, so bad input leaves no partial output.
  const bool has_metrics = run_folder && fs::exists(fs::path(target) / "metrics.jsonl");
  const std::vector<inspect::ScaleSeries> series = has_metrics ? inspect::read_scale_history(target) : std::vector<inspect::ScaleSeries>{};
  const inspect::Inspection in = inspect::inspect_checkpoint(target, o);
  report_missing_picture(inspect::write_inspection(in, out));
  std::printf("%zu tensors of recipe %s at step %lld against %s: %s/tensors.csv, histograms.csv, histograms.png\n", in.tensors.size(),
              in.recipe.c_str(), (long long)in.step, format.c_str(), out.c_str());
  std::vector<std::string> nonfinite;
  for (const inspect::InspectedTensor& t : in.tensors)
    if (t.histogram.nonfinite > 0) nonfinite.push_back(t.name + " (" + inspect::kind_name(t.kind) + ")");
  if (!nonfinite.empty())
    std::fprintf(stderr, "scalify: warning: %zu tensors hold NaN or infinite values, first %s (tensors.csv counts them)\n",
                 nonfinite.size(), nonfinite[0].c_str());
  for (const auto& [what, field] :
       {std::pair{"underflow", &inspect::ExponentHistogram::underflow}, std::pair{"clipped", &inspect::ExponentHistogram::clipped}}) {
    auto share = [f = field](const inspect::InspectedTensor& t) {
      return double(t.histogram.*f) / double(std::max<int64_t>(1, t.histogram.count));
    };
    const auto worst =
        std::max_element(in.tensors.begin(), in.tensors.end(), [&](const auto& x, const auto& y) { return share(x) < share(y); });
    if (worst == in.tensors.end() || worst->histogram.*field == 0)
      std::printf("most %s: none\n", what);
    else
      std::printf("most %s: %s (%s) %.2f%%\n", what, worst->name.c_str(), inspect::kind_name(worst->kind), 100.0 * share(*worst));
  }
  if (!has_metrics) return;
  if (series.empty()) {
    std::printf(
        "no scale history: the metrics hold no quantiser statistics (a recipe that quantises nothing, or fewer steps than stats_every)\n");
  } else {
    report_missing_picture(inspect::write_scale_history(series, out, "recipe " + in.recipe));
    std::printf("scale history of %zu quantised tensors: %s/scales.csv, scales.png, quant_fractions.png\n", series.size(), out.c_str());
  }
}

struct QuantizeArgs {
  std::string checkpoint, model, out, method = "amax", sweep, data, bias = "0", format = "e4m3";
  int64_t context = 0, windows = 0;
  bool weights_only = false;
};

// What --method, --bias, --format and --weights-only ask for.
train::PtqOptions ptq_options(const QuantizeArgs& a) {
  train::PtqOptions o{train::parse_ptq_method(a.method), parse_int_in("--bias", a.bias, -64, 64), !a.weights_only};
  if (a.format != "e4m3" && a.format != "e5m2") throw Error("quantize: --format takes e4m3 or e5m2, got '" + a.format + "'");
  o.element = a.format == "e5m2" ? Format::e5m2 : Format::e4m3;
  return o;
}

// LO:HI of --sweep.
std::pair<int, int> sweep_range(const std::string& sweep) {
  const size_t colon = sweep.find(':');
  if (colon == std::string::npos) throw Error("quantize: --sweep takes LO:HI (e.g. -8:12), got '" + sweep + "'");
  const int lo = parse_int_in("--sweep LO", sweep.substr(0, colon), -64, 64),
            hi = parse_int_in("--sweep HI", sweep.substr(colon + 1), -64, 64);
  if (lo > hi) throw Error("quantize: --sweep LO:HI needs LO <= HI, got " + sweep);
  return {lo, hi};
}

// A sweep's progress on stderr, a line per evaluation (each takes long enough to wonder about):
// what it evaluates, its index of all, the time since the sweep began.
train::SweepProgress sweep_progress() {
  return [start = std::chrono::steady_clock::now()](const std::string& what, size_t index, size_t total) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "quantize: evaluation %zu of %zu: %s (elapsed %.0f s)\n", index, total, what.c_str(), elapsed);
    std::fflush(stderr);
  };
}

// The summary of a quantised file written.
void print_written(const std::string& out, const std::string& method, const train::PtqOptions& o, const std::vector<train::PtqWeight>& w) {
  double worst_under = 0, worst_clip = 0;
  for (const train::PtqWeight& x : w) {
    worst_under = std::max(worst_under, x.underflow);
    worst_clip = std::max(worst_clip, x.clipped);
  }
  const bool fp4 = o.method == train::PtqMethod::nvfp4 || o.method == train::PtqMethod::mxfp4;
  std::printf("wrote %s: %zu linear weights in %s (%s%s%s); largest underflow %.3f%%, largest clipped %.3f%%\n", out.c_str(), w.size(),
              fp4 ? "e2m1" : std::string(format_name(o.element)).c_str(), method.c_str(),
              o.method == train::PtqMethod::cscale ? (", bias " + std::to_string(o.bias)).c_str() : "",
              o.activations ? "" : ", weights only", 100 * worst_under, 100 * worst_clip);
}

// quantize --model DIR --data FILE: one method's loss against f32, or with --sweep seed 003's
// study; --out FILE (without --sweep): the quantised model written for `scalify eval`.
void quantize_pretrained(const QuantizeArgs& a, bool method_given, bool bias_given, bool format_given, bool sweep) {
  if (a.context < 0 || a.windows < 0) throw Error("quantize: --context and --windows must be >= 0");
  if (sweep && (bias_given || a.weights_only || method_given || format_given))
    throw Error("quantize: --sweep runs every method, format and bias; it takes neither --method, --format, --bias nor --weights-only");
  const train::PtqOptions o = ptq_options(a);
  if (bias_given && o.method != train::PtqMethod::cscale) throw Error("quantize: --bias applies to --method cscale only");
  const auto range = sweep ? sweep_range(a.sweep) : std::pair{o.bias, o.bias};
  if (!sweep && !a.out.empty()) {
    print_written(a.out, a.method, o, train::quantize_pretrained(a.model, a.out, o, a.context));
    if (a.data.empty()) return;
  }
  if (a.data.empty()) throw Error("quantize: --model needs --data FILE (text or an llm.c token file), or --out FILE to write the model");
  if (sweep && !a.out.empty()) check_out_folder(a.out);
  const train::Pretrained p = train::load_pretrained(a.model);
  const std::vector<int32_t> tokens = train::read_tokens(a.data, p.tokenizer.get(), p.hf.model.vocab);
  const int64_t context = a.context > 0 ? a.context : train::default_context(p.hf.model);
  if (sweep) {
    const train::PretrainedPtq study =
        train::pretrained_ptq(p, tokens, context, size_t(a.windows), range.first, range.second, sweep_progress());
    std::printf("%s", train::pretrained_ptq_markdown(study).c_str());
    if (!a.out.empty()) {
      report_missing_picture(train::write_pretrained_ptq(a.out, study));
      std::printf("report: %s/report.md, sweep.csv, scaling_biases.csv, scaling_biases.png\n", a.out.c_str());
    }
    return;
  }
  const std::map<std::string, Tensor> f32 = train::parameter_values(*p.session);
  const train::TokenEval base = train::evaluate_tokens(*p.session, tokens, p.tokenizer.get(), context, size_t(a.windows));
  std::vector<train::PtqWeight> report;
  const auto values = train::ptq_quantize_values(f32, train::ptq_weights(p.session->model), o, &report);
  const train::TokenEval q = train::evaluate_tokens(*train::inference_session(p.session->cfg, train::ptq_inference_recipe(o), values),
                                                    tokens, p.tokenizer.get(), context, size_t(a.windows));
  std::printf("f32: loss %.6f, perplexity %.4f\n%s%s%s: loss %.6f, perplexity %.4f (%+.3f%% loss; %zu tokens)\n", base.loss,
              base.perplexity, a.method.c_str(), o.method == train::PtqMethod::cscale ? (" bias " + std::to_string(o.bias)).c_str() : "",
              o.activations ? "" : " weights only", q.loss, q.perplexity, 100 * (q.loss - base.loss) / base.loss, q.tokens);
}

}  // namespace

void add_inspect_commands(CLI::App& app) {
  struct InspectArgs {
    std::string target, out, format = "e4m3";
    inspect::InspectOptions o;
  };
  auto ia = std::make_shared<InspectArgs>();
  auto* i = app.add_subcommand("inspect",
                               "Exponent histograms of every activation, weight and gradient of a checkpoint on one batch (CSV, PNG), "
                               "and for a run folder the scale of each quantised tensor over training");
  i->add_option("checkpoint", ia->target, "checkpoint .safetensors or run folder")->required();
  i->add_option("--out", ia->out, "output folder (default: <run>/inspect, or ./inspect for a file)");
  i->add_option("--format", ia->format, "format whose range the histograms are drawn against (default e4m3)");
  i->add_flag("--initial", ia->o.initial, "the run's model at initialisation instead of the checkpoint's");
  i->add_option("--batch", ia->o.batch, "which training batch (default 0)")->transform(non_negative_integer());
  i->add_option("--data", ia->o.data, "corpus (default: the run's)");
  i->callback([ia] { run_inspect(ia->target, ia->out, ia->format, ia->o); });

  auto qa = std::make_shared<QuantizeArgs>();
  auto* q = app.add_subcommand(
      "quantize",
      "Post-training quantisation of a checkpoint's linear layers to FP8 e4m3 (FP8-AMAX, FP8-CSCALE, MXFP8) or FP4 e2m1 (NVFP4, MXFP4); "
      "`scalify eval` runs the result. --sweep LO:HI compares them instead (seed 003 Table 3)");
  auto* ckpt = q->add_option("checkpoint", qa->checkpoint, "checkpoint .safetensors or run folder");
  auto* model =
      q->add_option("--model", qa->model, "a Hugging Face model folder or .gguf file instead: evaluate --method, or --sweep, on --data")
          ->excludes(ckpt);
  q->add_option("--context", qa->context, "with --model: tokens per window (default: the model's longest, at most 2048)")
      ->transform(integer())
      ->needs(model);
  q->add_option("--windows", qa->windows, "with --model: at most this many windows per evaluation (default: all)")
      ->transform(integer())
      ->needs(model);
  q->add_option("--out", qa->out,
                "quantised checkpoint to write (.safetensors; with --model too: `scalify eval FILE` runs it), or with --sweep a folder "
                "for the report");
  auto* method = q->add_option("--method", qa->method,
                               "amax (per-tensor bias from amax), cscale (one constant bias), mx (MXFP8), nvfp4, mxfp4; default amax");
  auto* weights_only = q->add_flag("--weights-only", qa->weights_only, "quantise the weights only; the activations stay f32");
  auto* bias = q->add_option("--bias", qa->bias, "cscale: the scaling bias b in [-64, 64] (values are cast as x * 2^b); default 0");
  auto* format = q->add_option("--format", qa->format, "amax and cscale: the FP8 element format, e4m3 (default) or e5m2");
  auto* sweep = q->add_option("--sweep", qa->sweep,
                              "LO:HI: validation loss of f32, FP8-AMAX (e4m3, e5m2), MXFP8, NVFP4, MXFP4 and FP8-CSCALE (e4m3, e5m2) for "
                              "every bias in [LO, HI]");
  q->add_option("--data", qa->data, "--sweep: corpus (default: the run's); with --model: a text or llm.c token file (required)");
  q->callback([qa, method, bias, format, sweep, weights_only] {
    if (!qa->model.empty())
      return quantize_pretrained(*qa, method->count() > 0, bias->count() > 0, format->count() > 0, sweep->count() > 0);
    if (qa->checkpoint.empty()) throw Error("quantize: give a checkpoint or --model DIR");
    if (sweep->count() == 0) {
      if (qa->out.empty()) throw Error("quantize: --out FILE.safetensors is required");
      const train::PtqOptions o = ptq_options(*qa);
      if (bias->count() > 0 && o.method != train::PtqMethod::cscale) throw Error("quantize: --bias applies to --method cscale only");
      if (!qa->data.empty()) throw Error("quantize: --data applies to --sweep only (eval takes --data for the quantised file)");
      print_written(qa->out, qa->method, o, train::quantize_checkpoint(qa->checkpoint, qa->out, o));
      return;
    }
    if (bias->count() + method->count() + weights_only->count() + format->count() > 0)
      throw Error("quantize: --sweep runs every method, format and bias; it takes neither --method, --format, --bias nor --weights-only");
    const auto [lo, hi] = sweep_range(qa->sweep);
    if (!qa->out.empty()) check_out_folder(qa->out);
    const std::vector<train::PtqSweepRow> rows = train::ptq_sweep(qa->checkpoint, lo, hi, qa->data, sweep_progress());
    const std::string md = train::ptq_sweep_markdown(rows);
    std::printf("%s", md.c_str());
    if (!qa->out.empty()) {
      io::make_folder(qa->out);
      std::ostringstream csv;
      csv << "method,bias,val_loss,val_bpb,relative,not_run\n";
      for (const train::PtqSweepRow& r : rows)
        csv << r.method << "," << r.bias << "," << r.eval.loss << "," << r.eval.bits_per_byte << "," << r.relative << ",\"" << r.not_run
            << "\"\n";
      io::write_text_atomically((fs::path(qa->out) / "sweep.csv").string(), csv.str());
      io::write_text_atomically((fs::path(qa->out) / "sweep.md").string(), md);
    }
  });
}

}  // namespace scalify::cli
