#include "scalify/inspect/scale_history.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scalify/error.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/report/gnuplot.hpp"

namespace scalify::inspect {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<ScaleSeries> read_scale_history(const std::string& run_dir) {
  const fs::path file = fs::path(run_dir) / "metrics.jsonl";
  if (fs::exists(file) && !fs::is_regular_file(file)) throw Error("'" + file.string() + "' is not a regular file");  // a pipe would block
  std::ifstream in(file);
  if (!in) throw Error("cannot read '" + file.string() + "' (not a run folder?)");
  std::vector<ScaleSeries> series;
  std::map<std::string, size_t> index;
  std::string line;
  // A last line without its newline is one a running trainer is still writing: left out.
  for (int64_t n = 1; std::getline(in, line) && !in.eof(); ++n) {
    const json j = io::try_parse_json(line);
    if (j.is_discarded() || !j.is_object() || !j.contains("step"))
      throw Error("'" + file.string() + "' line " + std::to_string(n) + " is not a metrics record");
    if (!j.contains("quant")) continue;
    try {
      if (!j.at("step").is_number_integer() || j.at("step").get<int64_t>() < 0) throw Error("step is not a step number");
      const int64_t step = j.at("step").get<int64_t>();
      if (!j.at("quant").is_object()) throw Error("'quant' is not an object");
      for (const auto& [name, q] : j.at("quant").items()) {
        const size_t dot = name.rfind('.');
        if (dot == std::string::npos) throw Error("tensor name without a role");
        auto [it, added] = index.emplace(name, series.size());
        if (added) series.push_back({name.substr(0, dot), name.substr(dot + 1), {}});
        const double scale = q.at("scale").get<double>();
        if (!(scale > 0) || !std::isfinite(scale))
          throw Error("'" + name + "' has scale " + io::json_excerpt(q.at("scale")) + ", not a positive number");
        const double underflow = q.at("underflow").get<double>(), clipped = q.at("clipped").get<double>();
        if (!(underflow >= 0 && underflow <= 1 && clipped >= 0 && clipped <= 1))
          throw Error("'" + name + "' has underflow or clipped fractions outside [0, 1]");
        const double energy = q.contains("underflow_energy") ? q.at("underflow_energy").get<double>() : NAN;
        if (!(energy >= 0 && energy <= 1) && !std::isnan(energy)) throw Error("'" + name + "' has an underflow energy outside [0, 1]");
        series[it->second].points.push_back({step, -std::log2(scale), underflow, clipped, energy});
      }
    } catch (const std::exception& e) {
      throw Error("'" + file.string() + "' line " + std::to_string(n) + ": bad quant record (" + e.what() + ")");
    }
  }
  return series;
}

namespace {

// "h3.attn.qkv" -> {"h3", "attn.qkv"}: the block and the kind of linear layer.
std::pair<std::string, std::string> split_layer(const std::string& layer) {
  const size_t dot = layer.find('.');
  return dot == std::string::npos ? std::pair{layer, std::string()} : std::pair{layer.substr(0, dot), layer.substr(dot + 1)};
}

template <class T>
std::vector<T> first_seen(const std::vector<ScaleSeries>& series, T (*key)(const ScaleSeries&)) {
  std::vector<T> out;
  for (const ScaleSeries& s : series)
    if (std::find(out.begin(), out.end(), key(s)) == out.end()) out.push_back(key(s));
  return out;
}
std::string role_of(const ScaleSeries& s) { return s.role; }
std::string kind_of(const ScaleSeries& s) { return split_layer(s.layer).second; }
std::string block_of(const ScaleSeries& s) { return split_layer(s.layer).first; }

constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"};

}  // namespace

std::string write_scale_history(const std::vector<ScaleSeries>& series, const std::string& dir_name, const std::string& title) {
  const fs::path dir(dir_name);
  io::make_folder(dir.string());
  std::ostringstream csv;
  csv << "step,layer,role,bias,underflow,clipped\n";
  for (const ScaleSeries& s : series)
    for (const ScalePoint& p : s.points)
      csv << p.step << "," << s.layer << "," << s.role << "," << p.bias << "," << p.underflow << "," << p.clipped << "\n";
  io::write_text_atomically((dir / "scales.csv").string(), csv.str());
  if (series.empty()) return "the run quantises no tensor (no scales to draw)";

  const std::vector<std::string> roles = first_seen(series, role_of), kinds = first_seen(series, kind_of),
                                 blocks = first_seen(series, block_of);
  // One data block per series for the scales; per (role, kind) the largest fractions over blocks.
  std::ostringstream dat, frac;
  for (size_t i = 0; i < series.size(); ++i) {
    for (const ScalePoint& p : series[i].points) dat << p.step << " " << p.bias << "\n";
    dat << "\n\n";
  }
  std::vector<std::pair<std::string, std::string>> frac_keys;
  for (const std::string& role : roles)
    for (const std::string& kind : kinds) {
      std::map<int64_t, std::pair<double, double>> worst;
      for (const ScaleSeries& s : series)
        if (s.role == role && kind_of(s) == kind)
          for (const ScalePoint& p : s.points) {
            auto& w = worst[p.step];
            w = {std::max(w.first, p.underflow), std::max(w.second, p.clipped)};
          }
      for (const auto& [step, w] : worst) frac << step << " " << w.first << " " << w.second << "\n";
      frac << "\n\n";
      frac_keys.push_back({role, kind});
    }
  const std::string dat_file = (dir / "scales.dat").string(), frac_file = (dir / "quant_fractions.dat").string();
  io::write_text_atomically(dat_file, dat.str());
  io::write_text_atomically(frac_file, frac.str());

  // One y-axis for every panel of a picture: panels side by side are compared by eye.
  double bias_lo = INFINITY, bias_hi = -INFINITY, frac_hi = 0;
  for (const ScaleSeries& s : series)
    for (const ScalePoint& p : s.points) {
      bias_lo = std::min(bias_lo, p.bias);
      bias_hi = std::max(bias_hi, p.bias);
      frac_hi = std::max({frac_hi, p.underflow, p.clipped});
    }
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size " << 360 * kinds.size() + 200 << "," << 280 * roles.size() + 80 << " font ',9'\n"
     << "set output " << report::gnuplot_quote((dir / "scales.png").string()) << "\n"
     << "set multiplot layout " << roles.size() << "," << kinds.size() << " title "
     << report::gnuplot_quote("Scaling bias -log2(scale) of each quantised tensor over training, " + title + " (a line per block)") << "\n"
     << "set grid\nset xlabel 'step'\nset ylabel 'scaling bias'\nset key top right font ',8'\nset yrange [" << std::floor(bias_lo) - 1
     << ":" << std::ceil(bias_hi) + 1 << "]\n";
  for (const std::string& role : roles)
    for (const std::string& kind : kinds) {
      gp << "set title " << report::gnuplot_quote(kind + " " + role) << "\nplot ";
      int drawn = 0;
      for (size_t i = 0; i < series.size(); ++i)
        if (series[i].role == role && kind_of(series[i]) == kind) {
          const size_t b = size_t(std::find(blocks.begin(), blocks.end(), block_of(series[i])) - blocks.begin());
          gp << (drawn++ ? ", " : "") << report::gnuplot_quote(dat_file) << " index " << i << " with lines lw 1.5 lc rgb '"
             << kColours[b % 12] << "' title " << report::gnuplot_quote(block_of(series[i]));
        }
      gp << (drawn ? "" : "NaN notitle") << "\n";
    }
  gp << "unset multiplot\n"
     << "set output " << report::gnuplot_quote((dir / "quant_fractions.png").string()) << "\n"
     << "set multiplot layout " << roles.size() << "," << kinds.size() << " title "
     << report::gnuplot_quote("Underflow and clipped fractions over training, " + title + " (the largest over the blocks)") << "\n"
     << "set ylabel 'fraction of values'\nset yrange [0:" << std::max(1e-3, frac_hi * 1.05) << "]\n";
  for (size_t k = 0; k < frac_keys.size(); ++k)
    gp << "set title " << report::gnuplot_quote(frac_keys[k].second + " " + frac_keys[k].first) << "\nplot "
       << report::gnuplot_quote(frac_file) << " index " << k << " using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title 'underflow', "
       << report::gnuplot_quote(frac_file) << " index " << k << " using 1:3 with lines lw 1.5 lc rgb '#d62728' title 'clipped'\n";
  gp << "unset multiplot\n";
  const std::string script = (dir / "scales.gp").string();
  io::write_text_atomically(script, gp.str());
  return report::run_gnuplot(script);
}

}  // namespace scalify::inspect
