#include "scalify/hub/gguf_writer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "scalify/error.hpp"
#include "scalify/io/atomic_file.hpp"

namespace scalify::hub {

namespace {

// GGUF's metadata value types (docs/gguf.md: gguf_metadata_value_type).
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

template <typename T>
void put(std::string& out, T value) {  // little-endian, as every platform this builds on is
  char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));
  out.append(b, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}
void pad(std::string& out) { out.append((GgufWriter::kAlignment - out.size() % GgufWriter::kAlignment) % GgufWriter::kAlignment, '\0'); }

// f32 values as f16 or bf16 bit patterns (the engine's conversion rounds to nearest even).
std::string as_half(const Tensor& f32, DType dtype) {
  const Tensor h = f32.to(dtype).contiguous();
  return std::string(reinterpret_cast<const char*>(h.raw_bytes()), size_t(h.numel()) * 2);
}

}  // namespace

std::string quantize_q8_0(const float* x, size_t n) {
  constexpr size_t kBlock = 32;
  if (n % kBlock != 0) throw Error("Q8_0: a row of " + std::to_string(n) + " values is not a whole number of 32-value blocks");
  const size_t blocks = n / kBlock;
  std::vector<float> d(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    float amax = 0;
    for (size_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[b * kBlock + j]));
    d[b] = amax / 127.0f;
  }
  const std::string d16 = as_half(Tensor::from_vector(d, {int64_t(blocks)}), DType::f16);
  std::string out;
  out.reserve(blocks * (2 + kBlock));
  for (size_t b = 0; b < blocks; ++b) {
    out.append(d16, b * 2, 2);
    const float id = d[b] != 0 ? 1.0f / d[b] : 0.0f;  // ggml multiplies by the reciprocal
    for (size_t j = 0; j < kBlock; ++j) out += char(int8_t(std::roundf(x[b * kBlock + j] * id)));
  }
  return out;
}

GgufWriter::GgufWriter() { add_u32("general.alignment", kAlignment); }

void GgufWriter::add_key(const std::string& key, uint32_t value_type, const std::string& encoded) {
  if (std::find(keys_.begin(), keys_.end(), key) != keys_.end()) throw Error("GGUF: metadata key '" + key + "' given twice");
  keys_.push_back(key);
  put_string(metadata_, key);
  put<uint32_t>(metadata_, value_type);
  metadata_ += encoded;
}

void GgufWriter::add_string(const std::string& key, const std::string& value) {
  std::string e;
  put_string(e, value);
  add_key(key, kString, e);
}
void GgufWriter::add_u32(const std::string& key, uint32_t value) {
  std::string e;
  put(e, value);
  add_key(key, kU32, e);
}
void GgufWriter::add_i32(const std::string& key, int32_t value) {
  std::string e;
  put(e, value);
  add_key(key, kI32, e);
}
void GgufWriter::add_f32(const std::string& key, float value) {
  std::string e;
  put(e, value);
  add_key(key, kF32, e);
}
void GgufWriter::add_bool(const std::string& key, bool value) {
  std::string e;
  put<uint8_t>(e, value ? 1 : 0);
  add_key(key, kBool, e);
}
void GgufWriter::add_strings(const std::string& key, const std::vector<std::string>& values) {
  std::string e;
  put<uint32_t>(e, kString);
  put<uint64_t>(e, values.size());
  for (const std::string& v : values) put_string(e, v);
  add_key(key, kArray, e);
}
void GgufWriter::add_i32s(const std::string& key, const std::vector<int32_t>& values) {
  std::string e;
  put<uint32_t>(e, kI32);
  put<uint64_t>(e, values.size());
  for (int32_t v : values) put(e, v);
  add_key(key, kArray, e);
}
void GgufWriter::add_f32s(const std::string& key, const std::vector<float>& values) {
  std::string e;
  put<uint32_t>(e, kF32);
  put<uint64_t>(e, values.size());
  for (float v : values) put(e, v);
  add_key(key, kArray, e);
}

void GgufWriter::add_tensor(const std::string& name, const Tensor& value, Type type) {
  for (const Entry& e : tensors_)
    if (e.name == name) throw Error("GGUF: tensor '" + name + "' given twice");
  if (value.dim() < 1 || value.dim() > 4)
    throw Error("GGUF: tensor '" + name + "' has " + std::to_string(value.dim()) + " dimensions, not 1 to 4");
  const Tensor f32 = value.to(DType::f32).contiguous();
  Entry e{name, f32.shape(), type, {}};
  switch (type) {
    case Type::f32: e.data.assign(reinterpret_cast<const char*>(f32.raw_bytes()), size_t(f32.numel()) * 4); break;
    case Type::f16: e.data = as_half(f32, DType::f16); break;
    case Type::bf16: e.data = as_half(f32, DType::bf16); break;
    case Type::q8_0:
      if (f32.shape().back() % 32 != 0)
        throw Error("GGUF: tensor '" + name + "' has rows of " + std::to_string(f32.shape().back()) +
                    " values; Q8_0 needs a multiple of 32");
      e.data = quantize_q8_0(f32.data<float>(), size_t(f32.numel()));
      break;
  }
  tensors_.push_back(std::move(e));
}

void GgufWriter::emit(const io::ByteSink& sink) const {
  std::string head = "GGUF";
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, keys_.size());
  head += metadata_;
  uint64_t offset = 0;  // from the start of the data section, each tensor aligned
  for (const Entry& e : tensors_) {
    put_string(head, e.name);
    put<uint32_t>(head, uint32_t(e.shape.size()));
    for (auto it = e.shape.rbegin(); it != e.shape.rend(); ++it) put<uint64_t>(head, uint64_t(*it));
    put<uint32_t>(head, uint32_t(e.type));
    put<uint64_t>(head, offset);
    offset += (e.data.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  pad(head);
  sink(head.data(), head.size());
  const std::string zeros(kAlignment, '\0');
  for (const Entry& e : tensors_) {
    sink(e.data.data(), e.data.size());
    sink(zeros.data(), (kAlignment - e.data.size() % kAlignment) % kAlignment);
  }
}

std::string GgufWriter::bytes() const {
  std::string out;
  emit([&](const void* data, size_t size) { out.append(static_cast<const char*>(data), size); });
  return out;
}

void GgufWriter::write(const std::string& path) const {
  io::write_file_atomically(path, [&](const io::ByteSink& sink) { emit(sink); });
}

}  // namespace scalify::hub
