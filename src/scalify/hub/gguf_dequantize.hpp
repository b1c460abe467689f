#pragma once
// ggml's tensor types (the `type` of a GGUF tensor) and their dequantisation to f32, bit for bit as
// ggml's dequantize_row_* (ggml-quants.c) and the `gguf` package's gguf/quants.py compute them:
// each value is the block's f16 scale (and minimum) times its integer code, in f32, one rounding
// per operation in the order ggml writes it (no fused multiply-add: this file is built with
// -ffp-contract=off).
//
// Every type ggml defines has a block size here (so a file holding any of them can be laid out
// and checked); the ones dequantised are F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K.
#include <cstdint>
#include <optional>
#include <string>

namespace scalify::hub {

enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q4_k = 12,
  q6_k = 14,
  bf16 = 30,
};

// A type's storage: `elements` values in `bytes` bytes (F32: 1 in 4; Q4_1: 32 in 20).
struct GgmlBlock {
  uint64_t elements = 0, bytes = 0;
};
// The block of ggml type number `type`, for every type ggml defines; nullopt for a number it does
// not define.
std::optional<GgmlBlock> ggml_block(uint32_t type);
// "Q4_1", or "type 99" for a number ggml does not define.
std::string ggml_type_name(uint32_t type);
// Whether dequantize_ggml reads this type.
bool ggml_dequantizable(uint32_t type);
// "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K": for error messages.
const char* ggml_dequantizable_names();

// `n` values of `type` (a whole number of blocks, ggml_block(type)->bytes each, at `data`) into
// `out`. Throws scalify::Error for a type that is not dequantisable or an `n` that is not a
// multiple of the block.
void dequantize_ggml(uint32_t type, const uint8_t* data, uint64_t n, float* out);

}  // namespace scalify::hub
