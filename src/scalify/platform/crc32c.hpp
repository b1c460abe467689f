#pragma once
// CRC-32C (Castagnoli, the checksum of iSCSI, ext4 and Btrfs metadata): what checkpoints store
// for every tensor. Chosen over a 64-bit hash because a CRC *guarantees* what a checkpoint check
// is for: every single-bit flip and every burst of up to 32 flipped bits is detected, whatever the
// tensor's size (a hash only makes a miss unlikely); and x86-64 computes it in hardware (SSE4.2's
// crc32 instruction, about 8 bytes in 3 cycles), so checking a checkpoint costs far less than
// reading it.
#include <cstddef>
#include <cstdint>
#include <string>

namespace scalify::platform {

// The CRC-32C of `size` bytes, continuing from `crc` (0 to start): crc32c("123456789") = 0xE3069283.
// Uses the crc32 instruction where the CPU has SSE4.2.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The same, one byte at a time from a table: the plain reference the fast path is tested against.
uint32_t crc32c_reference(const void* data, size_t size, uint32_t crc = 0);
// A CRC as stored in files: 8 lowercase hex digits.
std::string crc32c_text(uint32_t crc);

}  // namespace scalify::platform
