#pragma once
// Peak resident memory of this process, resettable so one process can measure several runs
// (Linux: /proc/self/status VmHWM, reset by writing 5 to /proc/self/clear_refs).
#include <cstdint>

namespace scalify::platform {

// Resets the peak to the current resident size; false where the kernel does not allow it.
bool reset_peak_memory();
// Peak resident bytes since the start or the last reset; 0 where unknown.
int64_t peak_memory_bytes();

}  // namespace scalify::platform
