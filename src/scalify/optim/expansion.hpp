#pragma once
// COAT's per-group dynamic range expansion (arXiv 2410.19313) of an optimizer moment stored in FP8
// (optim/state_format.hpp says how a group's k, centre and scale are chosen):
//   forward  y = sign(x) fl32((|x| / centre)^k) / scale    the value whose code is stored
//   inverse  x = sign(y) fl32((|y| scale)^(1/k) centre)    the moment a code stands for
// the powers taken in f64 by the active vector math's pow (tensor/vector_math.hpp).
//
// Those powers cost about 8 cycles an element, and a step takes four per parameter, so the
// vectorised forms certify cheap approximations against an error bound instead, giving the same
// results:
//  - inverse: 2^(q log2(|y| scale)) in f64 from a table of log2 of the codes' mantissas and a
//    series for 2^f, within a relative delta of the exact value; where rounding it times (1 - delta)
//    and (1 + delta) to f32 gives one value, that is the exact result's rounding. The other
//    elements take the pow (none of 2.5M codes of moment-like groups; at most about 1 in 2^19).
//  - forward_bracket: 2^(k log2(|x| / centre)) in f32 within a relative delta of the power: y at
//    its ends times (1 -/+ delta) brackets the exact y. Encoding is monotone, so where both ends
//    take one code, that is the exact code; the caller takes forward() where they differ (1 element
//    in 5,000 of Gaussian first moments, 1 in 15,000 of second moments, measured).
// The bounds and the agreement are tested against the pow on every code and on random moments
// (test_state_format).
#include <cstdint>

namespace scalify::optim {

// One group's expansion.
struct Expansion {
  float k = 1, centre = 1, scale = 1;
  float forward(float x) const;  // by the pow
  float inverse(float y) const;
  // The inverse over n values, certified (see above); y and x may be the same array.
  void inverse(const float* y, float* x, int64_t n) const;
  // The brackets (lo 0 and hi inf out of the approximations' reach; nothing is in it where k,
  // centre or scale is not finite and positive):
  //  |lo[i]| <= |y| <= |hi[i]| for y = forward(x[i]), with x[i]'s sign;
  void forward_bracket(const float* x, float* lo, float* hi, int64_t n) const;
  //  lo[i] <= |the exact inverse of y[i] in f64, before its rounding to f32| <= hi[i].
  void inverse_bracket(const float* y, double* lo, double* hi, int64_t n) const;
};

// The expansion for a group with largest and smallest non-zero magnitudes hi >= lo > 0.
Expansion expansion_for(float hi, float lo, double code_max, int expand_min);
inline constexpr double kMaxExpansion = 1024;

}  // namespace scalify::optim
