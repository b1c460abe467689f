// Neural-network kernels: softmax, normalisation, embedding, cross-entropy, concat/split,
// dropout and causal masks. Rows are the last dimension; other dimensions are moved there first.
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/platform/parallel.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/tensor/vector_math.hpp"

namespace scalify::ops {

namespace {

// Runs row_fn(in_row, out_row, D) over the rows of x along `dim`; returns a tensor shaped as x.
template <class RowFn>
Tensor map_rows(const Tensor& x, int dim, const char* op, RowFn row_fn) {
  if (x.dim() == 0) throw Error(std::string(op) + ": needs at least one dimension");
  const int d = dim < 0 ? dim + x.dim() : dim;
  if (d < 0 || d >= x.dim())
    throw Error(std::string(op) + ": dimension " + std::to_string(dim) + " out of range for shape " + shape_str(x.shape()));
  const Tensor moved = d == x.dim() - 1 ? x : x.transpose(d, -1);
  Tensor out = dispatch_compute(computes_in_f64(x), [&]<class T>() {
    const Dense<T> in(moved);
    Tensor o = Tensor::empty(moved.shape(), dtype_for<T>());
    const int64_t D = moved.size(-1), rows = D == 0 ? 0 : moved.numel() / D;
    T* po = o.data<T>();
#pragma omp parallel for if (rows * D > platform::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) row_fn(in.data() + r * D, po + r * D, D);
    return o;
  });
  return d == x.dim() - 1 ? out : out.transpose(d, -1).contiguous();
}

// Same for two inputs of the same shape (y and grad).
template <class RowFn>
Tensor map_rows2(const Tensor& x, const Tensor& g, int dim, const char* op, RowFn row_fn) {
  if (x.shape() != g.shape()) throw Error(std::string(op) + ": shapes differ: " + shape_str(x.shape()) + " and " + shape_str(g.shape()));
  const int d = dim < 0 ? dim + x.dim() : dim;
  const Tensor mx = d == x.dim() - 1 ? x : x.transpose(d, -1);
  const Tensor mg = d == x.dim() - 1 ? g : g.transpose(d, -1);
  Tensor out = dispatch_compute(computes_in_f64(x, g), [&]<class T>() {
    const Dense<T> a(mx), b(mg);
    Tensor o = Tensor::empty(mx.shape(), dtype_for<T>());
    const int64_t D = mx.size(-1), rows = D == 0 ? 0 : mx.numel() / D;
    T* po = o.data<T>();
#pragma omp parallel for if (rows * D > platform::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) row_fn(a.data() + r * D, b.data() + r * D, po + r * D, D);
    return o;
  });
  return d == x.dim() - 1 ? out : out.transpose(d, -1).contiguous();
}

template <class T>
T row_max(const T* x, int64_t D) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < D; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// A row whose largest in_mul x overflows T (a scaled tensor's data times a scale near 2^127):
// in_mul x - max would be inf - inf. Its softmax and log-softmax are finite all the same;
// computed in double, where in_mul x cannot overflow, and only for such rows, so every other
// row's result stays as the fast path makes it.
template <class T>
bool shift_overflows(T top, T k) {
  return std::isfinite(top) && !std::isfinite(k * top);
}
template <class T>
void softmax_in_double(const T* x, T* out, int64_t D, double k, bool log) {
  double top = -std::numeric_limits<double>::infinity(), s = 0;
  for (int64_t i = 0; i < D; ++i) top = std::max(top, k * double(x[i]));
  for (int64_t i = 0; i < D; ++i) s += std::exp(k * double(x[i]) - top);
  for (int64_t i = 0; i < D; ++i) out[i] = T(log ? k * double(x[i]) - top - std::log(s) : std::exp(k * double(x[i]) - top) / s);
}

}  // namespace

Tensor softmax(const Tensor& x, int dim, double in_mul) {
  return map_rows(x, dim, "softmax", [in_mul](const auto* in, auto* out, int64_t D) {
    using T = std::remove_cvref_t<decltype(*in)>;
    const T k = T(in_mul), top = row_max(in, D);
    if (shift_overflows(top, k)) return softmax_in_double(in, out, D, in_mul, false);
    const T m = k * top;  // k > 0: a scale
    double s = 0;
    if constexpr (std::is_same_v<T, float>) {
      s = vecmath::active().exp_shifted_sum(in, out, D, k, m);
    } else {
      for (int64_t i = 0; i < D; ++i) s += double(out[i] = std::exp(k * in[i] - m));
    }
    const T inv = T(1.0 / s);
    for (int64_t i = 0; i < D; ++i) out[i] *= inv;
  });
}

Tensor log_softmax(const Tensor& x, int dim, double in_mul) {
  return map_rows(x, dim, "log_softmax", [in_mul](const auto* in, auto* out, int64_t D) {
    using T = std::remove_cvref_t<decltype(*in)>;
    const T k = T(in_mul), top = row_max(in, D);
    if (shift_overflows(top, k)) return softmax_in_double(in, out, D, in_mul, true);
    const T m = k * top;
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += std::exp(double(k * in[i] - m));
    // Shifted first, then the log of the sum: m + log(s) rounded to m's precision (equal logits of
    // 1e6 gave ln 8 - 0.017, of 2^23 gave 2 instead of ln 8).
    const T log_s = T(std::log(s));
    for (int64_t i = 0; i < D; ++i) out[i] = (k * in[i] - m) - log_s;
  });
}

Tensor softmax_backward(const Tensor& y, const Tensor& grad, int dim) {
  return map_rows2(y, grad, dim, "softmax_backward", [](const auto* yy, const auto* g, auto* out, int64_t D) {
    using T = std::remove_cvref_t<decltype(*yy)>;
    double dot = 0;
    for (int64_t i = 0; i < D; ++i) dot += double(yy[i]) * g[i];
    for (int64_t i = 0; i < D; ++i) out[i] = yy[i] * (g[i] - T(dot));
  });
}

Tensor log_softmax_backward(const Tensor& y, const Tensor& grad, int dim) {
  return map_rows2(y, grad, dim, "log_softmax_backward", [](const auto* yy, const auto* g, auto* out, int64_t D) {
    using T = std::remove_cvref_t<decltype(*yy)>;
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += g[i];
    for (int64_t i = 0; i < D; ++i) out[i] = g[i] - std::exp(yy[i]) * T(s);
  });
}

namespace {
void check_affine_row(const Tensor& p, int64_t D, const char* what, const char* op) {
  if (p.defined() && (p.dim() != 1 || p.size(0) != D))
    throw Error(std::string(op) + ": " + what + " of shape " + shape_str(p.shape()) + " does not match rows of " + std::to_string(D));
}

// Normalises the rows of x; with an affine (a defined weight), y = xhat * (w_mul w) + b_mul b in
// the same row loop, else y is xhat.
// Rows of x are read through ChunkSource (f16 data decoded a row at a time, no f32 copy of the
// whole tensor) and the affine output y, where there is one, is written through ChunkSink (in
// store_as); each thread keeps its own row buffers.
NormResult normalise_rows(const Tensor& x, double eps, bool center, const char* op, const Affine& a = {}, DType store_as = DType::f32) {
  NormResult r;
  const int64_t D = x.dim() ? x.size(-1) : 0;
  check_affine_row(a.weight, D, "weight", op);
  check_affine_row(a.bias, D, "bias", op);
  Shape stat_shape = x.shape();
  if (!stat_shape.empty()) stat_shape.back() = 1;
  const bool affine = a.weight.defined();
  dispatch_compute(computes_in_f64(x) || (affine && computes_in_f64(a.weight)), [&]<class T>() {
    const ChunkSource<T> in(x, x.shape());
    r.xhat = Tensor::empty(x.shape(), dtype_for<T>());
    r.rstd = Tensor::empty(stat_shape, dtype_for<T>());
    r.y = affine ? Tensor::empty(x.shape(), kernel_output_dtype<T>(store_as)) : r.xhat;
    const ChunkSink<T> out(r.y);
    std::optional<Dense<T>> w, b;  // rows of D: converted once
    if (affine) w.emplace(a.weight);
    if (a.bias.defined()) b.emplace(a.bias);
    const T wm = T(a.weight_mul), bm = T(a.bias_mul);
    T* xh = r.xhat.data<T>();
    T* rs = r.rstd.data<T>();
    const int64_t rows = D == 0 ? 0 : x.numel() / D;
#pragma omp parallel if (x.numel() > platform::kParallelGrain)
    {
      std::vector<T> row_in(static_cast<size_t>(D)), row_out(static_cast<size_t>(D));
#pragma omp for
      for (int64_t row = 0; row < rows; ++row) {
        const T* v = in.read(row * D, D, row_in.data());
        double mean = 0, var = 0;
        if (center) {
          for (int64_t i = 0; i < D; ++i) mean += v[i];
          mean /= double(D);
        }
        for (int64_t i = 0; i < D; ++i) var += (v[i] - mean) * (v[i] - mean);
        var /= double(D);
        const double rstd = 1.0 / std::sqrt(var + eps);
        rs[row] = T(rstd);
        T* h = xh + row * D;
        for (int64_t i = 0; i < D; ++i) h[i] = T((v[i] - mean) * rstd);
        if (!affine) continue;
        T* o = out.chunk(row * D, row_out.data());
        for (int64_t i = 0; i < D; ++i) o[i] = h[i] * (*w)[i] * wm;
        if (b)
          for (int64_t i = 0; i < D; ++i) o[i] += (*b)[i] * bm;
        out.commit(row * D, D, o);
      }
    }
    return 0;
  });
  if (D == 0) throw Error(std::string(op) + ": last dimension of shape " + shape_str(x.shape()) + " is empty");
  return r;
}

Tensor norm_backward(const NormResult& r, const Tensor& g, bool center, const char* op, const Tensor& weight = {}, double weight_mul = 1,
                     DType store_as = DType::f32) {
  if (r.xhat.shape() != g.shape())
    throw Error(std::string(op) + ": shapes differ: " + shape_str(r.xhat.shape()) + " and " + shape_str(g.shape()));
  if (g.dim() == 0 || (g.size(-1) && r.rstd.numel() != g.numel() / g.size(-1)))
    throw Error(std::string(op) + ": needs one rstd per row of " + shape_str(g.shape()) + ", got " + shape_str(r.rstd.shape()));
  check_affine_row(weight, g.size(-1), "weight", op);
  return dispatch_compute(computes_in_f64(r.xhat, g), [&]<class T>() {
    const Dense<T> xs(r.xhat), rs(r.rstd);
    const ChunkSource<T> gs(g, g.shape());
    std::optional<Dense<T>> w;
    if (weight.defined()) w.emplace(weight);
    const T wm = T(weight_mul);
    Tensor out = Tensor::empty(g.shape(), kernel_output_dtype<T>(store_as));
    const ChunkSink<T> sink(out);
    const int64_t D = g.dim() ? g.size(-1) : 0, rows = D == 0 ? 0 : g.numel() / D;
#pragma omp parallel if (rows * D > platform::kParallelGrain)
    {
      std::vector<T> g_row(static_cast<size_t>(D)), gw(w ? static_cast<size_t>(D) : 0), o_row(static_cast<size_t>(D));
#pragma omp for
      for (int64_t row = 0; row < rows; ++row) {
        const T* xh = xs.data() + row * D;
        const T* gg = gs.read(row * D, D, g_row.data());
        if (w) {  // g * w
          for (int64_t i = 0; i < D; ++i) gw[size_t(i)] = gg[i] * (*w)[i] * wm;
          gg = gw.data();
        }
        double mg = 0, mgx = 0;
        for (int64_t i = 0; i < D; ++i) {
          mg += gg[i];
          mgx += double(gg[i]) * xh[i];
        }
        mg /= double(D);
        mgx /= double(D);
        const T rstd = rs[row];
        T* o = sink.chunk(row * D, o_row.data());
        for (int64_t i = 0; i < D; ++i) o[i] = T(gg[i] - (center ? mg : 0.0) - xh[i] * mgx) * rstd;
        sink.commit(row * D, D, o);
      }
    }
    return out;
  });
}
}  // namespace

NormResult layer_norm(const Tensor& x, double eps) { return normalise_rows(x, eps, true, "layer_norm"); }
NormResult rms_norm(const Tensor& x, double eps) { return normalise_rows(x, eps, false, "rms_norm"); }
Tensor layer_norm_backward(const NormResult& r, const Tensor& g) { return norm_backward(r, g, true, "layer_norm_backward"); }
Tensor rms_norm_backward(const NormResult& r, const Tensor& g) { return norm_backward(r, g, false, "rms_norm_backward"); }
NormResult norm_affine(const Tensor& x, double eps, bool center, const Affine& a, DType store_as) {
  if (!a.weight.defined()) throw Error("norm_affine: needs a weight");
  return normalise_rows(x, eps, center, center ? "layer_norm" : "rms_norm", a, store_as);
}
Tensor norm_affine_backward(const NormResult& r, const Tensor& g, bool center, const Tensor& weight, double weight_mul, DType store_as) {
  if (!weight.defined()) throw Error("norm_affine_backward: needs the weight");
  return norm_backward(r, g, center, center ? "layer_norm_backward" : "rms_norm_backward", weight, weight_mul, store_as);
}

namespace {
void check_ids(const Tensor& ids, int64_t vocab, const std::vector<int64_t>& v, const char* op) {
  if (!is_integer(ids.dtype())) throw Error(std::string(op) + ": indices must be i32 or i64, got " + std::string(dtype_name(ids.dtype())));
  for (int64_t id : v)
    if (id < 0 || id >= vocab)
      throw Error(std::string(op) + ": index " + std::to_string(id) + " is out of range [0, " + std::to_string(vocab) + ")");
}
std::vector<int64_t> ids_of(const Tensor& ids) {
  const std::vector<double> d = ids.to_vector();
  return std::vector<int64_t>(d.begin(), d.end());
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  if (weight.dim() != 2) throw Error("embedding: weight must be [vocab, dim], got " + shape_str(weight.shape()));
  const int64_t V = weight.size(0), D = weight.size(1);
  const std::vector<int64_t> idx = ids_of(ids);
  check_ids(ids, V, idx, "embedding");
  Shape out_shape = ids.shape();
  out_shape.push_back(D);
  return dispatch_compute(computes_in_f64(weight), [&]<class T>() {
    const Dense<T> w(weight);
    Tensor out = Tensor::empty(out_shape, dtype_for<T>());
    T* o = out.data<T>();
    for (size_t i = 0; i < idx.size(); ++i) std::copy(w.data() + idx[i] * D, w.data() + (idx[i] + 1) * D, o + int64_t(i) * D);
    return out;
  });
}

Tensor embedding_backward(const Tensor& grad, const Tensor& ids, int64_t vocab) {
  const std::vector<int64_t> idx = ids_of(ids);
  check_ids(ids, vocab, idx, "embedding_backward");
  const int64_t D = grad.size(-1);
  return dispatch_compute(computes_in_f64(grad), [&]<class T>() {
    const Dense<T> g(grad);
    Tensor out = Tensor::zeros({vocab, D}, dtype_for<T>());
    T* o = out.data<T>();
    for (size_t i = 0; i < idx.size(); ++i)  // scatter-add: repeated ids accumulate
      for (int64_t j = 0; j < D; ++j) o[idx[i] * D + j] += g[int64_t(i) * D + j];
    return out;
  });
}

namespace {
// Whether a mean cross-entropy `loss` of these logits is more than rounding noise. Each logit is
// known to half an ulp of the largest, so the loss only to about an ulp of it: when that reaches
// the loss itself and one nat, the loss cannot be right (finite weights of 3e38 made every logit
// equal, and the loss came out 0 where equal logits give ln C). Such a loss becomes NaN, which
// every caller already treats as a loss that is not finite: training diverges, evaluation refuses.
bool loss_resolved(const Tensor& logits, double in_mul, double loss) {
  const Tensor x = logits.contiguous();
  return dispatch_compute(computes_in_f64(x), [&]<class T>() {
    const Dense<T> v(x);
    const int64_t n = x.numel();
    double top = 0;  // a logit of -inf (a masked class) has no rounding
#pragma omp parallel for reduction(max : top) if (n > platform::kParallelGrain)
    for (int64_t i = 0; i < n; ++i)
      if (double(v[i]) != -INFINITY) top = std::max(top, std::abs(double(v[i])));
    top *= std::abs(in_mul);
    if (!std::isfinite(top)) return false;
    const double ulp = top > 0 ? std::ldexp(1.0, std::ilogb(top) - (std::numeric_limits<T>::digits - 1)) : 0.0;
    return ulp < std::max(loss, 1.0);
  });
}
void check_xent(const Tensor& logits, const Tensor& targets, const std::vector<int64_t>& t) {
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0))
    throw Error("cross_entropy: logits must be [N, C] and targets [N], got " + shape_str(logits.shape()) + " and " +
                shape_str(targets.shape()));
  check_ids(targets, logits.size(1), t, "cross_entropy");
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double in_mul) {
  const std::vector<int64_t> t = ids_of(targets);
  check_xent(logits, targets, t);
  const Tensor lsm = log_softmax(logits, -1, in_mul);
  return dispatch_compute(computes_in_f64(logits), [&]<class T>() {
    const Dense<T> l(lsm);
    const int64_t N = logits.size(0), C = logits.size(1);
    double loss = 0;
    for (int64_t i = 0; i < N; ++i) loss -= l[i * C + t[size_t(i)]];
    loss = N ? loss / double(N) : 0.0;
    return Tensor::scalar(loss_resolved(logits, in_mul, loss) ? loss : NAN, dtype_for<T>());
  });
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, double grad, double in_mul) {
  const std::vector<int64_t> t = ids_of(targets);
  check_xent(logits, targets, t);
  Tensor p = softmax(logits, -1, in_mul);
  const int64_t N = logits.size(0), C = logits.size(1);
  return dispatch_compute(computes_in_f64(logits), [&]<class T>() {
    T* g = p.data<T>();
    const T s = T(grad / double(std::max<int64_t>(N, 1)));
    for (int64_t i = 0; i < N; ++i) {
      g[i * C + t[size_t(i)]] -= T(1);
      for (int64_t j = 0; j < C; ++j) g[i * C + j] *= s;
    }
    return p;
  });
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  if (xs.empty()) throw Error("concat: no tensors");
  const int nd = xs[0].dim();
  const int d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd) throw Error("concat: dimension " + std::to_string(dim) + " out of range for " + shape_str(xs[0].shape()));
  Shape out_shape = xs[0].shape();
  out_shape[size_t(d)] = 0;
  bool f64 = false;
  for (const Tensor& x : xs) {
    Shape a = x.shape(), b = xs[0].shape();
    if (x.dim() != nd || (a[size_t(d)] = 0, b[size_t(d)] = 0, a != b))
      throw Error("concat: shapes " + shape_str(xs[0].shape()) + " and " + shape_str(x.shape()) + " differ outside dimension " +
                  std::to_string(d));
    out_shape[size_t(d)] += x.size(d);
    f64 = f64 || x.dtype() == DType::f64;
  }
  Tensor out = Tensor::empty(out_shape, f64 ? DType::f64 : DType::f32);
  int64_t at = 0;
  for (const Tensor& x : xs) {
    Tensor dst = out.slice(d, at, at + x.size(d));
    dst.copy_(x);
    at += x.size(d);
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  const int d = dim < 0 ? dim + x.dim() : dim;
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (d < 0 || d >= x.dim() || total != x.size(d))
    throw Error("split: sizes summing to " + std::to_string(total) + " do not split dimension " + std::to_string(dim) + " of " +
                shape_str(x.shape()));
  std::vector<Tensor> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(x.slice(d, at, at + s));
    at += s;
  }
  return out;
}

Tensor dropout_mask(const Shape& shape, double p, uint64_t seed, DType dtype) {
  if (!(p >= 0.0 && p < 1.0)) throw Error("dropout: p must be in [0, 1), got " + std::to_string(p));
  const int64_t n = numel_of(shape);
  std::vector<double> m(static_cast<size_t>(n));
  const double threshold = p * 4294967296.0, keep = 1.0 / (1.0 - p);
  for (int64_t i = 0; i < n; ++i) m[size_t(i)] = double(kernels::random_bits(seed, uint64_t(i))) < threshold ? 0.0 : keep;
  return Tensor::from_vector(m, shape).to(dtype);
}

Tensor causal_mask(int64_t T) {
  std::vector<float> m(static_cast<size_t>(T * T));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) m[size_t(i * T + j)] = j <= i ? 1.0f : 0.0f;
  return Tensor::from_vector(m, {T, T});
}

}  // namespace scalify::ops
