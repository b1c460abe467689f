#pragma once
// Loss scaling (SPEC §6), the baseline SCALIFY replaces. Static: multiply the loss by S and divide
// the gradients by S before the update. Dynamic: start at 2^15; on any inf/NaN gradient halve S
// and skip the step; double S after `growth_interval` clean steps in a row.
#include <cstdint>
#include <vector>

#include "scalify/autograd/var.hpp"

namespace scalify::quant {

struct LossScalerConfig {
  enum class Kind : uint8_t { none, fixed, dynamic } kind = Kind::dynamic;
  double scale = 32768.0;  // the static scale, or the dynamic one's start (2^15)
  int growth_interval = 2000;
  double backoff = 0.5, growth = 2.0;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config = {});
  Var scale_loss(const Var& loss) const;  // loss * S
  // Divides every parameter gradient by S. Returns false when a gradient is inf/NaN: then the
  // gradients are cleared and the optimizer step must be skipped (dynamic: S is halved).
  bool unscale(const std::vector<Var>& params);
  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }
  int64_t steps() const { return steps_; }
  struct State {
    double scale;
    int64_t skipped, steps, clean;
  };
  State state() const { return {scale_, skipped_, steps_, clean_}; }
  void load_state(const State& s);  // for checkpoints; throws on a non-positive scale

 private:
  LossScalerConfig c_;
  double scale_;
  int64_t skipped_ = 0, steps_ = 0, clean_ = 0;
};

}  // namespace scalify::quant
