#pragma once
// A GGUF file (ggml's format for llama.cpp and the tools around it; ggml's docs/gguf.md), read
// without trusting it. Little-endian layout:
//   "GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 metadata count,
//   metadata: (string key, uint32 value type, value) each, a string being uint64 length + bytes
//     and an array uint32 element type + uint64 count + elements (arrays may nest),
//   tensor infos: (string name, uint32 n_dims, uint64 dims[n_dims], uint32 ggml type, uint64 offset),
//   padding to `general.alignment` (default 32), then the data section: each tensor at its offset
//     from the section's start, a multiple of the alignment.
// dims[0] is the innermost (contiguous) dimension: the row-major shape is dims reversed.
//
// Every count and size is checked against the bytes left before anything is allocated, so a file
// that lies gets a scalify::Error naming the file and what is wrong, never a crash, a hang or a
// huge allocation: a bad magic or version, a string or array longer than the file, arrays nested
// deeper than kMaxArrayDepth, a duplicate key or tensor name, a value type or ggml type that does
// not exist, an alignment that is not a power of two, dims whose product overflows, tensor data
// outside the file, misaligned or overlapping another tensor's.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scalify/tensor/tensor.hpp"

namespace scalify::hub {

enum class GgufValueType : uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);  // "uint32", "string", "array", ...

// One metadata value. Integers are held in `integer` (signed types) or `unsigned_integer`,
// floats in `real`. An array has `count` elements of `element_type`: strings in `texts`, arrays in
// `items`, numbers and bools as their stored little-endian bytes in `raw` (GgufFile's getters
// decode them; a token-type array of 49,152 int32 stays 196 KB).
struct GgufValue {
  GgufValueType type = GgufValueType::uint8;
  uint64_t unsigned_integer = 0;
  int64_t integer = 0;
  double real = 0;
  bool boolean = false;
  std::string text;
  GgufValueType element_type = GgufValueType::uint8;
  uint64_t count = 0;
  std::vector<std::string> texts;
  std::vector<GgufValue> items;
  std::string raw;
  // "uint32", "array of string", "array of array of int32": what errors call its type.
  std::string type_description() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] innermost
  uint32_t type = 0;           // ggml type number (gguf_dequantize.hpp)
  uint64_t offset = 0;         // from the start of the data section
  uint64_t bytes = 0;          // its data's size
  uint64_t elements = 0;
  Shape shape() const;  // row-major: dims reversed ([V, D] for token_embd's dims {D, V})
};

class GgufFile {
 public:
  static constexpr int kMaxArrayDepth = 4;  // arrays of arrays: GGUF files nest at most one level

  // Reads PATH (a regular file; memory-mapped read-only, so tensors are read on demand).
  static GgufFile open(const std::string& path);
  // The same on bytes in memory; `what` names them in errors (what the fuzz tests drive).
  static GgufFile parse(std::string bytes, const std::string& what);

  const std::string& path() const { return what_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  bool has(const std::string& key) const { return index_.count(key) != 0; }
  const GgufValue& value(const std::string& key) const;  // an error naming the key when absent
  // Typed getters: an error naming the file, the key, the expected type and the stored one when the
  // key is absent or of another type. uint: any integer type holding a value >= 0; integer: any
  // integer type that fits int64; real: float32 or float64; text: string; flag: bool.
  uint64_t get_uint(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_real(const std::string& key) const;
  const std::string& get_text(const std::string& key) const;
  bool get_flag(const std::string& key) const;
  std::vector<std::string> get_texts(const std::string& key) const;  // array of string
  std::vector<int64_t> get_ints(const std::string& key) const;       // array of an integer type
  std::vector<double> get_reals(const std::string& key) const;       // array of float32 or float64
  // With a default where the key is absent (a key of the wrong type is still an error).
  uint64_t get_uint_or(const std::string& key, uint64_t fallback) const { return has(key) ? get_uint(key) : fallback; }
  double get_real_or(const std::string& key, double fallback) const { return has(key) ? get_real(key) : fallback; }

  // Tensor infos, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;  // null when absent
  const GgufTensorInfo& tensor(const std::string& name) const;       // an error naming it when absent
  // The tensor's stored bytes (info.bytes of them), valid while this file (or a copy) lives.
  const uint8_t* data(const GgufTensorInfo& info) const;
  // The tensor as f32 in its row-major shape (gguf_dequantize.hpp); an error naming the tensor
  // and its type when the type is not one Scalify dequantises.
  Tensor dequantize(const std::string& name) const;

 private:
  std::string what_;
  std::shared_ptr<const void> owner_;  // the mapping or the bytes
  const uint8_t* bytes_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t> index_, tensor_index_;
  std::vector<GgufTensorInfo> tensors_;

  void read();  // parses bytes_ into the rest
  [[noreturn]] void fail_key(const std::string& key, const std::string& expected) const;
};

// Whether PATH names a GGUF file rather than a model folder: not a folder, and named *.gguf or
// starting with the magic "GGUF". What the loaders (hf_config, hf_weights) dispatch on.
bool is_gguf(const std::string& path);

}  // namespace scalify::hub
