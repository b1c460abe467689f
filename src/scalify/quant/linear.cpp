#include "scalify/quant/linear.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "scalify/autograd/data_precision.hpp"
#include "scalify/autograd/functions.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/quant/block_gemm.hpp"
#include "scalify/quant/hadamard.hpp"
#include "scalify/scaled/scale_rules.hpp"
#include "scalify/scaled/scaled_ops.hpp"
#include "scalify/tensor/convert.hpp"
#include "scalify/tensor/gemm.hpp"

namespace scalify::quant {

namespace {

// The six operands, in the order (and under the names) checkpoints store their quantisers' state;
// the order also sets each one's stochastic-rounding stream.
enum Slot : size_t { fwd_w, fwd_x, dgrad_g, dgrad_w, wgrad_x, wgrad_g, kSlots };
constexpr const char* kSlotNames[] = {"weight", "activation", "gradient", "weight_t", "activation_t", "gradient_t"};
static_assert(std::size(kSlotNames) == kSlots, "a checkpoint name for every operand");
// Whether the slot's GEMM reduces along the rows of its tensor as stored (x [rows, K] forward,
// g [rows, N] and w [K, N] in dx = g w^T), or down its columns (w forward, x and g in dw = x^T g).
constexpr bool kReducesAlongRows[] = {false, true, true, true, false, false};
static_assert(std::size(kReducesAlongRows) == kSlots, "an orientation for every operand");

const QuantizerConfig& config_of(const LinearRecipe& r, Slot s) {
  switch (s) {
    case fwd_w: return r.forward.weight;
    case fwd_x: return r.forward.activation;
    case dgrad_g: return r.input_grad.gradient;
    case dgrad_w: return r.input_grad.weight;
    case wgrad_x: return r.weight_grad.activation;
    default: return r.weight_grad.gradient;
  }
}

// A block / MX config with its blocks along the GEMM's reduction: along the rows (1 x k) or down
// the columns (k x 1). Two-dimensional blocks (blockwise weights: 128 x 128, SPEC §5) cover the
// reduction in either orientation and stay as configured. Per-tensor configs have no blocks.
QuantizerConfig oriented(QuantizerConfig c, bool along_rows) {
  if (!c.blockwise() || (c.scaling == Scaling::block && c.block.rows > 1 && c.block.cols > 1)) return c;
  const size_t k = c.scaling == Scaling::mx ? 32 : std::max(c.block.rows, c.block.cols);
  c.block.rows = along_rows ? 1 : k;
  c.block.cols = along_rows ? k : 1;
  return c;
}

// GEMMs on codes run in bf16 where the CPU has bf16 dot products (gemm::code_gemm), else in f32.
DType gemm_dtype() { return gemm::code_gemm() == gemm::CodeGemm::onednn_bf16 ? DType::bf16 : DType::f32; }

// How one GEMM runs, decided by its two operands' configs:
//   on codes: per-tensor operands whose codes are bf16 values (FP8, FP6, FP4), or SCALIFY's
//     propagated scales: the codes in bf16 (or their f32 values), the decode scales in alpha;
//   on dequantised values, f32; or for block operands bf16 on the values when every value is a
//     bf16 value (MX: FP8 codes times power-of-two scales), or bf16 on the codes per block of the
//     reduction with the block scales applied to each partial product (block_scaled_gemm).
// Products are exact and accumulate in f32 on every path.
enum class GemmPath { codes, values_f32, values_bf16, block_codes_bf16 };
struct GemmPlan {
  GemmPath path = GemmPath::values_f32;
  DType codes = DType::f32;  // GemmPath::codes: the type the GEMM reads the codes in
};

// Whether a block role's dequantised values (before a tensor scale) are bf16 values: its format's
// are, and its block scales are powers of two (MX, or blocks with an MX scale rule), or E4M3 scales
// of FP4 codes (NVFP4: 2 + 4 significant bits, within bf16's 8).
bool bf16_block_values(const QuantizerConfig& c) {
  if (!codes_fit_bf16(c.format)) return false;
  if (c.scaling == Scaling::mx) return true;
  if (c.scaling != Scaling::block) return false;
  if (pow2_block_scales(c.block.rule)) return true;
  return (c.block.rule == BlockScaleRule::nvfp4 || c.block.rule == BlockScaleRule::e4m3_amax) && c.format == Format::e2m1;
}

GemmPlan plan_gemm(const QuantizerConfig& a, const QuantizerConfig& b, bool propagate) {
  const bool codes_bf16 = codes_fit_bf16(a.format) && codes_fit_bf16(b.format);
  if (!a.blockwise() && !b.blockwise()) {
    if (codes_bf16 || propagate) return {GemmPath::codes, codes_bf16 ? gemm_dtype() : DType::f32};
    return {};
  }
  if (gemm_dtype() != DType::bf16) return {};
  if (bf16_block_values(a) && bf16_block_values(b)) return {GemmPath::values_bf16};
  if (codes_bf16) return {GemmPath::block_codes_bf16};
  return {};
}

Tensor gemm_f32_or_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Tensor& a, const Tensor& b, float alpha) {
  Tensor c = Tensor::empty({M, N});
  if (a.dtype() == DType::bf16)
    gemm::gemm_bf16(ta, tb, M, N, K, a.data<uint16_t>(), b.data<uint16_t>(), c.data<float>(), alpha);
  else
    gemm::sgemm(ta, tb, M, N, K, a.data<float>(), ta ? M : K, b.data<float>(), tb ? K : N, 0.0f, c.data<float>(), N, alpha);
  return c;
}

// A per-tensor operand as a codes GEMM reads it: FP8/FP6/FP4 codes as their exact bf16 values (an
// infinity, a non-saturating e5m2 gradient, stays one as on the f32 path), else the codes' values.
Tensor codes_operand(const Quantized& q, DType t) {
  const Tensor& d = q.per_tensor.data;
  if (t == DType::bf16 && dtype_size(d.dtype()) == 1 && d.is_contiguous()) return byte_codes_as_bf16(d);
  return d.to(t).contiguous();
}
float decode_scale(const Quantized& q) { return q.per_tensor.any_scale ? 1.0f : q.per_tensor.scalar_scale(); }

// A quantised operand with, for a codes GEMM, the tensor the GEMM reads (codes_operand): made once,
// and read again by a later GEMM that reuses the quantisation on the same path.
struct Operand {
  Quantized q;
  Tensor codes;
};
Operand operand(Quantized q, const GemmPlan& p) {
  Operand o{std::move(q), {}};
  if (p.path == GemmPath::codes) o.codes = codes_operand(o.q, p.codes);
  return o;
}
Tensor codes_for(const Operand& o, const GemmPlan& p) {
  return o.codes.defined() && o.codes.dtype() == p.codes ? o.codes : codes_operand(o.q, p.codes);
}

// C [M, N] = op(A) op(B) (op: transpose when ta / tb; layouts as gemm::gemm_bf16) of two quantised
// operands. With `propagate` (SCALIFY) the output keeps the operands' scales times the matmul rule's
// r = pow2_round(sqrt(K)), and the GEMM takes 1 / r (scaled/scale_rules.hpp).
ScaledTensor gemm(const GemmPlan& p, bool propagate, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Operand& oa,
                  const Operand& ob) {
  const Quantized &a = oa.q, &b = ob.q;
  switch (p.path) {
    case GemmPath::codes: {
      const Tensor ca = codes_for(oa, p), cb = codes_for(ob, p);
      const float sa = decode_scale(a), sb = decode_scale(b);
      if (!propagate) return ScaledTensor(gemm_f32_or_bf16(ta, tb, M, N, K, ca, cb, sa * sb));
      const float r = scaled::rules::reduction(double(K));
      return with_exact_scale(gemm_f32_or_bf16(ta, tb, M, N, K, ca, cb, 1.0f / r), double(sa) * sb * r);
    }
    case GemmPath::block_codes_bf16:
      if (a.blockwise && b.blockwise) {
        const Tensor c = block_scaled_gemm(ta, tb, M, N, K, a.blocks, b.blocks);
        if (c.defined()) return ScaledTensor(c);
      }
      break;
    case GemmPath::values_bf16: {
      // The tensor scales (NVFP4's) as the GEMM's alpha, while their product is a normal f32.
      const double alpha = double(a.blocks.tensor_scale) * b.blocks.tensor_scale;
      if (alpha < 0x1p-100 || alpha > 0x1p100) break;
      const Tensor ha = a.dequantize_bf16();
      const Tensor hb = ha.defined() ? b.dequantize_bf16() : Tensor();
      if (hb.defined()) return ScaledTensor(gemm_f32_or_bf16(ta, tb, M, N, K, ha, hb, float(alpha)));
      break;
    }
    case GemmPath::values_f32: break;
  }
  return ScaledTensor(gemm_f32_or_bf16(ta, tb, M, N, K, a.dequantize().contiguous(), b.dequantize().contiguous(), 1.0f));
}

// Whether operand `later` reuses the quantisation of the same tensor as operand `earlier`: the same
// configuration, per-tensor (block scales depend on the orientation).
bool reuses(const LinearRecipe& r, Slot later, Slot earlier) {
  const QuantizerConfig& a = config_of(r, later);
  return a == config_of(r, earlier) && !a.blockwise() && a.transform == Transform::none;
}

}  // namespace

namespace {
thread_local GemmOperandObserver* g_gemm_observer = nullptr;
}

GemmOperandObserver::GemmOperandObserver(Fn fn) : fn_(std::move(fn)), previous_(g_gemm_observer) { g_gemm_observer = this; }
GemmOperandObserver::~GemmOperandObserver() { g_gemm_observer = previous_; }

void GemmOperandObserver::notify(LinearGemm gemm, const Quantized& a, const Quantized& b) {
  if (g_gemm_observer) g_gemm_observer->fn_(gemm, a, b);
}

uint64_t layer_stream(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

QLinear::QLinear(LinearRecipe recipe, uint64_t stream)
    : recipe_(std::move(recipe)), quantizers_(std::make_shared<std::vector<Quantizer>>()) {
  // A transform is undone only by its GEMM partner's (Recipe::validate says so by name too).
  const LinearRecipe& r = recipe_;
  for (const QuantizerConfig* c : {&r.forward.activation, &r.forward.weight, &r.input_grad.gradient, &r.input_grad.weight})
    if (c->transform != Transform::none) throw Error("linear: a transform applies to the weight-gradient GEMM's operands only");
  if (r.weight_grad.activation.transform != r.weight_grad.gradient.transform)
    throw Error("linear: the weight-gradient GEMM's activation and gradient need the same transform");
  // Each operand draws its own stochastic-rounding bits.
  for (size_t i = 0; i < kSlots; ++i)
    quantizers_->emplace_back(oriented(config_of(recipe_, Slot(i)), kReducesAlongRows[i]), stream * 8 + i);
}

const QuantStats& QLinear::weight_stats() const { return (*quantizers_)[fwd_w].last(); }
const QuantStats& QLinear::activation_stats() const { return (*quantizers_)[fwd_x].last(); }
const QuantStats& QLinear::gradient_stats() const { return (*quantizers_)[dgrad_g].last(); }

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
  const LinearRecipe& r = recipe_;
  // SCALIFY on scaled inputs: no statistics anywhere; the operands keep their propagated scales,
  // and so do the output and both gradients, by the matmul rule.
  const bool propagate = r.all_scalify() && (x.scaled().is_scaled() || w.scaled().is_scaled());
  const GemmPlan fwd = plan_gemm(r.forward.activation, r.forward.weight, propagate),
                 dgrad = plan_gemm(r.input_grad.gradient, r.input_grad.weight, propagate),
                 wgrad = plan_gemm(r.weight_grad.activation, r.weight_grad.gradient, propagate);
  // A forward pass that records no gradients (evaluation, sampling) is inference: it leaves the
  // quantisers' state as training left it.
  const QuantizeMode mode = grad_enabled() ? QuantizeMode::training : QuantizeMode::inference;
  const std::shared_ptr<std::vector<Quantizer>> q = quantizers_;
  // Codes GEMMs in f32 take the codes' values: the quantiser writes them instead of the codes.
  auto quantize = [q, mode](Slot s, const ScaledTensor& t, const GemmPlan& p) {
    return operand((*q)[s].quantize(t, p.path == GemmPath::codes && p.codes == DType::f32, mode), p);
  };
  const ScaledTensor xs = scaled::reshape(x.scaled(), {rows, K}), &ws = w.scaled();
  const Operand qx = quantize(fwd_x, xs, fwd), qw = quantize(fwd_w, ws, fwd);
  GemmOperandObserver::notify(LinearGemm::forward, qx.q, qw.q);
  ScaledTensor y = scaled::reshape(gemm(fwd, propagate, false, false, rows, N, K, qx, qw), out_shape);
  // A scaled weight whose scale does not propagate (MS-AMP's scaled f16 master): the quantisers
  // read its represented value, and its gradient comes back unscaled in f32, not rounded into the
  // weight's f16 data (which has no scale for it). The output and the input's gradient still take
  // their storage as every op's do (Var::make's promoted rule, applied here).
  const bool scaled_master = !propagate && ws.is_scaled();
  const DType x_storage = x.scaled().data.dtype();
  if (scaled_master) y.data = to_storage(y.data, Var::storage_for({x, w}, y.data.dtype()), "qlinear");
  // The backward keeps the forward's quantised operands it reuses, else the sources to quantise.
  const bool reuse_w = reuses(r, dgrad_w, fwd_w), reuse_x = reuses(r, wgrad_x, fwd_x), reuse_g = reuses(r, wgrad_g, dgrad_g);
  const Var out = Var::make(
      "qlinear", y, {x, w},
      [quantize, dgrad, wgrad, propagate, rows, K, N, reuse_g, scaled_master, x_storage,
       hadamard = r.weight_grad.activation.transform == Transform::hadamard16, qw = reuse_w ? qw : Operand(), qx = reuse_x ? qx : Operand(),
       w_src = reuse_w ? ScaledTensor() : ws, x_src = reuse_x ? ScaledTensor() : xs, x_shape = x.shape()](const ScaledTensor& g_in) {
        const ScaledTensor g = scaled::reshape(g_in, {rows, N});
        const Operand qg = quantize(dgrad_g, g, dgrad);
        const Operand qwt = w_src.data.defined() ? quantize(dgrad_w, w_src, dgrad) : qw;
        GemmOperandObserver::notify(LinearGemm::input_grad, qg.q, qwt.q);
        ScaledTensor dx = gemm(dgrad, propagate, false, true, rows, K, N, qg, qwt);
        if (scaled_master && dtype_size(x_storage) >= 2) dx.data = to_storage(dx.data, x_storage, "qlinear grad");
        // The weight-gradient GEMM reduces over the rows (tokens): a transform of both operands
        // along them leaves dw as it is (Recipe::validate: both or neither).
        auto along_tokens = [hadamard](const ScaledTensor& t) { return hadamard ? hadamard16_rows(t) : t; };
        const Operand qxt = x_src.data.defined() ? quantize(wgrad_x, along_tokens(x_src), wgrad) : qx;
        const Operand qgt = reuse_g ? qg : quantize(wgrad_g, along_tokens(g), wgrad);
        GemmOperandObserver::notify(LinearGemm::weight_grad, qxt.q, qgt.q);
        const ScaledTensor dw = gemm(wgrad, propagate, true, false, K, N, rows, qxt, qgt);
        return std::vector<ScaledTensor>{scaled::reshape(dx, x_shape), dw};
      },
      scaled_master ? Var::Storage::as_computed : Var::Storage::promoted);
  return b.defined() ? out + b : out;
}

std::vector<std::pair<std::string, Quantizer*>> QLinear::quantizers() const {
  std::vector<std::pair<std::string, Quantizer*>> out;
  for (size_t i = 0; i < kSlots; ++i) out.emplace_back(kSlotNames[i], &(*quantizers_)[i]);
  return out;
}

}  // namespace scalify::quant
