#include "scalify/compare/plots.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "scalify/io/atomic_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/report/gnuplot.hpp"

namespace scalify::compare {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A run's curves: training loss as 10-step means, and every evaluation with its batch means.
struct Evaluation {
  double loss = NAN;
  std::vector<double> batches;
};
struct Curves {
  std::map<int64_t, double> train;
  std::map<int64_t, Evaluation> val;
};

Curves read_curves(const fs::path& run_dir) {
  Curves c;
  std::ifstream in;
  if (fs::is_regular_file(run_dir / "metrics.jsonl")) in.open(run_dir / "metrics.jsonl");  // a pipe there would block
  std::string line;
  const int64_t window = 10;
  double sum = 0;
  int64_t n = 0, last = 0;
  while (std::getline(in, line)) {
    const json j = io::try_parse_json(line);
    if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>() + 1;
    if (j.contains("val_loss")) {
      Evaluation& e = c.val[step];
      e.loss = j["val_loss"].is_number() ? j["val_loss"].get<double>() : NAN;
      if (j.contains("val_batch_losses") && j["val_batch_losses"].is_array())  // absent from older runs
        for (const json& b : j["val_batch_losses"]) e.batches.push_back(b.is_number() ? b.get<double>() : NAN);
    }
    if (j.contains("loss") && j["loss"].is_number() && std::isfinite(j["loss"].get<double>())) {
      last = step;
      sum += j["loss"].get<double>();
      if (++n == window || step % window == 0) {
        c.train[step] = sum / double(n);
        sum = 0;
        n = 0;
      }
    }
  }
  if (n > 0) c.train[last] = sum / double(n);  // a last, partial bucket
  return c;
}

std::string fixed(double v) {
  std::ostringstream s;
  s.precision(6);
  s << v;
  return std::isfinite(v) ? s.str() : "NaN";
}

// Eight colours apart for the eye and in grey, and a dash pattern each: no two recipes of a panel alike.
constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
std::string line_style(size_t i) { return "lw 2 lc rgb '" + std::string(kColours[i % 8]) + "' dt " + std::to_string(1 + i % 4); }
std::string marker(size_t i) { return "pt " + std::to_string(5 + 2 * (i % 4)); }

// The verdict's colour in delta.png.
std::string verdict_colour(const std::string& verdict) {
  if (verdict.starts_with("better")) return "#1f77b4";
  if (verdict.starts_with("not distinguishable")) return "#2ca02c";
  if (verdict.starts_with("within")) return "#9467bd";
  if (verdict.starts_with("inconclusive")) return "#ff7f0e";
  if (verdict.starts_with("worse")) return "#d62728";
  return "#7f7f7f";
}

struct Panel {
  std::string family;
  std::vector<const RecipeOutcome*> rows;
};

// The families present, in drawing order, each with its recipes (baselines left out); a
// comparison of baselines alone gets one panel of them.
std::vector<Panel> panels(const std::vector<RecipeOutcome>& rows) {
  std::vector<Panel> out;
  for (const std::string& family : recipe_families()) {
    Panel p{family, {}};
    for (const RecipeOutcome& o : rows)
      if (o.recipe != o.baseline && recipe_family(o.recipe) == family) p.rows.push_back(&o);
    if (!p.rows.empty()) out.push_back(p);
  }
  if (out.empty()) {
    out.push_back({"baselines", {}});
    for (const RecipeOutcome& o : rows) out.back().rows.push_back(&o);
  }
  return out;
}

std::string layout(size_t panels) { return std::to_string((panels + 1) / 2) + "," + std::to_string(panels > 1 ? 2 : 1); }

// The mean over seeds of the runs' curves (training buckets and validation losses present in every seed).
Curves mean_curves(const std::vector<const Curves*>& seeds) {
  Curves m;
  if (seeds.empty()) return m;
  for (const auto& [step, l] : seeds[0]->train) {
    double sum = 0;
    size_t n = 0;
    for (const Curves* c : seeds)
      if (c->train.count(step)) sum += c->train.at(step), ++n;
    if (n == seeds.size()) m.train[step] = sum / double(n);
  }
  for (const auto& [step, e] : seeds[0]->val) {
    double sum = 0;
    size_t n = 0;
    for (const Curves* c : seeds)
      if (c->val.count(step)) sum += c->val.at(step).loss, ++n;
    if (n == seeds.size()) m.val[step].loss = sum / double(n);
  }
  return m;
}

}  // namespace

std::string write_comparison_plots(const std::string& dir_name, const std::vector<RecipeOutcome>& rows,
                                   const std::vector<RecipeOutcome>& runs, int64_t batch) {
  const fs::path dir(dir_name);
  for (const char* png : {"delta.png", "loss_delta.png", "loss.png"}) fs::remove(dir / png);  // none may outlive this report
  // Every run's curves by (recipe, seed), and which runs finished: means over seeds take only
  // those (a seed that diverged midway would make the mean jump where it drops out), unless none
  // did, when the first seed's curves show how its run ended.
  std::map<std::pair<std::string, uint64_t>, Curves> curves;
  std::set<std::pair<std::string, uint64_t>> finished;
  for (const RecipeOutcome& r : runs) {
    if (r.seeds.empty()) continue;
    curves[{r.recipe, r.seeds[0]}] = read_curves(dir / "runs" / r.run);
    if (r.status == "ok") finished.insert({r.recipe, r.seeds[0]});
  }
  auto seeds_of = [&](const RecipeOutcome& row) {
    std::vector<const Curves*> out;
    for (uint64_t s : row.seeds)
      if (finished.count({row.recipe, s}) && !curves.at({row.recipe, s}).train.empty()) out.push_back(&curves.at({row.recipe, s}));
    if (out.empty() && !row.seeds.empty() && curves.count({row.recipe, row.seeds[0]}))
      out.push_back(&curves.at({row.recipe, row.seeds[0]}));
    return out;
  };
  const auto row_of = [&](const std::string& recipe) -> const RecipeOutcome* {
    for (const RecipeOutcome& o : rows)
      if (o.recipe == recipe) return &o;
    return nullptr;
  };
  const std::vector<Panel> families = panels(rows);
  const bool deltas = families.front().family != "baselines";
  std::ostringstream gp;
  gp << "set grid\nset style fill transparent solid 0.18 noborder\n";

  // delta.png: the final deltas, one line per recipe in table order (top to bottom).
  std::ostringstream forest;
  std::vector<std::pair<const RecipeOutcome*, double>> shown;  // rows drawn, and their y
  double lo = -0.01, hi = 0.06;
  for (const RecipeOutcome& o : rows) {
    if (o.recipe == o.baseline || o.status != "ok" || !std::isfinite(o.val_delta)) continue;
    const double h = std::isfinite(o.noise.half_width) ? o.noise.half_width : 0;
    lo = std::min(lo, o.val_delta - h);
    hi = std::max(hi, o.val_delta + h);
    shown.push_back({&o, double(shown.size())});
  }
  // The axis stops at +0.2: a recipe far beyond parity is drawn at the edge with its value.
  const double x_top = std::min(hi + 0.01, 0.2), x_bottom = std::max(lo - 0.01, -0.2);
  std::ostringstream forest_plot, labels;
  for (const auto& [o, y] : shown) {
    const double h = std::isfinite(o->noise.half_width) ? o->noise.half_width : 0;
    const double x = std::clamp(o->val_delta, x_bottom, x_top);
    forest << y << " " << fixed(x) << " " << fixed(std::max(o->val_delta - h, x_bottom)) << " " << fixed(std::min(o->val_delta + h, x_top))
           << "\n\n\n";
    forest_plot << (forest_plot.str().empty() ? "" : ", ") << report::gnuplot_quote((dir / "delta.dat").string()) << " index " << int(y)
                << " using 2:1:3:4 with xerrorbars pt 7 ps 1.3 lw 2 lc rgb '" << verdict_colour(o->verdict) << "' notitle";
    if (o->val_delta > x_top || o->val_delta < x_bottom) {
      std::string value = fixed(o->val_delta);
      if (o->val_delta > 0) value.insert(value.begin(), '+');
      labels << "set label " << report::gnuplot_quote(value) << " at " << fixed(x) << "," << y << " offset "
             << (o->val_delta > 0 ? "-7" : "1") << ",0.8 font ',9'\n";
    }
  }
  if (!shown.empty()) {
    std::ostringstream ytics;
    for (const auto& [o, y] : shown) ytics << (ytics.str().empty() ? "" : ", ") << report::gnuplot_quote(o->name) << " " << y;
    std::string legend;
    for (const std::string& v : verdict_names(kParityNats))
      legend += ", NaN with points pt 7 ps 1.3 lc rgb '" + verdict_colour(v) + "' title " + report::gnuplot_quote(v);
    gp << "set terminal pngcairo noenhanced size 1400," << 160 + 26 * shown.size() << " font ',11'\n"
       << "set output " << report::gnuplot_quote((dir / "delta.png").string()) << "\n"
       << "set title 'Validation loss minus the baseline''s, with its 95 % interval (f32; unit_f32 for unit scaling, umup for u-μP)'\n"
       << "set xlabel 'delta loss (nats)'\nunset ylabel\nset ytics (" << ytics.str() << ")\nset yrange [" << double(shown.size()) - 0.5
       << ":-0.5]\nset xrange [" << fixed(x_bottom) << ":" << fixed(x_top) << "]\nset key outside right\n"
       << labels.str() << "set arrow 1 from 0, graph 0 to 0, graph 1 nohead lw 2 lc rgb 'black'\n"
       << "set arrow 2 from " << kParityNats << ", graph 0 to " << kParityNats << ", graph 1 nohead lw 2 dt 2 lc rgb 'black'\n"
       << "plot " << forest_plot.str() << legend << "\n"
       << "unset arrow\nunset label\nset ytics auto\nset autoscale\nunset xlabel\n";
  }
  io::write_text_atomically((dir / "delta.dat").string(), forest.str());

  // loss_delta.png: the delta at every evaluation, mean over seeds, with its interval as a band.
  // The y-axis holds every final delta with its interval and the later curves' lows; early
  // evaluations, where the curves are still far apart, are cut rather than flattening the rest.
  std::ostringstream delta_dat;
  int block = 0;
  double d_lo = -0.01, d_hi = 0.06;
  for (const auto& [o, y] : shown) {  // a recipe beyond delta.png's axis (+0.2) leaves this one's panels, cut, to the rest
    const double top = o->val_delta + (std::isfinite(o->noise.half_width) ? o->noise.half_width : 0);
    if (top <= 0.2) d_hi = std::max(d_hi, top);
  }
  std::vector<std::string> panel_plots;
  for (const Panel& p : families) {
    if (!deltas) break;
    std::ostringstream plot;
    plot << "plot 0 with lines lw 3 lc rgb 'black' title 'baseline', " << kParityNats << " with lines lw 2 dt 2 lc rgb 'black' title '+"
         << kParityNats << "'";
    for (size_t i = 0; i < p.rows.size(); ++i) {
      const RecipeOutcome& o = *p.rows[i];
      const RecipeOutcome* base = row_of(o.baseline);
      if (!base || o.status != "ok" || base->status != "ok") continue;  // a delta only where both finished every seed
      const auto first_seed = curves.find({o.recipe, o.seeds.at(0)});
      if (first_seed == curves.end()) continue;
      std::ostringstream d;
      for (const auto& evaluation : first_seed->second.val) {
        const int64_t step = evaluation.first;
        std::vector<std::vector<double>> mine, theirs;
        std::vector<double> plain;  // the seeds' deltas of the losses alone (runs without batch means)
        for (uint64_t s : o.seeds) {
          if (!curves.count({o.recipe, s}) || !curves.count({base->recipe, s})) continue;
          const auto& a = curves.at({o.recipe, s}).val;
          const auto& b = curves.at({base->recipe, s}).val;
          if (!a.count(step) || !b.count(step)) continue;
          mine.push_back(a.at(step).batches);
          theirs.push_back(b.at(step).batches);
          plain.push_back(a.at(step).loss - b.at(step).loss);
        }
        if (plain.empty()) continue;
        const DeltaInterval di = delta_over_seeds(mine, theirs, batch, o.result.val_windows);  // every evaluation has the same windows
        double mean = 0;
        for (double x : plain) mean += x / double(plain.size());
        const double h = std::isfinite(di.half_width) ? di.half_width : 0;
        if (!std::isfinite(mean)) continue;
        d << step << " " << fixed(mean) << " " << fixed(mean - h) << " " << fixed(mean + h) << "\n";
        if (step > o.result.steps / 5) d_lo = std::min(d_lo, mean);
      }
      if (d.str().empty()) continue;
      delta_dat << d.str() << "\n\n";
      const std::string data = report::gnuplot_quote((dir / "delta_steps.dat").string()) + " index " + std::to_string(block++);
      plot << ", " << data << " using 1:3:4 with filledcurves lc rgb '" << kColours[i % 8] << "' notitle, " << data
           << " using 1:2 with linespoints " << line_style(i) << " " << marker(i) << " title " << report::gnuplot_quote(o.name);
    }
    panel_plots.push_back(plot.str());
  }
  // A family measured against another baseline than f32 says so in its panel's title.
  auto panel_title = [&](const Panel& p) {
    const std::string& base = p.rows.front()->baseline;
    return report::gnuplot_quote(p.family + (base == "f32" ? "" : " (vs " + base + ")"));
  };
  io::write_text_atomically((dir / "delta_steps.dat").string(), delta_dat.str());
  const double y_top = std::min(d_hi + 0.01, 0.25), y_bottom = std::max(d_lo - 0.005, -0.1);
  const size_t panel_rows = (families.size() + 1) / 2;
  if (deltas && block > 0) {
    gp << "set terminal pngcairo noenhanced size 1400," << 60 + 360 * panel_rows << " font ',10'\n"
       << "set output " << report::gnuplot_quote((dir / "loss_delta.png").string()) << "\n"
       << "set multiplot layout " << layout(families.size())
       << " title 'Validation loss minus the baseline''s over training, mean over seeds, shaded: 95 % interval (one y-axis for all "
          "panels, cut above the final deltas)'\n"
       << "set xlabel 'step'\nset ylabel 'delta loss (nats)'\nset yrange [" << fixed(y_bottom) << ":" << fixed(y_top)
       << "]\nset key inside top right font ',9'\n";
    for (size_t i = 0; i < families.size(); ++i) gp << "set title " << panel_title(families[i]) << "\n" << panel_plots[i] << "\n";
    gp << "unset multiplot\nset autoscale\n";
  }

  // loss.png: each family with its baselines; the y-axis from the lowest loss up to the baseline's
  // training loss a fifth of the way in (warm-up's fall would flatten everything after it).
  std::ostringstream train_dat, val_dat;
  int loss_block = 0;
  double lowest = INFINITY, top = -INFINITY;
  std::vector<std::string> loss_plots;
  for (const Panel& p : families) {
    std::vector<const RecipeOutcome*> drawn;
    for (const RecipeOutcome* o : p.rows)
      if (const RecipeOutcome* b = row_of(o->baseline); b && std::find(drawn.begin(), drawn.end(), b) == drawn.end())
        drawn.insert(drawn.begin(), b);
    for (const RecipeOutcome* o : p.rows)
      if (std::find(drawn.begin(), drawn.end(), o) == drawn.end()) drawn.push_back(o);
    std::ostringstream plot;
    size_t colour = 0;
    for (const RecipeOutcome* o : drawn) {
      const Curves c = mean_curves(seeds_of(*o));
      if (c.train.empty()) continue;
      for (const auto& [s, l] : c.train) {
        train_dat << s << " " << fixed(l) << "\n";
        lowest = std::min(lowest, l);
      }
      for (const auto& [s, e] : c.val) val_dat << s << " " << fixed(e.loss) << "\n";
      if (c.val.empty()) val_dat << "0 NaN\n";
      train_dat << "\n\n";
      val_dat << "\n\n";
      if (o->recipe == o->baseline) {
        const int64_t fifth = c.train.rbegin()->first / 5;
        const auto at = c.train.lower_bound(fifth);
        if (at != c.train.end()) top = std::max(top, at->second);
      }
      const bool baseline = o->recipe == o->baseline;
      const std::string line = baseline ? "lw 3 lc rgb 'black'" : line_style(colour),
                        point = baseline ? "lc rgb 'black' pt 7" : "lc rgb '" + std::string(kColours[colour % 8]) + "' " + marker(colour);
      if (!baseline) ++colour;
      const std::string title = report::gnuplot_quote(o->name + (o->status == "ok" ? "" : " (" + o->status + ")"));
      plot << (plot.str().empty() ? "plot " : ", ") << report::gnuplot_quote((dir / "train.dat").string()) << " index " << loss_block
           << " with lines " << line << " title " << title << ", " << report::gnuplot_quote((dir / "val.dat").string()) << " index "
           << loss_block << " with points ps 1.2 " << point << " notitle";
      ++loss_block;
    }
    loss_plots.push_back(plot.str().empty() ? "plot NaN notitle" : plot.str());
  }
  if (loss_block == 0) return "no recipe has a training curve";
  io::write_text_atomically((dir / "train.dat").string(), train_dat.str());
  io::write_text_atomically((dir / "val.dat").string(), val_dat.str());
  if (!std::isfinite(top) || top <= lowest) top = lowest + 1;
  gp << "set terminal pngcairo noenhanced size 1400," << 60 + 360 * panel_rows << " font ',10'\n"
     << "set output " << report::gnuplot_quote((dir / "loss.png").string()) << "\n"
     << "set multiplot layout " << layout(families.size())
     << " title 'Training loss (lines, 10-step means) and validation loss (points), mean over seeds; baselines in black'\n"
     << "set xlabel 'step'\nset ylabel 'loss (nats per token)'\nset yrange [" << fixed(lowest - 0.02 * (top - lowest)) << ":" << fixed(top)
     << "]\nset key inside top right font ',9'\n";
  for (size_t i = 0; i < families.size(); ++i) gp << "set title " << panel_title(families[i]) << "\n" << loss_plots[i] << "\n";
  gp << "unset multiplot\n";
  io::write_text_atomically((dir / "plots.gp").string(), gp.str());
  return report::run_gnuplot((dir / "plots.gp").string());
}

}  // namespace scalify::compare
