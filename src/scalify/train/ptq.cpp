#include "scalify/train/ptq.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "scalify/error.hpp"
#include "scalify/formats/block.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/quant/quantizer.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/train/init_record.hpp"
#include "scalify/train/pretrained.hpp"
#include "scalify/train/session.hpp"

namespace scalify::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char* ptq_method_name(PtqMethod m) {
  switch (m) {
    case PtqMethod::amax: return "amax";
    case PtqMethod::cscale: return "cscale";
    case PtqMethod::mx: return "mx";
    case PtqMethod::nvfp4: return "nvfp4";
    case PtqMethod::mxfp4: return "mxfp4";
  }
  return "?";
}

PtqMethod parse_ptq_method(const std::string& name) {
  for (PtqMethod m : {PtqMethod::amax, PtqMethod::cscale, PtqMethod::mx, PtqMethod::nvfp4, PtqMethod::mxfp4})
    if (name == ptq_method_name(m)) return m;
  throw Error("unknown quantisation method '" + name + "' (valid: amax, cscale, mx, nvfp4, mxfp4)");
}

namespace {

constexpr int kPtqVersion = 2;  // 2: with checksums (io/safetensors.hpp); 1 (before them) still loads

// The element format of a quantisation's weights, and its block length along the reduction (0: none).
Format element_of(const PtqOptions& o) {
  return o.method == PtqMethod::nvfp4 || o.method == PtqMethod::mxfp4 ? Format::e2m1 : o.method == PtqMethod::mx ? Format::e4m3 : o.element;
}
int64_t block_of(PtqMethod m) { return m == PtqMethod::nvfp4 ? 16 : m == PtqMethod::mx || m == PtqMethod::mxfp4 ? 32 : 0; }

void check(const PtqOptions& o) {
  if (o.bias < -64 || o.bias > 64) throw Error("quantize: the scaling bias must be in [-64, 64], got " + std::to_string(o.bias));
  const bool per_tensor = o.method == PtqMethod::amax || o.method == PtqMethod::cscale;
  if (per_tensor ? o.element != Format::e4m3 && o.element != Format::e5m2 : o.element != Format::e4m3)
    throw Error("quantize: the element format " + std::string(format_name(o.element)) +
                (per_tensor ? std::string(" is neither e4m3 nor e5m2")
                            : " applies to amax and cscale only; " + std::string(ptq_method_name(o.method)) + " has its own"));
}

// How one role is quantised: weights once (MX blocks down the columns, along the reduction
// dimension K of x[rows, K] @ w[K, N]), activations at every batch (MX along their rows).
quant::QuantizerConfig role(const PtqOptions& o, bool weight) {
  quant::QuantizerConfig c;
  c.format = element_of(o);
  c.margin = 0;
  switch (o.method) {
    case PtqMethod::amax: c.scaling = quant::Scaling::amax_bias; break;
    case PtqMethod::cscale:
      c.scaling = quant::Scaling::constant_bias;
      c.bias = o.bias;
      break;
    case PtqMethod::mx:
    case PtqMethod::mxfp4:
      c.scaling = quant::Scaling::mx;
      c.block = weight ? BlockSpec{32, 1, BlockScaleRule::mx_floor} : BlockSpec{1, 32, BlockScaleRule::mx_floor};
      break;
    case PtqMethod::nvfp4:
      c.scaling = quant::Scaling::block;
      c.block = weight ? BlockSpec{16, 1, BlockScaleRule::nvfp4} : BlockSpec{1, 16, BlockScaleRule::nvfp4};
      break;
  }
  return c;
}

}  // namespace

std::vector<std::string> ptq_weights(const nn::Gpt& model) {
  std::vector<std::string> names;
  for (const std::string& l : model.linear_names()) names.push_back(l + ".w");
  return names;
}

quant::Recipe model_of(quant::Recipe r, const quant::Recipe& trained) {
  r.unit_scaled = trained.unit_scaled;
  r.umup = trained.umup;
  return r;
}

quant::Recipe ptq_inference_recipe(const PtqOptions& o, const quant::Recipe& trained) {
  quant::Recipe r;
  r.name = std::string("ptq_") + ptq_method_name(o.method);
  quant::QuantizerConfig as_given;
  as_given.scaling = quant::Scaling::none;
  as_given.format = Format::f32;
  r.linear = quant::LinearRecipe::uniform(as_given, o.activations ? role(o, false) : as_given, as_given);
  return model_of(r, trained);
}

bool activation_scale_per_window(const quant::Recipe& recipe) {
  if (!recipe.linear.quantized) return false;
  const quant::QuantizerConfig& a = recipe.linear.forward.activation;
  return a.scaling == quant::Scaling::amax_bias || a.scaling == quant::Scaling::current ||
         (a.scaling == quant::Scaling::block && a.block.rule == BlockScaleRule::nvfp4);
}

namespace {

std::vector<std::string> weight_names(const Session& s) { return ptq_weights(s.model); }

struct QuantizedWeight {
  quant::Quantized q;
  PtqWeight report;
};

QuantizedWeight quantize_weight(const std::string& name, const Tensor& w, const PtqOptions& o) {
  const int64_t block = block_of(o.method);
  if (block > 0 && w.size(0) % block != 0)
    throw Error(std::string("quantize: ") + ptq_method_name(o.method) + " needs the reduction dimension of '" + name + "' (" +
                std::to_string(w.size(0)) + ") to be a multiple of " + std::to_string(block));
  quant::Quantizer quantizer(role(o, true));
  QuantizedWeight r{quantizer.quantize(w), {}};
  const quant::QuantStats& st = quantizer.last();
  r.report = {name, -std::log2(double(st.scale)), st.underflow, st.clipped};
  return r;
}

EvalResult evaluate_values(const TrainConfig& cfg, const quant::Recipe& recipe, const std::map<std::string, Tensor>& values,
                           const Corpus& val) {
  TrainConfig c = cfg;
  if (activation_scale_per_window(recipe)) c.batch = 1;
  return eval_session(*inference_session(c, recipe, values), val);
}

}  // namespace

std::map<std::string, Tensor> ptq_quantize_values(const std::map<std::string, Tensor>& f32, const std::vector<std::string>& weights,
                                                  const PtqOptions& o, std::vector<PtqWeight>* report) {
  check(o);
  std::map<std::string, Tensor> v = f32;
  for (const std::string& w : weights) {
    QuantizedWeight q = quantize_weight(w, f32.at(w), o);
    v[w] = q.q.dequantize();
    if (report) report->push_back(q.report);
  }
  return v;
}

namespace {

// Writes the quantised checkpoint `out` of `values` (f32, by parameter name, in `names` order):
// `weights` quantised as `o` says, metadata "config" `cfg` and "scalify.ptq" `ptq` with the
// method's keys added.
std::vector<PtqWeight> write_quantized(const std::string& out, const std::vector<std::string>& names,
                                       const std::map<std::string, Tensor>& values, const std::vector<std::string>& weights,
                                       const PtqOptions& o, const TrainConfig& cfg, json ptq) {
  io::SafeTensors st;
  std::vector<PtqWeight> report;
  for (const std::string& name : names) {
    const Tensor& v = values.at(name);
    if (std::find(weights.begin(), weights.end(), name) == weights.end()) {
      st.tensors.emplace_back("param." + name, v);
      continue;
    }
    QuantizedWeight q = quantize_weight(name, v, o);
    report.push_back(q.report);
    if (!q.q.blockwise) {
      st.tensors.emplace_back("param." + name, q.q.per_tensor.data);
      st.tensors.emplace_back("param." + name + ".scale", Tensor::full({}, q.q.per_tensor.scalar_scale()));
    } else {
      const BlockQuantized& b = q.q.blocks;
      Tensor codes = Tensor::empty(v.shape(), dtype_of(b.element));
      std::memcpy(codes.raw_bytes(), b.codes.data(), b.codes.size());
      const Shape scale_shape{int64_t(b.scale_rows()), int64_t(b.scale_cols())};
      if (pow2_block_scales(b.block.rule)) {
        Tensor scales = Tensor::empty(scale_shape, DType::e8m0);
        const std::vector<uint8_t> e8m0 = b.e8m0_scales();
        std::memcpy(scales.raw_bytes(), e8m0.data(), e8m0.size());
        st.tensors.emplace_back("param." + name + ".scale", scales);
      } else {  // NVFP4: E4M3 block scales (each an e4m3 value: the cast is exact) and the f32 tensor scale
        st.tensors.emplace_back("param." + name + ".scale", Tensor::from_vector(b.scales, scale_shape).to(DType::e4m3));
        st.tensors.emplace_back("param." + name + ".tensor_scale", Tensor::full({}, b.tensor_scale));
      }
      st.tensors.emplace_back("param." + name, codes);
    }
  }
  ptq["version"] = kPtqVersion;
  ptq["method"] = ptq_method_name(o.method);
  ptq["element"] = std::string(format_name(element_of(o)));
  ptq["bias"] = o.bias;
  ptq["activations"] = o.activations;
  st.metadata = {{"config", cfg.to_toml()}, {"scalify.ptq", ptq.dump()}};
  io::write_safetensors(out, st);
  return report;
}

void check_output_file(const std::string& out, std::vector<std::string> inputs) {
  std::error_code ec;
  if (fs::is_directory(out, ec))
    throw Error("quantize: the output '" + out + "' is a folder; give a file name such as model_fp8.safetensors");
  io::refuse_to_overwrite(out, inputs, "quantize");
}

}  // namespace

std::vector<PtqWeight> quantize_checkpoint(const std::string& checkpoint, const std::string& out, const PtqOptions& o) {
  check(o);
  std::vector<std::string> inputs = {checkpoint_file(checkpoint)};  // and the files of its run folder
  for (const char* f : run_file_names()) inputs.push_back((fs::path(checkpoint_file(checkpoint)).parent_path() / f).string());
  check_output_file(out, inputs);
  const auto [src, cfg] = read_checkpoint(checkpoint);
  const std::unique_ptr<Session> s = load_session(src, cfg, checkpoint_file(checkpoint));
  json ptq = {{"source_step", checkpoint_step(src, checkpoint_file(checkpoint))}};
  if (s->recipe.unit_scaled) ptq["unit_scaled"] = true;  // the model variant its values belong to; absent: standard
  if (s->recipe.umup) ptq["umup"] = true;
  return write_quantized(out, s->names, parameter_values(*s), weight_names(*s), o, cfg, ptq);
}

std::vector<PtqWeight> quantize_pretrained(const std::string& model_dir, const std::string& out, const PtqOptions& o, int64_t context) {
  check(o);
  std::vector<std::string> inputs = {model_dir};  // the model (a .gguf file) and every file of a model folder
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec)) inputs.push_back(e.path().string());
  check_output_file(out, inputs);
  const Pretrained p = load_pretrained(model_dir);
  const int64_t c = context > 0 ? context : default_context(p.hf.model);
  if (c > p.hf.model.seq)
    throw Error("quantize: --context " + std::to_string(c) + " exceeds the model's " + std::to_string(p.hf.model.seq));
  // The folder it came from gives the tokenizer eval reads text with; its files are recorded.
  TrainConfig cfg = p.session->cfg;
  cfg.init = model_dir;
  cfg = record_init(cfg);
  return write_quantized(out, p.session->names, parameter_values(*p.session), weight_names(*p.session), o, cfg,
                         {{"source_model", cfg.init}, {"context", c}});
}

namespace {

// A quantised weight's exact values: its codes decoded and multiplied by their scales (a
// power of two per tensor; per block of `block_of(method)` rows of each column, E8M0 or NVFP4's
// E4M3 under its f32 tensor scale).
template <class Bad>
Tensor decode_weight(const Tensor& t, const io::SafeTensors& st, const std::string& key, const PtqOptions& o, Bad&& bad) {
  const Format element = element_of(o);
  if (t.dtype() != dtype_of(element) || t.dim() != 2)
    throw bad("is neither f32 nor a 2-D " + std::string(format_name(element)) + " weight");
  if (!st.has(key + ".scale")) throw bad("has no scale");
  const Tensor& scale = st.at(key + ".scale");
  const int64_t block = block_of(o.method);
  if (block == 0) {
    if (scale.dtype() != DType::f32 || scale.numel() != 1)
      throw bad("needs an f32 scalar scale, has " + std::string(dtype_name(scale.dtype())) + " " + shape_str(scale.shape()));
    const double sc = scale.item();
    if (!(sc > 0) || !std::isfinite(sc) || std::exp2(std::round(std::log2(sc))) != sc)
      throw bad("has scale " + std::to_string(sc) + ", not a positive power of two");
    try {
      return ScaledTensor(t, float(sc)).value();
    } catch (const Error& e) {
      throw bad(e.what());
    }
  }
  const int64_t K = t.size(0), N = t.size(1);
  const bool nvfp4 = o.method == PtqMethod::nvfp4;
  const DType scale_dtype = nvfp4 ? DType::e4m3 : DType::e8m0;
  if (scale.dtype() != scale_dtype || scale.shape() != Shape{(K + block - 1) / block, N})
    throw bad("needs " + std::string(dtype_name(scale_dtype)) + " block scales of shape [K/" + std::to_string(block) + ", N]");
  BlockQuantized b{element, size_t(K), size_t(N), BlockSpec{size_t(block), 1, nvfp4 ? BlockScaleRule::nvfp4 : BlockScaleRule::mx_floor},
                   {},      {}};
  const Tensor codes = t.contiguous();
  b.codes.assign(codes.raw_bytes(), codes.raw_bytes() + K * N);
  b.scales = scale.to_floats();
  for (float v : b.scales)
    if (!std::isfinite(v) || v < 0) throw bad("has a block scale that is negative or not finite");
  const uint8_t top_code = uint8_t((1u << info(element).bits) - 1);
  for (size_t i = 0; i < b.codes.size(); ++i)
    if (uint8_t(b.codes[i]) > top_code) throw bad("holds a byte that is no " + std::string(format_name(element)) + " code");
  if (nvfp4) {
    if (!st.has(key + ".tensor_scale") || st.at(key + ".tensor_scale").dtype() != DType::f32 || st.at(key + ".tensor_scale").numel() != 1)
      throw bad("needs an f32 scalar tensor_scale (NVFP4)");
    b.tensor_scale = float(st.at(key + ".tensor_scale").item());
    if (!(b.tensor_scale > 0) || !std::isfinite(b.tensor_scale)) throw bad("has a tensor_scale that is not finite and positive");
  }
  Tensor v = Tensor::empty({K, N});
  dequantize_blocks(b, std::span(v.data<float>(), size_t(K * N)));
  return v;
}

}  // namespace

bool is_quantized_checkpoint(const io::SafeTensors& st) { return st.metadata.count("scalify.ptq") > 0; }

EvalResult evaluate_quantized(const io::SafeTensors& st, const std::string& file, const std::string& data) {
  TrainConfig cfg = checkpoint_config(st, file);
  if (!data.empty()) cfg.data = data;
  PtqOptions o;
  quant::Recipe trained;  // the model variant: unit_scaled, umup
  int version = 0;
  int64_t context = 0;  // > 0: quantised from a pretrained model, evaluated on windows of this many tokens
  try {
    const json ptq = io::parse_json(st.metadata.at("scalify.ptq"), "metadata");
    version = ptq.at("version").get<int>();
    if (version != 1 && version != kPtqVersion)
      throw Error("version " + io::json_excerpt(ptq.at("version")) + ", this build reads 1 and 2");
    o.method = parse_ptq_method(ptq.at("method").get<std::string>());
    const std::string element = ptq.at("element").get<std::string>();
    if (element == "e5m2") o.element = Format::e5m2;
    if (element != format_name(element_of(o))) throw Error("element format " + io::json_excerpt(ptq.at("element")));
    o.bias = ptq.at("bias").get<int>();
    o.activations = !ptq.contains("activations") || ptq.at("activations").get<bool>();
    trained.unit_scaled = ptq.contains("unit_scaled") && ptq.at("unit_scaled").get<bool>();
    trained.umup = ptq.contains("umup") && ptq.at("umup").get<bool>();
    if (ptq.contains("context")) context = ptq.at("context").get<int64_t>();
    if (ptq.contains("context") && (context < 1 || context > cfg.model.seq)) throw Error("context " + std::to_string(context));
    check(o);
  } catch (const std::exception& e) {
    throw Error("quantised checkpoint '" + file + "': bad 'scalify.ptq' metadata (" + e.what() + ")");
  }
  if (version == kPtqVersion) require_checksums(st, file);
  // Parameters: f32 tensors as they are, weights decoded; nothing non-finite.
  std::map<std::string, Tensor> values;
  for (const auto& [key, t] : st.tensors) {
    if (!key.starts_with("param.") || key.ends_with(".scale") || key.ends_with(".tensor_scale")) continue;
    const std::string name = key.substr(6);
    auto bad = [&](const std::string& why) { return Error("quantised checkpoint '" + file + "': tensor '" + key + "' " + why); };
    if (t.dtype() == DType::f32) {
      values[name] = t;
    } else {
      values[name] = decode_weight(t, st, key, o, bad);
    }
    if (!std::isfinite(ops::sum_squares(values[name]))) throw bad("holds NaN or infinite values");
  }
  if (context > 0) {  // a pretrained model's (quantize --model): evaluated as eval --model evaluates it
    const std::unique_ptr<tokenize::Tokenizer> tokenizer = run_tokenizer(cfg, file);
    const std::vector<int32_t> tokens = read_tokens(cfg.data.empty() ? default_corpus_path() : cfg.data, tokenizer.get(), cfg.model.vocab);
    const TokenEval t =
        evaluate_tokens(*inference_session(cfg, ptq_inference_recipe(o, trained), values), tokens, tokenizer.get(), context, size_t(0));
    return {t.loss, t.bits_per_byte, t.windows, {}};
  }
  return evaluate_values(cfg, ptq_inference_recipe(o, trained), values, corpus_for(cfg));
}

std::vector<PtqSweepRow> ptq_sweep(const std::string& checkpoint, int lo, int hi, const std::string& data, const SweepProgress& progress) {
  auto [src, cfg] = read_checkpoint(checkpoint);
  if (!data.empty()) cfg.data = data;
  const std::unique_ptr<Session> s = load_session(src, cfg, checkpoint_file(checkpoint));
  const Corpus val = corpus_for(cfg);
  return ptq_sweep(
      parameter_values(*s), weight_names(*s), lo, hi,
      [&](const quant::Recipe& r, const std::map<std::string, Tensor>& v) { return evaluate_values(cfg, model_of(r, s->recipe), v, val); },
      progress);
}

size_t ptq_sweep_evaluations(int lo, int hi) {
  return lo > hi ? 0 : 8 + 2 * size_t(hi - lo + 1);
}  // f32, two AMAX, MXFP8, four FP4, two CSCALE

std::vector<PtqSweepRow> ptq_sweep(const std::map<std::string, Tensor>& f32, const std::vector<std::string>& w, int lo, int hi,
                                   const ModelEval& evaluate, const SweepProgress& progress) {
  if (lo > hi) throw Error("ptq sweep: empty bias range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  check({PtqMethod::cscale, lo});
  check({PtqMethod::cscale, hi});
  const size_t total = ptq_sweep_evaluations(lo, hi);
  size_t index = 0;
  auto starting = [&](const std::string& what) {
    if (progress) progress(what, ++index, total);
  };
  std::vector<PtqSweepRow> rows;
  starting("f32");
  rows.push_back({"f32", 0, evaluate(quant::preset("f32"), f32), 0, ""});
  require_finite_loss(rows[0].eval.loss, "ptq sweep: the f32 validation loss (what the sweep compares against)");
  auto run = [&](const char* label, const PtqOptions& o) {
    starting(std::string(label) + (o.method == PtqMethod::cscale ? " bias " + std::to_string(o.bias) : ""));
    const EvalResult e = evaluate(ptq_inference_recipe(o), ptq_quantize_values(f32, w, o));
    rows.push_back({label, o.bias, e, (e.loss - rows[0].eval.loss) / rows[0].eval.loss, ""});
  };
  run("fp8_amax", {PtqMethod::amax, 0});
  run("fp8_amax_e5m2", {PtqMethod::amax, 0, true, Format::e5m2});
  auto blocked = [&](const char* label, const PtqOptions& o) {
    const int64_t block = block_of(o.method);
    if (std::all_of(w.begin(), w.end(), [&](const std::string& n) { return f32.at(n).size(0) % block == 0; }))
      run(label, o);
    else {  // a model too narrow for the blocks: the row says so
      ++index;
      rows.push_back({label, 0, {NAN, NAN, 0, {}}, NAN, "a reduction dimension is not a multiple of " + std::to_string(block)});
    }
  };
  blocked("mxfp8", {PtqMethod::mx, 0});
  blocked("nvfp4", {PtqMethod::nvfp4, 0});
  blocked("nvfp4_weights", {PtqMethod::nvfp4, 0, false});
  blocked("mxfp4", {PtqMethod::mxfp4, 0});
  blocked("mxfp4_weights", {PtqMethod::mxfp4, 0, false});
  for (int b = lo; b <= hi; ++b) run("fp8_cscale", {PtqMethod::cscale, b});
  for (int b = lo; b <= hi; ++b) run("fp8_cscale_e5m2", {PtqMethod::cscale, b, true, Format::e5m2});
  return rows;
}

std::pair<int, int> cscale_band(const std::vector<PtqSweepRow>& rows, double tolerance, const std::string& method) {
  std::vector<const PtqSweepRow*> c;
  for (const PtqSweepRow& r : rows)
    if (r.method == method) c.push_back(&r);
  auto ok = [&](size_t i) { return std::isfinite(c[i]->relative) && c[i]->relative <= tolerance; };
  size_t best = c.size();
  for (size_t i = 0; i < c.size(); ++i)
    if (ok(i) && (best == c.size() || c[i]->eval.loss < c[best]->eval.loss)) best = i;
  if (best == c.size()) return {1, 0};
  size_t a = best, b = best;
  while (a > 0 && ok(a - 1) && c[a - 1]->bias == c[a]->bias - 1) --a;
  while (b + 1 < c.size() && ok(b + 1) && c[b + 1]->bias == c[b]->bias + 1) ++b;
  return {c[a]->bias, c[b]->bias};
}

std::string ptq_sweep_markdown(const std::vector<PtqSweepRow>& rows, double tolerance) {
  std::ostringstream md;
  md << "| model | scaling bias | validation loss | vs f32 |\n|---|---:|---:|---:|\n";
  for (const PtqSweepRow& r : rows) {
    md << "| " << r.method << " | " << (r.method.starts_with("fp8_cscale") ? std::to_string(r.bias) : "") << " | ";
    if (!std::isfinite(r.eval.loss)) {
      md << (r.not_run.empty() ? "not finite" : "n/a (" + r.not_run + ")") << " | |\n";
      continue;
    }
    char cells[64];
    std::snprintf(cells, sizeof cells, "%.4f | %+.2f%% |\n", r.eval.loss, 100.0 * r.relative);
    md << cells;
  }
  char within[32];
  std::snprintf(within, sizeof within, "%g%%", 100 * tolerance);
  for (const char* method : {"fp8_cscale", "fp8_cscale_e5m2"}) {
    int first = 64, last = -64;  // the sweep's own range
    for (const PtqSweepRow& r : rows)
      if (r.method == method) first = std::min(first, r.bias), last = std::max(last, r.bias);
    if (first > last) continue;  // a sweep without these rows
    const auto [lo, hi] = cscale_band(rows, tolerance, method);
    md << "\nFP8-CSCALE (" << (std::string(method).ends_with("e5m2") ? "e5m2" : "e4m3") << ") is within " << within
       << " of f32 for biases ";
    if (lo > hi)
      md << "none of the sweep.\n";
    else if (lo == first || hi == last)
      md << "[" << lo << ", " << hi << "], which reaches the end of the sweep: widen it to find where the band stops.\n";
    else
      md << "[" << lo << ", " << hi << "]: below, weights underflow; above, activations clip.\n";
  }
  return md.str();
}

}  // namespace scalify::train
