#include "scalify/train/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/train/init_record.hpp"
#include "scalify/train/ptq.hpp"
#include "scalify/train/session.hpp"

namespace scalify::train {

void require_finite_loss(double loss, const std::string& what) {
  // Finite parameters can still overflow a low-precision activation format, or make logits too
  // large for their differences to be resolved.
  if (!std::isfinite(loss))
    throw Error(what + " is not finite or cannot be right (an activation overflows its format, or the logits are so large that " +
                "their rounding exceeds the loss)");
}

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
  require_finite_loss(r.loss, "eval: the validation loss of '" + file + "'");
  return r;
}

std::vector<int32_t> sample_ids(const Session& s, const std::vector<int32_t>& prompt, const SampleOptions& o, const std::string& what) {
  if (o.tokens < 0 || o.tokens > 100000) throw Error("sample: tokens must be in [0, 100000]");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) throw Error("sample: temperature must be >= 0");
  if (o.top_k < 0) throw Error("sample: top_k must be >= 0");
  const nn::GptConfig& model = s.cfg.model;
  std::vector<int64_t> ctx(prompt.begin(), prompt.end());
  for (int64_t id : ctx)
    if (id < 0 || id >= model.vocab) throw Error("sample: prompt token " + std::to_string(id) + " is outside the vocabulary");
  if (ctx.empty()) throw Error("sample: the prompt has no token");
  std::vector<int32_t> out;
  const NoGrad no_grad;
  const nn::Gpt forward = s.forward_model();
  const bool cached = forward.kv_cache_refusal().empty();
  nn::KvCache cache;
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t n = int64_t(ctx.size());
    Tensor logits;  // [1, rows, vocab]: the next token's are the last row
    if (cached && n <= model.seq) {
      const int64_t known = cache.length();  // the prompt first, then the token sampled last
      logits = forward.logits(Tensor::from_indices(std::vector<int64_t>(ctx.begin() + known, ctx.end()), {1, n - known}), cache).value();
    } else {  // past the context the positions shift: the last `seq` ids recomputed
      const int64_t T = std::min<int64_t>(n, model.seq);
      logits = forward.logits(Tensor::from_indices(std::vector<int64_t>(ctx.end() - T, ctx.end()), {1, T})).value();
    }
    const int64_t last = logits.size(1) - 1;
    std::vector<double> l(size_t(model.vocab));
    for (int64_t v = 0; v < model.vocab; ++v) l[size_t(v)] = logits.at({0, last, v});
    if (!std::all_of(l.begin(), l.end(), [](double x) { return std::isfinite(x); }))
      throw Error("sample: the logits of '" + what + "' are not finite (an activation overflows its format)");
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
    if (!o.ignore_eos && std::find(o.eos_ids.begin(), o.eos_ids.end(), next) != o.eos_ids.end()) break;
    ctx.push_back(next);
    out.push_back(int32_t(next));
  }
  return out;
}

std::string sample(const std::string& checkpoint, const std::string& prompt, const SampleOptions& o) {
  auto [st, cfg] = read_checkpoint(checkpoint);
  const std::unique_ptr<Session> s = load_session(st, cfg, checkpoint_file(checkpoint));
  // A model fine-tuned from a pretrained one speaks its tokenizer's tokens; the byte-level GPT bytes.
  const std::unique_ptr<tokenize::Tokenizer> tokenizer = run_tokenizer(cfg, checkpoint);
  if (!cfg.init.empty() && !tokenizer)
    throw Error("sample: '" + checkpoint + "' was fine-tuned from '" + cfg.init + "', which holds no tokenizer to read the prompt with");
  SampleOptions with_eos = o;
  if (!cfg.init.empty()) with_eos.eos_ids = hub::read_hf_config(cfg.init).eos_ids;
  return sample_text(*s, tokenizer.get(), prompt, with_eos, checkpoint);
}

std::string sample_text(const Session& s, const tokenize::Tokenizer* tokenizer, const std::string& prompt, const SampleOptions& o,
                        const std::string& what) {
  const std::string text = prompt.empty() ? "\n" : prompt;  // something to continue
  std::vector<int32_t> ids;
  if (tokenizer)
    ids = tokenizer->encode(text);
  else
    for (char c : text) ids.push_back(int32_t(uint8_t(c)));
  const std::vector<int32_t> out = sample_ids(s, ids, o, what);
  if (tokenizer) return tokenizer->decode(out);
  std::string bytes;
  for (int32_t id : out) bytes.push_back(char(uint8_t(id)));
  return bytes;
}

}  // namespace scalify::train
