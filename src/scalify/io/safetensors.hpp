#pragma once
// safetensors files (the public format of Hugging Face): 8-byte little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {str: str}},
// then the tensor bytes, row-major, little-endian, offsets relative to the end of the header.
//
// Dtype strings: F32, F64, F16, BF16, F8_E4M3 (e4m3fn), F8_E5M2, I32, I64, U8 (u8: raw bytes) as the
// format defines them. Scalify's other formats (e4m3fnuz, e5m2fnuz, e4m3b11fnuz, e8m0, e2m3, e3m2, e2m1; one code
// per byte) are written as U8 and named in the metadata key "scalify.dtypes" (a JSON object
// {tensor name: scalify dtype name}), so any reader gets the bytes and Scalify gets the type back.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "scalify/tensor/tensor.hpp"

namespace scalify::io {

struct SafeTensors {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order (sorted by name on write)
  std::map<std::string, std::string> metadata;
  bool verified = false;  // read: every tensor and the metadata matched their stored checksums
  bool has(const std::string& name) const;
  const Tensor& at(const std::string& name) const;  // throws naming the missing tensor
};

// Checksums: the metadata key "scalify.crc32c" holds a JSON object {tensor name: CRC-32C of its
// bytes as 8 hex digits, "__metadata__": the CRC-32C of the other metadata} (platform/crc32c.hpp says
// why that checksum). Every write stores them; every read that finds them verifies them all and
// names the first tensor that fails. A file without them (an older scalify's, another tool's)
// loads with a note (scalify/note.hpp).
//
// Writes atomically (io/atomic_file.hpp): a crash leaves the previous file intact. Names must be
// unique and non-empty and must not start with "__".
void write_safetensors(const std::string& path, const SafeTensors& content);
// Reads and validates everything (a regular file no larger than half the memory available,
// header size within the file, JSON well formed, known dtypes, shapes, offsets in order,
// non-overlapping, inside the file and matching the byte counts, checksums);
// anything else is a scalify::Error naming the file and the problem.
// A file without checksums loads with a note, or quietly where no checksums are expected (another
// tool's files, such as a Hugging Face model's).
enum class Unverified : uint8_t { note, quiet };
SafeTensors read_safetensors(const std::string& path, Unverified unverified = Unverified::note);
// The same on bytes in memory (`what` names them in errors); what the fuzz test drives.
SafeTensors parse_safetensors(const std::string& bytes, const std::string& what);

}  // namespace scalify::io
