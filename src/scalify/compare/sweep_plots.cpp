#include "scalify/compare/sweep_plots.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "scalify/io/atomic_file.hpp"
#include "scalify/report/gnuplot.hpp"

namespace scalify::compare {

namespace fs = std::filesystem;

namespace {

constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string number(double v) {
  if (!std::isfinite(v)) return "NaN";
  std::ostringstream s;
  s.precision(8);
  s << v;
  return s.str();
}

std::string recipe_name(const std::string& recipe) { return recipe.ends_with(".json") ? fs::path(recipe).stem().string() : recipe; }

}  // namespace

std::string write_sweep_plots(const SweepConfig& config, const std::vector<SweepCell>& cells) {
  const fs::path dir(config.out);
  const std::vector<SweepValue>& values = config.grid.values;
  const bool log_x = std::all_of(values.begin(), values.end(), [](const SweepValue& v) { return v.x > 0; });
  std::ostringstream gp, dat;
  const fs::path data_file = dir / "sweep_plots.dat";
  int block = 0;
  gp << "set grid\nset key outside right font ',10'\nset ylabel 'final validation loss (nats per token)'\nset xlabel "
     << report::gnuplot_quote(config.grid.key + (log_x ? " (log scale)" : "")) << "\n"
     << (log_x ? "set logscale x 2\n" : "") << "set xtics (";
  for (size_t i = 0; i < values.size(); ++i) gp << (i ? ", " : "") << report::gnuplot_quote(values[i].label) << " " << number(values[i].x);
  gp << ")\n";
  // The x-axis a little beyond the grid, so the end points and their circles show whole.
  const double first = values.front().x, last = values.back().x, pad = (last - first) * 0.04;
  gp << "set xrange [" << number(log_x ? first / 1.15 : first - pad) << ":" << number(log_x ? last * 1.15 : last + pad) << "]\n";
  for (const std::string& recipe : config.recipes) {
    const std::string name = recipe_name(recipe);
    for (const bool across_widths : {true, false}) {
      const std::vector<int64_t>& panels = across_widths ? config.depths : config.widths;
      const std::vector<int64_t>& curves = across_widths ? config.widths : config.depths;
      if (curves.size() < 2 && !across_widths) continue;  // one depth: no depth plot
      std::ostringstream plots;
      for (int64_t panel : panels) {
        std::ostringstream plot;
        bool any = false;  // a finite point to draw (gnuplot refuses a plot of none)
        for (size_t k = 0; k < curves.size(); ++k) {
          const int64_t w = across_widths ? curves[k] : panel, d = across_widths ? panel : curves[k];
          std::vector<double> losses(values.size(), NAN);
          for (const SweepCell& c : cells)
            if (c.recipe == recipe && c.width == w && c.depth == d && c.status == "ok" && c.value < values.size())
              losses[c.value] = c.val_loss;
          const std::optional<size_t> best = best_value(losses);
          any = any || best.has_value();
          for (size_t i = 0; i < values.size(); ++i) dat << number(values[i].x) << " " << number(losses[i]) << "\n";
          dat << "\n\n";
          if (best)
            dat << number(values[*best].x) << " " << number(losses[*best]) << "\n";
          else
            dat << "1 NaN\n";
          dat << "\n\n";
          const std::string colour = "lc rgb '" + std::string(kColours[k % 8]) + "'";
          const std::string src = report::gnuplot_quote(data_file.string());
          plot << (plot.str().empty() ? "plot " : ", ") << src << " index " << block << " with linespoints lw 2 pt 7 " << colour
               << " title " << report::gnuplot_quote((across_widths ? "width " : "depth ") + std::to_string(curves[k])) << ", " << src
               << " index " << block + 1 << " with points pt 6 ps 3.5 lw 2 " << colour << " notitle";
          block += 2;
        }
        if (!any) plot.str("set yrange [0:1]\nset label 1 'every cell diverged' at graph 0.5,0.5 center\nplot NaN notitle");
        plots << "set title "
              << report::gnuplot_quote(name + ": " + (across_widths ? "depth " : "width ") + std::to_string(panel) +
                                       " (circled: each curve's best)")
              << "\n"
              << plot.str() << "\nunset label 1\nset autoscale y\n";
      }
      const std::string png = (dir / (name + (across_widths ? "_widths.png" : "_depths.png"))).string();
      fs::remove(png);
      gp << "set terminal pngcairo noenhanced size 1000," << 80 + 420 * panels.size() << " font ',11'\nset output "
         << report::gnuplot_quote(png) << "\nset multiplot layout " << panels.size() << ",1\n"
         << plots.str() << "unset multiplot\nset output\n";
    }
  }
  io::write_text_atomically(data_file.string(), dat.str());
  io::write_text_atomically((dir / "sweep_plots.gp").string(), gp.str());
  return report::run_gnuplot((dir / "sweep_plots.gp").string());
}

}  // namespace scalify::compare
