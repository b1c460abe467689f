// Data parallelism's pieces (train/data_parallel.hpp) on ranks simulated by threads: the
// low-precision gradient exchange against a reference built from the scalar format codec, the
// exchange in storage against accumulate_gradient, and the quantisers' per-step commit under
// MicroBatchScope. tests/data_parallel_test.sh runs the same under mpirun end to end.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "scalify/formats/scalar.hpp"
#include "scalify/quant/quantizer.hpp"
#include "scalify/tensor/ops.hpp"
#include "scalify/train/data_parallel.hpp"

namespace scalify::train {
namespace {

// N ranks as N threads: each collective publishes its buffer, waits for all, reads the others'.
class ThreadRanks {
 public:
  explicit ThreadRanks(int n) : n_(n), sync_(n), slots_(size_t(n)) {}
  class Rank final : public platform::World {
   public:
    Rank(ThreadRanks& all, int rank) : all_(all), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return all_.n_; }
    void allgather(const void* send, size_t bytes, void* recv) const override {
      exchange(send, [&](int r, const std::byte* their) { std::memcpy(static_cast<std::byte*>(recv) + size_t(r) * bytes, their, bytes); });
    }
    void alltoall(const void* send, size_t bytes, void* recv) const override {
      exchange(send, [&](int r, const std::byte* their) {
        std::memcpy(static_cast<std::byte*>(recv) + size_t(r) * bytes, their + size_t(rank_) * bytes, bytes);
      });
    }
    void max(std::vector<double>& values) const override {
      std::vector<double> out = values;
      exchange(values.data(), [&](int, const std::byte* their) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = std::max(out[i], reinterpret_cast<const double*>(their)[i]);
      });
      values = out;
    }
    void broadcast(std::string& text, int from) const override {
      std::string theirs;
      exchange(&text, [&](int r, const std::byte* their) {
        if (r == from) theirs = *reinterpret_cast<const std::string*>(their);
      });
      text = theirs;
    }
    [[noreturn]] void abort(int) const override { std::abort(); }

   private:
    void exchange(const void* mine, const std::function<void(int, const std::byte*)>& read) const {
      all_.slots_[size_t(rank_)] = static_cast<const std::byte*>(mine);
      all_.sync_.arrive_and_wait();
      for (int r = 0; r < all_.n_; ++r) read(r, all_.slots_[size_t(r)]);
      all_.sync_.arrive_and_wait();
    }
    ThreadRanks& all_;
    int rank_;
  };
  // Runs body(rank) on every rank at once.
  void run(const std::function<void(const platform::World&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r)
      threads.emplace_back([this, r, &body] {
        const Rank me(*this, r);
        body(me);
      });
    for (std::thread& t : threads) t.join();
  }

 private:
  int n_;
  std::barrier<> sync_;
  std::vector<const std::byte*> slots_;
};

// One gradient through the wire format with the shared power of two, by the scalar codec.
float through_wire(float x, float scale, Format f) { return decode(f, encode(f, x * scale)) / scale; }
float shared_power_of_two(double amax, Format f) {
  return amax > 0 ? std::ldexp(1.0f, std::ilogb(max_value(f) / amax)) : 1.0f;  // 2^floor(log2(max / amax))
}

TEST(DataParallel, LowPrecisionExchangeEqualsTheCastSumCastAgain) {
  const int ranks = 3;
  const Format wire = Format::e4m3;
  const int64_t n = 37;  // not a multiple of the ranks: the last slice is padded
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < ranks; ++r) grads.push_back(Tensor::randn({n}, uint64_t(10 + r), 0.01 * (r + 1)).to_floats());
  // The reference: the amax over the ranks sets the first shared scale, the f32 sum in rank
  // order, its amax the second.
  double amax = 0;
  for (const auto& g : grads)
    for (float v : g) amax = std::max(amax, double(std::fabs(v)));
  const float s1 = shared_power_of_two(amax, wire);
  std::vector<float> sum(size_t(n), 0.0f);
  for (const auto& g : grads)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += through_wire(g[i], s1, wire);
  double amax2 = 0;
  for (float v : sum) amax2 = std::max(amax2, double(std::fabs(v)));
  const float s2 = shared_power_of_two(amax2, wire);

  ThreadRanks all(ranks);
  std::vector<std::vector<float>> results(ranks);
  all.run([&](const platform::World& world) {
    Var p(Tensor::zeros({n}), true), unused(Tensor::zeros({2}), true);
    p.set_grad(ScaledTensor(Tensor::from_vector(grads[size_t(world.rank())], {n})));
    const AllreduceCost cost = allreduce_gradients({"p", "unused"}, {p, unused}, wire, world);
    // The codes there and back; to each other rank 24 bytes of header per tensor, 16 of amax per gradient.
    EXPECT_EQ(cost.bytes_sent, 2.0 * (ranks - 1) * ((n + ranks - 1) / ranks) + (ranks - 1) * (2 * 24.0 + 16.0));
    EXPECT_FALSE(unused.scaled_grad().data.defined());  // no gradient: none made up
    results[size_t(world.rank())] = p.grad().to_floats();
  });
  for (int r = 0; r < ranks; ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(results[size_t(r)][size_t(i)], through_wire(sum[size_t(i)], s2, wire)) << r << " " << i;
}

TEST(DataParallel, ANonFiniteGradientOnOneRankIsNaNOnEvery) {
  ThreadRanks all(2);
  all.run([&](const platform::World& world) {
    Var p(Tensor::zeros({4}), true);
    std::vector<float> g = {1, 2, 3, 4};
    if (world.rank() == 1) g[2] = INFINITY;
    p.set_grad(ScaledTensor(Tensor::from_vector(g, {4})));
    allreduce_gradients({"p"}, {p}, Format::e5m2, world);
    for (float v : p.grad().to_floats()) EXPECT_TRUE(std::isnan(v));
  });
}

TEST(DataParallel, ExchangeInStorageSumsByTheAccumulationRule) {
  // Scaled f16 gradients of different scales: the sum is accumulate_gradient's of the whole
  // tensors, bit for bit, though each rank sums a slice (of 5 elements, and of the 2-element
  // tensor one, one or none).
  auto grad_of = [&](const Shape& shape, int r) {
    return ScaledTensor(Tensor::randn(shape, uint64_t(40 + r + shape[0])).to(DType::f16), std::ldexp(1.0f, -3 - 2 * r));
  };
  ThreadRanks all(3);
  all.run([&](const platform::World& world) {
    std::vector<Var> params;
    for (const Shape& shape : {Shape{3, 5}, Shape{2}}) {
      params.emplace_back(ScaledTensor(Tensor::zeros(shape, DType::f16), 1.0f), true);
      params.back().set_grad(grad_of(shape, world.rank()));
    }
    const AllreduceCost cost = allreduce_gradients({"p", "q"}, params, std::nullopt, world);
    EXPECT_EQ(cost.bytes_sent, 2.0 * (2 * 24 + 2 * (5 + 1) * 2));  // to 2 others: headers, f16 slices there and back
    for (const Var& p : params) {
      const Shape& shape = p.shape();
      const ScaledTensor expected =
          accumulate_gradient(accumulate_gradient(grad_of(shape, 0), grad_of(shape, 1), DType::f16), grad_of(shape, 2), DType::f16);
      EXPECT_EQ(p.scaled_grad().scalar_scale(), expected.scalar_scale());
      EXPECT_EQ(p.scaled_grad().data.dtype(), DType::f16);
      EXPECT_EQ(p.scaled_grad().data.to_floats(), expected.data.to_floats());
    }
  });
}

TEST(DataParallel, ParameterDriftIsAnErrorNamingTheParameter) {
  ThreadRanks all(2);
  all.run([&](const platform::World& world) {
    Var a(Tensor::ones({4}), true), b(Tensor::full({4}, world.rank() == 0 ? 1.0 : 1.5), true);
    try {
      check_parameters_agree({"a", "b"}, {a, b}, 7, world);
      ADD_FAILURE() << "drift not seen";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 'b' differs between rank 0 and rank 1 after step 7"), std::string::npos) << e.what();
    }
  });
}

TEST(DataParallel, MicroBatchesSplitEvenlyOrNotAtAll) {
  ThreadRanks all(2);
  all.run([&](const platform::World& world) {
    const MicroBatches m = rank_micro_batches(4, world);
    EXPECT_EQ(m.first, 2 * world.rank());
    EXPECT_EQ(m.count, 2);
    EXPECT_THROW(rank_micro_batches(3, world), platform::EveryRankError);
  });
}

TEST(DataParallel, AnErrorOnOneRankIsEveryRanksWithTheLowestFailingRanksMessage) {
  ThreadRanks all(3);
  all.run([&](const platform::World& world) {
    try {
      platform::every_rank_agrees(world, [&] {
        if (world.rank() >= 1) throw Error("corpus missing on rank " + std::to_string(world.rank()));
      });
      ADD_FAILURE() << "rank " << world.rank() << " went on";
    } catch (const platform::EveryRankError& e) {
      EXPECT_STREQ(e.what(), "corpus missing on rank 1");
    }
    platform::every_rank_agrees(world, [] {});  // no error: nothing thrown
  });
}

TEST(DataParallel, TheLossIsTheMeanInMicroBatchOrder) {
  ThreadRanks all(2);
  all.run([&](const platform::World& world) {
    const std::vector<double> mine = world.rank() == 0 ? std::vector<double>{0.1, 0.2} : std::vector<double>{0.3, 1e16};
    EXPECT_EQ(mean_loss(mine, world), (((0.1 + 0.2) + 0.3) + 1e16) / 4);
  });
}

}  // namespace
}  // namespace scalify::train

namespace scalify::quant {
namespace {

TEST(MicroBatchScope, DelayedScalingCommitsTheStepsAmaxOnce) {
  QuantizerConfig c;
  c.scaling = Scaling::delayed;
  Quantizer q(c);
  const float before = q.delayed_scale();
  {
    const MicroBatchScope m0(0);
    q.quantize(Tensor::from_vector(std::vector<float>{2.0f, -1.0f}, {2}));
  }
  {
    const MicroBatchScope m1(1);
    q.quantize(Tensor::from_vector(std::vector<float>{-8.0f, 1.0f}, {2}));
  }
  EXPECT_EQ(q.delayed_scale(), before);  // both micro-batches quantised with the step's scale
  EXPECT_EQ(q.steps(), 0);
  q.step_amax()[0] = std::max(q.step_amax()[0], 16.0f);  // another rank's larger amax
  q.commit_step();
  EXPECT_EQ(q.steps(), 1);
  EXPECT_EQ(q.state().history, std::vector<float>{16.0f});
  EXPECT_FLOAT_EQ(q.delayed_scale(), 448.0f / 16.0f);
  q.quantize(Tensor::from_vector(std::vector<float>{4.0f}, {1}));  // without a scope: a step per call, as before
  EXPECT_EQ(q.steps(), 2);
  EXPECT_EQ(q.state().history, (std::vector<float>{16.0f, 4.0f}));
}

TEST(MicroBatchScope, MicroBatchZeroDrawsTheUnscopedBitsAndOthersTheirOwn) {
  QuantizerConfig c;
  c.scaling = Scaling::current;
  c.format = Format::e5m2;
  c.rounding = Rounding::stochastic;
  const Tensor x = Tensor::randn({4096}, 3);
  Quantizer plain(c, 7), scoped(c, 7);
  const std::vector<float> unscoped = plain.quantize(x).dequantize().to_floats();
  std::vector<float> m0, m1;
  {
    const MicroBatchScope s(0);
    m0 = scoped.quantize(x).dequantize().to_floats();
  }
  {
    const MicroBatchScope s(1);
    m1 = scoped.quantize(x).dequantize().to_floats();
  }
  EXPECT_EQ(m0, unscoped);
  EXPECT_NE(m1, m0);
  scoped.commit_step();
  EXPECT_EQ(scoped.steps(), plain.steps());
}

}  // namespace
}  // namespace scalify::quant
