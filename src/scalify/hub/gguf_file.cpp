#include "scalify/hub/gguf_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "scalify/error.hpp"
#include "scalify/hub/gguf_dequantize.hpp"

namespace scalify::hub {

namespace {

constexpr uint32_t kMaxDims = 4;                       // GGML_MAX_DIMS
constexpr uint64_t kMaxAlignment = uint64_t(1) << 30;  // far above any real one (32)
constexpr uint64_t kMaxNestedArrays = uint64_t(1) << 20;

// The smallest encoding of one value of a type: what a count is checked against before anything
// is allocated (a string is at least its 8-byte length, an array its type and count).
uint64_t min_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::uint8:
    case GgufValueType::int8:
    case GgufValueType::boolean: return 1;
    case GgufValueType::uint16:
    case GgufValueType::int16: return 2;
    case GgufValueType::uint32:
    case GgufValueType::int32:
    case GgufValueType::float32: return 4;
    case GgufValueType::string:
    case GgufValueType::uint64:
    case GgufValueType::int64:
    case GgufValueType::float64: return 8;
    case GgufValueType::array: return 12;
  }
  return 1;
}

bool is_integer(GgufValueType t) {
  return t == GgufValueType::uint8 || t == GgufValueType::int8 || t == GgufValueType::uint16 || t == GgufValueType::int16 ||
         t == GgufValueType::uint32 || t == GgufValueType::int32 || t == GgufValueType::uint64 || t == GgufValueType::int64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::int8 || t == GgufValueType::int16 || t == GgufValueType::int32 || t == GgufValueType::int64;
}

// A bounds-checked little-endian cursor over the file's bytes.
struct Cursor {
  const uint8_t* p;
  uint64_t size, at = 0;
  const std::string& what;
  uint64_t nested_arrays = 0;

  [[noreturn]] void fail(const std::string& message) const { throw Error(what + ": " + message); }
  uint64_t left() const { return size - at; }
  void need(uint64_t n, const std::string& field) const {
    if (n > left())
      fail("truncated: " + field + " needs " + std::to_string(n) + " bytes at offset " + std::to_string(at) + ", the file has " +
           std::to_string(left()) + " left");
  }
  template <class T>
  T scalar(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, p + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string string(const std::string& field) {
    const uint64_t n = scalar<uint64_t>(field + "'s length");
    if (n > left())
      fail(field + " claims " + std::to_string(n) + " bytes at offset " + std::to_string(at) + ", more than the " + std::to_string(left()) +
           " left in the file");
    std::string s(reinterpret_cast<const char*>(p + at), size_t(n));
    at += n;
    return s;
  }
  GgufValueType value_type(const std::string& field) {
    const uint32_t t = scalar<uint32_t>(field);
    if (t > uint32_t(GgufValueType::float64))
      fail(field + " is " + std::to_string(t) + ", not a GGUF value type (0 to 12: uint8, int8, ..., string, array, ..., float64)");
    return GgufValueType(t);
  }

  GgufValue value(GgufValueType type, const std::string& field, int depth) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufValueType::uint8: v.unsigned_integer = scalar<uint8_t>(field); break;
      case GgufValueType::uint16: v.unsigned_integer = scalar<uint16_t>(field); break;
      case GgufValueType::uint32: v.unsigned_integer = scalar<uint32_t>(field); break;
      case GgufValueType::uint64: v.unsigned_integer = scalar<uint64_t>(field); break;
      case GgufValueType::int8: v.integer = scalar<int8_t>(field); break;
      case GgufValueType::int16: v.integer = scalar<int16_t>(field); break;
      case GgufValueType::int32: v.integer = scalar<int32_t>(field); break;
      case GgufValueType::int64: v.integer = scalar<int64_t>(field); break;
      case GgufValueType::float32: v.real = scalar<float>(field); break;
      case GgufValueType::float64: v.real = scalar<double>(field); break;
      case GgufValueType::boolean: {
        const uint8_t b = scalar<uint8_t>(field);
        if (b > 1) fail(field + " is a bool of value " + std::to_string(b) + " (0 or 1)");
        v.boolean = b == 1;
        break;
      }
      case GgufValueType::string: v.text = string(field); break;
      case GgufValueType::array: array(v, field, depth); break;
    }
    return v;
  }

  void array(GgufValue& v, const std::string& field, int depth) {
    if (depth >= GgufFile::kMaxArrayDepth)
      fail(field + ": arrays nested deeper than " + std::to_string(GgufFile::kMaxArrayDepth) + " levels");
    v.element_type = value_type(field + "'s element type");
    const uint64_t n = scalar<uint64_t>(field + "'s length");
    const uint64_t each = min_bytes(v.element_type);
    if (n > left() / each)
      fail(field + " claims " + std::to_string(n) + " elements of " + gguf_value_type_name(v.element_type) + ", more than the " +
           std::to_string(left()) + " bytes left in the file hold");
    v.count = n;
    if (v.element_type == GgufValueType::string) {
      v.texts.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.texts.push_back(string(field + "[" + std::to_string(i) + "]"));
    } else if (v.element_type == GgufValueType::array) {
      nested_arrays += n;
      if (nested_arrays > kMaxNestedArrays) fail(field + ": more than " + std::to_string(kMaxNestedArrays) + " nested arrays in the file");
      v.items.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.items.push_back(value(GgufValueType::array, field + "[" + std::to_string(i) + "]", depth + 1));
    } else {
      // Numbers and bools: their bytes as stored, decoded by the getters.
      v.raw.assign(reinterpret_cast<const char*>(p + at), size_t(n * each));
      if (v.element_type == GgufValueType::boolean)
        for (char c : v.raw)
          if (uint8_t(c) > 1) fail(field + " holds a bool of value " + std::to_string(uint8_t(c)) + " (0 or 1)");
      at += n * each;
    }
  }
};

// Element i of a numeric array's raw bytes, as int64 / uint64 / double (the caller checked the type).
template <class T>
T element(const GgufValue& v, uint64_t i) {
  T x;
  std::memcpy(&x, v.raw.data() + i * sizeof(T), sizeof(T));
  return x;
}

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::uint8: return "uint8";
    case GgufValueType::int8: return "int8";
    case GgufValueType::uint16: return "uint16";
    case GgufValueType::int16: return "int16";
    case GgufValueType::uint32: return "uint32";
    case GgufValueType::int32: return "int32";
    case GgufValueType::float32: return "float32";
    case GgufValueType::boolean: return "bool";
    case GgufValueType::string: return "string";
    case GgufValueType::array: return "array";
    case GgufValueType::uint64: return "uint64";
    case GgufValueType::int64: return "int64";
    case GgufValueType::float64: return "float64";
  }
  return "?";
}

std::string GgufValue::type_description() const {
  if (type != GgufValueType::array) return gguf_value_type_name(type);
  if (element_type == GgufValueType::array) return items.empty() ? "array of arrays" : "array of " + items[0].type_description();
  return std::string("array of ") + gguf_value_type_name(element_type);
}

Shape GgufTensorInfo::shape() const {
  Shape s;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) s.push_back(int64_t(*it));
  return s;
}

GgufFile GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const std::string message = "GGUF: cannot open '" + path + "': " + std::strerror(errno);
    if (errno == ENOENT) throw MissingFileError(message);
    throw FileError(message);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FileError("GGUF: '" + path + "' is not a regular file");
  }
  GgufFile f;
  f.what_ = path;
  f.size_ = uint64_t(st.st_size);
  if (f.size_ > 0) {
    void* m = ::mmap(nullptr, size_t(f.size_), PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (m == MAP_FAILED) throw FileError("GGUF: cannot map '" + path + "': " + std::strerror(err));
    const size_t length = size_t(f.size_);
    f.owner_ = std::shared_ptr<const void>(m, [length](const void* p) { ::munmap(const_cast<void*>(p), length); });
    f.bytes_ = static_cast<const uint8_t*>(m);
  } else {
    ::close(fd);
  }
  f.read();
  return f;
}

GgufFile GgufFile::parse(std::string bytes, const std::string& what) {
  GgufFile f;
  f.what_ = what;
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  f.bytes_ = reinterpret_cast<const uint8_t*>(owned->data());
  f.size_ = owned->size();
  f.owner_ = owned;
  f.read();
  return f;
}

void GgufFile::read() {
  Cursor c{bytes_, size_, 0, what_};
  if (size_ < 4 || std::memcmp(bytes_, "GGUF", 4) != 0) c.fail("not a GGUF file (it does not start with the magic \"GGUF\")");
  c.at = 4;
  version_ = c.scalar<uint32_t>("the version");
  if (version_ == 1) c.fail("GGUF version 1 (32-bit counts, 2023's first files) is not read; versions 2 and 3 are");
  if (version_ != 2 && version_ != 3) {
    const bool swapped = version_ == 0x02000000u || version_ == 0x03000000u;
    c.fail("GGUF version " + std::to_string(version_) + " is not read (versions 2 and 3 are)" +
           (swapped ? "; this is a big-endian file, and only little-endian ones are read" : ""));
  }
  const uint64_t tensor_count = c.scalar<uint64_t>("the tensor count");
  const uint64_t kv_count = c.scalar<uint64_t>("the metadata count");
  // A key/value takes at least 13 bytes (key length, type, one byte), a tensor info 24.
  if (kv_count > c.left() / 13)
    c.fail("the header claims " + std::to_string(kv_count) + " metadata entries, more than the " + std::to_string(c.left()) +
           " bytes left in the file hold");
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string entry = "metadata entry " + std::to_string(i);
    std::string key = c.string(entry + "'s key");
    const std::string field = "metadata '" + key + "'";
    const GgufValueType type = c.value_type(field + "'s type");
    GgufValue v = c.value(type, field, 0);
    if (!index_.emplace(key, metadata_.size()).second) c.fail(field + " appears twice");
    metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (has("general.alignment")) {
    alignment_ = get_uint("general.alignment");
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > kMaxAlignment)
      c.fail("metadata 'general.alignment' is " + std::to_string(alignment_) + ", not a power of two up to 2^30");
  }
  if (tensor_count > c.left() / 24)
    c.fail("the header claims " + std::to_string(tensor_count) + " tensors, more than the " + std::to_string(c.left()) +
           " bytes left in the file hold");
  tensors_.reserve(size_t(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = c.string("tensor info " + std::to_string(i) + "'s name");
    const std::string field = "tensor '" + t.name + "'";
    const uint32_t n_dims = c.scalar<uint32_t>(field + "'s dimension count");
    if (n_dims > kMaxDims) c.fail(field + " has " + std::to_string(n_dims) + " dimensions; ggml tensors have at most 4");
    t.elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.scalar<uint64_t>(field + "'s dimension " + std::to_string(d));
      if (n > uint64_t(INT64_MAX) || __builtin_mul_overflow(t.elements, n, &t.elements) || t.elements > uint64_t(INT64_MAX))
        c.fail(field + "'s dimensions overflow: their product is beyond 2^63");
      t.dims.push_back(n);
    }
    t.type = c.scalar<uint32_t>(field + "'s type");
    const std::optional<GgmlBlock> block = ggml_block(t.type);
    if (!block) c.fail(field + " has ggml type " + std::to_string(t.type) + ", which ggml does not define");
    t.offset = c.scalar<uint64_t>(field + "'s offset");
    const uint64_t row = t.dims.empty() ? 1 : t.dims[0];
    if (row % block->elements != 0)
      c.fail(field + "'s rows of " + std::to_string(row) + " values are not a whole number of " + ggml_type_name(t.type) + " blocks of " +
             std::to_string(block->elements));
    if (__builtin_mul_overflow(t.elements / block->elements, block->bytes, &t.bytes)) c.fail(field + "'s size overflows");
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) c.fail(field + " appears twice");
    tensors_.push_back(std::move(t));
  }
  data_start_ = (c.at + alignment_ - 1) / alignment_ * alignment_;  // c.at <= size_ and alignment_ <= 2^30: no overflow
  const uint64_t data_size = data_start_ <= size_ ? size_ - data_start_ : 0;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : tensors_) {
    const std::string field = "tensor '" + t.name + "'";
    if (t.offset % alignment_ != 0)
      c.fail(field + "'s offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(alignment_));
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      c.fail(field + "'s data (" + std::to_string(t.bytes) + " bytes at offset " + std::to_string(t.offset) +
             " of the data section) runs past the end of the file (the data section holds " + std::to_string(data_size) + " bytes)");
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->offset + by_offset[i - 1]->bytes > by_offset[i]->offset)
      c.fail("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap in the data section");
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const auto it = index_.find(key);
  if (it == index_.end()) throw Error(what_ + ": metadata '" + key + "' is missing");
  return metadata_[it->second].second;
}

void GgufFile::fail_key(const std::string& key, const std::string& expected) const {
  throw Error(what_ + ": metadata '" + key + "' must be " + expected + ", it is " + value(key).type_description());
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_integer(v.type)) fail_key(key, "an unsigned integer");
  if (is_signed(v.type) && v.integer < 0)
    throw Error(what_ + ": metadata '" + key + "' must be an integer >= 0, it is " + std::to_string(v.integer));
  return is_signed(v.type) ? uint64_t(v.integer) : v.unsigned_integer;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_integer(v.type)) fail_key(key, "an integer");
  if (!is_signed(v.type) && v.unsigned_integer > uint64_t(INT64_MAX))
    throw Error(what_ + ": metadata '" + key + "' is " + std::to_string(v.unsigned_integer) + ", beyond int64");
  return is_signed(v.type) ? v.integer : int64_t(v.unsigned_integer);
}

double GgufFile::get_real(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::float32 && v.type != GgufValueType::float64) fail_key(key, "a float32 or float64");
  return v.real;
}

const std::string& GgufFile::get_text(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::string) fail_key(key, "a string");
  return v.text;
}

bool GgufFile::get_flag(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::boolean) fail_key(key, "a bool");
  return v.boolean;
}

std::vector<std::string> GgufFile::get_texts(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::array || v.element_type != GgufValueType::string) fail_key(key, "an array of string");
  return v.texts;
}

std::vector<int64_t> GgufFile::get_ints(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::array || !is_integer(v.element_type)) fail_key(key, "an array of integers");
  std::vector<int64_t> out(size_t(v.count));
  for (uint64_t i = 0; i < v.count; ++i) {
    switch (v.element_type) {
      case GgufValueType::uint8: out[i] = element<uint8_t>(v, i); break;
      case GgufValueType::int8: out[i] = element<int8_t>(v, i); break;
      case GgufValueType::uint16: out[i] = element<uint16_t>(v, i); break;
      case GgufValueType::int16: out[i] = element<int16_t>(v, i); break;
      case GgufValueType::uint32: out[i] = element<uint32_t>(v, i); break;
      case GgufValueType::int32: out[i] = element<int32_t>(v, i); break;
      case GgufValueType::int64: out[i] = element<int64_t>(v, i); break;
      default: {
        const uint64_t u = element<uint64_t>(v, i);
        if (u > uint64_t(INT64_MAX))
          throw Error(what_ + ": metadata '" + key + "'[" + std::to_string(i) + "] is " + std::to_string(u) + ", beyond int64");
        out[i] = int64_t(u);
      }
    }
  }
  return out;
}

std::vector<double> GgufFile::get_reals(const std::string& key) const {
  const GgufValue& v = value(key);
  const bool f32 = v.element_type == GgufValueType::float32;
  if (v.type != GgufValueType::array || (!f32 && v.element_type != GgufValueType::float64)) fail_key(key, "an array of float32 or float64");
  std::vector<double> out(size_t(v.count));
  for (uint64_t i = 0; i < v.count; ++i) out[i] = f32 ? double(element<float>(v, i)) : element<double>(v, i);
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) throw Error(what_ + ": no tensor '" + name + "'");
  return *t;
}

const uint8_t* GgufFile::data(const GgufTensorInfo& info) const { return bytes_ + data_start_ + info.offset; }

Tensor GgufFile::dequantize(const std::string& name) const {
  const GgufTensorInfo& t = tensor(name);
  if (!ggml_dequantizable(t.type))
    throw Error(what_ + ": tensor '" + name + "' is " + ggml_type_name(t.type) + " (ggml type " + std::to_string(t.type) +
                "), which Scalify does not dequantise (it reads " + ggml_dequantizable_names() + ")");
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  if (t.elements > 0) dequantize_ggml(t.type, data(t), t.elements, out.data<float>());
  return out;
}

bool is_gguf(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty() || fs::is_directory(path, ec)) return false;
  if (fs::path(path).extension() == ".gguf") return true;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  char magic[4] = {};
  const bool yes = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::read(fd, magic, 4) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
  ::close(fd);
  return yes;
}

}  // namespace scalify::hub
