#include "scalify/autograd/data_precision.hpp"

#include <algorithm>
#include <cmath>

#include "scalify/formats/format.hpp"
#include "scalify/platform/parallel.hpp"
#include "scalify/tensor/storage_rounding.hpp"

namespace scalify {

namespace {
thread_local StorageCastRecorder* g_recorder = nullptr;

bool is_float(DType t) { return !is_integer(t); }

// Saturation is for finite values past the format's largest; an infinity (a mask's -inf fill) is
// exact in a format that has one and must stay infinite, or masked scores would become -65504
// times their scale and leak attention at small scales.
void keep_infinities(const Tensor& in, Tensor& out, Format f) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n = in.numel(), chunks = (n + kChunk - 1) / kChunk, bytes = info(f).storage_bytes();
#pragma omp parallel for if (n > platform::kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    restore_infinities(in.data<float>() + begin, std::min(kChunk, n - begin), f, out.raw_bytes() + begin * bytes);
  }
}
}  // namespace

DType promoted_storage(const std::vector<DType>& inputs) {
  bool any = false, mixed = false;
  DType low = DType::f32;
  for (DType t : inputs) {
    if (!is_float(t)) continue;
    if (t == DType::f64) return DType::f64;
    if (!any) low = t;
    mixed = mixed || t != low;
    any = true;
  }
  for (DType t : inputs)
    if (t == DType::f32) return DType::f32;
  return !any || mixed ? DType::f32 : low;
}

Tensor to_storage(const Tensor& data, DType storage, const std::string& what) {
  if (!data.defined() || data.dtype() == storage || !is_float(data.dtype()) || !is_float(storage)) return data;
  const std::optional<Format> f = dtype_format(storage);
  Tensor out;
  if (is_rounded_storage(storage) && data.dtype() == DType::f32 && data.is_contiguous()) {
    out = round_to_storage(data, storage);
  } else {
    out = data.to(storage);
    if (f && info(*f).specials == Specials::ieee && data.dtype() == DType::f32 && data.is_contiguous() && out.is_contiguous())
      keep_infinities(data, out, *f);
  }
  if (g_recorder && f && storage != DType::f32) {
    const double top = max_value(*f), normal = min_normal(*f);
    const std::vector<float> in = data.to_floats(), rounded = out.to_floats();
    StorageCastStats& s = g_recorder->stats_[what];
    s.values += int64_t(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      s.underflowed += in[i] != 0 && rounded[i] == 0 && !std::isnan(in[i]);
      s.subnormal += rounded[i] != 0 && std::fabs(double(rounded[i])) < normal;
      s.saturated += std::isfinite(in[i]) && std::fabs(double(in[i])) > top;
    }
  }
  return out;
}

DType kernel_store_as(DType storage) { return !g_recorder && is_rounded_storage(storage) ? storage : DType::f32; }

StorageCastRecorder::StorageCastRecorder() : previous_(g_recorder) { g_recorder = this; }
StorageCastRecorder::~StorageCastRecorder() { g_recorder = previous_; }

StorageCastStats StorageCastRecorder::total() const {
  StorageCastStats t;
  for (const auto& [name, s] : stats_) {
    t.values += s.values;
    t.underflowed += s.underflowed;
    t.subnormal += s.subnormal;
    t.saturated += s.saturated;
  }
  return t;
}

}  // namespace scalify
