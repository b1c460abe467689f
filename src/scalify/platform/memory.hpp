#pragma once
// Memory: the peak resident memory of this process, resettable so one process can measure several
// runs (Linux: /proc/self/status VmHWM, reset by writing 5 to /proc/self/clear_refs), and the most
// this process may use, which work is checked against before it allocates.
#include <cstdint>

namespace scalify::platform {

// Resets the peak to the current resident size; false where the kernel does not allow it.
bool reset_peak_memory();
// Peak resident bytes since the start or the last reset; 0 where unknown.
int64_t peak_memory_bytes();
// The most memory this process can have: the least of physical memory, the cgroup's limit
// (v2 memory.max, v1 memory.limit_in_bytes) and the address-space / data rlimits.
int64_t memory_limit_bytes();

}  // namespace scalify::platform
