#pragma once
// Numbers written by a user (command-line options, --set values, config strings): plain decimal
// only. No surrounding space, no '+', no hex ("0x10"), no value outside the type's range (which
// strtoull and stream extraction clamp or wrap silently); doubles must also be finite.
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>

namespace scalify::io {

template <class T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  if (text.empty() || text.front() == '+') return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace scalify::io
