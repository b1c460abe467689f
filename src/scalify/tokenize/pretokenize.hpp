#pragma once
// GPT-2's pre-tokenisation: text is cut into words before BPE merges within each, by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched leftmost-first (the first alternative that matches wins), here by hand over UTF-8 code
// points with the tables of unicode_classes.hpp.
#include <string_view>
#include <vector>

namespace scalify::tokenize {

// The words of `text`, in order; together they are exactly `text`. Text that is not valid UTF-8
// is still cut (GPT-2 works on bytes): each byte that does not start a well-formed UTF-8 sequence
// counts as one code point that is neither letter, number nor space, like punctuation.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace scalify::tokenize
