#include "scalify/hub/gguf_dequantize.hpp"

#include <bit>
#include <cstring>

#include "scalify/error.hpp"

namespace scalify::hub {

namespace {

struct TypeInfo {
  uint32_t number;
  const char* name;
  GgmlBlock block;
};

constexpr uint64_t kQK = 256;  // the K-quants' super-block

// ggml's type table (ggml.h's enum ggml_type, ggml.c's type_traits): every type defined today,
// so that a file holding one we do not dequantise still has a checkable layout.
constexpr TypeInfo kTypes[] = {
    {0, "F32", {1, 4}},
    {1, "F16", {1, 2}},
    {2, "Q4_0", {32, 2 + 16}},
    {3, "Q4_1", {32, 2 + 2 + 16}},
    {6, "Q5_0", {32, 2 + 4 + 16}},
    {7, "Q5_1", {32, 2 + 2 + 4 + 16}},
    {8, "Q8_0", {32, 2 + 32}},
    {9, "Q8_1", {32, 4 + 4 + 32}},
    {10, "Q2_K", {kQK, 2 + 2 + kQK / 16 + kQK / 4}},
    {11, "Q3_K", {kQK, 2 + kQK / 4 + kQK / 8 + 12}},
    {12, "Q4_K", {kQK, 2 + 2 + kQK / 2 + 12}},
    {13, "Q5_K", {kQK, 2 + 2 + kQK / 2 + kQK / 8 + 12}},
    {14, "Q6_K", {kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16}},
    {15, "Q8_K", {kQK, 4 + kQK + kQK / 8}},
    {16, "IQ2_XXS", {kQK, 2 + kQK / 4}},
    {17, "IQ2_XS", {kQK, 2 + kQK / 4 + kQK / 32}},
    {18, "IQ3_XXS", {kQK, 2 + kQK / 4 + kQK / 8}},
    {19, "IQ1_S", {kQK, 2 + kQK / 8 + kQK / 16}},
    {20, "IQ4_NL", {32, 2 + 16}},
    {21, "IQ3_S", {kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4}},
    {22, "IQ2_S", {kQK, 2 + kQK / 4 + kQK / 16}},
    {23, "IQ4_XS", {kQK, 2 + 2 + kQK / 2 + kQK / 64}},
    {24, "I8", {1, 1}},
    {25, "I16", {1, 2}},
    {26, "I32", {1, 4}},
    {27, "I64", {1, 8}},
    {28, "F64", {1, 8}},
    {29, "IQ1_M", {kQK, kQK / 8 + kQK / 16 + kQK / 32}},
    {30, "BF16", {1, 2}},
    {34, "TQ1_0", {kQK, 2 + 4 * 13}},
    {35, "TQ2_0", {kQK, 2 + 64}},
    {39, "MXFP4", {32, 1 + 16}},
};

const TypeInfo* find(uint32_t type) {
  for (const TypeInfo& t : kTypes)
    if (t.number == type) return &t;
  return nullptr;
}

// IEEE binary16 to f32, exactly (subnormals kept, a NaN's payload carried over as numpy does).
float half(const uint8_t* p) {
  const uint32_t h = uint32_t(p[0]) | uint32_t(p[1]) << 8;
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mant << 13);
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in f32
    const float v = float(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (exp + 112) << 23 | mant << 13);
}

void f32(const uint8_t* x, uint64_t n, float* y) { std::memcpy(y, x, n * 4); }
void f16(const uint8_t* x, uint64_t n, float* y) {
  for (uint64_t i = 0; i < n; ++i) y[i] = half(x + 2 * i);
}
void bf16(const uint8_t* x, uint64_t n, float* y) {
  for (uint64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>((uint32_t(x[2 * i]) | uint32_t(x[2 * i + 1]) << 8) << 16);
}

// 32-value blocks: {f16 d; int8 qs[32]}, y = q d.
void q8_0(const uint8_t* x, uint64_t blocks, float* y) {
  for (uint64_t b = 0; b < blocks; ++b, x += 34, y += 32) {
    const float d = half(x);
    for (int j = 0; j < 32; ++j) y[j] = float(int8_t(x[2 + j])) * d;
  }
}

// {f16 d; [f16 m;] [uint32 qh;] uint8 qs[16]}: value j < 16 in qs[j]'s low nibble, j + 16 in its
// high one; the 5-bit types take bit j of qh as each value's fifth bit. The symmetric types
// subtract half the range (8 or 16), the others add the minimum m: y = q d (+ m).
template <bool kMin, bool kFifthBit>
void q4_q5(const uint8_t* x, uint64_t blocks, float* y) {
  constexpr int kBytes = 2 + (kMin ? 2 : 0) + (kFifthBit ? 4 : 0) + 16;
  constexpr int kOffset = kMin ? 0 : kFifthBit ? 16 : 8;
  for (uint64_t b = 0; b < blocks; ++b, x += kBytes, y += 32) {
    const float d = half(x), m = kMin ? half(x + 2) : 0.0f;
    uint32_t qh = 0;
    if (kFifthBit) std::memcpy(&qh, x + (kMin ? 4 : 2), 4);
    const uint8_t* qs = x + kBytes - 16;
    for (int j = 0; j < 16; ++j) {
      int lo = qs[j] & 0x0f, hi = qs[j] >> 4;
      if (kFifthBit) {
        lo |= int((qh >> j) & 1) << 4;
        hi |= int((qh >> (j + 16)) & 1) << 4;
      }
      const float v0 = float(lo - kOffset) * d, v1 = float(hi - kOffset) * d;
      y[j] = kMin ? v0 + m : v0;
      y[j + 16] = kMin ? v1 + m : v1;
    }
  }
}

// Q4_K's eight 6-bit scales and minimums packed in 12 bytes (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// 256-value blocks: {f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]}, eight groups of 32, each
// y = (d sc) q - (dmin m); groups 2i and 2i + 1 are the low and high nibbles of the same 32 bytes.
void q4_k(const uint8_t* x, uint64_t blocks, float* y) {
  for (uint64_t b = 0; b < blocks; ++b, x += 144) {
    const float d = half(x), dmin = half(x + 2);
    const uint8_t *scales = x + 4, *q = x + 16;
    for (int g = 0; g < 8; g += 2, q += 32) {
      uint8_t sc, m;
      scale_min_k4(g, scales, &sc, &m);
      const float d1 = d * float(sc), m1 = dmin * float(m);
      scale_min_k4(g + 1, scales, &sc, &m);
      const float d2 = d * float(sc), m2 = dmin * float(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
    }
  }
}

// 256-value blocks: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d}, 6-bit values less 32,
// y = (d scale) q with one scale per 16 values. Each half of 128 values takes 64 bytes of ql (low
// nibbles: values 0-31 and 32-63, high nibbles: 64-95 and 96-127) and 32 of qh (two bits each).
void q6_k(const uint8_t* x, uint64_t blocks, float* y) {
  for (uint64_t b = 0; b < blocks; ++b, x += 210) {
    const float d = half(x + 208);
    const uint8_t *ql = x, *qh = x + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(x + 192);
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = int((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
        const int q2 = int((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
        const int q3 = int((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
        const int q4 = int((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        y[l] = d * float(sc[is]) * float(q1);
        y[l + 32] = d * float(sc[is + 2]) * float(q2);
        y[l + 64] = d * float(sc[is + 4]) * float(q3);
        y[l + 96] = d * float(sc[is + 6]) * float(q4);
      }
    }
  }
}

}  // namespace

std::optional<GgmlBlock> ggml_block(uint32_t type) {
  const TypeInfo* t = find(type);
  return t ? std::optional<GgmlBlock>(t->block) : std::nullopt;
}

std::string ggml_type_name(uint32_t type) {
  const TypeInfo* t = find(type);
  return t ? std::string(t->name) : "type " + std::to_string(type);
}

bool ggml_dequantizable(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::f32:
    case GgmlType::f16:
    case GgmlType::bf16:
    case GgmlType::q8_0:
    case GgmlType::q4_0:
    case GgmlType::q4_1:
    case GgmlType::q5_0:
    case GgmlType::q5_1:
    case GgmlType::q4_k:
    case GgmlType::q6_k: return true;
  }
  return false;
}

const char* ggml_dequantizable_names() { return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K"; }

void dequantize_ggml(uint32_t type, const uint8_t* x, uint64_t n, float* y) {
  if (!ggml_dequantizable(type))
    throw Error("GGUF: " + ggml_type_name(type) + " (type " + std::to_string(type) + ") is not dequantised by Scalify (it reads " +
                ggml_dequantizable_names() + ")");
  const uint64_t per_block = ggml_block(type)->elements;
  if (n % per_block != 0)
    throw Error("GGUF: " + std::to_string(n) + " values are not a whole number of " + ggml_type_name(type) + " blocks of " +
                std::to_string(per_block));
  const uint64_t blocks = n / per_block;
  switch (GgmlType(type)) {
    case GgmlType::f32: return f32(x, n, y);
    case GgmlType::f16: return f16(x, n, y);
    case GgmlType::bf16: return bf16(x, n, y);
    case GgmlType::q8_0: return q8_0(x, blocks, y);
    case GgmlType::q4_0: return q4_q5<false, false>(x, blocks, y);
    case GgmlType::q4_1: return q4_q5<true, false>(x, blocks, y);
    case GgmlType::q5_0: return q4_q5<false, true>(x, blocks, y);
    case GgmlType::q5_1: return q4_q5<true, true>(x, blocks, y);
    case GgmlType::q4_k: return q4_k(x, blocks, y);
    case GgmlType::q6_k: return q6_k(x, blocks, y);
  }
}

}  // namespace scalify::hub
