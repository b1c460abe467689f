#include "scalify/note.hpp"

#include <cstdio>
#include <mutex>
#include <utility>

namespace scalify {

namespace {
std::mutex g_mutex;
std::function<void(const std::string&)> g_sink = [](const std::string& m) { std::fprintf(stderr, "scalify: note: %s\n", m.c_str()); };
}  // namespace

void note(const std::string& message) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sink) g_sink(message);
}

std::function<void(const std::string&)> set_note_sink(std::function<void(const std::string&)> sink) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  return std::exchange(g_sink, std::move(sink));
}

}  // namespace scalify
