#pragma once
// Loader for the ml_dtypes reference vectors in tests/data/testvectors (layout: its README.md).
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalify/formats/format.hpp"

namespace scalify::testing {

inline std::string testvector_path(const std::string& file) { return std::string(SCALIFY_TESTVECTORS_DIR) + "/" + file; }

// Reads a file, gunzipping it when the name ends in .gz (gzread passes plain files through).
inline std::vector<uint8_t> read_testvector(const std::string& file) {
  const std::string path = testvector_path(file);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open test vector file " + path);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed || out.empty()) throw std::runtime_error("cannot read test vector file " + path);
  return out;
}

inline uint32_t load_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct VectorFormat {
  Format format;
  const char* stem;  // file-name stem in the test-vector folder
};

inline const std::vector<VectorFormat>& vector_formats() {
  static const std::vector<VectorFormat> v = {
      {Format::bf16, "bfloat16"},
      {Format::f16, "float16"},
      {Format::e4m3, "float8_e4m3fn"},
      {Format::e5m2, "float8_e5m2"},
      {Format::e4m3fnuz, "float8_e4m3fnuz"},
      {Format::e5m2fnuz, "float8_e5m2fnuz"},
      {Format::e4m3b11fnuz, "float8_e4m3b11fnuz"},
      {Format::e8m0, "float8_e8m0fnu"},
      {Format::e2m3, "float6_e2m3fn"},
      {Format::e3m2, "float6_e3m2fn"},
      {Format::e2m1, "float4_e2m1fn"},
  };
  return v;
}

inline const char* code_suffix(Format f) { return info(f).bits > 8 ? "u16le" : "u8"; }

// The README's two exemptions, where Scalify defines its own behaviour:
// 1. e8m0 from f32 bits 0x00400001..0x005FFFFF: round to nearest (2^-127, code 0x00).
inline bool e8m0_quirk_input(Format f, uint32_t f32_bits) {
  return f == Format::e8m0 && f32_bits >= 0x00400001u && f32_bits <= 0x005FFFFFu;
}
// 2. NaN into FP6/FP4 (formats without NaN): an error, not a signed zero.
inline bool nan_into_nanless(Format f, uint32_t f32_bits) { return !info(f).has_nan() && (f32_bits & 0x7FFFFFFFu) > 0x7F800000u; }

inline std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", v);
  return b;
}

}  // namespace scalify::testing

namespace scalify::testing {
inline void PrintTo(const VectorFormat& v, std::ostream* os) { *os << v.stem; }
}  // namespace scalify::testing
