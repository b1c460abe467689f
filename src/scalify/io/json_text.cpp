#include "scalify/io/json_text.hpp"

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
    throw Error(what + ": not valid JSON: " + e.what());
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
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > max_chars) text = text.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return text;
}

}  // namespace scalify::io
