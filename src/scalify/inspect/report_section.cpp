#include "scalify/inspect/report_section.hpp"

#include <algorithm>
#include <filesystem>
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

}  // namespace

std::string numerics_section(const std::vector<RunToInspect>& runs, const std::string& report_dir, const std::string& f32_run_dir) {
  std::ostringstream md, notes;
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
