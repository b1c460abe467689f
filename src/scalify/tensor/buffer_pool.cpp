#include "scalify/tensor/buffer_pool.hpp"

#include <mutex>
#include <unordered_map>
#include <vector>

namespace scalify {

namespace {

// Caching stops at this many bytes; beyond it freed buffers go back to the system.
constexpr size_t kMaxPooledBytes = size_t(2) << 30;
// Small buffers come cheaply from malloc; pooling them would only add locking.
constexpr size_t kMinPooledSize = size_t(64) << 10;

struct Pool {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<std::byte*>> free;
  size_t bytes = 0;
  ~Pool() {
    for (auto& [size, list] : free)
      for (std::byte* p : list) delete[] p;
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may be released during static teardown
  return *p;
}

}  // namespace

void BufferDeleter::operator()(std::byte* p) const {
  if (size >= kMinPooledSize) {
    Pool& pl = pool();
    std::lock_guard lock(pl.mutex);
    if (pl.bytes + size <= kMaxPooledBytes) {
      pl.free[size].push_back(p);
      pl.bytes += size;
      return;
    }
  }
  delete[] p;
}

Buffer acquire_buffer(size_t size) {
  if (size >= kMinPooledSize) {
    Pool& pl = pool();
    std::lock_guard lock(pl.mutex);
    auto it = pl.free.find(size);
    if (it != pl.free.end() && !it->second.empty()) {
      std::byte* p = it->second.back();
      it->second.pop_back();
      pl.bytes -= size;
      return Buffer(p, BufferDeleter{size});
    }
  }
  return Buffer(new std::byte[size], BufferDeleter{size});
}

size_t pooled_bytes() {
  Pool& pl = pool();
  std::lock_guard lock(pl.mutex);
  return pl.bytes;
}

}  // namespace scalify
