#pragma once
// Block quantisation of 2-D row-major tensors (SPEC §5): each block of br x bc elements shares
// one scale. MX = blocks of 32 along one axis with an E8M0 (power-of-two) scale; generic blocks
// (1 x K, K x K) carry an f32 scale; NVFP4 blocks an E4M3 scale under one f32 scale for the whole
// tensor. Elements always saturate.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string>
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
  // NVFP4 (TransformerEngine, arXiv 2509.25149), two levels: the tensor's encode scale
  // S = 448 * 6 / amax(tensor) in f32 (1 when amax is 0 or not finite; at most FLT_MAX), each
  // block's decode scale b = e4m3(amax(block) / 6 * S) (nearest, saturating), its elements
  // e2m1(x * (S / b)) (0 where b is 0); decoded value = code * b * (1 / S), tensor_scale = 1 / S.
  nvfp4,
  e4m3_amax,  // NVFP4 without the tensor scale (S = 1): b = e4m3(amax(block) / 6), elements e2m1(x / b)
};
// The rule's name ("mx_floor", "mx_ceil", "f32_amax", "nvfp4", "e4m3_amax"), and back (throws
// listing the valid names): the one table recipes' JSON and the Python bindings read.
const char* block_rule_name(BlockScaleRule r);
BlockScaleRule parse_block_rule(const std::string& name);
// Whether the rule's block scales are powers of two (E8M0 codes).
inline bool pow2_block_scales(BlockScaleRule r) { return r == BlockScaleRule::mx_floor || r == BlockScaleRule::mx_ceil; }

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
  float tensor_scale = 1;  // a decode factor of every block (nvfp4: 1 / S); value = code * scale * tensor_scale
  size_t scale_rows() const { return (rows + block.rows - 1) / block.rows; }
  size_t scale_cols() const { return (cols + block.cols - 1) / block.cols; }
  std::vector<uint8_t> e8m0_scales() const;  // MX rules only: the scales as E8M0 codes
};

// The scale of one block from its abs-max: the one place that owns the formula and its special
// cases (amax 0: 2^-127 for MX, 1 for f32, 0 for the e4m3 rules; amax NaN/inf: NaN).
// `tensor_encode`: nvfp4's S (other rules ignore it).
float block_scale(float amax, Format element, BlockScaleRule rule, float tensor_encode = 1);
// The e4m3 value nearest to v >= 0 (ties to even, saturating at 448): the scalar codec's
// decode(encode(v)) by exponent arithmetic, for the NVFP4 block scale of every block.
float e4m3_nearest(float v);
// nvfp4's tensor encode scale S from the tensor's abs-max (the rule's comment).
float nvfp4_tensor_encode(float amax);

// Called by quantize_blocks once rows [r0, r1) of q (a row, or a block row of taller blocks) have
// their codes and scales, on the thread that wrote them, while their inputs are still in cache:
// a pass over the result without reading the tensor again (the quantiser's statistics). Calls for
// different rows may run at once.
using BlockRowsDone = std::function<void(const BlockQuantized& q, size_t r0, size_t r1)>;
// `seed`: stochastic rounding's stream (element i of the row-major tensor draws bits (seed, i)).
BlockQuantized quantize_blocks(std::span<const float> x, size_t rows, size_t cols, Format element, const BlockSpec& spec,
                               Rounding rounding = Rounding::nearest_even, uint64_t seed = 0, const BlockRowsDone& rows_done = {});
// BlockQuantized is plain data: throws naming `op` unless its codes and scales fit its shape and
// block size, and `values` (the caller's buffer) is rows x cols.
void check_blocks(const BlockQuantized& q, size_t values, const char* op);
void dequantize_blocks(const BlockQuantized& q, std::span<float> out);
// Rows [r0, r1) of dequantize_blocks' values, bit for bit, into out ((r1 - r0) x cols): a pass
// over a large tensor a few rows at a time, without its f32 copy. Throws on rows out of range.
void dequantize_block_rows(const BlockQuantized& q, size_t r0, size_t r1, std::span<float> out);
// The dequantized values without the tensor scale (code * block scale: a GEMM applies tensor_scale
// as its alpha) as bf16 bit patterns, without an f32 copy; false (out then unspecified) unless
// every one is exactly a bf16 value that bf16 dot products keep (truncate_to_bf16_exact): true for
// MX blocks of FP8 codes, whose scales are powers of two, and for NVFP4's e2m1 codes times their
// E4M3 block scales (2 + 4 significant bits).
bool dequantize_blocks_bf16(const BlockQuantized& q, std::span<uint16_t> out);

}  // namespace scalify
