#include "scalify/inspect/report_section.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "scalify/inspect/inspect.hpp"
#include "scalify/inspect/scale_history.hpp"
#include "scalify/train/ptq.hpp"

namespace scalify::inspect {

namespace fs = std::filesystem;

namespace {

std::string percent(double f) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(2);
  s << 100.0 * f << "%";
  return s.str();
}

// The largest share of one class over the tensors of one kind.
double worst(const Inspection& in, TensorKind kind, int64_t ExponentHistogram::*field) {
  double w = 0;
  for (const InspectedTensor& t : in.tensors)
    if (t.kind == kind && t.histogram.count) w = std::max(w, double(t.histogram.*field) / double(t.histogram.count));
  return w;
}

// What a quantised operand is and which of the layer's GEMMs read it (quant/linear.cpp's slots:
// the *_t operands are quantised again for the backward GEMMs where a recipe asks).
std::pair<std::string, std::string> role_text(const std::string& role) {
  if (role == "weight") return {"weight", "its forward output and input gradient"};
  if (role == "activation") return {"input activation", "its forward output and weight gradient"};
  if (role == "gradient") return {"output gradient", "its input and weight gradients"};
  if (role == "weight_t") return {"weight (as the input gradient reads it)", "its input gradient"};
  if (role == "activation_t") return {"input activation (as the weight gradient reads it)", "its weight gradient"};
  if (role == "gradient_t") return {"output gradient (as the weight gradient reads it)", "its weight gradient"};
  return {role, "its GEMMs"};
}

}  // namespace

std::string underflow_reading(const std::string& name, const std::vector<ScaleSeries>& series, const std::string& verdict) {
  struct Loss {
    const ScaleSeries* s;
    double mean, max, energy;
  };
  std::vector<Loss> losses;
  for (const ScaleSeries& s : series) {
    if (s.points.empty()) continue;
    Loss l{&s, 0, 0, 0};
    int64_t with_energy = 0;
    for (const ScalePoint& p : s.points) {
      l.mean += p.underflow / double(s.points.size());
      l.max = std::max(l.max, p.underflow);
      if (!std::isnan(p.underflow_energy)) l.energy += p.underflow_energy, ++with_energy;
    }
    l.energy = with_energy ? l.energy / double(with_energy) : NAN;
    losses.push_back(l);
  }
  const auto worst = std::max_element(losses.begin(), losses.end(), [](const Loss& a, const Loss& b) { return a.mean < b.mean; });
  if (worst == losses.end() || worst->mean < 0.05) return "";
  std::map<std::string, int> over;  // operands losing more than 10 % on average, by role
  int count = 0;
  for (const Loss& l : losses)
    if (l.mean > 0.10) ++over[l.s->role], ++count;
  const auto [what, feeds] = role_text(worst->s->role);
  std::ostringstream s;
  s << "- **" << name << "**: " << worst->s->layer << "'s " << what << " loses the most: " << percent(worst->mean)
    << " of its non-zero values underflow on average over the run (at most " << percent(worst->max) << ")";
  if (std::isfinite(worst->energy)) s << ", and they carried " << percent(worst->energy) << " of its squared norm";
  s << ". " << count << " of " << losses.size() << " quantised operands lose more than 10 % on average";
  if (count > 0) {
    s << " (";
    int i = 0;
    for (const auto& [role, n] : over) s << (i++ ? ", " : "") << role << " " << n;
    s << ")";
  }
  s << ". ";
  const bool gap = verdict.starts_with("worse") || verdict.starts_with("inconclusive");
  if (std::isfinite(worst->energy) && worst->energy < 0.01)
    s << "Underflow flushes a tensor's smallest values first, and here they carried almost none of its magnitude, so the GEMMs "
         "that read it ("
      << feeds << ") lose almost nothing"
      << (gap ? ": this underflow does not explain the gap to the baseline"
              : ": the loss can stay with the baseline's although " + percent(worst->mean) + " of the values are lost");
  else if (std::isfinite(worst->energy))
    s << "The flushed values carried a real share of the tensor's magnitude, so the GEMMs that read it (" << feeds << ") lose signal too";
  else
    s << "(This run predates the squared-norm counter, so how much the flushed values carried is not known.)";
  if (!verdict.empty()) s << " (verdict on the loss: " << verdict << ")";
  s << ".\n";
  return s.str();
}

std::string numerics_section(const std::vector<RunToInspect>& runs, const std::string& report_dir, const std::string& f32_run_dir) {
  std::ostringstream md, notes, underflow;
  md << "## Numerics\n\n"
     << "`scalify inspect` of each recipe's final model on one training batch: the exponent histogram of every activation, weight "
        "and gradient against e4m3's range (`histograms.png`, the layout of Unit Scaling's Figures A.4-A.7), and for recipes with "
        "quantisers the scaling bias of every quantised tensor over training (`scales.png`, seed 003 Figures 7-9) with the "
        "underflow and clipped fractions (`quant_fractions.png`). The columns give the largest fraction of a tensor's values "
        "that e4m3 would flush to zero (underflow) or clip, per kind, as stored (scaled tensors: their data).\n\n"
     << "| recipe | histograms | scale history | activations under / clip | activation grads under / clip | weight grads under / clip |\n"
     << "|---|---|---|---:|---:|---:|\n";
  for (const RunToInspect& r : runs) {
    const fs::path out = fs::path(r.run_dir) / "inspect";
    const std::string link = fs::relative(out, report_dir).string();
    try {
      const Inspection in = inspect_checkpoint(r.run_dir, {});
      const std::string picture = write_inspection(in, out.string());
      const std::vector<ScaleSeries> series = read_scale_history(r.run_dir);
      underflow << underflow_reading(r.name, series, r.verdict);
      md << "| " << r.name << " | ";
      if (picture.empty())
        md << "[histograms](" << link << "/histograms.png)";
      else
        md << "(no picture)";
      md << " | ";
      if (series.empty())
        md << "none";
      else if (write_scale_history(series, out.string(), "recipe " + r.name).empty())
        md << "[scales](" << link << "/scales.png), [fractions](" << link << "/quant_fractions.png)";
      else
        md << "(no picture)";
      for (TensorKind k : {TensorKind::activation, TensorKind::activation_grad, TensorKind::weight_grad})
        md << " | " << percent(worst(in, k, &ExponentHistogram::underflow)) << " / " << percent(worst(in, k, &ExponentHistogram::clipped));
      md << " |\n";
    } catch (const std::exception& e) {
      notes << "- " << r.name << ": not inspected (" << e.what() << ")\n";
    }
  }
  md << notes.str();
  if (!underflow.str().empty())
    md << "\n### Where the quantisers flush values, and what that costs\n\n"
       << "From each run's quantiser counters (every stats_every steps): the operand that loses the most to underflow, "
          "the share of its squared norm those values carried, and the operands losing more than 10 %.\n\n"
       << underflow.str();
  if (f32_run_dir.empty()) return md.str();
  md << "\n### FP8 post-training quantisation of the f32 model (seed 003 Table 3)\n\n"
        "`scalify quantize` casts the four linear layers of every block to e4m3: FP8-AMAX (a per-tensor bias from amax for each "
        "weight once, for activations per batch), MXFP8 (32-element blocks) and FP8-CSCALE (one constant bias b for all). "
        "Validation loss:\n\n";
  try {
    md << train::ptq_sweep_markdown(train::ptq_sweep(f32_run_dir, -10, 12));
  } catch (const std::exception& e) {
    md << "(Not run: " << e.what() << ".)\n";
  }
  return md.str();
}

}  // namespace scalify::inspect
