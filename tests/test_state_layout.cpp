// The code layout of each optimizer-state format (optim/state_layout.hpp): the name `inspect`
// judges a moment by, its range, and the dtype checkpoints label its codes with. The unsigned
// layouts' ranges are worked out here from their bit fields (4 exponent bits, bias 7, 4 mantissa
// bits, top code NaN; 5 exponent bits, bias 15, 3 mantissa bits, IEEE specials).
#include <gtest/gtest.h>

#include <cmath>

#include "scalify/optim/state_layout.hpp"

namespace scalify::optim {
namespace {

TEST(StateLayout, EachFormatNamesItsOwnLayoutAndRange) {
  struct Want {
    StateFormat f;
    const char* name;
    DType file_dtype;
    double min_subnormal, min_normal, max;
  };
  const StateScaling tensor = StateScaling::per_tensor, group = StateScaling::per_group;
  const Want wants[] = {
      {{.storage = Format::e4m3, .scaling = tensor}, "e4m3", DType::e4m3, std::ldexp(1, -9), std::ldexp(1, -6), 448},
      {{.storage = Format::e5m2, .scaling = group}, "e5m2", DType::e5m2, std::ldexp(1, -16), std::ldexp(1, -14), 57344},
      // 0b1111'1110: 2^(15 - 7) x (1 + 14/16); the smallest code 2^(1 - 7) x 1/16.
      {{.storage = Format::e4m3, .scaling = group, .non_negative = true},
       "e4m4 (unsigned)",
       DType::u8,
       std::ldexp(1, -10),
       std::ldexp(1, -6),
       480},
      // 0b11110'111: 2^(30 - 15) x (1 + 7/8); the smallest code 2^(1 - 15) x 1/8.
      {{.storage = Format::e5m2, .scaling = tensor, .non_negative = true},
       "e5m3 (unsigned)",
       DType::u8,
       std::ldexp(1, -17),
       std::ldexp(1, -14),
       61440},
      // 16-bit codes keep their IEEE layout, signed or not.
      {{.storage = Format::f16, .scaling = tensor, .non_negative = true},
       "f16 scaled",
       DType::f16,
       std::ldexp(1, -24),
       std::ldexp(1, -14),
       65504},
      {{.storage = Format::bf16}, "bf16", DType::bf16, std::ldexp(1, -133), std::ldexp(1, -126), 0x1.fep127},
  };
  for (const Want& w : wants) {
    const StateLayout l = state_layout(w.f);
    EXPECT_EQ(l.name, w.name);
    EXPECT_EQ(l.file_dtype, w.file_dtype) << w.name;
    EXPECT_EQ(l.min_subnormal, w.min_subnormal) << w.name;
    EXPECT_EQ(l.min_normal, w.min_normal) << w.name;
    EXPECT_EQ(l.max, w.max) << w.name;
  }
}

}  // namespace
}  // namespace scalify::optim
