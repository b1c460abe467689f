// Elementwise kernels: unary maps and their derivatives, broadcasting binary ops, where, sum_to.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "scalify/error.hpp"
#include "scalify/formats/format.hpp"
#include "scalify/platform/parallel.hpp"
#include "scalify/tensor/dense.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/tensor/vector_math.hpp"

namespace scalify::ops {

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <class T>
T apply(Unary op, T x) {
  switch (op) {
    case Unary::neg: return -x;
    case Unary::exp: return std::exp(x);
    case Unary::log: return std::log(x);
    case Unary::sqrt: return std::sqrt(x);
    case Unary::rsqrt: return T(1) / std::sqrt(x);
    case Unary::abs: return std::fabs(x);
    case Unary::relu: return x > T(0) ? x : T(0);
    case Unary::gelu_tanh: return T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x)));
    case Unary::gelu_erf: return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
    case Unary::silu: return x / (T(1) + std::exp(-x));
    case Unary::sigmoid: return T(1) / (T(1) + std::exp(-x));
    case Unary::tanh: return std::tanh(x);
    case Unary::square: return x * x;
  }
  return x;
}

// d op(x) / dx from x and y = op(x).
template <class T>
T derivative(Unary op, T x, T y) {
  switch (op) {
    case Unary::neg: return T(-1);
    case Unary::exp: return y;
    case Unary::log: return T(1) / x;
    case Unary::sqrt: return T(0.5) / y;
    case Unary::rsqrt: return T(-0.5) * y * y * y;
    case Unary::abs: return x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0);
    case Unary::relu: return x > T(0) ? T(1) : T(0);
    case Unary::gelu_tanh: {
      // Beyond |x| = 30 the tanh is exactly ±1 and the sech^2 term exactly 0 in f32 and f64, but
      // x^3 overflows for |x| >= 2^43 (f32) and inf * 0 would give NaN: return the limit directly.
      if (std::fabs(x) > T(30)) return x > T(0) ? T(1) : T(0);
      const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
      const T t = std::tanh(u);
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
    }
    case Unary::gelu_erf: return T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2))) + x * T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
    case Unary::silu: {
      const T s = T(1) / (T(1) + std::exp(-x));
      return s * (T(1) + x * (T(1) - s));
    }
    case Unary::sigmoid: return y * (T(1) - y);
    case Unary::tanh: return T(1) - y * y;
    case Unary::square: return T(2) * x;
  }
  return T(0);
}

template <class T>
T apply(Binary op, T a, T b) {
  switch (op) {
    case Binary::add: return a + b;
    case Binary::sub: return a - b;
    case Binary::mul: return a * b;
    case Binary::div: return a / b;
    case Binary::maximum: return a != a || a > b ? a : b;  // a NaN in either operand propagates
    case Binary::minimum: return a != a || a < b ? a : b;
    case Binary::max_picks_a: return a != a || a >= b ? T(1) : T(0);
    case Binary::min_picks_a: return a != a || a <= b ? T(1) : T(0);
  }
  return a;
}

using platform::kParallelGrain;

}  // namespace

const char* unary_name(Unary op) {
  static constexpr const char* names[] = {"neg",       "exp",      "log",  "sqrt",    "rsqrt", "abs",   "relu",
                                          "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh",  "square"};
  static_assert(std::size(names) == size_t(Unary::square) + 1, "a name for every Unary op, in the enum's order");
  return names[static_cast<int>(op)];
}

Unary parse_unary(std::string_view name) {
  std::string known;
  for (int i = 0; i <= int(Unary::square); ++i) {
    if (name == unary_name(Unary(i))) return Unary(i);
    known += (i ? ", " : "") + std::string(unary_name(Unary(i)));
  }
  throw Error("unary: unknown op '" + std::string(name) + "' (" + known + ")");
}

namespace {

// Calls f.template operator()<OP>() for the runtime op, so each loop is compiled (and
// vectorised) for one op instead of switching per element.
template <class Op, Op... kOps, class F>
void with_op(Op op, F&& f) {
  ((op == kOps ? f.template operator()<kOps>() : void()), ...);
}
template <class F>
void with_unary(Unary op, F&& f) {
  using enum Unary;
  with_op<Unary, neg, exp, log, sqrt, rsqrt, abs, relu, gelu_tanh, gelu_erf, silu, sigmoid, tanh, square>(op, f);
}
template <class F>
void with_binary(Binary op, F&& f) {
  using enum Binary;
  with_op<Binary, add, sub, mul, div, maximum, minimum, max_picks_a, min_picks_a>(op, f);
}

// Elements per piece of for_chunks: the decode buffers of ChunkSource hold one piece.
constexpr int64_t kChunk = 4096;

// Runs chunk(begin, end) over [0, n) in pieces, in parallel above kParallelGrain elements.
template <class F>
void for_chunks(int64_t n, F&& chunk) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) chunk(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// f(z) = z g(z) with g bounded, g(+inf) = 1 and g(-inf) = 0: relu, gelu, silu.
constexpr bool times_bounded_gate(Unary op) {
  return op == Unary::relu || op == Unary::gelu_tanh || op == Unary::gelu_erf || op == Unary::silu;
}

// Whether in_mul x can overflow T for some finite x of x's dtype: never for f16 data below a
// multiplier of 2^113, nor for unscaled inputs, so the usual calls skip the check altogether.
template <class T>
bool may_overflow(const Tensor& x, double in_mul) {
  const std::optional<Format> f = dtype_format(x.dtype());
  const double largest = f ? max_value(*f) : double(std::numeric_limits<T>::max());
  return std::fabs(in_mul) * largest > double(std::numeric_limits<T>::max());
}

// Where in_mul x overflows to +-inf (a scaled tensor's data times a scale near 2^127), the
// kernels give inf or NaN (inf * 0 inside the formula), but out_mul f(in_mul x) = out_mul in_mul
// x g(in_mul x) is finite: out_mul in_mul x above, 0 below. Its derivative's limit is 1 above and
// 0 below, so the gradient is grad or 0. One vectorised check per chunk; the fix-up only where a
// value came out non-finite from finite inputs, so every other result stays as the kernel made it.
template <class T>
void gate_limits(const T* x, const T* grad, T* out, int64_t n, T in_mul, double out_in_mul) {
  int nonfinite = 0;  // o - o is NaN exactly for inf and NaN; written so that it vectorises
  for (int64_t i = 0; i < n; ++i) nonfinite |= int(!(out[i] - out[i] == T(0)));
  if (!nonfinite) return;
  for (int64_t i = 0; i < n; ++i) {
    const T z = in_mul * x[i];
    if (std::isfinite(out[i]) || !std::isfinite(x[i]) || !std::isinf(z) || (grad && !std::isfinite(grad[i]))) continue;
    out[i] = z < 0 ? T(0) : grad ? grad[i] : T(out_in_mul * double(x[i]));
  }
}

// log(in_mul x) where in_mul x left T's range (inf, or 0 from underflow) is still finite for a
// finite x > 0: log x + log in_mul, taken in double there only.
template <class T>
void log_limits(const T* x, T* out, int64_t n, T in_mul, double in_mul_d, double out_mul) {
  for (int64_t i = 0; i < n; ++i) {
    const T z = in_mul * x[i];
    if (std::isfinite(out[i]) || !(x[i] > 0) || !std::isfinite(x[i]) || (std::isfinite(z) && z != 0)) continue;
    out[i] = T(out_mul * (std::log(double(x[i])) + std::log(in_mul_d)));
  }
}

}  // namespace

Tensor unary(Unary op, const Tensor& x, double in_mul, double out_mul, DType store_as) {
  return dispatch_compute(computes_in_f64(x), [&]<class T>() {
    const ChunkSource<T> in(x, x.shape());
    Tensor out = Tensor::empty(x.shape(), kernel_output_dtype<T>(store_as));
    const ChunkSink<T> sink(out);
    const int64_t n = x.numel();
    const T a = T(in_mul), b = T(out_mul);
    const bool limits = times_bounded_gate(op) && may_overflow<T>(x, in_mul);
    if constexpr (std::is_same_v<T, float>) {
      if (op == Unary::gelu_tanh) {  // the step's costliest map: vectorised tanh
        const auto& vm = vecmath::active();
        for_chunks(n, [&](int64_t i0, int64_t i1) {
          T buf[kChunk], ob[kChunk];
          T* o = sink.chunk(i0, ob);
          const T* p = in.read(i0, i1 - i0, buf);
          vm.gelu_tanh(p, o, i1 - i0, a, b);
          if (limits) gate_limits<T>(p, nullptr, o, i1 - i0, a, in_mul * out_mul);
          sink.commit(i0, i1 - i0, o);
        });
        return out;
      }
    }
    with_unary(op, [&]<Unary OP>() {
      for_chunks(n, [&](int64_t i0, int64_t i1) {
        T buf[kChunk], ob[kChunk];
        const T* p = in.read(i0, i1 - i0, buf);
        T* oc = sink.chunk(i0, ob);
        if (in_mul == 1.0 && out_mul == 1.0) {
          for (int64_t i = 0; i < i1 - i0; ++i) oc[i] = apply(OP, p[i]);
        } else {
          for (int64_t i = 0; i < i1 - i0; ++i) oc[i] = b * apply(OP, a * p[i]);
          if constexpr (times_bounded_gate(OP))
            if (limits) gate_limits<T>(p, nullptr, oc, i1 - i0, a, in_mul * out_mul);
          if constexpr (OP == Unary::log) log_limits<T>(p, oc, i1 - i0, a, in_mul, out_mul);
        }
        sink.commit(i0, i1 - i0, oc);
      });
    });
    return out;
  });
}

bool derivative_uses_output(Unary op) {
  using enum Unary;
  return op == exp || op == sqrt || op == rsqrt || op == sigmoid || op == tanh;
}

Tensor unary_backward(Unary op, const Tensor& x, const Tensor& y, const Tensor& grad, double x_mul, DType store_as) {
  if (derivative_uses_output(op) && !y.defined()) throw Error(std::string("unary_backward: ") + unary_name(op) + " needs its output");
  return dispatch_compute(computes_in_f64(x, grad), [&]<class T>() {
    const ChunkSource<T> xs(x, x.shape()), gs(grad, x.shape());
    Tensor out = Tensor::empty(x.shape(), kernel_output_dtype<T>(store_as));
    const ChunkSink<T> sink(out);
    const int64_t n = x.numel();
    const T k = T(x_mul);
    const bool limits = times_bounded_gate(op) && may_overflow<T>(x, x_mul);
    if constexpr (std::is_same_v<T, float>) {
      if (op == Unary::gelu_tanh) {
        const auto& vm = vecmath::active();
        for_chunks(n, [&](int64_t i0, int64_t i1) {
          T xb[kChunk], gb[kChunk], ob[kChunk];
          T* o = sink.chunk(i0, ob);
          const T *px = xs.read(i0, i1 - i0, xb), *pg = gs.read(i0, i1 - i0, gb);
          vm.gelu_tanh_backward(px, pg, o, i1 - i0, k);
          if (limits) gate_limits<T>(px, pg, o, i1 - i0, k, 1.0);
          sink.commit(i0, i1 - i0, o);
        });
        return out;
      }
    }
    std::optional<ChunkSource<T>> ys;
    if (derivative_uses_output(op)) ys.emplace(y, x.shape());
    with_unary(op, [&]<Unary OP>() {
      for_chunks(n, [&](int64_t i0, int64_t i1) {
        T xb[kChunk], gb[kChunk], yb[kChunk], ob[kChunk];
        const int64_t len = i1 - i0;
        const T *px = xs.read(i0, len, xb), *pg = gs.read(i0, len, gb), *py = ys ? ys->read(i0, len, yb) : px;
        T* o = sink.chunk(i0, ob);
        for (int64_t i = 0; i < len; ++i) o[i] = pg[i] * derivative(OP, k * px[i], py[i]);
        if constexpr (times_bounded_gate(OP))
          if (limits) gate_limits<T>(px, pg, o, len, k, 1.0);
        sink.commit(i0, len, o);
      });
    });
    return out;
  });
}

namespace {

// b's elements repeat along the leading dimensions of shape (a bias row, a per-feature gain):
// b is contiguous and its shape, without leading ones, is shape's trailing dimensions.
bool is_trailing_row(const Tensor& b, const Shape& shape) {
  if (!b.is_contiguous() || b.numel() == 0) return false;
  const Shape& s = b.shape();
  size_t lead = 0;
  while (lead < s.size() && s[lead] == 1) ++lead;
  const size_t rest = s.size() - lead;
  if (rest > shape.size()) return false;
  for (size_t d = 0; d < rest; ++d)
    if (s[lead + d] != shape[shape.size() - rest + d]) return false;
  return true;
}

}  // namespace

Tensor binary(Binary op, const Tensor& a, const Tensor& b, double a_mul, double b_mul, DType store_as) {
  static constexpr const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "max_picks_a", "min_picks_a"};
  static_assert(std::size(names) == size_t(Binary::min_picks_a) + 1, "a name for every Binary op, in the enum's order");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), names[static_cast<int>(op)]);
  return dispatch_compute(computes_in_f64(a, b), [&]<class T>() {
    // A row operand (bias, gain) is read in place, cycling, instead of being expanded; one held
    // in another dtype (an f16 master bias) is converted once, exactly, at its own size.
    const bool row = b.shape() != shape && is_trailing_row(b, shape);
    const Tensor b_row = row && b.dtype() != dtype_for<T>() ? b.to(dtype_for<T>()) : b;
    const int64_t n = numel_of(shape), period = row ? b.numel() : n;  // row: b's length
    const ChunkSource<T> x(a, shape);
    std::optional<Dense<T>> y_row;
    std::optional<ChunkSource<T>> y;
    if (row)
      y_row.emplace(b_row, b.shape());
    else
      y.emplace(b, shape);
    Tensor out = Tensor::empty(shape, kernel_output_dtype<T>(store_as));
    const ChunkSink<T> sink(out);
    const T ma = T(a_mul), mb = T(b_mul);
    const bool plain = a_mul == 1.0 && b_mul == 1.0;
    if (n == 0) return out;
    with_binary(op, [&]<Binary OP>() {
      // len elements of the output from px and py (vectorisable loops).
      auto apply_n = [&](T* oc, const T* px, const T* py, int64_t len) {
        if (plain) {
          for (int64_t i = 0; i < len; ++i) oc[i] = apply(OP, px[i], py[i]);
        } else {
          for (int64_t i = 0; i < len; ++i) oc[i] = apply(OP, ma * px[i], mb * py[i]);
        }
      };
      // Elements [i0, i1) of the output (at most kChunk); a row operand is read in segments that
      // restart at each period.
      auto run = [&](int64_t i0, int64_t i1) {
        T xb[kChunk], yb[kChunk], ob[kChunk];
        const int64_t len = i1 - i0;
        const T* px = x.read(i0, len, xb);
        T* o = sink.chunk(i0, ob);
        if (!row) {
          apply_n(o, px, y->read(i0, len, yb), len);
        } else {
          for (int64_t i = 0, j = i0 % period; i < len; j = 0) {
            const int64_t seg = std::min(len - i, period - j);
            apply_n(o + i, px + i, y_row->data() + j, seg);
            i += seg;
          }
        }
        sink.commit(i0, len, o);
      };
      for_chunks(n, run);
    });
    return out;
  });
}

Tensor scale_shift(const Tensor& x, double mul, double add, DType store_as) {
  return dispatch_compute(computes_in_f64(x), [&]<class T>() {
    const ChunkSource<T> in(x, x.shape());
    Tensor out = Tensor::empty(x.shape(), kernel_output_dtype<T>(store_as));
    const ChunkSink<T> sink(out);
    const T m = T(mul), c = T(add);
    for_chunks(x.numel(), [&](int64_t i0, int64_t i1) {
      T buf[kChunk], ob[kChunk];
      const T* p = in.read(i0, i1 - i0, buf);
      T* o = sink.chunk(i0, ob);
      for (int64_t i = 0; i < i1 - i0; ++i) o[i] = p[i] * m + c;
      sink.commit(i0, i1 - i0, o);
    });
    return out;
  });
}

Tensor pow_scalar(const Tensor& x, double p) {
  return dispatch_compute(computes_in_f64(x), [&]<class T>() {
    const Dense<T> in(x);
    Tensor out = Tensor::empty(x.shape(), dtype_for<T>());
    T* o = out.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) o[i] = std::pow(in[i], T(p));
    return out;
  });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  return dispatch_compute(computes_in_f64(a, b), [&]<class T>() {
    const Dense<T> c(cond, shape), x(a, shape), y(b, shape);
    Tensor out = Tensor::empty(shape, dtype_for<T>());
    T* o = out.data<T>();
    const int64_t n = numel_of(shape);
#pragma omp parallel for if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) o[i] = c[i] != T(0) ? x[i] : y[i];
    return out;
  });
}

std::vector<int> broadcast_dims(const Shape& from, const Shape& to) {
  const int lead = int(from.size()) - int(to.size());
  if (lead < 0) throw Error("sum_to: cannot reduce " + shape_str(from) + " to " + shape_str(to));
  std::vector<int> dims;
  for (int d = 0; d < int(from.size()); ++d)
    if (d < lead || (to[size_t(d - lead)] == 1 && from[size_t(d)] != 1)) dims.push_back(d);
  return dims;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const std::vector<int> dims = broadcast_dims(g.shape(), shape);
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  return r.reshape(shape);
}

}  // namespace scalify::ops
