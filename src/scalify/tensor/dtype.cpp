#include "scalify/tensor/dtype.hpp"

#include <array>

#include "scalify/error.hpp"

namespace scalify {

namespace {
struct DTypeRow {
  DType dtype;
  std::string_view name;
  int size;
  std::optional<Format> format;
};
constexpr std::array<DTypeRow, 16> kDTypes{{
    {DType::f32, "f32", 4, Format::f32},
    {DType::f64, "f64", 8, std::nullopt},
    {DType::f16, "f16", 2, Format::f16},
    {DType::bf16, "bf16", 2, Format::bf16},
    {DType::e4m3, "e4m3", 1, Format::e4m3},
    {DType::e5m2, "e5m2", 1, Format::e5m2},
    {DType::e4m3fnuz, "e4m3fnuz", 1, Format::e4m3fnuz},
    {DType::e5m2fnuz, "e5m2fnuz", 1, Format::e5m2fnuz},
    {DType::e4m3b11fnuz, "e4m3b11fnuz", 1, Format::e4m3b11fnuz},
    {DType::e8m0, "e8m0", 1, Format::e8m0},
    {DType::e2m3, "e2m3", 1, Format::e2m3},
    {DType::e3m2, "e3m2", 1, Format::e3m2},
    {DType::e2m1, "e2m1", 1, Format::e2m1},
    {DType::i32, "i32", 4, std::nullopt},
    {DType::i64, "i64", 8, std::nullopt},
    {DType::u8, "u8", 1, std::nullopt},
}};
// row() indexes the table by the enum: every dtype has its row, in the enum's order.
constexpr bool dtypes_in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  return kDTypes.size() == static_cast<size_t>(DType::u8) + 1;
}
static_assert(dtypes_in_enum_order(), "kDTypes must hold one row per DType, in the enum's order");
const DTypeRow& row(DType t) { return kDTypes[static_cast<size_t>(t)]; }
}  // namespace

std::optional<Format> dtype_format(DType t) { return row(t).format; }
int dtype_size(DType t) { return row(t).size; }
std::string_view dtype_name(DType t) { return row(t).name; }

DType dtype_of(Format f) {
  for (const DTypeRow& r : kDTypes)
    if (r.format == f) return r.dtype;
  throw Error("format " + std::string(format_name(f)) + " has no tensor dtype");
}

DType parse_dtype(std::string_view name) {
  for (const DTypeRow& r : kDTypes)
    if (r.name == name) return r.dtype;
  if (name == "f64" || name == "float64" || name == "double") return DType::f64;
  if (name == "int32") return DType::i32;
  if (name == "int64") return DType::i64;
  try {
    return dtype_of(parse_format(name));  // accepts the format aliases (fp8_e4m3fn, bfloat16, ...)
  } catch (const Error&) {
    std::string valid;
    for (const DTypeRow& r : kDTypes) valid += (valid.empty() ? "" : ", ") + std::string(r.name);
    throw Error("unknown dtype '" + std::string(name) + "'; valid dtypes: " + valid);
  }
}

}  // namespace scalify
