#pragma once
// GPT-2's pre-tokenisation: text is cut into words before BPE merges within each, by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched leftmost-first (the first alternative that matches wins), here by hand over UTF-8 code
// points with the tables of unicode_classes.hpp.
#include <cstdint>
#include <string_view>
#include <vector>

namespace scalify::tokenize {

// The words of `text`, in order; together they are exactly `text`. Text that is not valid UTF-8
// is still cut (GPT-2 works on bytes): each byte that does not start a well-formed UTF-8 sequence
// counts as one code point that is neither letter, number nor space, like punctuation.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

// Llama 3's pre-tokenisation, by its tokenizer.json's pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// matched as gpt2_pretokenize matches GPT-2's (the contractions in either case, ASCII only).
std::vector<std::string_view> llama3_pretokenize(std::string_view text);

// The rules a byte-level BPE's pre-tokenizer is made of (tokenizer.json's pre_tokenizer, GGUF's
// tokenizer.ggml.pre), each cutting the words the rules before it made.
enum class PreTokenizeRule : uint8_t {
  kGpt2Pattern,    // gpt2_pretokenize (ByteLevel with use_regex, or a Split by GPT-2's pattern)
  kLlama3Pattern,  // llama3_pretokenize (a Split by Llama 3's pattern)
  kEachNumber,     // every number (\p{N}) a word of its own (Digits with individual_digits)
  kNumberRuns,     // every run of numbers a word (Digits without individual_digits)
};

// The words of `text` after each rule in turn; no rules leave the text one word (an empty text
// none). Together the words are exactly `text`.
std::vector<std::string_view> pretokenize(std::string_view text, const std::vector<PreTokenizeRule>& rules);

}  // namespace scalify::tokenize
