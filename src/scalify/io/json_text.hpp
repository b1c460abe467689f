#pragma once
// JSON from outside the process (recipes, checkpoint metadata, model folders, run logs): parsed
// with a bounded nesting depth and quoted in errors by a bounded excerpt. nlohmann's parser and
// destructor are iterative, but dump() and every walk over a value recurse: a 200 KB file of
// 100,000 nested brackets overflowed the stack in an error message. Internal to the library (the
// JSON library is a private dependency).
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace scalify::io {

// No file Scalify reads nests deeper than a few levels; 64 leaves room for other writers.
constexpr int kMaxJsonDepth = 64;

// Throws Error("<what>: JSON nested deeper than 64 levels ...") when text opens more than
// kMaxJsonDepth arrays or objects inside one another (brackets inside strings do not count).
void check_json_depth(std::string_view text, const std::string& what);

// check_json_depth, then the parsed value; text that is not JSON is Error("<what>: not valid JSON: ...").
nlohmann::json parse_json(std::string_view text, const std::string& what);

// The parsed value, or a discarded value (is_discarded()) when text is not JSON or nests too deep:
// for readers that name the bad line themselves.
nlohmann::json try_parse_json(std::string_view text);

// v's JSON text cut to at most max_chars characters ("..." marks a cut), for error messages.
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 64);

// Untrusted text (a key, a tensor name, a parser's message quoting its input) for an error
// message: control bytes escaped as \xNN, cut to at most max_chars ("..." marks a cut).
std::string text_excerpt(std::string_view text, size_t max_chars = 64);

}  // namespace scalify::io
