#pragma once
// Reading a file a user named (a config, a recipe, a checkpoint). Only a regular file is read: a
// FIFO would block forever and a device (/dev/zero, /dev/urandom) never ends, so both are refused
// before a byte is read; so is a file larger than the caller's limit, before it is loaded.
#include <cstdint>
#include <string>

namespace scalify::io {

// The whole content of `path`. `what` names the file's role in errors ("config", "recipe",
// "checkpoint"); `max_bytes` is the largest size accepted.
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// The first (at most) `bytes` bytes of `path`, under the same checks: a pipe or device is refused,
// never waited on (sniffing a format must not hang on a FIFO).
std::string read_input_head(const std::string& path, const std::string& what, size_t bytes);

// The CRC-32C of the whole of `path` (platform/crc32c), read in chunks under the same checks, so
// files of any size (a model's weights) cost no memory.
uint32_t input_file_crc32c(const std::string& path, const std::string& what);

}  // namespace scalify::io
