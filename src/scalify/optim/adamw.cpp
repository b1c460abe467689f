#include "scalify/optim/adamw.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <span>
#include <string>
#include <tuple>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/optim/fused_encoded_step.hpp"
#include "scalify/optim/grad_norm.hpp"
#include "scalify/optim/param_chunks.hpp"
#include "scalify/scaled/scale_rules.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::optim {

namespace {
// A new represented value for a scaled parameter, stored against its current scale.
ScaledTensor restore(const ScaledTensor& p, const Tensor& value) {
  ScaledTensor out = p;
  out.data = ops::scale_shift(value, 1.0 / p.scalar_scale(), 0.0).to(p.data.dtype());
  return out;
}
void check_lr(double lr, const char* who) {
  if (!(lr >= 0) || !std::isfinite(lr)) throw Error(std::string(who) + ": lr must be finite and >= 0, got " + std::to_string(lr));
}
void check_config(const AdamWConfig& c) {
  check_lr(c.lr, "AdamW");
  auto need = [](bool ok, const char* field, const char* what, double got) {
    if (!ok) throw Error(std::string("AdamW: ") + field + " must be " + what + ", got " + std::to_string(got));
  };
  need(c.beta1 >= 0 && c.beta1 < 1, "beta1", "in [0, 1)", c.beta1);
  need(c.beta2 >= 0 && c.beta2 < 1, "beta2", "in [0, 1)", c.beta2);
  need(c.eps > 0 && std::isfinite(c.eps), "eps", "finite and > 0", c.eps);
  need(c.weight_decay >= 0 && std::isfinite(c.weight_decay), "weight_decay", "finite and >= 0", c.weight_decay);
  need(c.rescale_every >= 0, "rescale_every", ">= 0 (0: never)", c.rescale_every);
  validate(c.m_format, "AdamW m_format");
  validate(c.v_format, "AdamW v_format");
  if (c.m_format.non_negative) throw Error("AdamW m_format: the first moment takes both signs (non_negative must be false)");
  if (c.master_rounding != Rounding::nearest_even && c.master_rounding != Rounding::stochastic)
    throw Error("AdamW: master_rounding must be nearest_even or stochastic");
}
// New weights (f32) into the master-weight storage: Tensor::to's rounding, or stochastic.
Tensor store_master(const Tensor& w, DType dtype, Rounding rounding, uint64_t seed) {
  if (dtype == DType::f32 || rounding == Rounding::nearest_even) return w.to(dtype);
  Tensor out = Tensor::empty(w.shape(), dtype);
  const auto n = size_t(w.numel());
  quantize(std::span<const float>(w.data<float>(), n), *dtype_format(dtype), 1.0f,
           std::span<std::byte>(out.raw_bytes(), n * size_t(dtype_size(dtype))), {.rounding = rounding, .seed = seed});
  return out;
}
}  // namespace

namespace {
// store_scaled_master of f32 weights whose largest magnitude is top.
ScaledTensor store_scaled_master_at(const Tensor& f, DType dtype, Rounding rounding, uint64_t seed, float top) {
  const auto n = size_t(f.numel());
  const std::span<const float> values(f.data<float>(), n);
  if (!std::isfinite(top)) throw Error("store_scaled_master: the weights are not finite");
  // At most 2^127, the largest power of two an f32 scale holds (bf16's range needs no more).
  const int e = std::min(state_tensor_exponent({.storage = *dtype_format(dtype), .scaling = StateScaling::per_tensor}, top), 127);
  Tensor data = Tensor::empty(f.shape(), dtype);
  quantize(values, *dtype_format(dtype), float(std::ldexp(1.0, e)), std::span<std::byte>(data.raw_bytes(), n * size_t(dtype_size(dtype))),
           {.rounding = rounding, .seed = seed});
  return ScaledTensor(std::move(data), float(std::ldexp(1.0, -e)));
}
}  // namespace

ScaledTensor store_scaled_master(const Tensor& w, DType dtype, Rounding rounding, uint64_t seed) {
  if (dtype != DType::f16 && dtype != DType::bf16)
    throw Error("store_scaled_master: dtype must be f16 or bf16, got " + std::string(dtype_name(dtype)));
  const Tensor f = w.to(DType::f32).contiguous();
  return store_scaled_master_at(f, dtype, rounding, seed, amax(std::span<const float>(f.data<float>(), size_t(f.numel()))));
}

namespace {
// The seed of stochastic rounding for step t, parameter k, and what it rounds (0 m, 1 v, 2 weight).
uint64_t rounding_seed(int64_t t, size_t k, int what) { return (uint64_t(t) << 24) ^ (uint64_t(k) << 2) ^ uint64_t(what); }
}  // namespace

AdamW::AdamW(std::vector<Var> params, AdamWConfig config, std::vector<double> lr_scale, std::vector<bool> decay,
             std::vector<double> decay_scale)
    : params_(std::move(params)),
      lr_scale_(std::move(lr_scale)),
      decay_(std::move(decay)),
      decay_scale_(std::move(decay_scale)),
      c_(config) {
  check_config(c_);
  if (lr_scale_.empty()) lr_scale_.assign(params_.size(), 1.0);
  if (decay_.empty()) decay_.assign(params_.size(), true);
  if (decay_scale_.empty()) decay_scale_.assign(params_.size(), 1.0);
  if (decay_scale_.size() != params_.size())
    throw Error("AdamW: " + std::to_string(decay_scale_.size()) + " decay multipliers for " + std::to_string(params_.size()) +
                " parameters");
  for (size_t k = 0; k < decay_scale_.size(); ++k)
    if (!(decay_scale_[k] >= 0) || !std::isfinite(decay_scale_[k]))
      throw Error("AdamW: decay_scale of parameter " + std::to_string(k) + " must be finite and >= 0, got " +
                  std::to_string(decay_scale_[k]));
  if (lr_scale_.size() != params_.size() || decay_.size() != params_.size())
    throw Error("AdamW: " + std::to_string(lr_scale_.size()) + " learning-rate multipliers and " + std::to_string(decay_.size()) +
                " decay switches for " + std::to_string(params_.size()) + " parameters");
  for (size_t k = 0; k < lr_scale_.size(); ++k)
    if (!(lr_scale_[k] >= 0) || !std::isfinite(lr_scale_[k]))
      throw Error("AdamW: lr_scale of parameter " + std::to_string(k) + " must be finite and >= 0, got " + std::to_string(lr_scale_[k]));
  m_codes_.resize(params_.size());
  v_codes_.resize(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    const Var& p = params_[k];
    if (!scaled_update(k) && encodes_state()) {  // zeros, encoded: codes 0, scale 1
      const std::vector<float> zeros(size_t(numel_of(p.shape())), 0.0f);
      m_codes_[k] = encode_state(zeros, c_.m_format);
      v_codes_[k] = encode_state(zeros, c_.v_format);
      m_.emplace_back();
      v_.emplace_back();
    } else if (scaled_update(k)) {  // zeros whose scale is ANY: the first update takes g's scale
      m_.push_back(any_scale_constant(Tensor::zeros(p.shape(), c_.state_dtype)));
      v_.push_back(any_scale_constant(Tensor::zeros(p.shape(), c_.state_dtype)));
    } else {
      m_.emplace_back(Tensor::zeros(p.shape()));
      v_.emplace_back(Tensor::zeros(p.shape()));
    }
  }
}

void AdamW::store_weights(size_t k, const Tensor& next, const Tensor& old_value, std::optional<float> next_amax) {
  const uint64_t seed = rounding_seed(t_, k, 2);
  Var& p = params_[k];
  if (p.scaled().is_scaled()) {  // a scaled master (scaled_update(k) is false): a new scale from the new weights' amax
    const float top = next_amax ? *next_amax : amax(std::span<const float>(next.data<float>(), size_t(next.numel())));
    p.set_value(store_scaled_master_at(next, p.scaled().data.dtype(), c_.master_rounding, seed, top));
  } else
    p.set_value(store_master(next, old_value.dtype(), c_.master_rounding, seed));
}

void AdamW::set_lr(double lr) {
  check_lr(lr, "AdamW::set_lr");
  c_.lr = lr;
}

// The fused passes allocate f32 copies of a batch's parameters (the new weights; a scaled master's
// value): batches of whole parameters of at most kStepBatch elements (a larger one alone) bound
// that transient memory by a batch, not the whole model (the chunks of a batch still share the
// threads; every element's update is the same whatever the batch).
std::vector<std::vector<size_t>> AdamW::step_batches(const std::vector<size_t>& ks) const {
  constexpr int64_t kStepBatch = int64_t(1) << 24;
  std::vector<std::vector<size_t>> batches;
  int64_t in_last = 0;
  for (size_t k : ks) {
    const int64_t n = numel_of(params_[k].shape());
    if (batches.empty() || in_last + n > kStepBatch) {
      batches.emplace_back();
      in_last = 0;
    }
    batches.back().push_back(k);
    in_last += n;
  }
  return batches;
}

void AdamW::step(double gradient_multiplier, Gradients gradients) {
  std::vector<size_t> plain, scaled;
  for (size_t k = 0; k < params_.size(); ++k)
    if (params_[k].scaled_grad().data.defined()) (scaled_update(k) ? scaled : plain).push_back(k);
  if (gradients == Gradients::unchecked) check_finite_gradients();  // before any parameter changes
  ++t_;
  const double bc1 = 1 - std::pow(c_.beta1, double(t_)), bc2 = 1 - std::pow(c_.beta2, double(t_));
  for (const std::vector<size_t>& batch : step_batches(plain))
    if (encodes_state())
      step_encoded(batch, bc1, bc2, gradient_multiplier);
    else
      step_plain(batch, bc1, bc2, gradient_multiplier);
  for (size_t k : step_scaled_fused(scaled, bc1, bc2, gradient_multiplier)) step_scaled(k, bc1, bc2, gradient_multiplier);
  for (size_t k : plain) params_[k].zero_grad();
  for (size_t k : scaled) params_[k].zero_grad();
}

// The sum of squares of all gradients is finite exactly when every gradient is: one pass over all
// of them, and only on failure one per parameter to name it.
void AdamW::check_finite_gradients() const {
  if (std::isfinite(gradient_sum_squares(params_))) return;
  for (size_t k = 0; k < params_.size(); ++k)
    if (!std::isfinite(gradient_sum_squares({params_[k]})))
      throw Error("optimizer: non-finite gradient in parameter " + std::to_string(k) + " of shape " + shape_str(params_[k].shape()));
}

namespace {
// The parameters ks of one fused pass: their weights and gradients read as f32, and buffers for
// the new weights.
// A parameter's value (Var::value); a scaled f16 / bf16 master (AdamWConfig::scaled_masters) as f32
// through the bulk decoder, one vectorised parallel pass (the same values as ScaledTensor::value's
// product, which makes several).
Tensor master_value(const Var& p) {
  const ScaledTensor& w = p.scaled();
  const DType d = w.data.dtype();
  if (!w.is_scaled() || !w.has_single_scale() || (d != DType::f16 && d != DType::bf16)) return p.value();
  const Tensor data = w.data.contiguous();
  Tensor out = Tensor::empty(w.shape(), DType::f32);
  const auto n = size_t(out.numel());
  dequantize(std::span<const std::byte>(data.raw_bytes(), n * size_t(dtype_size(d))), *dtype_format(d), w.scalar_scale(),
             std::span<float>(out.data<float>(), n));
  return out;
}
// A scaled f16 master: f16 data with one scale.
bool scaled_f16_master(const Var& p) {
  const ScaledTensor& w = p.scaled();
  return w.is_scaled() && w.has_single_scale() && w.data.dtype() == DType::f16;
}
struct FusedPass {
  std::vector<Tensor> values, gradients, next;
  std::vector<int64_t> sizes;
  std::deque<Dense<float>> weights, grads;
  std::vector<WeightsIn> weights_in;  // what the pass reads as each parameter's weights
  // f16_in_pass: the pass reads a scaled f16 master's data and scale itself (values holds the
  // data; weights an empty tensor) instead of an f32 copy.
  FusedPass(const std::vector<Var>& params, const std::vector<size_t>& ks, bool f16_in_pass = false) {
    for (size_t k : ks) {
      const bool own = f16_in_pass && scaled_f16_master(params[k]);
      values.push_back(own ? params[k].scaled().data.contiguous() : master_value(params[k]));
      gradients.push_back(params[k].grad());
      next.push_back(Tensor::empty(params[k].shape(), DType::f32));
      sizes.push_back(next.back().numel());
      static const Tensor no_weights = Tensor::empty({0});
      weights.emplace_back(own ? no_weights : values.back());
      grads.emplace_back(gradients.back());
      weights_in.push_back(
          own ? WeightsIn{.f16 = reinterpret_cast<const uint16_t*>(values.back().raw_bytes()), .scale = params[k].scaled().scalar_scale()}
              : WeightsIn{.f32 = weights.back().data()});
    }
  }
};
}  // namespace

void AdamW::step_plain(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier) {
  // One parallel, vectorised pass over every plain parameter at once: read the weight, gradient
  // and moments, write the moments in place and the new weight into a fresh (pooled) buffer.
  const FusedPass pass(params_, ks);
  const auto& [values, gradients, next, sizes, weights, grads, weights_in] = pass;
  const PlainUpdate up{float(c_.beta1), float(c_.beta2), float(1 - c_.beta1), float(1 - c_.beta2),
                       float(1 / bc1),  float(1 / bc2),  float(c_.eps),       float(gradient_multiplier)};
  for_each_chunk(param_chunks(sizes), [&](const ParamChunk& c, size_t) {
    const size_t k = ks[c.param];
    const float lr = float(c_.lr * lr_scale_[k]), wd = decay_[k] ? float(c_.weight_decay * decay_scale_[k]) : 0.0f;
    float* m = m_[k].data.data<float>();
    float* v = v_[k].data.data<float>();
    float* pw = next[c.param].data<float>();
    const float* pg = grads[c.param].data();
    const float* pold = weights[c.param].data();
#pragma omp simd
    for (int64_t i = c.begin; i < c.end; ++i) {
      up.moments(pg[i], m[i], v[i]);
      pw[i] = up.weight(pold[i], m[i], v[i], lr, wd);
    }
  });
  for (size_t j = 0; j < ks.size(); ++j) store_weights(ks[j], next[j], values[j]);
}

namespace {
bool per_tensor(const StateFormat& f) { return f.scaling == StateScaling::per_tensor; }
// The encoded step's update of a piece of decoded moments m, v (in place) and weights, with the
// largest magnitudes of the new moments (their bits: the order of non-negative floats; a float
// max stops the vectoriser under -ftrapping-math). The moments saturate at 2^127 (a gradient above
// ~6e20 would make v infinite, which no code holds): the step never raises on them, and the
// weights see the saturated moments.
struct EncodedUpdate {
  PlainUpdate up;
  float lr, wd;
  void run(const float* g, const float* w, float* next, float* m, float* v, int64_t n, int32_t& am, int32_t& av) const {
    const PlainUpdate u = up;  // locals: stores through the pointers could alias the members
    const float lr = this->lr, wd = this->wd;
    int32_t a = am, b = av;
#pragma omp simd reduction(max : a, b)
    for (int64_t i = 0; i < n; ++i) {
      u.moments(g[i], m[i], v[i]);
      m[i] = saturate(m[i]);
      v[i] = saturate(v[i]);
      next[i] = u.weight(w[i], m[i], v[i], lr, wd);
      a = std::max(a, int32_t(std::bit_cast<uint32_t>(m[i]) & 0x7FFFFFFFu));
      b = std::max(b, int32_t(std::bit_cast<uint32_t>(v[i]) & 0x7FFFFFFFu));
    }
    am = a;
    av = b;
  }
  // The moments alone (the per-tensor formats' second pass): the same values as run's.
  void moments(const float* g, float* m, float* v, int64_t n) const {
    const PlainUpdate u = up;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      u.moments(g[i], m[i], v[i]);
      m[i] = saturate(m[i]);
      v[i] = saturate(v[i]);
    }
  }
  // x with its magnitude at most 2^127, sign kept (by bits, as above): larger (f32's largest is
  // 2^128 - 2^104), a code rounded up could read back as infinity.
  static float saturate(float x) {
    const uint32_t b = std::bit_cast<uint32_t>(x);
    return std::bit_cast<float>(uint32_t(std::min(int32_t(b & 0x7FFFFFFFu), 0x7F000000)) | (b & 0x80000000u));
  }
};
}  // namespace

// Encoded moments, one parallel pass over all parameters, chunk by chunk: where the CPU and the
// formats allow, each chunk is one vector loop (optim/fused_encoded_step.hpp); else (the
// expansion, stochastic rounding, no AVX2) a piece at a time (whole groups, the buffers in L1),
// decoded into per-thread buffers, updated with the weight in step_plain's f32 arithmetic, and
// encoded back in place (no per-step allocation but the new weights). A per-tensor scale needs the new moment's amax before any code: those
// moments keep their codes in the first pass, which gathers the chunks' amax, and a second pass reads the codes and the gradient again,
// recomputes the moments (the same arithmetic, the same values) and encodes them at the new scale. Chunks hold whole groups of per-group
// formats. The moments saturate at 2^127 (EncodedUpdate), so the pass never stops halfway.
void AdamW::step_encoded(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier) {
  if (!c_.fused) return step_encoded_reference(ks, bc1, bc2, gradient_multiplier);
  const StateFormat &mf = c_.m_format, &vf = c_.v_format;
  FusedMoment fm{&mf, nullptr, {}}, fv{&vf, nullptr, {}};
  const bool fused = fused_step_applies(mf, vf, &fm.codec, &fv.codec);  // one vector pass instead of the pieces' four (never off x86)
  const FusedPass pass(params_, ks, fused);
  const auto& [values, gradients, next, sizes, weights, grads, weights_in] = pass;
  const PlainUpdate up{float(c_.beta1), float(c_.beta2), float(1 - c_.beta1), float(1 - c_.beta2),
                       float(1 / bc1),  float(1 / bc2),  float(c_.eps),       float(gradient_multiplier)};
  int64_t whole_groups = 1;
  for (const StateFormat* f : {&mf, &vf})
    if (f->scaling == StateScaling::per_group) whole_groups = std::lcm(whole_groups, f->group_size);
  const std::vector<ParamChunk> chunks = param_chunks(sizes, std::max<int64_t>(1, kParamChunk / whole_groups) * whole_groups);
  // Pieces of about 512 values, whole groups: two f32 buffers of it stay in L1 (measured: 512
  // fastest, 256 the same, 1024 and more 15-25 % slower).
  int64_t longest = 1;  // no buffer longer than a chunk (a huge group_size is one piece)
  for (const ParamChunk& c : chunks) longest = std::max(longest, c.end - c.begin);
  const int64_t piece = std::min(longest, std::max<int64_t>(1, 512 / whole_groups) * whole_groups);
  std::vector<PassAmax> chunk_amax(chunks.size());  // bits of the chunks' largest magnitudes
  auto buffers = [piece] {                          // grown once per thread, then reused
    thread_local std::vector<float> m, v;
    if (m.size() < size_t(piece)) {
      m.resize(size_t(piece));
      v.resize(size_t(piece));
    }
    return std::pair{m.data(), v.data()};
  };
  for_each_chunk(chunks, [&](const ParamChunk& c, size_t ci) {
    const size_t k = ks[c.param];
    const EncodedUpdate e{up, float(c_.lr * lr_scale_[k]), decay_[k] ? float(c_.weight_decay * decay_scale_[k]) : 0.0f};
#if SCALIFY_HAVE_X86_SIMD
    if (fused) {
      FusedMoment m_at = fm, v_at = fv;
      m_at.state = &m_codes_[k];
      v_at.state = &v_codes_[k];
      WeightsIn w = weights_in[c.param];
      if (w.f16) w.f16 += c.begin;
      if (w.f32) w.f32 += c.begin;
      fused_update_pass(up, e.lr, e.wd, grads[c.param].data() + c.begin, w, next[c.param].data<float>() + c.begin, m_at, v_at, c.begin,
                        c.end, chunk_amax[ci]);
      return;
    }
#endif
    const auto [m, v] = buffers();
    int32_t am = 0, av = 0;
    for (int64_t b = c.begin; b < c.end; b += piece) {
      const int64_t end = std::min(c.end, b + piece);
      decode_state_range(m_codes_[k], mf, b, end, m);
      decode_state_range(v_codes_[k], vf, b, end, v);
      e.run(grads[c.param].data() + b, weights[c.param].data() + b, next[c.param].data<float>() + b, m, v, end - b, am, av);
      if (!per_tensor(mf)) encode_state_range(m, mf, b, end, 0, rounding_seed(t_, k, 0), m_codes_[k]);
      if (!per_tensor(vf)) encode_state_range(v, vf, b, end, 0, rounding_seed(t_, k, 1), v_codes_[k]);
    }
    chunk_amax[ci] = {.m = am, .v = av};
  });
  if (per_tensor(mf) || per_tensor(vf)) {
    // The largest magnitude over the parameter's chunks gives the new scale.
    std::vector<int32_t> m_tensor_amax(ks.size()), v_tensor_amax(ks.size());
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      const size_t j = chunks[ci].param;
      m_tensor_amax[j] = std::max(m_tensor_amax[j], chunk_amax[ci].m);
      v_tensor_amax[j] = std::max(v_tensor_amax[j], chunk_amax[ci].v);
    }
    std::vector<int> m_exp(ks.size()), v_exp(ks.size());
    for (size_t j = 0; j < ks.size(); ++j) {
      m_exp[j] = state_tensor_exponent(mf, std::bit_cast<float>(m_tensor_amax[j]));
      v_exp[j] = state_tensor_exponent(vf, std::bit_cast<float>(v_tensor_amax[j]));
    }
    for_each_chunk(chunks, [&](const ParamChunk& c, size_t) {
      const size_t k = ks[c.param];
#if SCALIFY_HAVE_X86_SIMD
      auto in_reach = [](bool tensor, int e) { return !tensor || std::abs(e) <= VectorCodec::kMaxExponent; };
      if (fused && in_reach(per_tensor(mf), m_exp[c.param]) && in_reach(per_tensor(vf), v_exp[c.param])) {
        FusedMoment m_at = fm, v_at = fv;
        m_at.state = &m_codes_[k];
        v_at.state = &v_codes_[k];
        m_at.exponent = m_exp[c.param];
        v_at.exponent = v_exp[c.param];
        fused_moments_pass(up, grads[c.param].data() + c.begin, m_at, v_at, per_tensor(mf), per_tensor(vf), c.begin, c.end);
        return;
      }
#endif
      const auto [m, v] = buffers();
      const EncodedUpdate e{up, 0.0f, 0.0f};
      for (int64_t b = c.begin; b < c.end; b += piece) {
        const int64_t end = std::min(c.end, b + piece);
        if (per_tensor(mf)) decode_state_range(m_codes_[k], mf, b, end, m);
        if (per_tensor(vf)) decode_state_range(v_codes_[k], vf, b, end, v);
        e.moments(grads[c.param].data() + b, m, v, end - b);  // the one not per-tensor: garbage, unused
        if (per_tensor(mf)) encode_state_range(m, mf, b, end, m_exp[c.param], rounding_seed(t_, k, 0), m_codes_[k]);
        if (per_tensor(vf)) encode_state_range(v, vf, b, end, v_exp[c.param], rounding_seed(t_, k, 1), v_codes_[k]);
      }
    });
    for (size_t j = 0; j < ks.size(); ++j) {
      if (per_tensor(mf)) m_codes_[ks[j]].scales[0] = float(std::ldexp(1.0, -m_exp[j]));
      if (per_tensor(vf)) v_codes_[ks[j]].scales[0] = float(std::ldexp(1.0, -v_exp[j]));
    }
  }
  // The fused pass read scaled f16 masters in place and knows the new weights' amax: no f32 copy,
  // no amax pass.
  std::vector<int32_t> next_amax(ks.size());
  for (size_t ci = 0; ci < chunks.size(); ++ci) next_amax[chunks[ci].param] = std::max(next_amax[chunks[ci].param], chunk_amax[ci].next);
  for (size_t j = 0; j < ks.size(); ++j)
    store_weights(ks[j], next[j], values[j], weights_in[j].f16 ? std::optional(std::bit_cast<float>(next_amax[j])) : std::nullopt);
}

// The reference of step_encoded: whole moments decoded, the same f32 update element by element,
// whole moments encoded (AdamWState.FusedEncodedStepEqualsTheReference checks the two agree).
void AdamW::step_encoded_reference(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier) {
  const PlainUpdate up{float(c_.beta1), float(c_.beta2), float(1 - c_.beta1), float(1 - c_.beta2),
                       float(1 / bc1),  float(1 / bc2),  float(c_.eps),       float(gradient_multiplier)};
  for (size_t k : ks) {
    Var& p = params_[k];
    const Tensor value = p.value(), gradient = p.grad();
    const Dense<float> w(value), g(gradient);
    const auto n = size_t(value.numel());
    std::vector<float> m(n), v(n), next(n);
    decode_state(m_codes_[k], c_.m_format, m);
    decode_state(v_codes_[k], c_.v_format, v);
    const float lr = float(c_.lr * lr_scale_[k]), wd = decay_[k] ? float(c_.weight_decay * decay_scale_[k]) : 0.0f;
    for (size_t i = 0; i < n; ++i) {
      up.moments(g.data()[i], m[i], v[i]);
      m[i] = EncodedUpdate::saturate(m[i]);
      v[i] = EncodedUpdate::saturate(v[i]);
      next[i] = up.weight(w.data()[i], m[i], v[i], lr, wd);
    }
    m_codes_[k] = encode_state(m, c_.m_format, rounding_seed(t_, k, 0));
    v_codes_[k] = encode_state(v, c_.v_format, rounding_seed(t_, k, 1));
    store_weights(k, Tensor::from_vector(next, p.shape()), value);
  }
}

namespace {
// ema's scales and the two data multipliers (scaled::rules::ema, as scaled::ema).
struct Ema {
  float zs, a, b;
};
Ema ema_scales(double m_scale, double x_scale, double beta) {
  const scaled::rules::WeightedSum z = scaled::rules::ema(m_scale, x_scale, beta);
  return {z.scale, float(z.x_mul), float(z.y_mul)};
}
}  // namespace

namespace {
// One scaled parameter's fused update: scales and multipliers fixed before the pass, inputs read
// through their storage, outputs in the state's and the parameter's dtypes.
struct FusedUpdate {
  size_t k;
  Ema em, ev;
  float gmul, ps, inv_ps, lr;
  bool scale_g, decays;
  float wd;  // the weight decay where it applies
  Tensor m_out, v_out, p_out;
};
// Stores len f32 values at element begin of t, rounded as Tensor::to rounds, and leaves in y the
// values as stored when read_back (the update reads the moments through their storage).
void store_piece(float* y, Tensor& t, int64_t begin, int64_t len, bool read_back) {
  if (t.dtype() == DType::f32) {
    std::memcpy(t.data<float>() + begin, y, size_t(len) * sizeof(float));
    return;
  }
  const Format f = *dtype_format(t.dtype());
  const auto bytes = size_t(dtype_size(t.dtype()));
  const std::span<std::byte> codes(t.raw_bytes() + size_t(begin) * bytes, size_t(len) * bytes);
  quantize(std::span<const float>(y, size_t(len)), f, 1.0f, codes);
  if (read_back) dequantize(std::span<const std::byte>(codes), f, 1.0f, std::span(y, size_t(len)));
}
}  // namespace

// The composed step (step_scaled below), fused: every op's f32 arithmetic in the same order, per
// element, in one parallel pass over all the parameters it applies to (the composed form makes ~20
// passes over each parameter). Returns the parameters it does not apply to, untouched: ANY or
// per-block scales (the first step's zero moments), scale products outside [2^-126, 2^127]
// (with_exact_scale would move them into the data), a rescale step.
// KernelsVsReference.FusedScaledAdamWIsBitIdentical checks it.
std::vector<size_t> AdamW::step_scaled_fused(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier) {
  std::vector<size_t> rest;
  std::vector<FusedUpdate> ups;
  for (size_t k : ks) {
    const Var& p = params_[k];
    const ScaledTensor& g = p.scaled_grad();
    if (!c_.fused || !g.has_single_scale() || !m_[k].has_single_scale() || !v_[k].has_single_scale() || !p.scaled().has_single_scale() ||
        (c_.rescale_every > 0 && t_ % c_.rescale_every == 0)) {
      rest.push_back(k);
      continue;
    }
    // g * multiplier (scaled::mul_scalar): a power of two moves into the scale, the rest multiplies the data.
    double gs = g.scalar_scale();
    float gmul = 1.0f;
    if (gradient_multiplier != 1.0) {
      const ScaledTensor c = scaled_scalar(gradient_multiplier);
      if (c.any_scale) {
        rest.push_back(k);
        continue;
      }
      gs *= c.scalar_scale();
      const double m = c.data.item();
      gmul = float(m);
      if (m == 1.0) gmul = 1.0f;
    }
    const double sq_scale = gs * gs;  // square's power rule for a power-of-two scale: exact
    int e;
    if (!scale_kept_exactly(gs) || !scale_kept_exactly(sq_scale) || std::frexp(gs, &e) != 0.5) {
      rest.push_back(k);
      continue;
    }
    const float ps = p.scaled().scalar_scale();
    const DType state = m_[k].data.dtype();
    ups.push_back({k, ema_scales(m_[k].scalar_scale(), gs, c_.beta1), ema_scales(v_[k].scalar_scale(), sq_scale, c_.beta2), gmul, ps,
                   float(1.0 / ps), float(c_.lr * lr_scale_[k]), gradient_multiplier != 1.0 && gmul != 1.0f,
                   c_.weight_decay != 0 && decay_[k], float(c_.weight_decay * decay_scale_[k]), Tensor::empty(p.shape(), state),
                   Tensor::empty(p.shape(), state), Tensor::empty(p.shape(), p.scaled().data.dtype())});
  }
  if (ups.empty()) return rest;
  std::vector<ChunkSource<float>> in;  // per update: g, m, v, p data, read a piece at a time
  in.reserve(4 * ups.size());
  std::vector<int64_t> sizes;
  for (const FusedUpdate& u : ups) {
    const Var& p = params_[u.k];
    for (const Tensor* t : std::initializer_list<const Tensor*>{&p.scaled_grad().data, &m_[u.k].data, &v_[u.k].data, &p.scaled().data})
      in.emplace_back(*t, p.shape());
    sizes.push_back(numel_of(p.shape()));
  }
  const float inv_bc2 = float(1.0 / bc2), inv_bc1 = float(1.0 / bc1), eps = float(c_.eps);
  for_each_chunk(param_chunks(sizes), [&](const ParamChunk& c, size_t) {
    constexpr int64_t kPiece = 1024;  // seven buffers of it on the stack
    FusedUpdate& u = ups[c.param];
    const Ema em = u.em, ev = u.ev;
    float gb[kPiece], mb[kPiece], vb[kPiece], pb[kPiece], mo[kPiece], vo[kPiece], po[kPiece];
    for (int64_t b = c.begin; b < c.end; b += kPiece) {
      const int64_t len = std::min(kPiece, c.end - b);
      const float *pg = in[4 * c.param].read(b, len, gb), *pm = in[4 * c.param + 1].read(b, len, mb),
                  *pv = in[4 * c.param + 2].read(b, len, vb), *pp = in[4 * c.param + 3].read(b, len, pb);
      for (int64_t i = 0; i < len; ++i) {  // the moments (ema)
        const float gi = u.scale_g ? pg[i] * u.gmul + 0.0f : pg[i];
        mo[i] = em.a * pm[i] + em.b * gi;
        vo[i] = ev.a * pv[i] + ev.b * (gi * gi);
      }
      store_piece(mo, u.m_out, b, len, true);
      store_piece(vo, u.v_out, b, len, true);
      for (int64_t i = 0; i < len; ++i) {
        const float denom = std::sqrt((vo[i] * ev.zs) * inv_bc2 + 0.0f) * 1.0f + eps;
        float update = ((mo[i] * em.zs) * inv_bc1 + 0.0f) / denom;
        const float w = pp[i] * u.ps;
        if (u.decays) update = update + (w * u.wd + 0.0f);
        po[i] = (w - (update * u.lr + 0.0f)) * u.inv_ps + 0.0f;
      }
      store_piece(po, u.p_out, b, len, false);
    }
  });
  for (FusedUpdate& u : ups) {
    Var& p = params_[u.k];
    m_[u.k] = ScaledTensor(u.m_out, u.em.zs);
    v_[u.k] = ScaledTensor(u.v_out, u.ev.zs);
    ScaledTensor next = p.scaled();
    next.data = u.p_out;
    p.set_value(next);
  }
  return rest;
}

void AdamW::step_scaled(size_t k, double bc1, double bc2, double gradient_multiplier) {
  Var& p = params_[k];
  const ScaledTensor g = gradient_multiplier == 1.0 ? p.scaled_grad() : scaled::mul_scalar(p.scaled_grad(), gradient_multiplier);
  // Moments in scaled form: the ema rule picks their scales; data stored in state_dtype.
  m_[k] = cast_data(scaled::ema(m_[k], g, c_.beta1), *dtype_format(c_.state_dtype));
  v_[k] = cast_data(scaled::ema(v_[k], scaled::unary(ops::Unary::square, g), c_.beta2), *dtype_format(c_.state_dtype));
  // The update direction m / (sqrt(v) + eps) is O(1) elementwise: computed on represented values.
  const Tensor denom = ops::scale_shift(ops::unary(ops::Unary::sqrt, ops::scale_shift(v_[k].value(), 1.0 / bc2, 0.0)), 1.0, c_.eps);
  Tensor update = ops::div(ops::scale_shift(m_[k].value(), 1.0 / bc1, 0.0), denom);
  const Tensor w = p.value();
  if (c_.weight_decay != 0 && decay_[k]) update = ops::add(update, ops::scale_shift(w, c_.weight_decay * decay_scale_[k], 0.0));
  ScaledTensor next = restore(p.scaled(), ops::sub(w, ops::scale_shift(update, c_.lr * lr_scale_[k], 0.0)));
  if (c_.rescale_every > 0 && t_ % c_.rescale_every == 0) {
    next = dynamic_rescale_l2(next);
    m_[k] = dynamic_rescale_l2(m_[k]);
    v_[k] = dynamic_rescale_l2(v_[k]);
  }
  p.set_value(next);
}

void AdamW::load_encoded_state(int64_t steps, std::vector<EncodedState> m, std::vector<EncodedState> v) {
  if (steps < 0 || m.size() != params_.size() || v.size() != params_.size())
    throw Error("AdamW: encoded state for " + std::to_string(m.size()) + " parameters, expected " + std::to_string(params_.size()));
  for (size_t k = 0; k < params_.size(); ++k)
    if (m[k].numel != m_codes_[k].numel || v[k].numel != v_codes_[k].numel || m[k].codes.size() != m_codes_[k].codes.size() ||
        v[k].codes.size() != v_codes_[k].codes.size() || m[k].scales.size() != m_codes_[k].scales.size() ||
        v[k].scales.size() != v_codes_[k].scales.size() || m[k].expand_k.size() != m_codes_[k].expand_k.size() ||
        v[k].expand_k.size() != v_codes_[k].expand_k.size() || m[k].centre.size() != m_codes_[k].centre.size() ||
        v[k].centre.size() != v_codes_[k].centre.size())
      throw Error("AdamW: encoded state of parameter " + std::to_string(k) + " does not match its shape " + shape_str(params_[k].shape()) +
                  " and the state formats");
  // A non-negative moment's 16-bit codes carry no sign (the encoders drop it; 8-bit ones have no
  // sign bit): a negative one would reach the fused step, which cannot refuse it as the reference's
  // encode does, as a negative v (NaN weights). -0 reads as 0.
  for (const auto& [which, f, states] : {std::tuple{"first", &c_.m_format, &m}, std::tuple{"second", &c_.v_format, &v}})
    if (f->non_negative && info(f->storage).storage_bytes() == 2)
      for (size_t k = 0; k < states->size(); ++k) {
        const std::vector<std::byte>& codes = (*states)[k].codes;
        for (size_t i = 0; i < codes.size() / 2; ++i) {
          const auto code = uint16_t(uint16_t(codes[2 * i]) | uint16_t(codes[2 * i + 1]) << 8);  // little-endian
          if (code > 0x8000)
            throw Error("AdamW: parameter " + std::to_string(k) + "'s " + which + " moment holds a negative code at element " +
                        std::to_string(i) + " (a non-negative moment's codes carry no sign)");
        }
      }
  t_ = steps;
  m_codes_ = std::move(m);
  v_codes_ = std::move(v);
}

int64_t AdamW::state_bytes(size_t i) const {
  auto bytes = [](const ScaledTensor& t) {
    int64_t b = 0;
    for (const Tensor& x : {t.data, t.scale})
      if (x.defined()) b += x.numel() * dtype_size(x.dtype());
    return b;
  };
  return bytes(m_[i]) + bytes(v_[i]) + m_codes_[i].bytes() + v_codes_[i].bytes();
}

void AdamW::load_state(int64_t steps, std::vector<ScaledTensor> m, std::vector<ScaledTensor> v) {
  if (steps < 0 || m.size() != params_.size() || v.size() != params_.size())
    throw Error("AdamW: state for " + std::to_string(m.size()) + " parameters, expected " + std::to_string(params_.size()));
  for (size_t k = 0; k < params_.size(); ++k)
    if (m[k].shape() != params_[k].shape() || v[k].shape() != params_[k].shape())
      throw Error("AdamW: state of parameter " + std::to_string(k) + " has shape " + shape_str(m[k].shape()) + ", expected " +
                  shape_str(params_[k].shape()));
  t_ = steps;
  m_ = std::move(m);
  v_ = std::move(v);
}

void sgd_step(const std::vector<Var>& params, double lr) {
  check_lr(lr, "sgd_step");
  for (Var p : params) {
    if (!p.scaled_grad().data.defined()) continue;
    const Tensor w = ops::sub(p.value(), ops::scale_shift(p.grad(), lr, 0));
    if (p.scaled().is_scaled())
      p.set_value(restore(p.scaled(), w));
    else
      p.set_value(w.to(p.value().dtype()));
    p.zero_grad();
  }
}

}  // namespace scalify::optim
