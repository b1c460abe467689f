#pragma once
// Data precision (SPEC §2): an op computes in f32 (or f64) and its output data takes its inputs'
// storage dtype — rounded once, saturating — or f32 when any input is f32: JAX's and PyTorch's
// promotion; broadcast scalar constants (single-element values needing no gradient) are weakly
// typed and take no part. A gradient's data takes the storage dtype of the value it is the gradient of. So an
// f16 scaled graph keeps f16 activations and gradients end to end, and the propagated scales are
// what keeps them in range. Applied by Var (autograd/var.cpp) to every recorded op.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "scalify/tensor/tensor.hpp"

namespace scalify {

// The storage an op's output data takes from its inputs' data dtypes: f64 if any is f64, f32 if
// any is f32 (or two different low-precision dtypes meet, as f16 with bf16 in JAX), else the one
// low-precision dtype they share. Integer inputs do not take part; none at all gives f32.
DType promoted_storage(const std::vector<DType>& inputs);

// `data` rounded into `storage` (round to nearest even, finite values saturating at the format's
// largest; infinities stay infinite where the format has them); unchanged when it is already
// stored so or is integer. `what` names the tensor in the
// statistics a StorageCastRecorder collects.
Tensor to_storage(const Tensor& data, DType storage, const std::string& what);

// The `store_as` to give an op's kernel so it writes its output straight into `storage` (f16,
// bf16) instead of f32 that to_storage rounds afterwards: the same bits, one pass fewer. f32 while
// a StorageCastRecorder is counting on this thread (counting needs the unrounded values) and for
// other storages.
DType kernel_store_as(DType storage);

// How a cast into low-precision storage treated the values: underflowed = nonzero values that
// became 0, subnormal = values that became subnormals (nonzero, below the format's smallest
// normal: fewer significant bits, a precision loss the other counts do not show), saturated =
// finite values beyond the format's largest (clamped to it).
struct StorageCastStats {
  int64_t values = 0, underflowed = 0, subnormal = 0, saturated = 0;
  double underflow_fraction() const { return fraction(underflowed); }
  double subnormal_fraction() const { return fraction(subnormal); }
  double saturated_fraction() const { return fraction(saturated); }

 private:
  double fraction(int64_t n) const { return values ? double(n) / double(values) : 0.0; }
};

// While one is alive, every to_storage into a low-precision dtype on this thread is counted, per
// tensor name (an op's name, with " grad" for gradients). Costs a pass per cast: for inspection.
class StorageCastRecorder {
 public:
  StorageCastRecorder();
  ~StorageCastRecorder();
  StorageCastRecorder(const StorageCastRecorder&) = delete;
  StorageCastRecorder& operator=(const StorageCastRecorder&) = delete;
  const std::map<std::string, StorageCastStats>& stats() const { return stats_; }
  StorageCastStats total() const;

 private:
  friend Tensor to_storage(const Tensor&, DType, const std::string&);
  std::map<std::string, StorageCastStats> stats_;
  StorageCastRecorder* previous_;
};

}  // namespace scalify
