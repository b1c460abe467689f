#pragma once
// The layout of a state format's codes (optim/state_format.hpp), named and bounded: what
// `scalify inspect` judges a moment's code values against, and the dtype a checkpoint labels its
// code bytes with. A non-negative moment's 8-bit codes are unsigned E4M4 / E5M3 (the sign bit
// spent on mantissa, the bias kept): no safetensors dtype names them, so they are raw bytes (U8)
// and the checkpoint's state-format metadata says what they hold.
#include <string>

#include "scalify/optim/state_format.hpp"
#include "scalify/tensor/dtype.hpp"

namespace scalify::optim {

struct StateLayout {
  std::string name;  // f32, bf16, f16 scaled, e4m3, e5m2, e4m4 (unsigned), e5m3 (unsigned)
  DType file_dtype;  // the codes' dtype in a checkpoint: the storage's, u8 for the unsigned layouts
  // The code values' range (before the scale): smallest subnormal, smallest normal, largest finite.
  double min_subnormal, min_normal, max;
};

StateLayout state_layout(const StateFormat& f);

// The bytes a moment in format f holds per value, for large tensors: its code, and per group the
// f32 scale (and the expansion's k and centre); a per-tensor scale counts as nothing.
double state_bytes_per_value(const StateFormat& f);

}  // namespace scalify::optim
