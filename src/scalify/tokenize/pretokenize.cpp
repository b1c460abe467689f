#include "scalify/tokenize/pretokenize.hpp"

#include <algorithm>
#include <cstdint>

#include "scalify/tokenize/unicode_classes.hpp"
#include "scalify/tokenize/utf8.hpp"

namespace scalify::tokenize {

namespace {

enum class Class : uint8_t { kLetter, kNumber, kSpace, kOther };

struct CodePoint {
  size_t begin;  // byte offset in the text
  char32_t value;
  Class cls;
};

// A byte that is not part of well-formed UTF-8. The reference tokenizers take Python strings,
// which cannot hold one; counting it as punctuation lets any bytes encode (and decode back).
constexpr char32_t kInvalid = 0xFFFFFFFF;

Class classify(char32_t c) {
  if (c == kInvalid) return Class::kOther;
  if (is_letter(c)) return Class::kLetter;
  if (is_number(c)) return Class::kNumber;
  if (is_whitespace(c)) return Class::kSpace;
  return Class::kOther;
}

std::vector<CodePoint> code_points(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = kInvalid;
    size_t n = utf8_decode(text, i, cp);
    if (n == 0) {
      n = 1;
      cp = kInvalid;
    }
    out.push_back({i, cp, classify(cp)});
    i += n;
  }
  return out;
}

// How many code points the pattern's match at cps[i] spans (at least 1).
size_t match_length(const std::vector<CodePoint>& cps, size_t i) {
  const size_t n = cps.size();
  const auto value = [&](size_t k) { return k < n ? cps[k].value : kInvalid; };
  // 's 't 're 've 'm 'll 'd: lower case only, as in GPT-2.
  if (value(i) == '\'') {
    const char32_t a = value(i + 1), b = value(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
  size_t start = i;
  if (value(i) == ' ' && i + 1 < n && cps[i + 1].cls != Class::kSpace) start = i + 1;
  if (cps[start].cls != Class::kSpace) {
    size_t end = start + 1;
    while (end < n && cps[end].cls == cps[start].cls) ++end;
    return end - i;
  }
  // `\s+(?!\S)`: a run of spaces that is not followed by a non-space, so a run before a word
  // leaves its last space to the word (" ?\p{L}+"). Else `\s+`: a single space before a word.
  size_t end = i + 1;
  while (end < n && cps[end].cls == Class::kSpace) ++end;
  if (end == n || end - i == 1) return end - i;
  return end - i - 1;
}

// How many code points Llama 3's pattern matches at cps[i] (at least 1).
size_t llama3_match_length(const std::vector<CodePoint>& cps, size_t i) {
  const size_t n = cps.size();
  const auto value = [&](size_t k) { return k < n ? cps[k].value : kInvalid; };
  const auto cls = [&](size_t k) { return k < n ? cps[k].cls : Class::kOther; };
  const auto lower = [&](size_t k) { return value(k) >= 'A' && value(k) <= 'Z' ? value(k) + 32 : value(k); };
  const auto run = [&](size_t k, Class c) {
    while (k < n && cps[k].cls == c) ++k;
    return k;
  };
  const auto is_newline = [&](size_t k) { return value(k) == '\r' || value(k) == '\n'; };
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (value(i) == '\'') {
    const char32_t a = lower(i + 1), b = lower(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (cls(i) == Class::kLetter) return run(i, Class::kLetter) - i;
  if (cls(i) != Class::kNumber && !is_newline(i) && cls(i + 1) == Class::kLetter) return run(i + 1, Class::kLetter) - i;
  // \p{N}{1,3}
  if (cls(i) == Class::kNumber) return std::min(run(i, Class::kNumber) - i, size_t(3));
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t start = value(i) == ' ' && cls(i + 1) == Class::kOther ? i + 1 : i;
  if (cls(start) == Class::kOther) {
    size_t end = run(start, Class::kOther);
    while (is_newline(end)) ++end;
    return end - i;
  }
  // A run of spaces: `\s*[\r\n]+` up to its last line break, else `\s+(?!\S)` leaving its last
  // space to the word after it, else `\s+`.
  const size_t end = run(i, Class::kSpace);
  for (size_t k = end; k > i; --k)
    if (is_newline(k - 1)) return k - i;
  if (end == n || end - i == 1) return end - i;
  return end - i - 1;
}

// The words of `word` cut around its numbers: each a word of its own, or each run of them one word.
void cut_numbers(std::string_view word, bool each, std::vector<std::string_view>& out) {
  const std::vector<CodePoint> cps = code_points(word);
  for (size_t i = 0; i < cps.size();) {
    const bool number = cps[i].cls == Class::kNumber;
    size_t next = i + 1;
    while (next < cps.size() && (cps[next].cls == Class::kNumber) == number && !(number && each)) ++next;
    const size_t end = next < cps.size() ? cps[next].begin : word.size();
    out.push_back(word.substr(cps[i].begin, end - cps[i].begin));
    i = next;
  }
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text, const std::vector<PreTokenizeRule>& rules) {
  std::vector<std::string_view> words;
  if (!text.empty()) words.push_back(text);
  for (PreTokenizeRule rule : rules) {
    std::vector<std::string_view> next;
    for (std::string_view word : words) {
      if (rule == PreTokenizeRule::kGpt2Pattern) {
        for (std::string_view w : gpt2_pretokenize(word)) next.push_back(w);
      } else if (rule == PreTokenizeRule::kLlama3Pattern) {
        for (std::string_view w : llama3_pretokenize(word)) next.push_back(w);
      } else {
        cut_numbers(word, rule == PreTokenizeRule::kEachNumber, next);
      }
    }
    words = std::move(next);
  }
  return words;
}

namespace {
// The words of `text` by a pattern's match lengths.
template <class MatchLength>
std::vector<std::string_view> cut(std::string_view text, MatchLength length_at) {
  const std::vector<CodePoint> cps = code_points(text);
  std::vector<std::string_view> words;
  for (size_t i = 0; i < cps.size();) {
    const size_t next = i + length_at(cps, i);
    const size_t begin = cps[i].begin, end = next < cps.size() ? cps[next].begin : text.size();
    words.push_back(text.substr(begin, end - begin));
    i = next;
  }
  return words;
}
}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) { return cut(text, match_length); }
std::vector<std::string_view> llama3_pretokenize(std::string_view text) { return cut(text, llama3_match_length); }

}  // namespace scalify::tokenize
