#include "scalify/train/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "scalify/error.hpp"
#include "scalify/formats/bulk.hpp"
#include "scalify/platform/crc32c.hpp"
#include "scalify/quant/linear.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/scaled/scaled_tensor.hpp"
#include "scalify/tensor/ops.hpp"

namespace scalify::train {

using platform::World;

MicroBatches rank_micro_batches(int64_t accum, const World& world) {
  const int64_t n = world.size();
  if (accum % n != 0)
    throw platform::EveryRankError("data parallel: the step's accum=" + std::to_string(accum) +
                                   " micro-batches cannot be split evenly over " + std::to_string(n) +
                                   " ranks; set accum to a multiple of " + std::to_string(n) + " (--set accum=" + std::to_string(n) +
                                   ": one micro-batch of `batch` windows per rank)");
  return {world.rank() * (accum / n), accum / n};
}

namespace {

using clock = std::chrono::steady_clock;

// A gradient's layout, the same on every rank for the same model.
struct GradHeader {
  uint32_t dtype = 0, flags = 0;  // flags: 1 defined, 2 any_scale, 4 scaled
  float scale = 1;
  uint32_t pad = 0;
  int64_t numel = 0;
  bool same_layout(const GradHeader& o) const { return dtype == o.dtype && (flags & 1) == (o.flags & 1) && numel == o.numel; }
};

GradHeader header_of(const std::string& name, const ScaledTensor& g) {
  GradHeader h;
  if (!g.data.defined()) return h;
  if (g.scale.defined() && g.scale.numel() != 1)
    throw Error("data parallel: the gradient of '" + name + "' has per-block scales, which the all-reduce does not exchange");
  h.dtype = uint32_t(g.data.dtype());
  h.flags = 1 | (g.any_scale ? 2 : 0) | (g.scale.defined() ? 4 : 0);
  h.scale = g.scale.defined() ? float(g.scale.item()) : 1.0f;
  h.numel = g.data.numel();
  return h;
}

// Every rank's gradient headers (rank-major), checked to be rank 0's layout on every rank alike.
std::vector<GradHeader> gather_headers(const std::vector<std::string>& names, const std::vector<Var>& params, const World& world) {
  const size_t n = params.size(), ranks = size_t(world.size());
  std::vector<GradHeader> mine(n), all(n * ranks);
  for (size_t i = 0; i < n; ++i) mine[i] = header_of(names[i], params[i].scaled_grad());
  world.allgather(mine.data(), n * sizeof(GradHeader), all.data());
  for (size_t r = 1; r < ranks; ++r)
    for (size_t i = 0; i < n; ++i)
      if (!all[r * n + i].same_layout(all[i]))
        throw platform::EveryRankError("data parallel: rank " + std::to_string(r) + "'s gradient of '" + names[i] +
                                       "' differs from rank 0's in shape or storage (the ranks run different models?)");
  return all;
}

// The data as a gradient with the header's scale.
ScaledTensor with_header(const GradHeader& h, Tensor data) {
  ScaledTensor g = (h.flags & 4) ? ScaledTensor(std::move(data), Tensor::scalar(h.scale)) : ScaledTensor(std::move(data));
  g.any_scale = (h.flags & 2) != 0;
  return g;
}

// A gradient (or a slice of one, `shape`) rebuilt from its bytes and its header.
ScaledTensor gradient_from(const GradHeader& h, const Shape& shape, const std::byte* bytes) {
  Tensor data = Tensor::empty(shape, DType(h.dtype));
  std::memcpy(data.raw_bytes(), bytes, size_t(data.numel()) * dtype_size(DType(h.dtype)));
  return with_header(h, std::move(data));
}

// The exchange's buffers, kept from step to step: fresh ones of the gradients' size were zeroed
// and faulted in every step, most of the exchange's time (at 85M parameters on 2 ranks, the f32
// exchange took 24 % of the step with fresh buffers and 3 % with these; bench/data_parallel.py).
struct ExchangeBuffers {
  std::vector<std::byte> slot[6];
  std::byte* get(int i, size_t bytes) {
    if (slot[i].size() < bytes) slot[i].resize(bytes);
    return slot[i].data();
  }
};
ExchangeBuffers& exchange_buffers() {
  thread_local ExchangeBuffers buffers;  // the exchanging thread's (one per process in training)
  return buffers;
}

// Elements [begin, end) of a gradient of `numel` that rank `r` of `ranks` owns.
std::pair<size_t, size_t> owned(size_t numel, size_t r, size_t ranks) {
  const size_t slice = (numel + ranks - 1) / ranks;
  return {std::min(numel, r * slice), std::min(numel, (r + 1) * slice)};
}

// Exact: a reduce-scatter of the gradients in their storage, each rank summing its slice of every
// gradient over the ranks in rank order by backward()'s rule, then an all-gather of the sums. The
// rule is elementwise with a scale set by the operands' scales alone, so each slice of the sum is
// the slice of the whole tensors' sum, and its layout (storage, scale) is the rule's on stand-ins.
AllreduceCost allreduce_in_storage(const std::vector<std::string>& names, const std::vector<Var>& params, const World& world) {
  const size_t n = params.size(), ranks = size_t(world.size()), me = size_t(world.rank());
  const std::vector<GradHeader> all = gather_headers(names, params, world);
  const std::span<const GradHeader> mine(all.data() + me * n, n);
  std::vector<GradHeader> sum(n);
  // Each gradient's place in the exchanged blocks: its slice (padded) in its storage, then in the sum's.
  std::vector<size_t> slice(n, 0), at_in(n, 0), at_out(n, 0);
  size_t block_in = 0, block_out = 0;
  const std::byte zeros[16] = {};
  for (size_t i = 0; i < n; ++i) {
    if (!(mine[i].flags & 1)) continue;
    const DType storage = gradient_storage(params[i].scaled(), params[i].scaled_grad());
    ScaledTensor stand_in = gradient_from(all[i], {1}, zeros);
    for (size_t r = 1; r < ranks; ++r) stand_in = accumulate_gradient(stand_in, gradient_from(all[r * n + i], {1}, zeros), storage);
    sum[i] = header_of(names[i], stand_in);
    slice[i] = (size_t(mine[i].numel) + ranks - 1) / ranks;
    at_in[i] = block_in;
    at_out[i] = block_out;
    block_in += slice[i] * dtype_size(DType(mine[i].dtype));
    block_out += slice[i] * dtype_size(DType(sum[i].dtype));
  }
  ExchangeBuffers& buf = exchange_buffers();
  std::byte* send = buf.get(0, block_in * ranks);
  std::byte* recv = buf.get(1, block_in * ranks);
  std::byte* mine_summed = buf.get(2, block_out);
  std::byte* gathered = buf.get(3, block_out * ranks);
  std::vector<Tensor> data(n);
  for (size_t i = 0; i < n; ++i) {
    if (!(mine[i].flags & 1)) continue;
    data[i] = params[i].scaled_grad().data.contiguous();
    const size_t b = dtype_size(data[i].dtype());
    for (size_t c = 0; c < ranks; ++c) {
      const auto [lo, hi] = owned(size_t(mine[i].numel), c, ranks);
      std::memcpy(send + c * block_in + at_in[i], data[i].raw_bytes() + lo * b, (hi - lo) * b);
    }
  }
  world.alltoall(send, block_in, recv);
  for (size_t i = 0; i < n; ++i) {
    if (!(mine[i].flags & 1)) continue;
    const auto [lo, hi] = owned(size_t(mine[i].numel), me, ranks);
    if (lo == hi) continue;
    const Shape part{int64_t(hi - lo)};
    ScaledTensor s = gradient_from(all[i], part, recv + at_in[i]);
    for (size_t r = 1; r < ranks; ++r)
      s = accumulate_gradient(s, gradient_from(all[r * n + i], part, recv + r * block_in + at_in[i]),
                              gradient_storage(params[i].scaled(), params[i].scaled_grad()));
    const Tensor d = s.data.contiguous();
    std::memcpy(mine_summed + at_out[i], d.raw_bytes(), (hi - lo) * dtype_size(d.dtype()));
  }
  world.allgather(mine_summed, block_out, gathered);
  for (size_t i = 0; i < n; ++i) {
    if (!(mine[i].flags & 1)) continue;
    Tensor whole = Tensor::empty(params[i].shape(), DType(sum[i].dtype));
    const size_t b = dtype_size(DType(sum[i].dtype));
    for (size_t c = 0; c < ranks; ++c) {
      const auto [lo, hi] = owned(size_t(mine[i].numel), c, ranks);
      std::memcpy(whole.raw_bytes() + lo * b, gathered + c * block_out + at_out[i], (hi - lo) * b);
    }
    Var(params[i]).set_grad(with_header(sum[i], std::move(whole)));
  }
  return {double(ranks - 1) * (double(n * sizeof(GradHeader)) + double(block_in + block_out)), 0};
}

// The power of two that puts amax at or just below the format's largest value (1 for amax 0).
float shared_scale(double amax, double format_max) {
  if (!(amax > 0)) return 1.0f;
  int e = 0;
  std::frexp(format_max / amax, &e);  // format_max / amax = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, std::clamp(e - 1, -126, 127));
}

// One parameter's slice of the flat gradient: elements [begin, end) of the concatenation.
struct Segment {
  size_t param, begin, end;
};

// Low precision: reduce-scatter of the cast values, f32 sums in rank order, all-gather of the
// sums cast again.
AllreduceCost allreduce_on_wire(const std::vector<std::string>& names, const std::vector<Var>& params, Format wire, const World& world) {
  const size_t ranks = size_t(world.size()), rank = size_t(world.rank());
  gather_headers(names, params, world);  // the same gradients on every rank (no per-block scales)
  const size_t code_bytes = size_t(info(wire).storage_bytes());
  const double top = max_value(wire);
  std::vector<size_t> with_grad, offset;
  std::vector<Tensor> values;
  size_t total = 0;
  std::vector<double> amax;
  for (size_t i = 0; i < params.size(); ++i) {
    const ScaledTensor& g = params[i].scaled_grad();
    if (!g.data.defined()) continue;
    Tensor v;
    try {
      v = g.value().to(DType::f32).contiguous();
    } catch (const Error&) {  // beyond f32: not finite for the wire
      v = Tensor::full(g.shape(), NAN);
    }
    const float a = scalify::amax(std::span(v.data<float>(), size_t(v.numel())));
    amax.push_back(std::isfinite(a) ? double(a) : INFINITY);
    with_grad.push_back(i);
    offset.push_back(total);
    values.push_back(v);
    total += size_t(v.numel());
  }
  world.max(amax);
  const size_t slice = (total + ranks - 1) / ranks;  // elements per rank, the last slice padded with zeros
  // The segments of [lo, hi) of the flat gradient.
  auto segments = [&](size_t lo, size_t hi) {
    std::vector<Segment> out;
    for (size_t k = 0; k < with_grad.size(); ++k) {
      const size_t b = std::max(lo, offset[k]), e = std::min(hi, offset[k] + size_t(values[k].numel()));
      if (b < e) out.push_back({k, b, e});
    }
    return out;
  };
  ExchangeBuffers& buf = exchange_buffers();
  std::byte* send = buf.get(0, slice * ranks * code_bytes);
  std::byte* recv = buf.get(1, slice * ranks * code_bytes);
  std::fill(send, send + slice * ranks * code_bytes, std::byte{0});  // padding, and what is not finite
  for (size_t k = 0; k < with_grad.size(); ++k)
    if (std::isfinite(amax[k]))
      quantize(std::span<const float>(values[k].data<float>(), size_t(values[k].numel())), wire, shared_scale(amax[k], top),
               std::span(send + offset[k] * code_bytes, size_t(values[k].numel()) * code_bytes));
  world.alltoall(send, slice * code_bytes, recv);
  // This rank's slice: every rank's values summed in rank order.
  const size_t lo = std::min(total, rank * slice), hi = std::min(total, lo + slice);
  const std::vector<Segment> mine = segments(lo, hi);
  float* sum = reinterpret_cast<float*>(buf.get(2, slice * sizeof(float)));
  float* part = reinterpret_cast<float*>(buf.get(3, slice * sizeof(float)));
  std::fill(sum, sum + slice, 0.0f);
  for (size_t r = 0; r < ranks; ++r)
    for (const Segment& s : mine) {
      if (!std::isfinite(amax[s.param])) continue;
      const size_t n = s.end - s.begin, at = s.begin - lo;
      dequantize(std::span(recv + (r * slice + at) * code_bytes, n * code_bytes), wire, 1.0f / shared_scale(amax[s.param], top),
                 std::span(part, n));
      for (size_t j = 0; j < n; ++j) sum[at + j] += part[j];
    }
  std::vector<double> amax2(with_grad.size(), 0.0);
  for (const Segment& s : mine)
    amax2[s.param] = std::max(amax2[s.param], double(scalify::amax(std::span(sum + (s.begin - lo), s.end - s.begin))));
  world.max(amax2);
  std::byte* codes = buf.get(4, slice * code_bytes);
  std::byte* gathered = buf.get(5, slice * ranks * code_bytes);
  std::fill(codes, codes + slice * code_bytes, std::byte{0});
  for (const Segment& s : mine)
    if (std::isfinite(amax[s.param]))
      quantize(std::span<const float>(sum + (s.begin - lo), s.end - s.begin), wire, shared_scale(amax2[s.param], top),
               std::span(codes + (s.begin - lo) * code_bytes, (s.end - s.begin) * code_bytes));
  world.allgather(codes, slice * code_bytes, gathered);
  for (size_t k = 0; k < with_grad.size(); ++k) {
    Var p = params[with_grad[k]];
    const size_t n = size_t(values[k].numel());
    Tensor v = Tensor::empty(p.shape(), DType::f32);
    std::span<float> out(v.data<float>(), n);
    if (std::isfinite(amax[k]) && std::isfinite(amax2[k]))  // a sum past f32 is not finite either
      dequantize(std::span(gathered + offset[k] * code_bytes, n * code_bytes), wire, 1.0f / shared_scale(amax2[k], top), out);
    else
      std::fill(out.begin(), out.end(), NAN);
    // Back into the gradient's storage; a scaled one under the scale of the sum's RMS, the same on
    // every rank (the ranks' own gradient scales may differ where a rescale measured their data).
    const ScaledTensor& g = p.scaled_grad();
    p.set_grad(g.is_scaled() ? as_scaled(v, g.data.dtype()) : ScaledTensor(v.to(g.data.dtype())));
  }
  // The codes there and back; the headers (24 bytes) and the two amax all-reduces (16) per tensor.
  return {2.0 * double(ranks - 1) * double(slice * code_bytes) +
              double(ranks - 1) * (24.0 * double(params.size()) + 16.0 * double(with_grad.size())),
          0};
}

}  // namespace

AllreduceCost allreduce_gradients(const std::vector<std::string>& names, const std::vector<Var>& params, std::optional<Format> wire,
                                  const World& world) {
  const auto t0 = clock::now();
  if (!wire && world.size() == 1) return {};
  AllreduceCost c = wire ? allreduce_on_wire(names, params, *wire, world) : allreduce_in_storage(names, params, world);
  c.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return c;
}

double mean_loss(const std::vector<double>& my_losses, const World& world) {
  std::vector<double> all(my_losses.size() * size_t(world.size()));
  world.allgather(my_losses.data(), my_losses.size() * sizeof(double), all.data());
  double sum = 0;
  for (double l : all) sum += l;  // rank order is micro-batch order
  return sum / double(all.size());
}

std::vector<quant::Quantizer*> model_quantizers(const nn::Gpt& model) {
  std::vector<quant::Quantizer*> all;
  for (const auto& [layer, q] : model.quantized_linears())
    for (const auto& [role, quantizer] : q->quantizers()) all.push_back(quantizer);
  return all;
}

void commit_quantizers(const std::vector<quant::Quantizer*>& all, const World& world) {
  if (world.size() > 1) {
    // The amax, then a NaN flag for each (a NaN on any rank is the step's amax, as on one process).
    std::vector<double> amax;
    for (quant::Quantizer* q : all)
      for (float a : q->step_amax()) amax.push_back(std::isnan(a) ? 0.0 : double(a));
    const size_t k = amax.size();
    for (quant::Quantizer* q : all)
      for (float a : q->step_amax()) amax.push_back(std::isnan(a) ? 1.0 : 0.0);
    std::vector<double> count{double(k), -double(k)};  // the max and (minus) the min
    world.max(count);
    if (count[0] != -count[1])
      throw platform::EveryRankError("data parallel: the ranks quantised different numbers of tensors in one step");
    world.max(amax);
    size_t at = 0;
    for (quant::Quantizer* q : all)
      for (float& a : q->step_amax()) {
        a = amax[k + at] > 0 ? NAN : float(amax[at]);
        ++at;
      }
  }
  for (quant::Quantizer* q : all) q->commit_step();
}

namespace {

// A CRC-32C of a parameter's data and scale, continuing from `crc`.
uint32_t parameter_crc(const Var& p, uint32_t crc = 0) {
  const ScaledTensor& v = p.scaled();
  const Tensor d = v.data.contiguous();
  crc = platform::crc32c(d.raw_bytes(), size_t(d.numel()) * dtype_size(d.dtype()), crc);
  if (v.scale.defined()) {
    const Tensor s = v.scale.contiguous();
    crc = platform::crc32c(s.raw_bytes(), size_t(s.numel()) * dtype_size(s.dtype()), crc);
  }
  return crc;
}

}  // namespace

std::vector<platform::Agreed> run_description(const TrainConfig& config, const Corpus& corpus) {
  const std::string same_input = "give every rank the same arguments and files";
  std::vector<platform::Agreed> items;
  std::istringstream toml(config.to_toml());  // one "key = value" line per key
  for (std::string line; std::getline(toml, line);) {
    const size_t eq = line.find(" = ");
    if (!line.starts_with("#") && eq != std::string::npos) items.push_back({line.substr(0, eq), line.substr(eq + 3), same_input});
  }
  const nlohmann::json recipe = nlohmann::json::parse(quant::load_recipe(config.recipe).to_json());
  for (const auto& [field, value] : recipe.items())
    items.push_back({"the recipe's " + field, value.dump(), "give every rank the same recipe (a recipe file may differ between machines)"});
  uint32_t crc = platform::crc32c(corpus.train.data(), corpus.train.size() * sizeof(int32_t));
  crc = platform::crc32c(corpus.val.data(), corpus.val.size() * sizeof(int32_t), crc);
  items.push_back({"the corpus",
                   "CRC-32C " + platform::crc32c_text(crc) + " of " + std::to_string(corpus.train.size()) + " training and " +
                       std::to_string(corpus.val.size()) + " validation " + corpus.unit(),
                   "every machine must read the same text: a copy on one machine differs (keep the corpus on storage every rank sees)"});
  return items;
}

platform::Agreed starting_parameters(const std::vector<Var>& params, int64_t step, const TrainConfig& config) {
  uint32_t crc = 0;
  for (const Var& p : params) crc = parameter_crc(p, crc);
  return {"the parameters at step " + std::to_string(step),
          "CRC-32C " + platform::crc32c_text(crc) + " over " + std::to_string(params.size()) + " tensors",
          step > 0               ? "each rank read its own checkpoint, and they differ (keep the run folder on storage every rank sees)"
          : !config.init.empty() ? "each rank read its own --init model, and they differ (keep it on storage every rank sees)"
                                 : "the same config and seed built different models (a bug: please report it)"};
}

void check_parameters_agree(const std::vector<std::string>& names, const std::vector<Var>& params, int64_t step, const World& world) {
  if (world.size() == 1) return;
  std::vector<uint32_t> mine(params.size()), all(params.size() * size_t(world.size()));
  for (size_t i = 0; i < params.size(); ++i) mine[i] = parameter_crc(params[i]);
  world.allgather(mine.data(), mine.size() * sizeof(uint32_t), all.data());
  for (size_t r = 1; r < size_t(world.size()); ++r)
    for (size_t i = 0; i < params.size(); ++i)
      if (all[r * params.size() + i] != all[i])
        throw platform::EveryRankError("data parallel: parameter '" + names[i] + "' differs between rank 0 and rank " + std::to_string(r) +
                                       " after step " + std::to_string(step) +
                                       " (the ranks drifted apart; the run stops before writing a checkpoint)");
}

}  // namespace scalify::train
