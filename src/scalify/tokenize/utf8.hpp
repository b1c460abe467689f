#pragma once
// UTF-8 code points: reading one, strictly, and writing one.
#include <cstddef>
#include <string>
#include <string_view>

namespace scalify::tokenize {

// The length of the well-formed UTF-8 sequence at s[i] and its code point in `cp`, or 0 when the
// bytes there are not one (Unicode's Table 3-7: no overlong forms, no surrogates, nothing above
// U+10FFFF, no truncated sequence).
size_t utf8_decode(std::string_view s, size_t i, char32_t& cp);
// Appends code point `cp` (at most U+10FFFF) to `out` in UTF-8.
void utf8_append(std::string& out, char32_t cp);

}  // namespace scalify::tokenize
