#pragma once
// AdamW (decoupled weight decay) and SGD over parameters that may be scaled tensors.
//
// Unscaled parameters keep f32 state and a plain f32 update. Scaled parameters (SCALIFY,
// Algorithm 1 of seed 000) get scaled state: m and v are (data, scale) pairs updated with the
// scale rules (m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2), their data stored in
// `state_dtype` (e.g. f16); the parameter keeps its scale and its data dtype. Optionally every
// `rescale_every` steps the parameters and state are re-balanced to unit-RMS data
// (dynamic_rescale_l2), the only statistics the scaled update ever gathers.
#include <cstdint>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include "scalify/autograd/var.hpp"
#include "scalify/optim/state_format.hpp"

namespace scalify::optim {

enum class Gradients : uint8_t { unchecked, finite };

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  DType state_dtype = DType::f32;  // storage of m and v for scaled parameters
  int rescale_every = 0;           // 0: never
  // Scaled parameters: one fused pass per parameter (the same arithmetic, bit for bit), or the
  // composed scaled ops (the reference; also what any case the fused pass does not cover runs).
  // Encoded moments: one fused pass over all parameters, or the reference that decodes and
  // encodes whole tensors (the same codes and weights, bit for bit).
  bool fused = true;
  // Storage of m and v for unscaled parameters (optim/state_format.hpp): f32 (the plain update
  // above), or a low-precision format, in which case every step decodes the moments, updates them
  // and the weights in the f32 arithmetic of the plain update and re-encodes them (v_format must
  // be non_negative for 8-bit codes to spend the sign bit; m_format must not be).
  StateFormat m_format{}, v_format{};
  // How new unscaled weights round into a master-weight storage narrower than f32 (bf16, f16):
  // nearest_even, or stochastic (bits from a hash of the step and parameter, so a resume repeats them).
  Rounding master_rounding = Rounding::nearest_even;
  // Scaled parameters are MS-AMP's scaled master weights, not SCALIFY's: updated as unscaled ones
  // (their represented values, the plain or encoded moments), each new weight stored by
  // store_scaled_master in the parameter's data dtype at a scale from its new amax.
  bool scaled_masters = false;
};

// A master weight in scaled form, MS-AMP's rule (msamp/common/tensor/meta.py, margin 0): the scale is
// 2^-e with e the largest exponent keeping amax(w) x 2^e within `dtype`'s largest finite value
// (f16: 65504), and the data is w x 2^e rounded into `dtype` (nearest_even or stochastic with
// `seed`). An all-zero w gets scale 1. w: f32; dtype: f16 or bf16.
ScaledTensor store_scaled_master(const Tensor& w, DType dtype, Rounding rounding = Rounding::nearest_even, uint64_t seed = 0);

class AdamW {
 public:
  // lr_scale: optional per-parameter learning-rate multipliers (e.g. unit scaling's 1/sqrt(d)
  // for non-projection parameters); empty means 1 for all.
  // decay: optional per-parameter switch for weight decay (e.g. off for gains and biases); empty
  // means on for all.
  // decay_scale: optional per-parameter multipliers of weight_decay where it applies (u-μP's
  // independent weight decay: 1 / (lr x lr_scale)); empty means 1 for all.
  // Throws scalify::Error naming the field for a non-finite or negative lr, betas outside [0, 1),
  // eps not finite and positive, or a non-finite or negative weight decay.
  AdamW(std::vector<Var> params, AdamWConfig config, std::vector<double> lr_scale = {}, std::vector<bool> decay = {},
        std::vector<double> decay_scale = {});
  // One update from the parameters' gradients times gradient_multiplier (gradient clipping:
  // applied as the gradients are read, so they stay in their low-precision storage), parameters
  // without one skipped, then clears the gradients. A non-finite gradient is an error naming the
  // parameter, before any parameter changes; Gradients::finite skips that pass where the caller
  // has already checked (a finite global gradient norm).
  void step(double gradient_multiplier = 1.0, Gradients gradients = Gradients::unchecked);
  int64_t steps() const { return t_; }
  const ScaledTensor& first_moment(size_t i) const { return m_[i]; }
  const ScaledTensor& second_moment(size_t i) const { return v_[i]; }
  void set_lr(double lr);  // learning-rate schedules; lr must be finite and >= 0
  const AdamWConfig& config() const { return c_; }
  // Checkpoints: restores the step count and both moments (shapes must match the parameters').
  void load_state(int64_t steps, std::vector<ScaledTensor> m, std::vector<ScaledTensor> v);
  // Whether unscaled parameters keep encoded moments (m_format or v_format not f32); then
  // first_moment / second_moment of those parameters are empty and these hold them.
  bool encodes_state() const { return !c_.m_format.is_plain_f32() || !c_.v_format.is_plain_f32(); }
  const EncodedState& encoded_first_moment(size_t i) const { return m_codes_[i]; }
  const EncodedState& encoded_second_moment(size_t i) const { return v_codes_[i]; }
  // Checkpoints of encoded state: codes as saved (sizes must match the parameters').
  void load_encoded_state(int64_t steps, std::vector<EncodedState> m, std::vector<EncodedState> v);
  // True bytes of parameter i's two moments (codes and scales).
  int64_t state_bytes(size_t i) const;

 private:
  void check_finite_gradients() const;  // throws naming the first parameter with one
  // Whether parameter k takes SCALIFY's scaled update (step_scaled*): scaled, and not a scaled master.
  bool scaled_update(size_t k) const { return params_[k].scaled().is_scaled() && !c_.scaled_masters; }
  // New weights (f32) of parameter k into its master storage (next_amax: their largest magnitude, where known).
  void store_weights(size_t k, const Tensor& next, const Tensor& old_value, std::optional<float> next_amax = std::nullopt);
  std::vector<std::vector<size_t>> step_batches(const std::vector<size_t>& ks) const;
  void step_plain(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier);
  void step_encoded(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier);
  void step_encoded_reference(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier);
  void step_scaled(size_t k, double bc1, double bc2, double gradient_multiplier);
  std::vector<size_t> step_scaled_fused(const std::vector<size_t>& ks, double bc1, double bc2, double gradient_multiplier);
  std::vector<Var> params_;
  std::vector<ScaledTensor> m_, v_;
  std::vector<EncodedState> m_codes_, v_codes_;  // unscaled parameters when encodes_state()
  std::vector<double> lr_scale_;
  std::vector<bool> decay_;
  std::vector<double> decay_scale_;
  AdamWConfig c_;
  int64_t t_ = 0;
};

// Plain SGD: p -= lr * grad (scaled parameters keep their scale), then clears gradients. lr must be
// finite and >= 0.
void sgd_step(const std::vector<Var>& params, double lr);

}  // namespace scalify::optim
