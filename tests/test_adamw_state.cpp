// AdamW with low-precision moments (optim/state_format) and master weights: one update from the
// decoded moments equals the f64 update the test computes itself to f32 rounding; the new moments
// are the encodings of the f64 ones; the fused step equals its reference bit for bit and updates
// the codes in place; stochastically rounded bf16 master weights land on a neighbour.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "scalify/error.hpp"
#include "scalify/formats/kernels.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/optim/fused_encoded_step.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::optim {
namespace {

std::vector<float> decoded(const EncodedState& s, const StateFormat& f) {
  std::vector<float> out(size_t(s.numel));
  decode_state(s, f, out);
  return out;
}

TEST(AdamWState, Fp8MomentsUpdateEqualsTheF64Reference) {
  const StateFormat e4m3_tensor{.storage = Format::e4m3, .scaling = StateScaling::per_tensor};
  const StateFormat e4m3_group_expand{.storage = Format::e4m3, .scaling = StateScaling::per_group, .expand = true};
  const StateFormat f16_tensor_nonneg{.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true};
  const StateFormat e4m3_group_expand_nonneg{
      .storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true, .expand = true};
  for (const auto& [mf, vf] : {std::pair{e4m3_tensor, f16_tensor_nonneg}, std::pair{e4m3_group_expand, e4m3_group_expand_nonneg}}) {
    AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    c.m_format = mf;
    c.v_format = vf;
    std::vector<Var> params = {Var(Tensor::randn({300}, 1), true), Var(Tensor::randn({7, 5}, 2), true)};
    AdamW opt(params, c, {1.0, 0.5}, {true, false});
    ASSERT_TRUE(opt.encodes_state());
    for (int t = 1; t <= 3; ++t) {
      const double multiplier = t == 2 ? 0.25 : 1.0;
      std::vector<std::vector<double>> want_w, want_m, want_v, want_step;
      for (size_t k = 0; k < params.size(); ++k) {
        const Tensor g = Tensor::randn(params[k].shape(), 10 * t + int(k));
        params[k].set_grad(ScaledTensor(g));
        const std::vector<double> gv = g.to_vector(), w = params[k].value().to_vector();
        const std::vector<float> m = decoded(opt.encoded_first_moment(k), mf), v = decoded(opt.encoded_second_moment(k), vf);
        const double lr = c.lr * (k == 0 ? 1.0 : 0.5), wd = k == 0 ? c.weight_decay : 0.0;
        want_w.emplace_back(w.size());
        want_m.emplace_back(w.size());
        want_v.emplace_back(w.size());
        want_step.emplace_back(w.size());
        for (size_t i = 0; i < w.size(); ++i) {
          const double gi = gv[i] * multiplier;
          const double mi = c.beta1 * m[i] + (1 - c.beta1) * gi, vi = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
          const double mhat = mi / (1 - std::pow(c.beta1, t)), vhat = vi / (1 - std::pow(c.beta2, t));
          want_step[k][i] = lr * (mhat / (std::sqrt(vhat) + c.eps) + wd * w[i]);
          want_w[k][i] = w[i] - want_step[k][i];
          want_m[k][i] = mi;
          want_v[k][i] = vi;
        }
      }
      opt.step(multiplier);
      for (size_t k = 0; k < params.size(); ++k) {
        const std::vector<double> got = params[k].value().to_vector();
        // The step's f32 arithmetic (the f32-state step's) rounds where the reference is f64: the
        // new weight is within one f32 ulp of want plus 8 x 2^-24 of the step lr x update (the
        // roundings of m, v, sqrt, the quotient and the products; measured: at most 6.6).
        for (size_t i = 0; i < got.size(); ++i) {
          const float want = float(want_w[k][i]);
          const double ulp = std::nextafter(std::fabs(want), INFINITY) - std::fabs(want);
          ASSERT_LE(std::fabs(got[i] - want_w[k][i]), ulp + 8 * std::fabs(want_step[k][i]) * 0x1p-24)
              << "step " << t << " parameter " << k << " element " << i;
        }
        // The stored moments encode the f64 ones rounded to f32 (the encoders are tested in
        // test_state_format): the f32 update's moments could land one f32 ulp across a code's
        // rounding boundary, but on these 335 elements x 3 steps none does.
        std::vector<float> m32(want_m[k].begin(), want_m[k].end()), v32(want_v[k].begin(), want_v[k].end());
        EXPECT_EQ(opt.encoded_first_moment(k).codes, encode_state(m32, mf).codes) << "step " << t << " parameter " << k;
        EXPECT_EQ(opt.encoded_second_moment(k).codes, encode_state(v32, vf).codes) << "step " << t << " parameter " << k;
      }
    }
    EXPECT_EQ(opt.state_bytes(0), opt.encoded_first_moment(0).bytes() + opt.encoded_second_moment(0).bytes());
  }
}

// The fused step (chunks of whole groups, two passes for per-tensor scales) against the reference
// that decodes and encodes whole tensors: the same codes, scales, expansions and weights, on
// parameters of several chunks and odd lengths, groups that do not divide a chunk, stochastic rounding.
TEST(AdamWState, FusedEncodedStepEqualsTheReference) {
  using F = StateFormat;
  const F e4m3_tensor{.storage = Format::e4m3, .scaling = StateScaling::per_tensor};
  const F f16_tensor_nonneg{.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true};
  const F e4m3_group_expand{.storage = Format::e4m3, .scaling = StateScaling::per_group, .expand = true};
  const F e4m3_group_expand_nonneg{.storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true, .expand = true};
  const F e5m2_group100_sr{
      .storage = Format::e5m2, .scaling = StateScaling::per_group, .group_size = 100, .rounding = Rounding::stochastic};
  const F e4m3_group128_nonneg{.storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true};
  const F bf16_sr{.storage = Format::bf16, .rounding = Rounding::stochastic};
  const F f16_tensor_sr{.storage = Format::f16, .scaling = StateScaling::per_tensor, .rounding = Rounding::stochastic};
  // Formats the fused pass takes (fused_encoded_step.hpp) where the CPU has AVX2.
  const F e4m3_group128{.storage = Format::e4m3, .scaling = StateScaling::per_group};
  const F e5m2_group32{.storage = Format::e5m2, .scaling = StateScaling::per_group, .group_size = 32};
  const F f16_group32_nonneg{.storage = Format::f16, .scaling = StateScaling::per_group, .group_size = 32, .non_negative = true};
  const F e5m2_group48_nonneg{.storage = Format::e5m2, .scaling = StateScaling::per_group, .group_size = 48, .non_negative = true};
  const F e5m2_tensor{.storage = Format::e5m2, .scaling = StateScaling::per_tensor};
  const F e4m3_tensor_nonneg{.storage = Format::e4m3, .scaling = StateScaling::per_tensor, .non_negative = true};
  for (const auto& [mf, vf] :
       {std::pair{e4m3_tensor, f16_tensor_nonneg}, std::pair{e4m3_group_expand, e4m3_group_expand_nonneg},
        std::pair{e5m2_group100_sr, e4m3_group128_nonneg}, std::pair{bf16_sr, F{}}, std::pair{f16_tensor_sr, e4m3_group_expand_nonneg},
        std::pair{e4m3_group128, e4m3_group128_nonneg}, std::pair{e5m2_group32, f16_group32_nonneg},
        std::pair{e4m3_tensor, e5m2_group48_nonneg}, std::pair{e5m2_tensor, e4m3_tensor_nonneg}})
    for (const bool scaled_masters :
         {false, true}) {  // the weights in f32, or MS-AMP's scaled f16 masters (the fused pass reads them itself)
      AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .scaled_masters = scaled_masters};
      c.m_format = mf;
      c.v_format = vf;
      AdamWConfig ref_c = c;
      ref_c.fused = false;
      const std::vector<Shape> shapes = {{20000}, {300}, {7, 5}, {1}};
      std::vector<Var> fast_p, ref_p;
      for (size_t k = 0; k < shapes.size(); ++k) {
        const Tensor w = Tensor::randn(shapes[k], 1 + int(k));
        fast_p.emplace_back(scaled_masters ? store_scaled_master(w, DType::f16) : ScaledTensor(w), true);
        ref_p.emplace_back(scaled_masters ? store_scaled_master(w, DType::f16) : ScaledTensor(w), true);
      }
      AdamW fast(fast_p, c, {1.0, 0.5, 1.0, 2.0}, {true, false, true, true}, {1.0, 1.0, 0.5, 1.0});
      AdamW ref(ref_p, ref_c, {1.0, 0.5, 1.0, 2.0}, {true, false, true, true}, {1.0, 1.0, 0.5, 1.0});
      for (int t = 1; t <= 3; ++t) {
        for (size_t k = 0; k < shapes.size(); ++k) {
          // Parameter 2's moments are so small (f32 subnormals) that a per-tensor scale is past 2^127 (beyond the
          // fused encoder's reach); parameter 1's first 128 gradients are 0 (zero groups).
          std::vector<double> gv = ops::scale_shift(Tensor::randn(shapes[k], 10 * t + int(k)),
                                                    k == 0   ? 1e-3
                                                    : k == 2 ? 1e-38
                                                             : 1.0,
                                                    0.0)
                                       .to_vector();
          if (k == 1) std::fill(gv.begin(), gv.begin() + 128, 0.0);
          const Tensor g = Tensor::from_vector(std::vector<float>(gv.begin(), gv.end()), shapes[k]);
          fast_p[k].set_grad(ScaledTensor(g));
          ref_p[k].set_grad(ScaledTensor(g));
        }
        fast.step(t == 2 ? 0.25 : 1.0);
        ref.step(t == 2 ? 0.25 : 1.0);
        for (size_t k = 0; k < shapes.size(); ++k) {
          const std::string where =
              "step " + std::to_string(t) + " parameter " + std::to_string(k) + (scaled_masters ? " (scaled masters)" : "");
          for (const auto& [a, b] : {std::pair{&fast.encoded_first_moment(k), &ref.encoded_first_moment(k)},
                                     std::pair{&fast.encoded_second_moment(k), &ref.encoded_second_moment(k)}}) {
            ASSERT_EQ(a->codes, b->codes) << where;
            ASSERT_EQ(a->scales, b->scales) << where;
            ASSERT_EQ(a->expand_k, b->expand_k) << where;
            ASSERT_EQ(a->centre, b->centre) << where;
          }
          ASSERT_EQ(fast_p[k].value().to_vector(), ref_p[k].value().to_vector()) << where;
        }
      }
    }
}

// The fused step against the reference on random cases of what the fixed ones above do not pin
// together: the formats the fused pass takes, group sizes 16..2048, parameters of 1 element, odd
// tails and several chunks, f32 weights beside scaled f16 masters (subnormal ones too), eps below
// f32's range, per-tensor exponents past the fused encoder's reach, saturated moments, lr_scale 0,
// no decay, and after the first step any codes (NaN, infinities, subnormals) and power-of-two
// scales down to 2^-149. Both steps throw the same error or give the same bits.
TEST(AdamWState, FusedEncodedStepEqualsTheReferenceOnRandomCases) {
  using F = StateFormat;
  std::mt19937 rng(48);
  auto pick = [&]<class T>(std::initializer_list<T> xs) { return xs.begin()[rng() % xs.size()]; };
  auto bits = [](const auto& x) {  // f32 values' bits: NaNs compare
    std::vector<uint32_t> b;
    for (double v : x) b.push_back(std::bit_cast<uint32_t>(float(v)));
    return b;
  };
  for (int n = 0; n < 150; ++n) {
    const int64_t group = pick({16, 32, 48, 2048});
    const F mf{.storage = pick({Format::e4m3, Format::e5m2, Format::f16}),
               .scaling = pick({StateScaling::per_tensor, StateScaling::per_group}),
               .group_size = group};
    const F vf{.storage = pick({Format::e4m3, Format::e5m2, Format::f16}),
               .scaling = pick({StateScaling::per_tensor, StateScaling::per_group}),
               .group_size = group,
               .non_negative = pick({true, false})};
    AdamWConfig c{.lr = 1e-2, .eps = pick({1e-8, 1e-50}), .weight_decay = 0.1, .scaled_masters = true};
    c.m_format = mf;
    c.v_format = vf;
    AdamWConfig ref_c = c;
    ref_c.fused = false;
    std::vector<Shape> shapes(rng() % 3 + 1);
    std::vector<Var> fast_p, ref_p;
    for (Shape& shape : shapes) {
      shape = {pick({int64_t(1), int64_t(15), int64_t(17), int64_t(2049), int64_t(8193)})};
      const Tensor w = ops::scale_shift(Tensor::randn(shape, rng()), pick({1.0, 1e-44}), 0.0);
      const bool master = pick({true, false});
      fast_p.emplace_back(master ? store_scaled_master(w, DType::f16) : ScaledTensor(w), true);
      ref_p.emplace_back(master ? store_scaled_master(w, DType::f16) : ScaledTensor(w), true);
    }
    const std::vector<double> lr_scale(shapes.size(), pick({1.0, 0.0}));
    const std::vector<bool> decay(shapes.size(), pick({true, false}));
    AdamW fast(fast_p, c, lr_scale, decay), ref(ref_p, ref_c, lr_scale, decay);
    // An eps of 0 in f32 makes a zero or underflowing v's weight NaN (in both): with it, gradients of 1.
    const bool tiny_eps = c.eps < 1e-45;
    const double gradient_scale = tiny_eps ? 1.0 : pick({1.0, 1e-30, 1e-38, 1e34});
    const bool tamper = pick({true, false});
    const std::string where = "case " + std::to_string(n);
    for (int t = 1; t <= 3; ++t) {
      if (t == 2 && tamper) {  // any codes and scales, as a checkpoint may hold them
        std::vector<EncodedState> m, v;
        for (size_t k = 0; k < shapes.size(); ++k) {
          m.push_back(fast.encoded_first_moment(k));
          v.push_back(fast.encoded_second_moment(k));
          for (EncodedState* s : {&m.back(), &v.back()}) {
            for (std::byte& b : s->codes) b = std::byte(rng());
            for (float& scale : s->scales) scale = std::ldexp(1.0f, -int(rng() % 150));
          }
          if (vf.non_negative && vf.storage == Format::f16)  // load refuses negative ones
            for (size_t i = 1; i < v.back().codes.size(); i += 2) v.back().codes[i] &= std::byte(0x7F);
        }
        fast.load_encoded_state(1, m, v);
        ref.load_encoded_state(1, m, v);
      }
      for (size_t k = 0; k < shapes.size(); ++k) {
        std::vector<double> gv = ops::scale_shift(Tensor::randn(shapes[k], rng()), gradient_scale, 0.0).to_vector();
        if (!tiny_eps) std::fill(gv.begin(), gv.begin() + int64_t(gv.size()) / 2, 0.0);  // zero groups
        const Tensor g = Tensor::from_vector(std::vector<float>(gv.begin(), gv.end()), shapes[k]);
        fast_p[k].set_grad(ScaledTensor(g));
        ref_p[k].set_grad(ScaledTensor(g));
      }
      const std::string fast_error = testing::error_of([&] { fast.step(); }), ref_error = testing::error_of([&] { ref.step(); });
      ASSERT_EQ(fast_error, ref_error) << where << " step " << t;
      if (fast_error != "(no error)") break;  // a tampered state's NaN weights, refused by a scaled master
      for (size_t k = 0; k < shapes.size(); ++k) {
        const std::string at = where + " step " + std::to_string(t) + " parameter " + std::to_string(k);
        for (const auto& [a, b] : {std::pair{&fast.encoded_first_moment(k), &ref.encoded_first_moment(k)},
                                   std::pair{&fast.encoded_second_moment(k), &ref.encoded_second_moment(k)}}) {
          ASSERT_EQ(a->codes, b->codes) << at;
          ASSERT_EQ(bits(a->scales), bits(b->scales)) << at;
        }
        ASSERT_EQ(bits(fast_p[k].scaled().data.to_vector()), bits(ref_p[k].scaled().data.to_vector())) << at;
        ASSERT_EQ(fast_p[k].scaled().scalar_scale(), ref_p[k].scaled().scalar_scale()) << at;
      }
    }
  }
}

// The fused pass (checked against the reference above) takes the presets' FP8 and f16 moments
// where the format kernels run AVX2 or AVX-512, and nothing else: not the expansion, stochastic
// rounding, bf16, unequal or odd group sizes.
TEST(AdamWState, TheFusedPassTakesTheFormatsItEncodes) {
  const bool vector = kernels::active_isa() != kernels::Isa::scalar;
  for (const char* name : {"msamp_o2", "fp8_adam_no_expansion"}) {
    const AdamWConfig c = quant::optimizer_config(quant::preset(name), {});
    EXPECT_EQ(fused_step_applies(c.m_format, c.v_format), vector) << name;
  }
  const AdamWConfig coat = quant::optimizer_config(quant::preset("coat"), {});
  EXPECT_FALSE(fused_step_applies(coat.m_format, coat.v_format));
  using F = StateFormat;
  const F group128{.storage = Format::e4m3, .scaling = StateScaling::per_group};
  for (const F& other :
       {F{.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = 64},
        F{.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = 100},
        F{.storage = Format::e4m3, .scaling = StateScaling::per_group, .rounding = Rounding::stochastic}, F{.storage = Format::bf16}})
    EXPECT_FALSE(fused_step_applies(group128, other)) << format_name(other.storage) << " group " << other.group_size;
  EXPECT_FALSE(
      fused_step_applies(F{.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = kMaxFusedGroup + 16}, group128));
}

// The lanes past a parameter's end in the fused pass's last vector count in no amax: with an eps
// below f32's smallest subnormal (valid, > 0; 0 in the f32 update) their 0 / (sqrt(0) + 0) was a
// NaN that became the new weights' amax, so the step of a scaled f16 master of 17 elements threw
// "the weights are not finite" where the reference steps.
TEST(AdamWState, TheFusedPassTailCountsOnlyTheParametersElements) {
  const AdamWConfig preset = quant::optimizer_config(quant::preset("msamp_o2"), {});
  AdamWConfig c{.lr = 1e-2, .eps = 1e-50, .weight_decay = 0.1, .scaled_masters = true};
  c.m_format = preset.m_format;
  c.v_format = preset.v_format;
  AdamWConfig ref_c = c;
  ref_c.fused = false;
  const Tensor w = Tensor::randn({17}, 3), g = Tensor::randn({17}, 4);
  Var a(store_scaled_master(w, DType::f16), true), b(store_scaled_master(w, DType::f16), true);
  AdamW fused({a}, c), reference({b}, ref_c);
  a.set_grad(ScaledTensor(g));
  b.set_grad(ScaledTensor(g));
  ASSERT_NO_THROW(reference.step());
  ASSERT_NO_THROW(fused.step());
  EXPECT_EQ(a.scaled().scalar_scale(), b.scaled().scalar_scale());
  EXPECT_EQ(a.value().to_vector(), b.value().to_vector());
  EXPECT_EQ(fused.encoded_first_moment(0).codes, reference.encoded_first_moment(0).codes);
  EXPECT_EQ(fused.encoded_second_moment(0).codes, reference.encoded_second_moment(0).codes);
}

// A non-negative f16 second moment's codes carry no sign (the encoders drop it): a loaded state
// with a negative one is refused, naming the parameter and element. It used to load, and the
// fused step took the negative v (sqrt: NaN weights, stored) where the reference threw on encoding it.
TEST(AdamWState, LoadRefusesANegativeCodeInANonNegativeMoment) {
  AdamWConfig c{.lr = 1e-2};
  c.m_format = {.storage = Format::e4m3, .scaling = StateScaling::per_tensor};
  c.v_format = {.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true};
  Var a(Tensor::randn({20}, 1), true), b(Tensor::randn({3}, 2), true);
  AdamW opt({a, b}, c);
  std::vector<EncodedState> m = {opt.encoded_first_moment(0), opt.encoded_first_moment(1)};
  std::vector<EncodedState> v = {opt.encoded_second_moment(0), opt.encoded_second_moment(1)};
  v[1].codes[2 * 2 + 1] = std::byte(0x80);  // element 2: -0, which the decode reads as 0, loads
  EXPECT_NO_THROW(opt.load_encoded_state(1, m, v));
  v[1].codes[2 * 2] = std::byte(0x01);  // -2^-24
  EXPECT_ERROR(opt.load_encoded_state(1, m, v), "parameter 1's second moment holds a negative code at element 2");
}

// A gradient whose (1 - beta2) g g overflows f32 (|g| > ~6e20 at beta2 0.999) makes v infinite, which no code
// holds: the encoded step saturates the moments at 2^127 instead of raising
// (it used to raise after some parameters' codes were rewritten). Every moment and weight stays
// finite, the huge element's v decodes to at least 1e38, and fused equals the reference.
// A model past 2^24 elements steps in batches of whole parameters (AdamW::step_batches): every
// parameter is updated once, exactly as by an optimizer of its own, in f32 and encoded state.
TEST(AdamWState, BatchedStepsUpdateEveryParameterOnceAsAlone) {
  const std::vector<int64_t> sizes = {9 << 20, 7, 9 << 20, 5};  // batches {0, 1}, {2, 3}
  auto values = [](int64_t n, uint64_t seed) {                  // cheap pseudo-random values in [-1, 1)
    std::vector<float> v(size_t(n), 0.0f);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 2654435761u + seed * 40503u) % 2048) / 1024.0f - 1.0f;
    return Tensor::from_vector(v, {n});
  };
  for (const bool encoded : {false, true}) {
    AdamWConfig c{.lr = 1e-2, .weight_decay = 0.1};
    if (encoded) {
      c.m_format = {.storage = Format::e4m3, .scaling = StateScaling::per_group};
      c.v_format = {.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true};
    }
    std::vector<Var> all, alone;
    for (size_t k = 0; k < sizes.size(); ++k) {
      all.emplace_back(values(sizes[k], k), true);
      alone.emplace_back(values(sizes[k], k), true);
    }
    AdamW together(all, c);
    std::vector<AdamW> each;
    for (const Var& p : alone) each.emplace_back(std::vector<Var>{p}, c);
    for (uint64_t step = 0; step < 2; ++step) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        all[k].set_grad(ScaledTensor(values(sizes[k], 10 * k + step + 7)));
        alone[k].set_grad(ScaledTensor(values(sizes[k], 10 * k + step + 7)));
        each[k].step();
      }
      together.step();
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Tensor a = all[k].value(), b = alone[k].value(), start = values(sizes[k], k);
      EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), size_t(a.numel()) * 4), 0)
          << "parameter " << k << (encoded ? " encoded" : "");
      EXPECT_NE(std::memcmp(a.data<float>(), start.data<float>(), size_t(a.numel()) * 4), 0) << "parameter " << k << " was not updated";
    }
  }
}

// A group larger than every parameter is one piece as long as the parameter: the step's buffers
// are a chunk's at most (they were sized by the group: 2^30 elements aborted the process), and the
// codes are the reference's.
TEST(AdamWState, AGroupLargerThanTheParameterIsOnePiece) {
  AdamWConfig c{.lr = 1e-2};
  c.m_format = {.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = int64_t(1) << 30};
  c.v_format = {.storage = Format::e4m3, .scaling = StateScaling::per_group, .group_size = (int64_t(1) << 30) - 3, .non_negative = true};
  AdamWConfig ref = c;
  ref.fused = false;
  Var a(Tensor::randn({3000}, 1), true), b(Tensor::randn({3000}, 1), true);
  AdamW fused({a}, c), reference({b}, ref);
  for (uint64_t step = 0; step < 2; ++step) {
    a.set_grad(ScaledTensor(Tensor::randn({3000}, 5 + step)));
    b.set_grad(ScaledTensor(Tensor::randn({3000}, 5 + step)));
    fused.step();
    reference.step();
  }
  EXPECT_EQ(fused.encoded_first_moment(0).codes, reference.encoded_first_moment(0).codes);
  EXPECT_EQ(fused.encoded_second_moment(0).codes, reference.encoded_second_moment(0).codes);
  EXPECT_EQ(a.value().to_vector(), b.value().to_vector());
}

// Scaled masters of small weights and in bf16: the scale stops at 2^127 (the largest an f32 scale
// holds; 2^-e with e up to 149 overflowed to inf and the store threw), and the value is the
// weight rounded to the storage (power-of-two scales: exact), computed here by the bits.
TEST(AdamWState, ScaledMastersOfSmallWeightsAndInBf16) {
  auto bf16_nearest = [](float x) {
    const uint32_t b = std::bit_cast<uint32_t>(x);
    return std::bit_cast<float>((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
  };
  for (const float v : {0.1f, 1e-3f}) {
    const ScaledTensor m = store_scaled_master(Tensor::from_vector(std::vector<float>{v, -v / 3}, {2}), DType::bf16);
    EXPECT_EQ(m.data.dtype(), DType::bf16);
    EXPECT_EQ(m.scalar_scale(), 0x1p-127f) << v;
    const std::vector<double> back = m.value().to_vector();
    EXPECT_EQ(float(back[0]), bf16_nearest(v)) << v;
    EXPECT_EQ(float(back[1]), bf16_nearest(-v / 3)) << v;
  }
  const ScaledTensor tiny = store_scaled_master(Tensor::from_vector(std::vector<float>{1e-36f}, {1}), DType::f16);
  EXPECT_EQ(tiny.scalar_scale(), 0x1p-127f);
  EXPECT_NEAR(tiny.value().to_vector()[0], 1e-36, 1e-36 * 0x1p-10);  // f16 keeps 11 bits of 1e-36 x 2^127
}

TEST(AdamWState, AHugeGradientSaturatesTheMomentsInsteadOfRaising) {
  using F = StateFormat;
  const F e4m3_tensor{.storage = Format::e4m3, .scaling = StateScaling::per_tensor};
  const F f16_tensor_nonneg{.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true};
  const F e4m3_group{.storage = Format::e4m3, .scaling = StateScaling::per_group};
  const F e4m3_group_nonneg{.storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true};
  const F e4m3_group_expand{.storage = Format::e4m3, .scaling = StateScaling::per_group, .expand = true};
  const F e4m3_group_expand_nonneg{.storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true, .expand = true};
  for (const auto& [mf, vf] : {std::pair{e4m3_tensor, f16_tensor_nonneg}, std::pair{e4m3_group, e4m3_group_nonneg},
                               std::pair{e4m3_group_expand, e4m3_group_expand_nonneg}}) {
    AdamWConfig c{.lr = 1e-2};
    c.m_format = mf;
    c.v_format = vf;
    AdamWConfig ref_c = c;
    ref_c.fused = false;
    const std::vector<Shape> shapes = {{300}, {500}};
    std::vector<Var> fast_p, ref_p;
    for (size_t k = 0; k < shapes.size(); ++k) {
      fast_p.emplace_back(Tensor::randn(shapes[k], 1 + int(k)), true);
      ref_p.emplace_back(Tensor::randn(shapes[k], 1 + int(k)), true);
    }
    AdamW fast(fast_p, c), ref(ref_p, ref_c);
    for (size_t k = 0; k < shapes.size(); ++k) {
      std::vector<float> g;
      for (const double x : Tensor::randn(shapes[k], 7 + int(k)).to_vector()) g.push_back(float(x));
      if (k == 1) g[130] = 1e25f;
      fast_p[k].set_grad(ScaledTensor(Tensor::from_vector(g, shapes[k])));
      ref_p[k].set_grad(ScaledTensor(Tensor::from_vector(g, shapes[k])));
    }
    ASSERT_NO_THROW(fast.step());
    ASSERT_NO_THROW(ref.step());
    for (size_t k = 0; k < shapes.size(); ++k) {
      EXPECT_EQ(fast.encoded_first_moment(k).codes, ref.encoded_first_moment(k).codes);
      EXPECT_EQ(fast.encoded_second_moment(k).codes, ref.encoded_second_moment(k).codes);
      EXPECT_EQ(fast.encoded_second_moment(k).scales, ref.encoded_second_moment(k).scales);
      EXPECT_EQ(fast_p[k].value().to_vector(), ref_p[k].value().to_vector());
      const std::vector<float> m = decoded(fast.encoded_first_moment(k), mf), v = decoded(fast.encoded_second_moment(k), vf);
      const std::vector<double> w = fast_p[k].value().to_vector();
      for (size_t i = 0; i < m.size(); ++i) {
        ASSERT_TRUE(std::isfinite(m[i]) && std::isfinite(v[i]) && std::isfinite(w[i]))
            << "parameter " << k << " element " << i << ": m " << m[i] << " v " << v[i] << " w " << w[i];
      }
      if (k == 1) {
        EXPECT_GE(v[130], 1e38f);
      }
    }
  }
}

// The fused step writes the new codes into the state's own buffers: no allocation per step.
TEST(AdamWState, FusedStepUpdatesTheCodesInPlace) {
  AdamWConfig c{.lr = 1e-2};
  c.m_format = {.storage = Format::e4m3, .scaling = StateScaling::per_tensor};
  c.v_format = {.storage = Format::e4m3, .scaling = StateScaling::per_group, .non_negative = true, .expand = true};
  std::vector<Var> params = {Var(Tensor::randn({1000}, 1), true)};
  AdamW opt(params, c);
  const std::byte* m_codes = opt.encoded_first_moment(0).codes.data();
  const float* v_scales = opt.encoded_second_moment(0).scales.data();
  for (int t = 1; t <= 2; ++t) {
    params[0].set_grad(ScaledTensor(Tensor::randn({1000}, 2 + t)));
    opt.step();
    EXPECT_EQ(opt.encoded_first_moment(0).codes.data(), m_codes) << "step " << t;
    EXPECT_EQ(opt.encoded_second_moment(0).scales.data(), v_scales) << "step " << t;
  }
  EXPECT_NE(opt.encoded_first_moment(0).scales[0], 1.0f);  // the step did change the state
}

// bf16 master weights with stochastic rounding: each new weight is one of the two bf16 values
// around the f64 update, not always the nearest.
TEST(AdamWState, StochasticBf16MasterWeightsLandOnANeighbour) {
  AdamWConfig c{.lr = 1e-3};
  c.master_rounding = Rounding::stochastic;
  std::vector<Var> params = {Var(Tensor::randn({4096}, 3).to(DType::bf16), true)};
  AdamW opt(params, c);
  const Tensor g = Tensor::randn({4096}, 4);
  params[0].set_grad(ScaledTensor(g.to(DType::bf16)));
  const std::vector<double> w = params[0].value().to_vector(), gv = params[0].grad().to_vector();
  opt.step();
  ASSERT_EQ(params[0].value().dtype(), DType::bf16);
  const std::vector<double> got = params[0].value().to_vector();
  int not_nearest = 0, inexact = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double mhat = 0.1 * gv[i] / 0.1, vhat = 0.001 * gv[i] * gv[i] / 0.001;  // step 1: bias correction undoes (1 - beta)
    const double want = w[i] - c.lr * (mhat / (std::sqrt(vhat) + c.eps));
    // The bf16 neighbours of want: truncate its f32 bits to bf16, and the next bf16 up in magnitude.
    const float wf = float(want);
    const uint32_t bits = std::bit_cast<uint32_t>(wf) & 0xFFFF0000u;
    const double down = std::bit_cast<float>(bits), up = std::bit_cast<float>(bits + 0x10000u);
    ASSERT_TRUE(got[i] == down || got[i] == up) << i << ": " << want << " -> " << got[i];
    if (double(wf) != down) ++inexact;
    const double nearest = std::fabs(wf - down) <= std::fabs(up - wf) ? down : up;
    not_nearest += got[i] != nearest;
  }
  EXPECT_GT(inexact, 3000);
  EXPECT_GT(not_nearest, inexact / 10);
}

// f16's round to nearest even of x, computed here in double: 11 significant bits above 2^-14,
// the fixed quantum 2^-24 below (subnormals). |x| must stay below 65520 (no overflow here).
double f16_nearest(double x) {
  const int e = std::max(std::ilogb(std::fabs(x)), -14);
  const double quantum = std::ldexp(1.0, e - 10);
  return std::nearbyint(x / quantum) * quantum;  // the default rounding mode: ties to even
}

// MS-AMP's scaled f16 master weights (Recipe::linear_master_weight scaled_f16): the parameter is
// f16 data and one power-of-two scale; the update reads its represented value and the encoded
// moments (not SCALIFY's scaled state), and stores the new f32 weights at the scale 2^-e, e the
// largest exponent with amax x 2^e <= 65504 (MS-AMP's rule, margin 0). The test runs the same
// update on an f32 master holding the same represented values and encodes its result itself.
TEST(AdamWState, ScaledF16MasterStoresTheF32UpdateAtItsAmaxScale) {
  AdamWConfig c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  c.m_format = {.storage = Format::e4m3, .scaling = StateScaling::per_tensor};
  c.v_format = {.storage = Format::f16, .scaling = StateScaling::per_tensor, .non_negative = true};
  AdamWConfig scaled_config = c;
  scaled_config.scaled_masters = true;
  const Shape shape{33, 17};
  const int64_t n = numel_of(shape);
  // The starting master: N(0, 0.02) weights in f16 at scale 2^-20 (their amax x 2^20 fits f16).
  const Tensor w0 = ops::scale_shift(Tensor::randn(shape, 5), 0.02, 0.0);
  std::vector<float> data0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) data0[size_t(i)] = float(f16_nearest(std::ldexp(w0.to_vector()[size_t(i)], 20)));
  std::vector<Var> scaled = {Var(ScaledTensor(Tensor::from_vector(data0, shape).to(DType::f16), 0x1p-20f), true)};
  std::vector<Var> f32 = {Var(scaled[0].value(), true)};
  AdamW scaled_opt(scaled, scaled_config, {0.5}), f32_opt(f32, c, {0.5});
  ASSERT_EQ(scaled_opt.encoded_first_moment(0).numel, n) << "encoded moments, not SCALIFY's scaled state";
  for (int t = 1; t <= 3; ++t) {
    const Tensor g = ops::scale_shift(Tensor::randn(shape, uint64_t(10 + t)), 1e-3, 0.0);
    f32[0].set_value(scaled[0].value());  // the same represented weights before every step
    scaled[0].set_grad(ScaledTensor(g));
    f32[0].set_grad(ScaledTensor(g));
    scaled_opt.step();
    f32_opt.step();
    const std::vector<double> want = f32[0].value().to_vector();  // the f32 update
    double top = 0;
    for (double w : want) top = std::max(top, std::fabs(w));
    int e = 0;
    while (std::ldexp(top, e + 1) <= 65504.0) ++e;
    while (std::ldexp(top, e) > 65504.0) --e;
    const ScaledTensor& p = scaled[0].scaled();
    ASSERT_EQ(p.data.dtype(), DType::f16) << "step " << t;
    ASSERT_TRUE(p.has_single_scale()) << "step " << t;
    EXPECT_EQ(double(p.scalar_scale()), std::ldexp(1.0, -e)) << "step " << t;
    const std::vector<double> data = p.data.to_vector(), represented = scaled[0].value().to_vector();
    for (size_t i = 0; i < want.size(); ++i) {
      const double x = std::ldexp(want[i], e);
      ASSERT_EQ(data[i], f16_nearest(x)) << "step " << t << " element " << i;
      // The represented weight is the f32 update to within half an f16 step at this scale.
      const double half_step = std::ldexp(1.0, std::max(std::ilogb(std::fabs(x)), -14) - 11 - e);
      ASSERT_LE(std::fabs(represented[i] - want[i]), half_step) << "step " << t << " element " << i;
    }
    EXPECT_EQ(scaled_opt.state_bytes(0), f32_opt.state_bytes(0));
  }
  EXPECT_GT(scaled[0].scaled().scalar_scale(), 0x1p-20f) << "the scale followed the weights' amax";
}

// An all-zero master (a bias at initialisation) keeps scale 1; dtypes without a scale are refused.
TEST(AdamWState, ScaledMasterOfZerosAndBadDtypes) {
  const ScaledTensor z = store_scaled_master(Tensor::zeros({5}), DType::f16);
  EXPECT_EQ(z.scalar_scale(), 1.0f);
  EXPECT_EQ(z.data.dtype(), DType::f16);
  EXPECT_THROW(store_scaled_master(Tensor::zeros({5}), DType::f32), Error);
  EXPECT_THROW(store_scaled_master(Tensor::from_vector(std::vector<float>{1.0f, NAN}, Shape{2}), DType::f16), Error);
}

TEST(AdamWState, RejectsASignlessFirstMoment) {
  AdamWConfig c;
  c.m_format = {.storage = Format::e4m3, .scaling = StateScaling::per_tensor, .non_negative = true};
  EXPECT_THROW(AdamW({Var(Tensor::randn({4}, 1), true)}, c), Error);
}

}  // namespace
}  // namespace scalify::optim
