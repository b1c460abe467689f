#include "scalify/quant/linear.hpp"

#include <cmath>
#include <optional>
#include <utility>

#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/quant/block_gemm.hpp"
#include "scalify/scaled/scale_rules.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/convert.hpp"
#include "scalify/tensor/gemm.hpp"

namespace scalify::quant {

namespace {
QuantizerConfig role(Scaling s, Format f) {
  QuantizerConfig c;
  c.scaling = s;
  c.format = f;
  return c;
}
LinearRecipe make(const std::string& name, QuantizerConfig w, QuantizerConfig a, QuantizerConfig g) {
  return {name, true, w, a, g};
}
bool blockwise(const QuantizerConfig& c) { return c.scaling == Scaling::block || c.scaling == Scaling::mx; }

// Per-tensor operands: the GEMM runs on the codes, decoded exactly to bf16 or f32 (gemm::code_gemm
// decides by CPU), with the product of the decode scales as alpha. Shapes as gemm::gemm_bf16.
DType gemm_dtype() { return gemm::code_gemm() == gemm::CodeGemm::onednn_bf16 ? DType::bf16 : DType::f32; }
Tensor gemm_operand(const Quantized& q, DType t) {
  const Tensor& d = q.per_tensor.data;
  // FP8/FP6/FP4 codes as their exact values; an infinity (a non-saturating e5m2 gradient) stays
  // one, as on the f32 path.
  if (t == DType::bf16 && dtype_size(d.dtype()) == 1 && d.is_contiguous()) return byte_codes_as_bf16(d);
  return d.to(t).contiguous();
}
float scale_of(const Quantized& q) { return q.per_tensor.any_scale ? 1.0f : q.per_tensor.scalar_scale(); }
Tensor gemm_codes(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& a, const Tensor& b, float alpha) {
  Tensor c = Tensor::empty({M, N});
  if (a.dtype() == DType::bf16)
    gemm::gemm_bf16(ta, tb, M, N, K, a.data<uint16_t>(), b.data<uint16_t>(), c.data<float>(), alpha);
  else
    gemm::sgemm(ta, tb, M, N, K, a.data<float>(), ta ? M : K, b.data<float>(), tb ? K : N, 0.0f, c.data<float>(), N, alpha);
  return c;
}
// How a block-quantised product runs: f32 on the dequantized values; bf16 on them when every
// value is a bf16 value (MX: FP8 codes times power-of-two scales); or bf16 on the codes per block
// of the reduction, the block scales applied to each partial product (blockwise's amax / 448
// scales, block_scaled_gemm). Products are exact and accumulate in f32 on every path.
enum class BlockGemm { f32, bf16_values, bf16_codes };
Tensor dequantized_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Quantized& a, const Quantized& b, BlockGemm how) {
  if (how == BlockGemm::bf16_codes && a.blockwise && b.blockwise) {
    const Tensor c = block_scaled_gemm(ta, tb, M, N, K, a.blocks, b.blocks);
    if (c.defined()) return c;
  }
  if (how == BlockGemm::bf16_values) {
    const Tensor ha = a.dequantize_bf16();
    const Tensor hb = ha.defined() ? b.dequantize_bf16() : Tensor();
    if (hb.defined()) return gemm_codes(ta, tb, M, N, K, ha, hb, 1.0f);
  }
  return gemm_codes(ta, tb, M, N, K, a.dequantize().contiguous(), b.dequantize().contiguous(), 1.0f);
}
// Whether a role's dequantized values can be bf16 values: its format's are, and its scales are
// powers of two (MX, or blocks with an MX scale rule).
bool pow2_block_role(const QuantizerConfig& c) {
  return codes_fit_bf16(c.format) && (c.scaling == Scaling::mx || (c.scaling == Scaling::block && c.block.rule != BlockScaleRule::f32_amax));
}
// A block/MX config with blocks along the rows (1 x K) or down the columns (K x 1). Two-dimensional
// blocks (blockwise weights: 128 x 128, SPEC §5) cover the reduction in either orientation and
// stay as configured.
QuantizerConfig along(QuantizerConfig c, bool rows) {
  if (c.scaling == Scaling::block && c.block.rows > 1 && c.block.cols > 1) return c;
  const size_t k = c.scaling == Scaling::mx ? 32 : std::max(c.block.rows, c.block.cols);
  c.block.rows = rows ? 1 : k;
  c.block.cols = rows ? k : 1;
  return c;
}
}  // namespace

LinearRecipe recipe_f32() { return {}; }
LinearRecipe recipe_scalify(Format fwd, Format bwd) {
  return make(std::string("scalify_").append(format_name(fwd)), role(Scaling::scalify, fwd), role(Scaling::scalify, fwd),
              role(Scaling::scalify, bwd));
}
LinearRecipe recipe_cast(Format fwd, Format bwd) {
  return make(std::string("cast_").append(format_name(fwd)), role(Scaling::none, fwd), role(Scaling::none, fwd),
              role(Scaling::none, bwd));
}
LinearRecipe recipe_current(int margin) {
  QuantizerConfig g = role(Scaling::current, Format::e5m2);
  g.margin = margin;
  return make("current", role(Scaling::current, Format::e4m3), role(Scaling::current, Format::e4m3), g);
}
LinearRecipe recipe_delayed(int history, HistoryReduce reduce) {
  QuantizerConfig c = role(Scaling::delayed, Format::e4m3);
  c.history = history;
  c.reduce = reduce;
  QuantizerConfig g = c;
  g.format = Format::e5m2;
  return make("delayed", c, c, g);
}
LinearRecipe recipe_fp8_amax(int margin) {
  QuantizerConfig g = role(Scaling::amax_bias, Format::e5m2);
  g.margin = margin;
  return make("fp8_amax", role(Scaling::amax_bias, Format::e4m3), role(Scaling::amax_bias, Format::e4m3), g);
}
LinearRecipe recipe_fp8_cscale(int bias) {
  QuantizerConfig c = role(Scaling::constant_bias, Format::e4m3);
  c.bias = bias;
  QuantizerConfig g = c;
  g.format = Format::e5m2;
  return make("fp8_cscale(" + std::to_string(bias) + ")", c, c, g);
}
LinearRecipe recipe_mxfp8() {
  return make("mxfp8", role(Scaling::mx, Format::e4m3), role(Scaling::mx, Format::e4m3), role(Scaling::mx, Format::e5m2));
}
LinearRecipe recipe_blockwise() {
  QuantizerConfig w = role(Scaling::block, Format::e4m3), a = w, g = role(Scaling::block, Format::e5m2);
  w.block = {128, 128, BlockScaleRule::f32_amax};
  return make("blockwise", w, a, g);
}

QLinear::QLinear(LinearRecipe recipe, uint64_t stream) : recipe_(std::move(recipe)) {
  const LinearRecipe& r = recipe_;
  // Forward: x [rows, K] and w [K, N] both blocked along K. Backward: dX = G W^T reduces over N
  // (G and W blocked along N), dW = X^T G reduces over rows (X and G blocked down the rows).
  // Each role draws its own stochastic-rounding bits.
  const uint64_t s = stream * 8;
  state_ = std::make_shared<State>(State{Quantizer(blockwise(r.weight) ? along(r.weight, false) : r.weight, s),
                                         Quantizer(blockwise(r.activation) ? along(r.activation, true) : r.activation, s + 1),
                                         Quantizer(blockwise(r.gradient) ? along(r.gradient, true) : r.gradient, s + 2),
                                         Quantizer(along(r.weight, true), s + 3), Quantizer(along(r.activation, false), s + 4),
                                         Quantizer(along(r.gradient, false), s + 5)});
}

Var QLinear::operator()(const Var& x, const Var& w, const Var& b) const {
  if (w.shape().size() != 2 || x.shape().empty() || x.shape().back() != w.shape()[0])
    throw Error("linear: input " + shape_str(x.shape()) + " does not match weight " + shape_str(w.shape()));
  if (!recipe_.quantized) {
    const Var y = matmul(x, w);
    return b.defined() ? y + b : y;
  }
  const int64_t K = w.shape()[0], N = w.shape()[1], rows = numel_of(x.shape()) / K;
  Shape out_shape = x.shape();
  out_shape.back() = N;
  State& st = *state_;
  // A forward pass that records no gradients (evaluation, sampling) is inference: it leaves the
  // quantisers' state as training left it.
  const QuantizeMode mode = grad_enabled() ? QuantizeMode::training : QuantizeMode::inference;
  const bool block = blockwise(recipe_.weight) || blockwise(recipe_.activation) || blockwise(recipe_.gradient);
  auto flat = [&](const ScaledTensor& s) { return scaled::reshape(s, {rows, K}); };
  const std::shared_ptr<State> state = state_;
  const bool codes_bf16 =
      codes_fit_bf16(recipe_.weight.format) && codes_fit_bf16(recipe_.activation.format) && codes_fit_bf16(recipe_.gradient.format);
  // SCALIFY on scaled inputs: no statistics anywhere; the operands keep their propagated scales and
  // so do the output and both gradients, by the matmul rule (r = pow2_round(sqrt(reduced dim)) in
  // the scale, 1 / r in the GEMM's alpha).
  const bool propagate = recipe_.weight.scaling == Scaling::scalify && recipe_.activation.scaling == Scaling::scalify &&
                         recipe_.gradient.scaling == Scaling::scalify && (x.scaled().is_scaled() || w.scaled().is_scaled());
  const bool on_codes = !block && (codes_bf16 || propagate);
  const DType t = codes_bf16 ? gemm_dtype() : DType::f32;
  // f32 GEMMs take the codes' values: the quantiser writes them instead of the codes.
  const bool as_values = on_codes && t == DType::f32;
  const Quantized qx = st.activation.quantize(flat(x.scaled()), as_values, mode), qw = st.weight.quantize(w.scaled(), as_values, mode);
  if (on_codes) {
    const Tensor cx = gemm_operand(qx, t), cw = gemm_operand(qw, t);
    const float sx = scale_of(qx), sw = scale_of(qw);
    const float rk = propagate ? scaled::rules::reduction(double(K)) : 1.0f;
    const Tensor y = gemm_codes(false, false, rows, N, K, cx, cw, propagate ? 1.0f / rk : sx * sw).reshape(out_shape);
    const ScaledTensor out_value = propagate ? with_exact_scale(y, double(sx) * sw * rk) : ScaledTensor(y);
    const Var out = Var::make("qlinear", out_value, {x, w}, [state, cx, cw, sx, sw, rows, K, N, propagate, mode, xs = x.shape()](const ScaledTensor& g) {
      const bool values = cx.dtype() == DType::f32;
      const Quantized qg = propagate ? state->gradient.quantize(scaled::reshape(g, {rows, N}), values, mode)
                                     : state->gradient.quantize((g.is_scaled() ? g.value() : g.data).reshape({rows, N}), values, mode);
      const Tensor cg = gemm_operand(qg, cx.dtype());
      const float sg = scale_of(qg);
      if (!propagate)
        return std::vector<ScaledTensor>{ScaledTensor(gemm_codes(false, true, rows, K, N, cg, cw, sg * sw).reshape(xs)),
                                         ScaledTensor(gemm_codes(true, false, K, N, rows, cx, cg, sx * sg))};
      const float rn = scaled::rules::reduction(double(N)), rr = scaled::rules::reduction(double(rows));
      return std::vector<ScaledTensor>{with_exact_scale(gemm_codes(false, true, rows, K, N, cg, cw, 1.0f / rn).reshape(xs), double(sg) * sw * rn),
                                       with_exact_scale(gemm_codes(true, false, K, N, rows, cx, cg, 1.0f / rr), double(sx) * sg * rr)};
    });
    return b.defined() ? out + b : out;
  }
  const bool values_bf16 = pow2_block_role(recipe_.weight) && pow2_block_role(recipe_.activation) && pow2_block_role(recipe_.gradient);
  const BlockGemm how = !block || gemm_dtype() != DType::bf16 ? BlockGemm::f32
                        : values_bf16                         ? BlockGemm::bf16_values
                        : codes_bf16                          ? BlockGemm::bf16_codes
                                                              : BlockGemm::f32;
  const Tensor y = dequantized_gemm(false, false, rows, N, K, qx, qw, how).reshape(out_shape);
  // Per-tensor: the forward's quantised operands serve the transposed products too. Block: the
  // backward re-quantises from the high-precision sources along each of its reductions.
  const std::optional<std::pair<Quantized, Quantized>> forward_operands =
      block ? std::nullopt : std::optional(std::pair(qx, qw));
  const Var out = Var::make("qlinear", ScaledTensor(y), {x, w},
                            [state, forward_operands, how, mode, x_src = block ? x.value() : Tensor(), w_src = block ? w.value() : Tensor(), rows, K, N,
                             xs = x.shape()](const ScaledTensor& g) {
    State& s = *state;
    const Tensor g2 = (g.is_scaled() ? g.value() : g.data).reshape({rows, N});
    const Quantized qg = s.gradient.quantize(g2, false, mode);
    Tensor grad_x, grad_w;
    if (forward_operands) {  // f32 products of the represented values, each decoded once
      const Tensor gq = qg.dequantize().contiguous();
      grad_x = gemm_codes(false, true, rows, K, N, gq, forward_operands->second.dequantize().contiguous(), 1.0f);
      grad_w = gemm_codes(true, false, K, N, rows, forward_operands->first.dequantize().contiguous(), gq, 1.0f);
    } else {
      const Quantized wt = s.weight_t.quantize(w_src, false, mode), xt = s.activation_t.quantize(x_src.reshape({rows, K}), false, mode),
                      gt = s.gradient_t.quantize(g2, false, mode);
      grad_x = dequantized_gemm(false, true, rows, K, N, qg, wt, how);
      grad_w = dequantized_gemm(true, false, K, N, rows, xt, gt, how);
    }
    return std::vector<ScaledTensor>{ScaledTensor(grad_x.reshape(xs)), ScaledTensor(grad_w)};
  });
  return b.defined() ? out + b : out;
}

std::vector<std::pair<std::string, Quantizer*>> QLinear::quantizers() const {
  State& s = *state_;
  return {{"weight", &s.weight}, {"activation", &s.activation}, {"gradient", &s.gradient},
          {"weight_t", &s.weight_t}, {"activation_t", &s.activation_t}, {"gradient_t", &s.gradient_t}};
}

}  // namespace scalify::quant
