#pragma once
// The real pretrained model the `real_model`-labelled tests read: SmolLM2-135M-Instruct.Q4_1.gguf,
// which scripts/fetch_smollm2.sh installs into a cache. Such a test starts with
// REQUIRE_SMOLLM2(path) and skips, saying why, when the file is absent.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace scalify::testing {

// $SCALIFY_SMOLLM2, else ${SCALIFY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalify}/SmolLM2-135M-Instruct.Q4_1.gguf
// (where scripts/fetch_smollm2.sh puts it).
inline std::string smollm2_path() {
  if (const char* p = std::getenv("SCALIFY_SMOLLM2")) return p;
  std::string cache;
  if (const char* c = std::getenv("SCALIFY_CACHE")) {
    cache = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME")) {
    cache = std::string(x) + "/scalify";
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home ? home : "") + "/.cache/scalify";
  }
  return cache + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace scalify::testing

#define REQUIRE_SMOLLM2(path)                                  \
  const std::string path = ::scalify::testing::smollm2_path(); \
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent (scripts/fetch_smollm2.sh installs it, or set SCALIFY_SMOLLM2)"

// A fine-tune of the real model writes about 3 GB (its checkpoint carries Adam's moments); a
// machine without that much scratch disk skips it, saying so, rather than failing mid-write.
#define REQUIRE_SCRATCH_DISK(bytes)                                                                                                       \
  if (const auto free_bytes = std::filesystem::space(std::filesystem::temp_directory_path()).available; free_bytes < uintmax_t(bytes))    \
  GTEST_SKIP() << "needs " << (uintmax_t(bytes) >> 20) << " MB of scratch disk in " << std::filesystem::temp_directory_path() << ", has " \
               << (free_bytes >> 20) << " MB"
