#include "scalify/io/json_text.hpp"

#include <cstdint>
#include <cstdio>

#include "scalify/error.hpp"

namespace scalify::io {

void check_json_depth(std::string_view text, const std::string& what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw Error(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels (at byte " + std::to_string(i) +
                    "); no valid file nests that deep");
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced brackets are the parser's to name
    }
  }
}

nlohmann::json parse_json(std::string_view text, const std::string& what) {
  check_json_depth(text, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what + ": not valid JSON: " + text_excerpt(e.what(), 200));
  }
}

nlohmann::json try_parse_json(std::string_view text) {
  try {
    check_json_depth(text, "");
  } catch (const Error&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
  return nlohmann::json::parse(text, nullptr, false);
}

std::string json_excerpt(const nlohmann::json& v, size_t max_chars) {
  // Every value Scalify holds was parsed under kMaxJsonDepth, so this dump's recursion is bounded;
  // invalid UTF-8 in a string is replaced rather than thrown.
  return text_excerpt(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max_chars);
}

std::string text_excerpt(std::string_view text, size_t max_chars) {
  std::string out;
  for (const char c : text) {
    if (out.size() >= max_chars) return out.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
    if (uint8_t(c) < 0x20 || c == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", unsigned(uint8_t(c)));
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace scalify::io
