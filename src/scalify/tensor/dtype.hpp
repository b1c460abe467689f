#pragma once
// Element types of tensors: every number format of formats/ (stored for real: one byte per FP8
// element), plus f64 (for gradient checks) and integer indices.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "scalify/formats/format.hpp"

namespace scalify {

enum class DType : uint8_t {
  f32,
  f64,
  f16,
  bf16,
  e4m3,
  e5m2,
  e4m3fnuz,
  e5m2fnuz,
  e4m3b11fnuz,
  e8m0,
  e2m3,
  e3m2,
  e2m1,
  i32,
  i64,
  u8,  // raw bytes: codes whose layout no other dtype names (a non-negative moment's E4M4 / E5M3)
};

// The number format a floating dtype is stored in (none for f64 and the integer types).
std::optional<Format> dtype_format(DType t);
DType dtype_of(Format f);
int dtype_size(DType t);
std::string_view dtype_name(DType t);
DType parse_dtype(std::string_view name);  // throws scalify::Error listing the valid names
inline bool is_integer(DType t) { return t == DType::i32 || t == DType::i64 || t == DType::u8; }

}  // namespace scalify
