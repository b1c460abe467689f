#pragma once
// Block quantisation of 2-D row-major tensors (SPEC §5): each block of br x bc elements shares
// one scale. MX = blocks of 32 along one axis with an E8M0 (power-of-two) scale; generic blocks
// (1 x K, K x K) carry an f32 scale. Elements always saturate.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "scalify/formats/format.hpp"
#include "scalify/formats/scalar.hpp"

namespace scalify {

enum class BlockScaleRule : uint8_t {
  mx_floor,  // OCP MX: X = 2^(floor(log2 amax) - emax_elem), clamped to 2^[-127, 127]; the top
             // binade can clip to the element max (e4m3 amax 500 -> 448)
  mx_ceil,   // round-up ("RCEIL"): the smallest 2^k with amax / 2^k <= element max; never clips
  f32_amax,  // f32 scale = amax / element max, so the block's amax maps onto the element max
};

struct BlockSpec {
  size_t rows = 1;   // block height
  size_t cols = 32;  // block width
  BlockScaleRule rule = BlockScaleRule::mx_floor;
  bool operator==(const BlockSpec&) const = default;
};

// MX blocks of `size` consecutive elements along `axis` (1: along a row, 0: down a column).
BlockSpec mx_blocks(int axis, BlockScaleRule rule = BlockScaleRule::mx_floor, size_t size = 32);

// Leaves new elements default-initialised (bytes: not zeroed): the quantiser writes every code,
// so clearing the buffer first was a wasted pass.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

struct BlockQuantized {
  Format element;
  size_t rows = 0, cols = 0;
  BlockSpec block;
  std::vector<std::byte, DefaultInitAllocator<std::byte>> codes;  // rows x cols element codes, row-major
  std::vector<float> scales;                                      // ceil(rows/br) x ceil(cols/bc) decode factors, row-major;
                                                                  // NaN for a block holding NaN or inf (it decodes as NaN)
  size_t scale_rows() const { return (rows + block.rows - 1) / block.rows; }
  size_t scale_cols() const { return (cols + block.cols - 1) / block.cols; }
  std::vector<uint8_t> e8m0_scales() const;  // MX rules only: the scales as E8M0 codes
};

// The scale of one block from its abs-max: the one place that owns the formula and its special
// cases (amax 0: 2^-127 for MX, 1 for f32; amax NaN/inf: NaN).
float block_scale(float amax, Format element, BlockScaleRule rule);

BlockQuantized quantize_blocks(std::span<const float> x, size_t rows, size_t cols, Format element, const BlockSpec& spec,
                               Rounding rounding = Rounding::nearest_even);
// BlockQuantized is plain data: throws naming `op` unless its codes and scales fit its shape and
// block size, and `values` (the caller's buffer) is rows x cols.
void check_blocks(const BlockQuantized& q, size_t values, const char* op);
void dequantize_blocks(const BlockQuantized& q, std::span<float> out);
// The dequantized values as bf16 bit patterns, without an f32 copy; false (out then unspecified)
// unless every one is exactly a bf16 value that bf16 dot products keep (truncate_to_bf16_exact):
// true for MX blocks of FP8 codes, whose scales are powers of two.
bool dequantize_blocks_bf16(const BlockQuantized& q, std::span<uint16_t> out);

}  // namespace scalify
