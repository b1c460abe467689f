#include "scalify/inspect/inspect.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "scalify/error.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/optim/state_format.hpp"
#include "scalify/optim/state_layout.hpp"
#include "scalify/report/gnuplot.hpp"
#include "scalify/train/session.hpp"

namespace scalify::inspect {

namespace fs = std::filesystem;

const char* kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::activation: return "activation";
    case TensorKind::activation_grad: return "activation_grad";
    case TensorKind::weight: return "weight";
    case TensorKind::weight_grad: return "weight_grad";
    case TensorKind::first_moment: return "first_moment";
    case TensorKind::second_moment: return "second_moment";
  }
  return "?";
}

namespace {

double largest_scale_log2(const ScaledTensor& t) {
  if (!t.scale.defined()) return NAN;
  double m = 0;
  for (float s : t.scale.to_floats()) m = std::max(m, double(s));
  return m > 0 ? std::log2(m) : NAN;
}

InspectedTensor describe(const std::string& name, TensorKind kind, const ScaledTensor& t, const FormatRange& range,
                         const std::string& range_name) {
  InspectedTensor r{name, kind, t.data.dtype(), largest_scale_log2(t), 0, exponent_histogram(t.data, range), range_name, range};
  const ExponentHistogram& h = r.histogram;
  r.rms = h.count > h.nonfinite ? std::sqrt(h.sum_squares / double(h.count - h.nonfinite)) : NAN;
  return r;
}

}  // namespace

Inspection inspect_checkpoint(const std::string& checkpoint, const InspectOptions& o) {
  std::unique_ptr<train::Session> s;
  Inspection r;
  r.format = o.format;
  const FormatRange range = format_range(o.format);
  const std::string range_name(format_name(o.format));
  auto describe_in_format = [&](const std::string& name, TensorKind kind, const ScaledTensor& t) {
    return describe(name, kind, t, range, range_name);
  };
  if (!fs::exists(checkpoint))
    throw MissingFileError("inspect: '" + checkpoint + "' does not exist (give a checkpoint file or a run folder)");
  if (o.initial) {
    s = train::make_session(fs::is_directory(checkpoint) ? train::run_config(checkpoint) : train::read_checkpoint(checkpoint).second,
                            nullptr);
  } else {
    const auto [st, cfg] = train::read_checkpoint(checkpoint);
    s = train::load_session(st, cfg, train::checkpoint_file(checkpoint), train::NonFinite::allow);
    r.step = train::checkpoint_step(st, train::checkpoint_file(checkpoint));
  }
  r.recipe = s->cfg.recipe;
  train::TrainConfig cfg = s->cfg;
  if (!o.data.empty()) cfg.data = o.data;
  const train::Corpus corpus = train::corpus_for(cfg);
  const int64_t T = cfg.model.seq;
  const train::Batch b = train::make_batch(corpus.train, train::train_starts(corpus.train.size(), cfg.batch, T, cfg.seed, o.batch), T);

  // Activations arrive in model order, their gradients in reverse: gradients are put in their
  // activation's row.
  std::vector<InspectedTensor> activations;
  std::map<std::string, InspectedTensor> gradients;
  nn::ScaleProbe probe;
  probe.observe = [&](const std::string& name, bool gradient, const ScaledTensor& t) {
    if (!t.data.defined()) return;
    if (gradient)
      gradients.emplace(name, describe_in_format(name, TensorKind::activation_grad, t));
    else
      activations.push_back(describe_in_format(name, TensorKind::activation, t));
  };
  Var loss = s->forward_model().loss(b.ids, b.targets, &probe);
  if (s->scaler) loss = s->scaler->scale_loss(loss);  // gradients as the recipe stores them
  loss.backward();

  for (const InspectedTensor& a : activations) r.tensors.push_back(a);
  for (const InspectedTensor& a : activations)
    if (auto g = gradients.find(a.name); g != gradients.end()) r.tensors.push_back(g->second);
  for (size_t i = 0; i < s->params.size(); ++i) {
    // MS-AMP's scaled f16 masters (Recipe::linear_master_weight): their scale puts the data at the
    // top of f16's range by design, so they are judged against f16, not the chosen format.
    const ScaledTensor& w = s->params[i].scaled();
    const bool scaled_master = s->opt->config().scaled_masters && w.is_scaled();
    const Format judged = scaled_master ? *dtype_format(w.data.dtype()) : o.format;
    r.tensors.push_back(describe(s->names[i], TensorKind::weight, w, format_range(judged), std::string(format_name(judged))));
  }
  for (size_t i = 0; i < s->params.size(); ++i)
    if (s->params[i].scaled_grad().data.defined())
      r.tensors.push_back(describe_in_format(s->names[i], TensorKind::weight_grad, s->params[i].scaled_grad()));
  if (s->opt->encodes_state())
    for (const TensorKind kind : {TensorKind::first_moment, TensorKind::second_moment})
      for (size_t i = 0; i < s->params.size(); ++i) {
        const bool m = kind == TensorKind::first_moment;
        const optim::StateFormat& f = m ? s->opt->config().m_format : s->opt->config().v_format;
        const optim::EncodedState& e = m ? s->opt->encoded_first_moment(i) : s->opt->encoded_second_moment(i);
        const optim::StateLayout layout = optim::state_layout(f);
        const FormatRange own{f.storage, layout.min_subnormal / 2, layout.min_subnormal, layout.min_normal, layout.max};
        InspectedTensor t =
            describe(s->names[i], kind, ScaledTensor(Tensor::from_vector(optim::code_values(e, f), {e.numel})), own, layout.name);
        t.storage = layout.file_dtype;
        double largest = 0;
        for (float v : e.scales) largest = std::max(largest, double(v));
        t.scale_log2 = largest > 0 ? std::log2(largest) : NAN;
        r.tensors.push_back(t);
      }
  return r;
}

namespace {

std::string fraction(int64_t part, int64_t whole) {
  std::ostringstream s;
  s.precision(6);
  s << (whole ? double(part) / double(whole) : 0.0);
  return s.str();
}

// The heat maps: one panel per kind, a row per tensor, a column per binade [2^e, 2^(e+1)) drawn
// over [e, e+1] on the log2 axis, shade = the share of the tensor's values in it; a zero column
// on the left and a non-finite column on the right; the smallest subnormal, smallest normal and
// largest value of the range each panel's rows are judged against as dashed lines (the format's,
// or the moments' own layout).
std::string draw_heat_maps(const Inspection& in, const fs::path& dir) {
  const FormatRange range = format_range(in.format);
  int lo = int(std::floor(std::log2(range.min_subnormal))) - 2, hi = int(std::floor(std::log2(range.max))) + 2;
  for (const InspectedTensor& t : in.tensors) {
    lo = std::min(lo, int(std::floor(std::log2(t.range.min_subnormal))) - 2);
    hi = std::max(hi, int(std::floor(std::log2(t.range.max))) + 2);
    if (t.histogram.lowest() <= t.histogram.highest()) {
      lo = std::min(lo, t.histogram.lowest());
      hi = std::max(hi, t.histogram.highest());
    }
  }
  const int zero_x = lo - 2, nonfinite_x = hi + 2;  // one empty column between them and the bins
  // Encoded optimizer moments get two more panels.
  const bool has_moments =
      std::any_of(in.tensors.begin(), in.tensors.end(), [](const InspectedTensor& t) { return t.kind == TensorKind::first_moment; });
  std::ostringstream gp;
  size_t rows_max = 0;
  for (TensorKind k : {TensorKind::activation, TensorKind::weight})
    rows_max = std::max<size_t>(
        rows_max, size_t(std::count_if(in.tensors.begin(), in.tensors.end(), [&](const InspectedTensor& t) { return t.kind == k; })));
  gp << "set terminal pngcairo noenhanced size 2400," << 260 + 13 * rows_max << " font ',9'\n"
     << "set output " << report::gnuplot_quote((dir / "histograms.png").string()) << "\n"
     << "set multiplot layout 1," << (has_moments ? 6 : 4) << " title "
     << report::gnuplot_quote("log2 |x| of every tensor, recipe " + in.recipe + ", step " + std::to_string(in.step) +
                              "; shade: share of the tensor's values (square root); dashed: the smallest subnormal, smallest normal and "
                              "largest value of " +
                              std::string(format_name(in.format)) +
                              " (moments: their own layout); scaled tensors: their data, scale in the label")
     << "\n"
     << "set palette defined (0 'white', 0.3 '#9ecae1', 1 '#08306b')\nunset colorbox\nset cbrange [0:1]\n"
     << "set xrange [" << zero_x << ":" << nonfinite_x + 1 << "]\nset xlabel 'log2 |x|'\nset ytics nomirror\nset tics front\n";
  std::vector<std::pair<TensorKind, const char*>> panels = {{TensorKind::activation, "activations"},
                                                            {TensorKind::activation_grad, "activation gradients"},
                                                            {TensorKind::weight, "weights"},
                                                            {TensorKind::weight_grad, "weight gradients"}};
  if (has_moments) {
    panels.emplace_back(TensorKind::first_moment, "first moments (codes)");
    panels.emplace_back(TensorKind::second_moment, "second moments (codes)");
  }
  // Numbered ticks every 5 or 10 binades, clear of the zero and non-finite columns' labels.
  std::ostringstream xtics;
  xtics << "'0' " << zero_x + 0.5 << ", 'inf/NaN' " << nonfinite_x + 0.5;
  const int step = hi - lo > 60 ? 10 : 5;
  for (int x = (lo / step) * step; x <= hi; x += step)
    if (x > zero_x + 3 && x < nonfinite_x - 4) xtics << ", '" << x << "' " << x;
  for (const auto& [kind, title] : panels) {
    std::vector<const InspectedTensor*> rows;
    for (const InspectedTensor& t : in.tensors)
      if (t.kind == kind) rows.push_back(&t);
    std::ostringstream dat, ytics;
    for (size_t y = 0; y < rows.size(); ++y) {
      const ExponentHistogram& h = rows[y]->histogram;
      for (int x = zero_x; x <= nonfinite_x; ++x) {
        const int64_t n = x == zero_x ? h.zeros : x == nonfinite_x ? h.nonfinite : x == zero_x + 1 || x == nonfinite_x - 1 ? 0 : h.at(x);
        dat << x + 0.5 << " " << y << " " << std::sqrt(h.count ? double(n) / double(h.count) : 0.0) << "\n";
      }
      dat << "\n";
      std::string label = rows[y]->name;
      if (std::isfinite(rows[y]->scale_log2)) label += " x2^" + std::to_string(int(std::lround(rows[y]->scale_log2)));
      ytics << (y ? ", " : "") << report::gnuplot_quote(label) << " " << y;
    }
    const std::string file = (dir / (std::string("heat_") + kind_name(kind) + ".dat")).string();
    io::write_text_atomically(file, dat.str());
    // The lines of the range the panel's rows are judged against where they share one (a kind of
    // moment has one layout for every parameter), else the inspection's format's.
    const bool shared = !rows.empty() && std::all_of(rows.begin(), rows.end(),
                                                     [&](const InspectedTensor* t) { return t->range_name == rows[0]->range_name; });
    const FormatRange& judged = shared ? rows[0]->range : range;
    gp << "unset arrow\n";
    for (double v : {judged.min_subnormal, judged.min_normal, judged.max})
      gp << "set arrow from " << std::log2(v) << ", graph 0 to " << std::log2(v) << ", graph 1 nohead dt 2 lw 1.5 lc rgb '#d62728' front\n";
    const std::string heading =
        shared && rows[0]->range_name != format_name(in.format) ? std::string(title) + ", " + rows[0]->range_name : std::string(title);
    gp << "set title " << report::gnuplot_quote(heading) << "\nset yrange [" << (rows.empty() ? 0.5 : double(rows.size()) - 0.5)
       << ":-0.5]\n"
       << "set ytics (" << (rows.empty() ? "'none' 0" : ytics.str()) << ")\n"
       << "set xtics (" << xtics.str() << ")\n";
    if (rows.empty())
      gp << "plot NaN notitle\n";
    else
      gp << "plot " << report::gnuplot_quote(file) << " using 1:2:3 with image notitle\n";
  }
  gp << "unset multiplot\n";
  const std::string script = (dir / "histograms.gp").string();
  io::write_text_atomically(script, gp.str());
  return report::run_gnuplot(script);
}

}  // namespace

std::string write_inspection(const Inspection& in, const std::string& dir_name) {
  const fs::path dir(dir_name);
  io::make_folder(dir.string());
  std::ostringstream tensors, bins;
  tensors << "tensor,kind,storage,values,rms,scale_log2,zero,underflow,subnormal,normal,clipped,nonfinite,range\n";
  bins << "tensor,kind,exponent,count\n";
  for (const InspectedTensor& t : in.tensors) {
    const ExponentHistogram& h = t.histogram;
    tensors << t.name << "," << kind_name(t.kind) << "," << dtype_name(t.storage) << "," << h.count << "," << t.rms << ","
            << (std::isfinite(t.scale_log2) ? std::to_string(int(std::lround(t.scale_log2))) : "") << "," << fraction(h.zeros, h.count)
            << "," << fraction(h.underflow, h.count) << "," << fraction(h.subnormal, h.count) << "," << fraction(h.normal, h.count) << ","
            << fraction(h.clipped, h.count) << "," << fraction(h.nonfinite, h.count) << "," << t.range_name << "\n";
    for (int e = h.lowest(); e <= h.highest(); ++e)
      if (h.at(e)) bins << t.name << "," << kind_name(t.kind) << "," << e << "," << h.at(e) << "\n";
  }
  io::write_text_atomically((dir / "tensors.csv").string(), tensors.str());
  io::write_text_atomically((dir / "histograms.csv").string(), bins.str());
  return draw_heat_maps(in, dir);
}

}  // namespace scalify::inspect
