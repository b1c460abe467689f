#include "scalify/tokenize/bpe.hpp"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <climits>
#include <queue>

#include "scalify/error.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/tokenize/pretokenize.hpp"
#include "scalify/tokenize/utf8.hpp"

namespace scalify::tokenize {

namespace {
// GPT-2's files are 1 MB (vocab.json) and 0.5 MB (merges.txt); larger vocabularies a few times that.
constexpr uint64_t kMaxFileBytes = uint64_t(256) << 20;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// The bytes a vocabulary entry stands for: each character mapped back through byte_to_unicode.
// An entry with a character outside that map (an added token written as plain text) stands for
// its own UTF-8 text, as in Hugging Face's ByteLevel decoder.
std::string token_bytes_of(const std::string& token, const std::unordered_map<char32_t, uint8_t>& unicode_to_byte) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    char32_t cp = 0;
    const size_t n = utf8_decode(token, i, cp);
    const auto it = n == 0 ? unicode_to_byte.end() : unicode_to_byte.find(cp);
    if (it == unicode_to_byte.end()) return token;
    bytes += char(it->second);
    i += n;
  }
  return bytes;
}
}  // namespace

std::string byte_vocab_json() {
  nlohmann::json vocab = nlohmann::json::object();
  const std::array<char32_t, 256> map = byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string token;
    utf8_append(token, map[size_t(b)]);
    vocab[token] = b;
  }
  return vocab.dump() + "\n";
}

std::array<char32_t, 256> byte_to_unicode() {
  std::array<char32_t, 256> map{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[size_t(b)] = printable ? char32_t(b) : next++;
  }
  return map;
}

BpeTokenizer::BpeTokenizer(const std::string& vocab_path, const std::string& merges_path)
    : kind_("GPT-2 byte-level BPE"), files_(vocab_path + ", " + merges_path), source_("'" + vocab_path + "'") {
  // vocab.json: {"token": id, ...}, the ids 0..n-1 each once.
  const nlohmann::json vocab =
      io::parse_json(io::read_input_file(vocab_path, "tokenizer", kMaxFileBytes), "tokenizer: '" + vocab_path + "'");
  if (!vocab.is_object() || vocab.empty())
    throw Error("tokenizer: '" + vocab_path + "' must be a JSON object of tokens and their ids, {\"token\": id, ...}");
  std::vector<std::string> token_of(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= int64_t(vocab.size()))
      throw Error("tokenizer: '" + vocab_path + "': the id of token " + in_quotes(token) + " is " + io::json_excerpt(value) +
                  ", not an integer in [0, " + std::to_string(vocab.size()) + ") (the number of tokens)");
    const int32_t id = value.get<int32_t>();
    if (seen[size_t(id)])
      throw Error("tokenizer: '" + vocab_path + "': tokens " + in_quotes(token_of[size_t(id)]) + " and " + in_quotes(token) +
                  " have the same id " + std::to_string(id));
    seen[size_t(id)] = true;
    token_of[size_t(id)] = token;
  }
  set_tokens(token_of);

  // merges.txt: an optional "#version: ..." first line, then one merge a line, "left right", by rank.
  const std::string text = io::read_input_file(merges_path, "tokenizer", kMaxFileBytes);
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a file saved with CRLF line ends
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const auto at = [&] { return "tokenizer: '" + merges_path + "' line " + std::to_string(line_no) + ": "; };
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == line.size() || line.find(' ', space + 1) != std::string::npos)
      throw Error(at() + "expected two symbols separated by one space, got " + in_quotes(line));
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    const auto id_of = [&](const std::string& symbol) {
      const auto it = ids_.find(symbol);
      if (it == ids_.end()) throw Error(at() + "symbol " + in_quotes(symbol) + " is not in '" + vocab_path + "'");
      return it->second;
    };
    const int32_t l = id_of(left), r = id_of(right), merged = id_of(left + right);
    add_merge(l, r, merged, rank++);
  }
  mark_encodable();
}

BpeTokenizer::BpeTokenizer(BpeParts parts)
    : kind_(parts.kind),
      files_(parts.source),
      source_("'" + parts.source + "'"),
      pre_(std::move(parts.pre)),
      unk_(parts.unk),
      bos_(parts.bos),
      eos_(parts.eos),
      fuse_unk_(parts.fuse_unk),
      ignore_merges_(parts.ignore_merges) {
  const std::string at = "tokenizer: '" + parts.source + "': ";
  if (parts.tokens.empty()) throw Error(at + "the vocabulary has no tokens");
  if (parts.tokens.size() > size_t(INT32_MAX)) throw Error(at + "more than 2^31 tokens");
  set_tokens(parts.tokens);
  const auto check = [&](int32_t id, const char* what) {
    if (id < 0 || size_t(id) >= parts.tokens.size())
      throw Error(at + what + " " + std::to_string(id) + " is not a token id in [0, " + std::to_string(parts.tokens.size()) + ")");
  };
  if (unk_ != -1) check(unk_, "the unknown token");
  if (bos_ != -1) check(bos_, "the beginning-of-sequence token");
  if (eos_ != -1) check(eos_, "the end-of-sequence token");
  for (size_t i = 0; i < parts.merges.size(); ++i) {
    const auto& [left, right] = parts.merges[i];
    const auto id_of = [&](const std::string& symbol) {
      const auto it = ids_.find(symbol);
      if (it == ids_.end())
        throw Error(at + "merge " + std::to_string(i) + " (" + in_quotes(left + " " + right) + "): " + in_quotes(io::text_excerpt(symbol)) +
                    " is not a token");
      return it->second;
    };
    const int32_t l = id_of(left), r = id_of(right), merged = id_of(left + right);  // in this order, for the error
    add_merge(l, r, merged, int32_t(i));
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (int32_t id : pass == 0 ? parts.added : parts.added_normalized) {
      check(id, "added token");
      if (parts.tokens[size_t(id)].empty()) throw Error(at + "added token " + std::to_string(id) + " is empty");
      bytes_[size_t(id)] = parts.tokens[size_t(id)];  // written as it is in text, not in stand-in characters
      added_[pass][uint8_t(bytes_[size_t(id)][0])].push_back(id);
      has_added_[pass] = true;
    }
    // The longest first, so that of two added tokens starting at one place the longer wins.
    for (std::vector<int32_t>& ids : added_[pass])
      std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[size_t(a)].size() > bytes_[size_t(b)].size(); });
  }
  mark_encodable();
  for (int32_t id : parts.added) encodable_[size_t(id)] = true;
  for (int32_t id : parts.added_normalized) encodable_[size_t(id)] = true;
  if (ignore_merges_)
    for (size_t id = 0; id < bytes_.size(); ++id)
      if (encodable_[id]) word_id_.emplace(bytes_[id], int32_t(id));
}

void BpeTokenizer::set_tokens(const std::vector<std::string>& tokens) {
  const std::array<char32_t, 256> stand_in = byte_to_unicode();
  std::unordered_map<char32_t, uint8_t> unicode_to_byte;
  for (int b = 0; b < 256; ++b) unicode_to_byte[stand_in[size_t(b)]] = uint8_t(b);
  bytes_.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    bytes_.push_back(token_bytes_of(tokens[id], unicode_to_byte));
    ids_[tokens[id]] = int32_t(id);
  }
  // A byte without a token of its own is dropped from the text (or is the unknown token).
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, stand_in[size_t(b)]);
    const auto it = ids_.find(s);
    byte_id_[size_t(b)] = it == ids_.end() ? -1 : it->second;
  }
}

void BpeTokenizer::mark_encodable() {
  encodable_.assign(bytes_.size(), false);
  for (int32_t id : byte_id_)
    if (id >= 0) encodable_[size_t(id)] = true;
  if (unk_ >= 0) encodable_[size_t(unk_)] = true;
  for (const auto& [pair, merge] : merges_) encodable_[size_t(merge.result)] = true;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  // The word's tokens as a linked list; merged-away tokens are marked dead, not erased.
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
    char first;  // the byte it started as
  };
  if (ignore_merges_) {
    const auto it = word_id_.find(std::string(word));
    if (it != word_id_.end()) return out.push_back(it->second);
  }
  std::vector<Symbol> s;
  s.reserve(word.size());
  for (char c : word) {
    int32_t id = byte_id_[uint8_t(c)];
    if (id < 0 && unk_ >= 0 && !(fuse_unk_ && !s.empty() && s.back().id == unk_ && byte_id_[uint8_t(s.back().first)] < 0)) id = unk_;
    if (id < 0) continue;
    s.push_back({id, int32_t(s.size()) - 1, int32_t(s.size()) + 1, true, c});
  }
  if (s.empty()) return;
  s.back().next = -1;
  // Candidate merges, the lowest rank first, then the leftmost. A candidate goes stale when one of
  // its tokens merges with another; it is skipped when its pair no longer merges into its result.
  struct Candidate {
    int32_t rank, pos, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t pos) {
    if (pos < 0 || s[size_t(pos)].next < 0) return;
    const auto it = merges_.find(pair_key(s[size_t(pos)].id, s[size_t(s[size_t(pos)].next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.result});
  };
  for (size_t i = 0; i + 1 < s.size(); ++i) consider(int32_t(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = s[size_t(c.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = s[size_t(left.next)];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.result != c.result) continue;
    left.id = c.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) s[size_t(right.next)].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = s[size_t(i)].next) out.push_back(s[size_t(i)].id);
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  for (std::string_view word : pretokenize(text, pre_)) encode_word(word, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  split_added(text, 0, ids);
  return ids;
}

void BpeTokenizer::split_added(std::string_view text, int pass, std::vector<int32_t>& out) const {
  if (pass == 2) return encode_text(text, out);
  // Added tokens first, the leftmost, then the longest: the text between them goes to the next pass.
  const std::array<std::vector<int32_t>, 256>& table = added_[pass];
  size_t plain = 0;
  for (size_t i = 0; i < text.size() && has_added_[pass];) {
    int32_t found = -1;
    for (int32_t id : table[uint8_t(text[i])])
      if (text.compare(i, bytes_[size_t(id)].size(), bytes_[size_t(id)]) == 0) {
        found = id;
        break;
      }
    if (found < 0) {
      ++i;
      continue;
    }
    split_added(text.substr(plain, i - plain), pass + 1, out);
    out.push_back(found);
    i += bytes_[size_t(found)].size();
    plain = i;
  }
  split_added(text.substr(plain), pass + 1, out);
}

// The bytes as they are: Hugging Face's decode replaces bytes that do not form UTF-8 (a text cut
// inside a character) by U+FFFD, while here decode(encode(x)) == x for any bytes x.
std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    check_id(id);
    text += bytes_[size_t(id)];
  }
  return text;
}

size_t BpeTokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return encodable_[size_t(id)] ? bytes_[size_t(id)].size() : 0;
}

void BpeTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ") of " +
                source_);
}

std::string BpeTokenizer::description() const { return kind_ + ", " + std::to_string(vocab_size()) + " tokens (" + files_ + ")"; }

}  // namespace scalify::tokenize
