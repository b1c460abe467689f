#include "scalify/io/safetensors.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "scalify/error.hpp"
#include "scalify/io/atomic_file.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/note.hpp"
#include "scalify/platform/crc32c.hpp"
#include "scalify/platform/memory.hpp"

namespace scalify::io {

using json = nlohmann::json;

namespace {
constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the reference implementation's limit
constexpr const char* kDtypesKey = "scalify.dtypes";
// The checksums: {tensor name: CRC-32C of its bytes, ..., "__metadata__": CRC-32C of the other
// metadata}. kHeaderKey, a metadata key of its own (so readers of earlier versions, which check the
// entries of kChecksumsKey one for one, still read the file), holds the CRC-32C of the whole header
// besides: the metadata and every tensor's entry (dtype, shape, offsets) with its checksum, so no
// part of the header goes unchecked (a dtype changed from F8_E4M3 to F8_E5M2 passed every other CRC).
constexpr const char* kChecksumsKey = "scalify.crc32c";
constexpr const char* kHeaderKey = "scalify.crc32c.header";
constexpr const char* kMetadataEntry = "__metadata__";

using TextMap = std::map<std::string, std::string>;

// Adds key and value to a running CRC-32C, each with its terminating NUL.
uint32_t add_pair(uint32_t c, const std::string& k, const std::string& v) {
  c = platform::crc32c(k.data(), k.size() + 1, c);
  return platform::crc32c(v.data(), v.size() + 1, c);
}
// The CRC-32C of the metadata but the checksums' own key (and, with `header`, kHeaderKey), key and
// value of each in key order: a flipped digit in the stored config is caught like one in a tensor.
// With `header`, each tensor's entry (canonical JSON) and checksum follow, in name order.
uint32_t metadata_crc(const TextMap& meta, const TextMap* entries = nullptr, const TextMap* checksums = nullptr) {
  uint32_t c = 0;
  for (const auto& [k, v] : meta)
    if (k != kChecksumsKey && !(entries && k == kHeaderKey)) c = add_pair(c, k, v);
  if (entries)
    for (const auto& [name, entry] : *entries) c = add_pair(add_pair(c, name, entry), name, checksums->at(name));
  return c;
}
bool is_crc32c_text(const std::string& s) {
  return s.size() == 8 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
uint32_t tensor_crc(const Tensor& contiguous) {
  return platform::crc32c(contiguous.raw_bytes(), size_t(contiguous.numel()) * size_t(dtype_size(contiguous.dtype())));
}

// The standard dtype string of a scalify dtype, or "" when it has none (stored as U8).
std::string standard_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::e4m3: return "F8_E4M3";
    case DType::e5m2: return "F8_E5M2";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    default: return "";
  }
}
DType from_standard(const std::string& s, const std::string& what) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::i32, DType::i64, DType::u8})
    if (standard_name(t) == s) return t;
  throw Error(what + ": unsupported dtype '" + s + "'");
}
}  // namespace

bool SafeTensors::has(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; });
}
const Tensor& SafeTensors::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  throw Error("safetensors: no tensor named '" + name + "'");
}

void write_safetensors(const std::string& path, const SafeTensors& content) {
  std::vector<std::pair<std::string, Tensor>> sorted = content.tensors;
  for (auto& entry : sorted) entry.second = entry.second.contiguous();  // once: checksummed, then written
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  json header = json::object(), custom = json::object();
  TextMap checksums, entries;
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto& [name, t] = sorted[i];
    if (name.empty() || name.rfind("__", 0) == 0) throw Error("safetensors: bad tensor name '" + name + "' for " + path);
    if (i > 0 && sorted[i - 1].first == name) throw Error("safetensors: duplicate tensor name '" + name + "' for " + path);
    std::string dt = standard_name(t.dtype());
    if (dt.empty()) {
      dt = "U8";
      custom[name] = std::string(dtype_name(t.dtype()));
    }
    const uint64_t bytes = uint64_t(t.numel()) * uint64_t(dtype_size(t.dtype()));
    header[name] = {{"dtype", dt}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
    entries[name] = header[name].dump();
    checksums[name] = platform::crc32c_text(tensor_crc(t));
    offset += bytes;
  }
  std::map<std::string, std::string> meta = content.metadata;
  if (!custom.empty()) meta[kDtypesKey] = custom.dump();
  meta[kHeaderKey] = platform::crc32c_text(metadata_crc(meta, &entries, &checksums));
  checksums[kMetadataEntry] = platform::crc32c_text(metadata_crc(meta));  // kHeaderKey included
  meta[kChecksumsKey] = json(checksums).dump();
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes, as the reference does
  write_file_atomically(path, [&](const ByteSink& out) {
    uint8_t n[8];
    for (int i = 0; i < 8; ++i) n[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    out(n, 8);
    out(text.data(), text.size());
    for (const auto& [name, t] : sorted) out(t.raw_bytes(), size_t(t.numel()) * size_t(dtype_size(t.dtype())));
  });
}

SafeTensors parse_safetensors(const std::string& bytes, const std::string& what) {
  auto bad = [&](const std::string& why) { return Error(what + ": not a valid safetensors file: " + why); };
  if (bytes.size() < 8) throw bad("shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  if (n > kMaxHeader || n > bytes.size() - 8)
    throw bad("header length " + std::to_string(n) + " exceeds the file (" + std::to_string(bytes.size()) + " bytes)");
  json header;
  try {
    const std::string_view text(bytes.data() + 8, size_t(n));
    check_json_depth(text, what + ": not a valid safetensors file: header");
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw bad("header is not JSON: " + text_excerpt(e.what(), 200));
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  SafeTensors out;
  json custom = json::object();
  if (header.contains("__metadata__")) {
    const json& m = header["__metadata__"];
    if (!m.is_object()) throw bad("__metadata__ is not an object");
    for (const auto& [k, v] : m.items()) {
      if (!v.is_string()) throw bad("metadata value of '" + text_excerpt(k) + "' is not a string");
      out.metadata[k] = v.get<std::string>();
    }
    if (out.metadata.count(kDtypesKey)) {
      try {
        check_json_depth(out.metadata[kDtypesKey], what + ": " + kDtypesKey);
        custom = json::parse(out.metadata[kDtypesKey]);
      } catch (const json::exception&) {
        throw bad(std::string(kDtypesKey) + " is not JSON");
      }
      if (!custom.is_object()) throw bad(std::string(kDtypesKey) + " is not an object");
    }
  }
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  TextMap entry_text;  // each tensor's entry as canonical JSON, for the header's checksum
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    entry_text[name] = e.dump(-1, ' ', false, json::error_handler_t::replace);
    const std::string where = "tensor '" + text_excerpt(name) + "'";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw bad(where + " needs dtype, shape and data_offsets");
    if (!e["dtype"].is_string()) throw bad(where + ": dtype is not a string");
    const std::string dt = e["dtype"].get<std::string>();
    Entry en{name, DType::f32, {}, 0, 0};
    try {
      if (dt == "U8" && custom.contains(name)) {
        if (!custom[name].is_string()) throw Error("its scalify dtype is not a string");
        en.dtype = parse_dtype(custom[name].get<std::string>());
        if (dtype_size(en.dtype) != 1 || !standard_name(en.dtype).empty()) throw Error("U8 cannot hold " + custom[name].get<std::string>());
      } else {
        en.dtype = from_standard(dt, where);
      }
    } catch (const Error& err) {
      throw bad(where + ": " + err.what());
    }
    if (!e["shape"].is_array() || e["shape"].size() > 16) throw bad(where + ": shape is not an array of at most 16 sizes");
    uint64_t numel = 1;
    for (const json& s : e["shape"]) {
      if (!s.is_number_unsigned()) throw bad(where + ": shape holds something other than a non-negative integer");
      const uint64_t d = s.get<uint64_t>();
      if (d > uint64_t(std::numeric_limits<int64_t>::max()) || (d != 0 && numel > data_size / d + 1))
        throw bad(where + ": shape too large for the file");
      numel *= d;
      en.shape.push_back(int64_t(d));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad(where + ": data_offsets is not [begin, end]");
    en.begin = off[0].get<uint64_t>();
    en.end = off[1].get<uint64_t>();
    if (en.begin > en.end || en.end > data_size)
      throw bad(where + ": data_offsets [" + std::to_string(en.begin) + ", " + std::to_string(en.end) + ") outside the " +
                std::to_string(data_size) + " data bytes");
    if (en.end - en.begin != numel * uint64_t(dtype_size(en.dtype)))
      throw bad(where + ": " + std::to_string(en.end - en.begin) + " bytes for shape " + shape_str(en.shape) + " of " +
                std::string(dtype_name(en.dtype)));
    entries.push_back(std::move(en));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      throw bad("tensors '" + text_excerpt(entries[i - 1].name) + "' and '" + text_excerpt(entries[i].name) + "' overlap");
  const auto stored = out.metadata.find(kChecksumsKey);
  TextMap checksums;  // tensor name -> CRC-32C in hex
  if (stored != out.metadata.end()) {
    const json j = try_parse_json(stored->second);
    if (!j.is_object()) throw bad(std::string(kChecksumsKey) + " is not a JSON object");
    for (const auto& [name, crc] : j.items()) {
      if (!crc.is_string() || !is_crc32c_text(crc.get<std::string>()))
        throw Error(what + ": " + kChecksumsKey + " holds " + json_excerpt(crc) + " for '" + text_excerpt(name) +
                    "', not a CRC-32C in 8 hex digits: the file is corrupt");
      checksums[name] = crc.get<std::string>();
    }
    const auto fails = [&] { return Error(what + ": the metadata fails its checksum (CRC-32C): the file is corrupt"); };
    if (!checksums.count(kMetadataEntry) || checksums[kMetadataEntry] != platform::crc32c_text(metadata_crc(out.metadata))) throw fails();
    checksums.erase(kMetadataEntry);
    // Files of earlier versions carry no header checksum.
    const auto header_crc = out.metadata.find(kHeaderKey);
    if (header_crc != out.metadata.end()) {
      for (const auto& [name, crc] : checksums)
        if (!entry_text.count(name)) throw bad(std::string(kChecksumsKey) + " names tensors the file does not hold");
      for (const auto& [name, e] : entry_text)
        if (!checksums.count(name)) throw Error(what + ": tensor '" + text_excerpt(name) + "' has no checksum in " + kChecksumsKey);
      if (header_crc->second != platform::crc32c_text(metadata_crc(out.metadata, &entry_text, &checksums)))
        throw Error(what + ": the header fails its checksum (CRC-32C): a tensor's dtype, shape or offsets changed; the file is corrupt");
      out.metadata.erase(header_crc);
    }
  }
  for (const Entry& en : entries) {
    Tensor t = Tensor::empty(en.shape, en.dtype);
    if (en.end > en.begin) std::memcpy(t.raw_bytes(), data + en.begin, en.end - en.begin);
    if (stored != out.metadata.end()) {
      const std::string actual = platform::crc32c_text(tensor_crc(t));
      const auto crc = checksums.find(en.name);
      if (crc == checksums.end()) throw Error(what + ": tensor '" + text_excerpt(en.name) + "' has no checksum in " + kChecksumsKey);
      if (crc->second != actual)
        throw Error(what + ": tensor '" + text_excerpt(en.name) + "' fails its checksum (CRC-32C " + actual + ", stored " + crc->second +
                    "): the file is corrupt");
    }
    out.tensors.emplace_back(en.name, std::move(t));
  }
  if (stored != out.metadata.end()) {
    if (checksums.size() != entries.size()) throw bad(std::string(kChecksumsKey) + " names tensors the file does not hold");
    out.metadata.erase(stored);
    out.verified = true;
  }
  out.metadata.erase(kDtypesKey);
  return out;
}

SafeTensors read_safetensors(const std::string& path, Unverified unverified) {
  // The bytes and the tensors made from them are both in memory while the file is read.
  const uint64_t limit = uint64_t(platform::memory_limit_bytes() / 2);
  SafeTensors st = parse_safetensors(read_input_file(path, "checkpoint", limit), path);
  if (!st.verified && unverified == Unverified::note)
    note("'" + path + "' carries no checksums (written by an older scalify or another tool): its tensors load unverified");
  return st;
}

}  // namespace scalify::io
