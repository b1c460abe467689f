// `scalify snr`: SNR of N(0, sigma^2) samples across formats as sigma sweeps 2^-30..2^20
// (Figure 2 of Unit Scaling), written as CSV and plotted with gnuplot, then the Appendix D
// outlier scenario beside the paper's figures.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/snr.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/report/gnuplot.hpp"

namespace scalify::cli {
namespace {

struct SnrOptions {
  std::string out_dir = "runs/snr";
  std::vector<std::string> formats = {"f16", "bf16", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "e3m2", "e2m3", "e2m1"};
  double lo = -30, hi = 20, step = 0.25;
  size_t samples = 1 << 16;
  uint64_t seed = 1;
};

double db(double snr) { return 10.0 * std::log10(snr); }

void write_plot(const SnrOptions& o, const std::vector<Format>& formats) {
  namespace fs = std::filesystem;
  const fs::path gp = fs::path(o.out_dir) / "snr.gp";
  std::ostringstream s;
  s << "set terminal pngcairo size 1000,600\n"
    << "set output " << report::gnuplot_quote((fs::path(o.out_dir) / "snr.png").string()) << "\n"
    << "set datafile separator ','\n"
    << "set title 'SNR of N(0, sigma^2) samples, unscaled, round-to-nearest-even, saturating'\n"
    << "set xlabel 'log2(sigma)'\nset ylabel 'SNR (dB)'\nset grid\nset key outside right\n"
    << "set yrange [-5:*]\nplot ";
  const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  for (size_t i = 0; i < formats.size(); ++i)
    s << (i ? ", " : "") << report::gnuplot_quote((fs::path(o.out_dir) / "snr.csv").string()) << " using 1:(strcol(2) eq '"
      << format_name(formats[i]) << "' ? $4 : 1/0) with lines lw 2 lc rgb '" << colours[i % 10] << "' dt " << 1 + i / 10 << " title '"
      << format_name(formats[i]) << "'";
  s << "\n";
  io::write_text_atomically(gp.string(), s.str());
  if (const std::string why = report::run_gnuplot(gp.string()); !why.empty())
    std::fprintf(stderr, "warning: no plot: %s; the CSV is still at %s\n", why.c_str(), (fs::path(o.out_dir) / "snr.csv").c_str());
  else
    std::printf("plot: %s\n", (fs::path(o.out_dir) / "snr.png").c_str());
}

void run(const SnrOptions& o) {
  namespace fs = std::filesystem;
  std::vector<Format> formats;
  for (const std::string& name : o.formats) {
    const Format f = parse_format(name);
    // A format named twice (or by two aliases) would repeat its rows in the CSV and the plot.
    if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
  }
  check_snr_sweep(o.lo, o.hi, o.step, o.samples);
  std::error_code ec;
  if (fs::exists(o.out_dir, ec) && !fs::is_directory(o.out_dir, ec)) throw Error("--out '" + o.out_dir + "' exists and is not a folder");
  fs::create_directories(o.out_dir, ec);
  if (ec) throw Error("--out: cannot create folder '" + o.out_dir + "': " + ec.message());
  std::printf("SNR sweep: %zu samples per point, log2(sigma) from %g to %g step %g, %zu formats\n", o.samples, o.lo, o.hi, o.step,
              formats.size());
  const auto points = snr_sweep(formats, o.lo, o.hi, o.step, o.samples, o.seed);
  const std::string csv = (std::filesystem::path(o.out_dir) / "snr.csv").string();
  {
    std::ostringstream f;
    f << "log2_sigma,format,snr,snr_db\n";
    // Grouped by format, so each format's rows are consecutive (gnuplot draws them as a line).
    for (Format fmt : formats)
      for (const SnrPoint& p : points)
        if (p.format == fmt) f << p.log2_sigma << "," << format_name(p.format) << "," << p.snr << "," << db(p.snr) << "\n";
    io::write_text_atomically(csv, f.str());
  }
  std::printf("csv: %s\n", csv.c_str());
  write_plot(o, formats);

  // A compact view: SNR in dB at a few scales.
  const double show[] = {-24, -16, -8, 0, 8, 16};
  std::printf("\nSNR (dB) by log2(sigma):\n%-10s", "format");
  for (double l : show) std::printf(" %7g", l);
  std::printf("\n");
  for (Format f : formats) {
    std::printf("%-10s", std::string(format_name(f)).c_str());
    for (double l : show)
      for (const SnrPoint& p : points)
        if (p.format == f && std::fabs(p.log2_sigma - l) < 1e-9) std::printf(" %7.1f", db(p.snr));
    std::printf("\n");
  }

  const OutlierScenario s = outlier_scenario(size_t(1) << 22, o.seed);
  std::printf(
      "\nUnit Scaling Appendix D: SNR of N(0,1) non-outliers (4M samples), outliers median 60, max 180\n"
      "%-38s %12s %14s %8s\n"
      "%-38s %12.3g %14.3g %8s\n%-38s %12.3g %14.3g %8s\n%-38s %12.3g %14.3g %8s\n",
      "quantiser", "nearest-even", "toward-zero", "paper", "INT8 scaled so 180 -> 127", s.int8_max_nearest, s.int8_max_toward_zero, "2.03",
      "INT8 scaled so 60 -> 127", s.int8_median_nearest, s.int8_median_toward_zero, "14.8", "e4m3fnuz (Graphcore E4, max 240)",
      s.e4m3fnuz_nearest, s.e4m3fnuz_toward_zero, "1.29e3");
  std::printf(
      "The paper's INT8 figures match round-toward-zero; its E4 figure lies between our "
      "two conventions (see docs/RESULTS.md).\n");
}

}  // namespace

void add_snr_command(CLI::App& app) {
  auto o = std::make_shared<SnrOptions>();
  auto* cmd = app.add_subcommand("snr",
                                 "SNR of N(0, sigma^2) per format vs sigma; CSV, PNG plot and "
                                 "the Unit Scaling Appendix D outlier scenario");
  cmd->add_option("--out", o->out_dir, "Output folder for snr.csv, snr.gp and snr.png")->capture_default_str();
  cmd->add_option("--formats", o->formats, "Formats to sweep (names or aliases)")->delimiter(',')->capture_default_str();
  cmd->add_option("--from", o->lo, "Smallest log2(sigma)")->capture_default_str()->transform(finite_number());
  cmd->add_option("--to", o->hi, "Largest log2(sigma)")->capture_default_str()->transform(finite_number());
  // --from/--to/--step/--samples are checked by check_snr_sweep (finite, ordered, bounded points).
  cmd->add_option("--step", o->step, "Step in log2(sigma)")->capture_default_str()->transform(finite_number());
  cmd->add_option("--samples", o->samples, "Samples per point (at most 2^24)")->capture_default_str()->transform(non_negative_integer());
  cmd->add_option("--seed", o->seed, "Random seed (>= 0)")->capture_default_str()->transform(non_negative_integer());
  cmd->callback([o] { run(*o); });
}

}  // namespace scalify::cli
