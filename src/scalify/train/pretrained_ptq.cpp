#include "scalify/train/pretrained_ptq.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "scalify/error.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/report/gnuplot.hpp"

namespace scalify::train {

namespace fs = std::filesystem;

namespace {

// The seed's names of the four quantised linear layers (Figure 6).
const std::pair<const char*, const char*> kKinds[] = {
    {"attn.qkv", "attn qkv"}, {"attn.proj", "attn out"}, {"mlp.fc", "ff intermediate"}, {"mlp.out", "ff output"}};

// "h3.mlp.fc" -> {3, "ff intermediate"}.
std::pair<int, std::string> layer_and_kind(const std::string& linear) {
  const size_t dot = linear.find('.');
  const std::string rest = linear.substr(dot + 1);
  for (const auto& [engine, seed] : kKinds)
    if (rest == engine) return {std::stoi(linear.substr(1, dot - 1)), seed};
  throw Error("ptq: no linear-layer kind for '" + linear + "'");
}

EvalResult as_eval_result(const TokenEval& t) { return {t.loss, t.bits_per_byte, t.windows, {}}; }

// FP8-AMAX's biases: each weight's from quantising it, each activation's counted per window as
// the evaluation quantises it (one window a pass: activation_scale_per_window), and the most
// frequent kept (the smallest on a tie).
std::vector<LayerScalingBias> amax_biases(const Pretrained& p, const std::map<std::string, Tensor>& f32, const std::vector<int32_t>& tokens,
                                          int64_t context, size_t max_windows) {
  const PtqOptions amax{PtqMethod::amax, 0};
  std::vector<PtqWeight> weights;
  const auto values = ptq_quantize_values(f32, ptq_weights(p.session->model), amax, &weights);
  const std::unique_ptr<Session> s = inference_session(p.session->cfg, ptq_inference_recipe(amax), values);
  std::map<const quant::Quantizer*, std::string> activation_of;  // each layer's activation quantiser
  for (const auto& [name, linear] : s->model.quantized_linears())
    for (const auto& [role, q] : linear->quantizers())
      if (role == "activation") activation_of[q] = name;
  std::map<std::string, std::map<int, size_t>> counts;
  const quant::InferenceObserver observer([&](const quant::Quantizer& q, const quant::QuantStats& st) {
    const auto it = activation_of.find(&q);
    if (it != activation_of.end()) ++counts[it->second][st.bias];
  });
  evaluate_tokens(*s, tokens, p.tokenizer.get(), context, max_windows);
  std::vector<LayerScalingBias> out;
  for (const PtqWeight& w : weights) {
    const std::string linear = w.name.substr(0, w.name.size() - 2);  // without ".w"
    const auto [layer, kind] = layer_and_kind(linear);
    int mode = 0;
    size_t most = 0;
    for (const auto& [bias, n] : counts[linear])
      if (n > most) {
        mode = bias;
        most = n;
      }
    out.push_back({layer, kind, int(std::lround(w.bias)), mode});
  }
  return out;
}

}  // namespace

PretrainedPtq pretrained_ptq(const Pretrained& p, const std::vector<int32_t>& tokens, int64_t context, size_t max_windows, int lo, int hi,
                             const SweepProgress& progress) {
  const std::map<std::string, Tensor> f32 = parameter_values(*p.session);
  const size_t total = ptq_sweep_evaluations(lo, hi) + 1;  // and the biases' pass
  PretrainedPtq study;
  study.rows = ptq_sweep(
      f32, ptq_weights(p.session->model), lo, hi,
      [&](const quant::Recipe& r, const std::map<std::string, Tensor>& v) {
        return as_eval_result(evaluate_tokens(*inference_session(p.session->cfg, r, v), tokens, p.tokenizer.get(), context, max_windows));
      },
      [&](const std::string& what, size_t index, size_t) {
        if (progress) progress(what, index, total);
      });
  if (progress) progress("FP8-AMAX biases", total, total);
  study.biases = amax_biases(p, f32, tokens, context, max_windows);
  return study;
}

std::string pretrained_ptq_markdown(const PretrainedPtq& study) {
  std::ostringstream md;
  md << ptq_sweep_markdown(study.rows, study.tolerance)
     << "\nFP8-AMAX scaling biases (values are cast as x * 2^b; activations: the most frequent over the windows):\n\n"
     << "| layer | kind | weight | activation |\n|---:|---|---:|---:|\n";
  for (const LayerScalingBias& b : study.biases)
    md << "| " << b.layer << " | " << b.kind << " | " << b.weight << " | " << b.activation << " |\n";
  return md.str();
}

std::string write_pretrained_ptq(const std::string& dir, const PretrainedPtq& study) {
  io::make_folder(dir);
  const fs::path d(dir);
  io::write_text_atomically((d / "report.md").string(), pretrained_ptq_markdown(study));
  std::ostringstream sweep;
  sweep << "method,bias,loss,bits_per_byte,relative,not_run\n";
  for (const PtqSweepRow& r : study.rows)
    sweep << r.method << "," << r.bias << "," << r.eval.loss << "," << r.eval.bits_per_byte << "," << r.relative << ",\"" << r.not_run
          << "\"\n";
  io::write_text_atomically((d / "sweep.csv").string(), sweep.str());
  std::ostringstream csv, dat;
  csv << "layer,kind,weight_bias,activation_bias\n";
  for (const LayerScalingBias& b : study.biases) csv << b.layer << "," << b.kind << "," << b.weight << "," << b.activation << "\n";
  io::write_text_atomically((d / "scaling_biases.csv").string(), csv.str());
  // One gnuplot data block per kind: layer, weight bias, activation bias.
  for (const auto& [engine, kind] : kKinds) {
    dat << "# " << kind << "\n";
    for (const LayerScalingBias& b : study.biases)
      if (b.kind == kind) dat << b.layer << " " << b.weight << " " << b.activation << "\n";
    dat << "\n\n";
  }
  const std::string dat_file = (d / "scaling_biases.dat").string(), script = (d / "scaling_biases.gp").string();
  io::write_text_atomically(dat_file, dat.str());
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 1100,420 font ',10'\n"
     << "set output " << report::gnuplot_quote((d / "scaling_biases.png").string()) << "\n"
     << "set multiplot layout 1,2 title 'FP8-AMAX scaling bias b (x * 2^b is cast to e4m3) by decoder layer'\n"
     << "set xlabel 'decoder layer'\nset ylabel 'scaling bias'\nset grid\nset key outside bottom center horizontal\n"
     << "set xtics " << (study.biases.size() > 4 * 16 ? 5 : 1) << "\nset offsets 0.3, 0.3, 1, 1\n";  // a tic per layer up to 16
  // Both panels on one y range, so weights and activations compare at a glance.
  int lo = 0, hi = 0;
  for (const LayerScalingBias& b : study.biases) {
    lo = std::min({lo, b.weight, b.activation});
    hi = std::max({hi, b.weight, b.activation});
  }
  gp << "set yrange [" << lo - 1 << ":" << hi + 1 << "]\n";
  const char* styles[] = {"lc rgb '#1f77b4' pt 7 dt 1", "lc rgb '#d62728' pt 5 dt 2", "lc rgb '#2ca02c' pt 9 dt 3",
                          "lc rgb '#9467bd' pt 11 dt 4"};
  for (int column : {2, 3}) {
    gp << "set title '" << (column == 2 ? "weights" : "activations (most frequent)") << "'\nplot ";
    for (int k = 0; k < 4; ++k)
      // Each kind a little to the side, so equal biases do not hide each other.
      gp << (k ? ", " : "") << report::gnuplot_quote(dat_file) << " index " << k << " using ($1 + " << 0.06 * (k - 1.5) << "):" << column
         << " with linespoints lw 1.5 " << styles[k] << " title " << report::gnuplot_quote(kKinds[k].second);
    gp << "\n";
  }
  gp << "unset multiplot\n";
  io::write_text_atomically(script, gp.str());
  return report::run_gnuplot(script);
}

}  // namespace scalify::train
