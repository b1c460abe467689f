#include "scalify/train/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/train/ptq.hpp"
#include "scalify/train/session.hpp"

namespace scalify::train {

EvalResult evaluate(const std::string& checkpoint, const std::string& data) {
  const std::string file = checkpoint_file(checkpoint);
  io::SafeTensors st = io::read_safetensors(file);
  const EvalResult r = [&] {
    if (is_quantized_checkpoint(st)) return evaluate_quantized(st, file, data);
    TrainConfig cfg = training_checkpoint_config(st, file);
    if (!data.empty()) cfg.data = data;
    const std::unique_ptr<Session> s = load_session(st, cfg, file);
    return eval_session(*s, corpus_for(cfg));
  }();
  // Finite parameters can still overflow a low-precision activation format.
  if (!std::isfinite(r.loss)) throw Error("eval: the validation loss of '" + file + "' is not finite (an activation overflows its format)");
  return r;
}

std::string sample(const std::string& checkpoint, const std::string& prompt, const SampleOptions& o) {
  if (o.tokens < 0 || o.tokens > 100000) throw Error("sample: tokens must be in [0, 100000]");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) throw Error("sample: temperature must be >= 0");
  if (o.top_k < 0) throw Error("sample: top_k must be >= 0");
  auto [st, cfg] = read_checkpoint(checkpoint);
  const std::unique_ptr<Session> s = load_session(st, cfg, checkpoint_file(checkpoint));
  std::vector<int64_t> ctx(prompt.begin(), prompt.end());
  for (auto& c : ctx) c = int64_t(uint8_t(c));
  if (ctx.empty()) ctx.push_back('\n');
  std::string out;
  const NoGrad no_grad;
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t T = std::min<int64_t>(int64_t(ctx.size()), cfg.model.seq);
    const std::vector<int64_t> window(ctx.end() - T, ctx.end());
    const Tensor logits = s->forward_model().logits(Tensor::from_indices(window, {1, T})).value();
    std::vector<double> l(size_t(cfg.model.vocab));
    for (int64_t v = 0; v < cfg.model.vocab; ++v) l[size_t(v)] = logits.at({0, T - 1, v});
    if (!std::all_of(l.begin(), l.end(), [](double x) { return std::isfinite(x); }))
      throw Error("sample: the logits of '" + checkpoint + "' are not finite (an activation overflows its format)");
    int64_t next = 0;
    if (o.temperature == 0) {
      next = std::max_element(l.begin(), l.end()) - l.begin();
    } else {
      std::vector<double> sorted = l;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const double cut = o.top_k > 0 && o.top_k < int64_t(l.size()) ? sorted[size_t(o.top_k - 1)] : -INFINITY;
      std::vector<double> p(l.size());
      double z = 0;
      for (size_t v = 0; v < l.size(); ++v) z += p[v] = l[v] >= cut ? std::exp((l[v] - sorted[0]) / o.temperature) : 0.0;
      double u = double(kernels::random_bits(o.seed, uint64_t(i))) * 0x1.0p-32 * z;  // uniform in [0, z)
      for (size_t v = 0; v < p.size(); ++v)
        if ((u -= p[v]) <= 0 || v + 1 == p.size()) {
          next = int64_t(v);
          break;
        }
    }
    ctx.push_back(next);
    out.push_back(char(uint8_t(next)));
  }
  return out;
}

}  // namespace scalify::train
