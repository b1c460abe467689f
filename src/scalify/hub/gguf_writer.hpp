#pragma once
// Writing a GGUF file (version 3, the format of ggml's docs/gguf.md): the header, metadata
// key/values, tensor infos, then the tensor data, each part aligned to 32 bytes with zero padding.
// Little-endian throughout. Shapes are given as the engine and NumPy hold them (the last dimension
// fastest); GGUF lists them reversed (ne[0] is the fastest dimension), which this writer does.
#include <cstdint>
#include <string>
#include <vector>

#include "scalify/io/atomic_file.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::hub {

class GgufWriter {
 public:
  // How a tensor is stored: ggml's type numbers.
  enum class Type : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };
  static constexpr uint32_t kAlignment = 32;

  // Metadata (general.alignment is written first, by the constructor). A key given twice is an error.
  GgufWriter();
  void add_string(const std::string& key, const std::string& value);
  void add_u32(const std::string& key, uint32_t value);
  void add_i32(const std::string& key, int32_t value);
  void add_f32(const std::string& key, float value);
  void add_bool(const std::string& key, bool value);
  void add_strings(const std::string& key, const std::vector<std::string>& values);
  void add_i32s(const std::string& key, const std::vector<int32_t>& values);
  void add_f32s(const std::string& key, const std::vector<float>& values);

  // `value` (any dtype; its values are taken as f32) stored as `type`: F16 and BF16 rounded to
  // nearest even, Q8_0 as ggml's quantize_row_q8_0_ref (its last dimension must be a multiple of 32).
  void add_tensor(const std::string& name, const Tensor& value, Type type);

  // The whole file, or written to `path` atomically (io/atomic_file).
  std::string bytes() const;
  void write(const std::string& path) const;

 private:
  void emit(const io::ByteSink& sink) const;
  void add_key(const std::string& key, uint32_t value_type, const std::string& encoded);
  std::vector<std::string> keys_;
  std::string metadata_;  // the encoded key/values, in order
  struct Entry {
    std::string name;
    Shape shape;
    Type type;
    std::string data;
  };
  std::vector<Entry> tensors_;
};

// One row of f32 values as ggml's Q8_0 blocks (34 bytes per 32 values: the scale d = amax / 127
// as f16, then round(x * (1 / d)) as int8, rounding halves away from zero).
std::string quantize_q8_0(const float* x, size_t n);

}  // namespace scalify::hub
