#include "scalify/optim/expansion.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>

#include "scalify/formats/kernels.hpp"
#include "scalify/tensor/vector_math.hpp"

namespace scalify::optim {

namespace {

constexpr int64_t kPiece = 256;

// log2(1 + j / 16), correctly rounded (Python's decimal to 60 digits): an FP8 code's value has at
// most 4 mantissa bits (E4M4's). Literals, so no static initialiser runs before them.
constexpr double kMantissaLog2[16] = {0x0.0p+0,
                                      0x1.663f6fac91316p-4,
                                      0x1.5c01a39fbd688p-3,
                                      0x1.fbc16b902680ap-3,
                                      0x1.49a784bcd1b8bp-2,
                                      0x1.91bba891f1709p-2,
                                      0x1.d6753e032ea0fp-2,
                                      0x1.0c10500d63aa6p-1,
                                      0x1.2b803473f7ad1p-1,
                                      0x1.49a784bcd1b8bp-1,
                                      0x1.66a008e4788ccp-1,
                                      0x1.82809d5be7073p-1,
                                      0x1.9d5d9fd5010b3p-1,
                                      0x1.b74948f5532dap-1,
                                      0x1.d053f6d260896p-1,
                                      0x1.e88c6b3626a73p-1};

// ln(2)^i / i!, the Taylor series of 2^f.
constexpr double taylor_exp2(int i) {
  double c = 1;
  for (int j = 1; j <= i; ++j) c *= 0.693147180559945309417232121458176568 / j;
  return c;
}

// The inverse's bracket over n values: lo[i] <= the exact |x| in f64 <= hi[i] (the pow within an
// ulp, times centre); 0 for zero, lo 0 and hi inf out of reach (y not normal or with more than 4
// mantissa bits, |u| past 1000, the approximation not a normal f64). The approximation A = 2^u centre, u = q (e + log2(1 +
// j/16) + log2(scale)) for |y| = 2^e (1 + j/16), 2^u = 2^n 2^f (|f| <= 1/2) with 2^f's series to
// f^12 (remainder below 2^-52), is within 2^-52 (1.1 q (1 + |log2 scale|) + 1.1 |u| + 4) of it:
// log2 scale within an ulp and the sums' roundings, times q, by ln 2, plus the series, its
// evaluation and the products. The ends are A (1 -/+ delta), delta over seven times that.
// Each element's ends go to out(i, lo, hi).
template <class Out>
[[gnu::always_inline]] inline void inverse_bracket_loop(const float* __restrict y, int64_t n, double q, double log2_scale, double centre,
                                                        Out out) {
  const double* mantissa_log2 = kMantissaLog2;
  const double delta_base = 0x1p-49 * (q * (std::fabs(log2_scale) + 1) + 8);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t mag = std::bit_cast<uint32_t>(y[i]) & 0x7FFFFFFFu;
    const auto exp_field = int32_t(mag >> 23);
    const double u = (double(exp_field - 127) + mantissa_log2[(mag >> 19) & 15] + log2_scale) * q;
    const double biased = u + 0x1.8p52;  // round to nearest: its low bits hold n
    const double f = u - (biased - 0x1.8p52);
    double p = taylor_exp2(12);
    p = p * f + taylor_exp2(11);
    p = p * f + taylor_exp2(10);
    p = p * f + taylor_exp2(9);
    p = p * f + taylor_exp2(8);
    p = p * f + taylor_exp2(7);
    p = p * f + taylor_exp2(6);
    p = p * f + taylor_exp2(5);
    p = p * f + taylor_exp2(4);
    p = p * f + taylor_exp2(3);
    p = p * f + taylor_exp2(2);
    p = p * f + taylor_exp2(1);
    p = p * f + 1;
    const double a = p * std::bit_cast<double>((std::bit_cast<uint64_t>(biased) + 1023) << 52) * centre;
    const double delta = delta_base + 0x1p-48 * std::fabs(u);
    const bool reach =
        (exp_field > 0) & (exp_field < 255) & ((mag & 0x7FFFFu) == 0) & (std::fabs(u) <= 1000) & (a >= DBL_MIN) & (a <= DBL_MAX);
    // Both ends computed unconditionally, then selected: a branch-free loop (AVX2 has no masked arithmetic).
    const double a_lo = a - a * delta, a_hi = a + a * delta;
    const double l = reach ? a_lo : 0.0, h = reach ? a_hi : std::numeric_limits<double>::infinity();
    out(i, mag == 0 ? 0.0 : l, mag == 0 ? 0.0 : h);
  }
}

// The forward bracket over n values: 2^(k log2 b), b = |x| / centre, in f32, log2 b = e + log2 m
// (m in [sqrt(1/2), sqrt(2)), log2 m by atanh's series in s = (m - 1) / (m + 1) to s^9, remainder
// below 2^-29), 2^t = 2^n 2^f by 2^f's series to f^7 (remainder below 2^-27). Against the pow
// it is within 2^-24 (4.2 k + 1.4 |t| + 3.3): b within 2^-23 (through 1 / centre, f32 normal),
// log2 m within 3 2^-24, the roundings of log2 b and t, by ln 2, plus the series and its
// evaluation. delta is twice that, which also covers the ends' own roundings.
[[gnu::always_inline]] inline void forward_bracket_loop(const float* __restrict x, float* __restrict lo, float* __restrict hi, int64_t n,
                                                        float k, float inv_centre, float scale) {
  constexpr float kTwoOverLn2 = 2.8853900817779268f;
  const float delta_base = 0x1p-24f * (8.2f * k + 12);
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    const float b = a * inv_centre;
    const uint32_t bb = std::bit_cast<uint32_t>(b);
    const int32_t e = int32_t(bb - 0x3F3504F3u) >> 23;  // b's exponent with m in [sqrt(1/2), sqrt(2))
    const float m = std::bit_cast<float>(bb - (uint32_t(e) << 23));
    const float s = (m - 1) / (m + 1), s2 = s * s;
    const float log2m = s * kTwoOverLn2 * (1 + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9)))));
    const float t = k * (float(e) + log2m);
    const float biased = t + 0x1.8p23f;  // round to nearest: its low bits hold n
    const float f = t - (biased - 0x1.8p23f);
    float p = float(taylor_exp2(7));
    p = p * f + float(taylor_exp2(6));
    p = p * f + float(taylor_exp2(5));
    p = p * f + float(taylor_exp2(4));
    p = p * f + float(taylor_exp2(3));
    p = p * f + float(taylor_exp2(2));
    p = p * f + float(taylor_exp2(1));
    p = p * f + 1;
    const bool reach = (b >= FLT_MIN) & (b <= FLT_MAX) & (std::fabs(t) <= 64);
    const float power = p * std::bit_cast<float>((std::bit_cast<uint32_t>(biased) + 127) << 23);
    const float delta = delta_base + 0x1p-22f * std::fabs(t);
    const float p_lo = power - power * delta, p_hi = power + power * delta;  // both computed, then selected (as the inverse's)
    const float l = reach ? p_lo : 0.0f, h = reach ? p_hi : std::numeric_limits<float>::infinity();
    const float y_lo = l / scale, y_hi = h / scale;
    lo[i] = std::copysign(a == 0 ? 0.0f : y_lo, x[i]);
    hi[i] = std::copysign(a == 0 ? 0.0f : y_hi, x[i]);
  }
}

// The kernels, for the plain build (SSE2) and for AVX2 and AVX-512 where the format kernels run
// them. Their roundings may differ (fused multiply-adds), their brackets hold all the same. The
// inverse's come as the brackets (for the tests), or as the results where certified (x[i] =
// sign(y[i]) f32(lo)) with whether they are not (f32(lo) != f32(hi)).
struct Kernels {
  void (*inverse_bracket)(const float*, double*, double*, int64_t, double, double, double);
  void (*inverse_certified)(const float*, float*, uint8_t*, int64_t, double, double, double);
  void (*forward_bracket)(const float*, float*, float*, int64_t, float, float, float);
};
#define SCALIFY_EXPANSION_KERNELS(NAME, ATTRIBUTE)                                                                                        \
  [[ATTRIBUTE]] void inverse_bracket_##NAME(const float* __restrict y, double* __restrict lo, double* __restrict hi, int64_t n, double q, \
                                            double log2_scale, double centre) {                                                           \
    inverse_bracket_loop(y, n, q, log2_scale, centre, [=](int64_t i, double l, double h) { lo[i] = l, hi[i] = h; });                      \
  }                                                                                                                                       \
  [[ATTRIBUTE]] void inverse_certified_##NAME(const float* __restrict y, float* __restrict x, uint8_t* __restrict uncertain, int64_t n,   \
                                              double q, double log2_scale, double centre) {                                               \
    inverse_bracket_loop(y, n, q, log2_scale, centre, [=](int64_t i, double l, double h) {                                                \
      x[i] = std::copysign(float(l), y[i]);                                                                                               \
      uncertain[i] = float(l) != float(h);                                                                                                \
    });                                                                                                                                   \
  }                                                                                                                                       \
  [[ATTRIBUTE]] void forward_bracket_##NAME(const float* __restrict x, float* __restrict lo, float* __restrict hi, int64_t n, float k,    \
                                            float inv_centre, float scale) {                                                              \
    forward_bracket_loop(x, lo, hi, n, k, inv_centre, scale);                                                                             \
  }                                                                                                                                       \
  constexpr Kernels kKernels_##NAME{inverse_bracket_##NAME, inverse_certified_##NAME, forward_bracket_##NAME};

SCALIFY_EXPANSION_KERNELS(plain, )
#if SCALIFY_HAVE_X86_SIMD
SCALIFY_EXPANSION_KERNELS(avx2, gnu::target("avx2,fma"))
SCALIFY_EXPANSION_KERNELS(avx512, gnu::target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,prefer-vector-width=512"))
#endif
#undef SCALIFY_EXPANSION_KERNELS

const Kernels& kernels_for_isa() {
#if SCALIFY_HAVE_X86_SIMD
  switch (kernels::active_isa()) {
    case kernels::Isa::avx512: return kKernels_avx512;
    case kernels::Isa::avx2: return kKernels_avx2;
    case kernels::Isa::scalar: break;
  }
#endif
  return kKernels_plain;
}

// k, centre and scale finite and positive (a group's, as expansion_for gives them from finite
// moments): otherwise no element is in the approximations' reach, zeros included (a NaN k reads a
// zero code back as NaN).
bool certifiable(const Expansion& e) {
  return std::isfinite(e.k) && std::isfinite(e.centre) && std::isfinite(e.scale) && e.k > 0 && e.centre > 0 && e.scale > 0;
}

// The inverse by the pow (the definition) for n values: x[i] = sign(y[i]) fl32(pow(|y[i]| scale, 1/k) centre); x may be y.
void inverse_by_pow(const Expansion& e, const float* y, float* x, int64_t n) {
  double base[kPiece], power[kPiece];
  for (int64_t b = 0; b < n; b += kPiece) {
    const int64_t len = std::min(kPiece, n - b);
    for (int64_t i = 0; i < len; ++i) base[i] = double(std::fabs(y[b + i])) * double(e.scale);
    vecmath::active().pow_f64(base, 1.0 / double(e.k), power, len);
    for (int64_t i = 0; i < len; ++i) x[b + i] = std::copysign(float(power[i] * double(e.centre)), y[b + i]);
  }
}

}  // namespace

float Expansion::forward(float x) const {
  const double base = double(std::fabs(x)) / double(centre);
  double power;
  vecmath::active().pow_f64(&base, double(k), &power, 1);
  return std::copysign(float(power) / scale, x);
}

void Expansion::inverse_bracket(const float* y, double* lo, double* hi, int64_t n) const {
  if (certifiable(*this))
    kernels_for_isa().inverse_bracket(y, lo, hi, n, 1.0 / double(k), std::log2(double(scale)), double(centre));
  else
    std::fill_n(lo, n, 0.0), std::fill_n(hi, n, std::numeric_limits<double>::infinity());
}

void Expansion::inverse(const float* y, float* x, int64_t n) const {
  if (!certifiable(*this)) return inverse_by_pow(*this, y, x, n);
  const auto certified = kernels_for_isa().inverse_certified;
  const double q = 1.0 / double(k), log2_scale = std::log2(double(scale));
  float in[kPiece], pending[kPiece];
  uint8_t uncertain[kPiece];
  int64_t index[kPiece];
  for (int64_t b = 0; b < n; b += kPiece) {
    const int64_t len = std::min(kPiece, n - b);
    std::copy_n(y + b, len, in);  // y may be x
    certified(in, x + b, uncertain, len, q, log2_scale, double(centre));
    // The others by the pow.
    if (std::none_of(uncertain, uncertain + len, [](uint8_t u) { return u != 0; })) continue;
    int64_t count = 0;
    for (int64_t i = 0; i < len; ++i) {
      index[count] = i;
      count += uncertain[i];
    }
    for (int64_t j = 0; j < count; ++j) pending[j] = in[index[j]];
    inverse_by_pow(*this, pending, pending, count);
    for (int64_t j = 0; j < count; ++j) x[b + index[j]] = pending[j];
  }
}

void Expansion::forward_bracket(const float* x, float* lo, float* hi, int64_t n) const {
  if (!certifiable(*this)) {
    for (int64_t i = 0; i < n; ++i) lo[i] = std::copysign(0.0f, x[i]), hi[i] = std::copysign(std::numeric_limits<float>::infinity(), x[i]);
    return;
  }
  // An inverse centre out of f32's normal range leaves no element in reach.
  const float inv_centre = 1.0f / centre;
  kernels_for_isa().forward_bracket(x, lo, hi, n, k, std::isnormal(inv_centre) ? inv_centre : std::numeric_limits<float>::quiet_NaN(),
                                    scale);
}

float Expansion::inverse(float y) const {
  float x;
  inverse(&y, &x, 1);
  return x;
}

Expansion expansion_for(float hi, float lo, double code_max, int expand_min) {
  const double ratio = double(hi) / double(lo);
  const double k = ratio == 1 ? kMaxExpansion : std::floor(std::log2(code_max * code_max / 2) / std::log2(ratio) * expand_min) / expand_min;
  Expansion e;
  e.k = float(std::clamp(k, 1.0 / expand_min, kMaxExpansion));
  e.centre = float(std::sqrt(double(hi) * double(lo)));
  e.scale = float(std::pow(double(hi) / double(e.centre), double(e.k)) / code_max);
  return e;
}

}  // namespace scalify::optim
