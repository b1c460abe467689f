#include "scalify/optim/state_layout.hpp"

namespace scalify::optim {

StateLayout state_layout(const StateFormat& f) {
  const bool unsigned_codes = f.non_negative && dtype_size(dtype_of(f.storage)) == 1;  // 8-bit codes
  StateLayout l{std::string(format_name(f.storage)), dtype_of(f.storage), min_subnormal(f.storage), min_normal(f.storage),
                double(state_code_max(f))};
  if (f.storage == Format::f16) l.name = "f16 scaled";
  if (unsigned_codes) {
    // One more mantissa bit, the same bias: the same smallest normal, half the smallest subnormal.
    l.name = f.storage == Format::e4m3 ? "e4m4 (unsigned)" : "e5m3 (unsigned)";
    l.file_dtype = DType::u8;
    l.min_subnormal /= 2;
  }
  return l;
}

double state_bytes_per_value(const StateFormat& f) {
  const double per_group = f.scaling == StateScaling::per_group ? (f.expand ? 3 : 1) * 4.0 / double(f.group_size) : 0;
  return info(f.storage).storage_bytes() + per_group;
}

}  // namespace scalify::optim
