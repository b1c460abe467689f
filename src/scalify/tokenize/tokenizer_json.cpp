#include "scalify/tokenize/tokenizer_json.hpp"

#include <nlohmann/json.hpp>

#include "scalify/error.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"

namespace scalify::tokenize {

namespace {

// Llama 3's tokenizer.json is 9 MB, Qwen's 7 MB; a few times that is still a tokenizer.
constexpr uint64_t kMaxFileBytes = uint64_t(256) << 20;

// tokenizers' ByteLevel pattern, which a Split may also give (GPT-2's regex).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3's (and its derivatives'), which a Split gives.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The parts of one file, each read with errors naming the file and the key.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& what) const { throw Error("tokenizer: '" + path_ + "': " + what); }

  const nlohmann::json& member(const nlohmann::json& object, const char* key, const std::string& where) const {
    const auto it = object.find(key);
    if (it == object.end()) fail(where + " has no \"" + key + "\"");
    return *it;
  }
  std::string string_of(const nlohmann::json& v, const std::string& where) const {
    if (!v.is_string()) fail(where + " is " + io::json_excerpt(v) + ", not a string");
    return v.get<std::string>();
  }
  bool flag(const nlohmann::json& object, const char* key, const std::string& where, bool absent) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return absent;
    if (!it->is_boolean()) fail(where + "." + key + " is " + io::json_excerpt(*it) + ", not true or false");
    return it->get<bool>();
  }
  std::string type_of(const nlohmann::json& v, const std::string& where) const {
    if (!v.is_object()) fail(where + " is " + io::json_excerpt(v) + ", not an object");
    return string_of(member(v, "type", where), where + ".type");
  }

  // A pre_tokenizer's rules, appended; whether it held a ByteLevel.
  bool pre_tokenizer(const nlohmann::json& p, const std::string& where, std::vector<PreTokenizeRule>& rules) const {
    const std::string type = type_of(p, where);
    if (type == "Sequence") {
      const nlohmann::json& list = member(p, "pretokenizers", where);
      if (!list.is_array()) fail(where + ".pretokenizers is " + io::json_excerpt(list) + ", not a list");
      bool byte_level = false;
      for (size_t i = 0; i < list.size(); ++i)
        byte_level |= pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", rules);
      return byte_level;
    }
    if (type == "ByteLevel") {
      if (flag(p, "add_prefix_space", where, false))
        fail(where + " is a ByteLevel with add_prefix_space, which Scalify does not read (a space before the text)");
      if (flag(p, "use_regex", where, true)) rules.push_back(PreTokenizeRule::kGpt2Pattern);
      return true;
    }
    if (type == "Digits") {
      rules.push_back(flag(p, "individual_digits", where, false) ? PreTokenizeRule::kEachNumber : PreTokenizeRule::kNumberRuns);
      return false;
    }
    if (type == "Split") {
      const nlohmann::json& pattern = member(p, "pattern", where);
      const auto regex = pattern.is_object() ? pattern.find("Regex") : pattern.end();
      const std::string text = regex == pattern.end() ? io::json_excerpt(pattern) : string_of(*regex, where + ".pattern.Regex");
      const std::string behavior = string_of(member(p, "behavior", where), where + ".behavior");
      const bool known = text == kGpt2Pattern || text == kLlama3Pattern;
      if (!known || behavior != "Isolated" || flag(p, "invert", where, false))
        fail(where + " is a Split by " + io::text_excerpt(text, 200) + " (" + behavior +
             "), which Scalify does not read: it reads a Split, Isolated, by GPT-2's pattern " + kGpt2Pattern + " or Llama 3's " +
             kLlama3Pattern);
      rules.push_back(text == kGpt2Pattern ? PreTokenizeRule::kGpt2Pattern : PreTokenizeRule::kLlama3Pattern);
      return false;
    }
    fail(where + " is a " + io::text_excerpt(type) +
         " pre-tokenizer, which Scalify does not read (it reads ByteLevel, Digits, a Split by GPT-2's or Llama 3's pattern, and Sequences "
         "of them)");
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

std::unique_ptr<BpeTokenizer> read_tokenizer_json(const std::string& path) {
  const Reader r(path);
  const nlohmann::json doc = io::parse_json(io::read_input_file(path, "tokenizer", kMaxFileBytes), "tokenizer: '" + path + "'");
  if (!doc.is_object()) r.fail("not a tokenizer.json: the file is " + io::json_excerpt(doc) + ", not an object");
  BpeParts parts;
  parts.source = path;
  parts.kind = "byte-level BPE";

  // The model: a BPE over byte-level tokens.
  const nlohmann::json& model = r.member(doc, "model", "the file");
  const auto type = model.is_object() ? model.find("type") : model.end();
  if (type == model.end() || !type->is_string() || type->get<std::string>() != "BPE")
    r.fail("the model is " + (type == model.end() ? io::json_excerpt(model) : io::json_excerpt(*type)) +
           ", not a BPE: Scalify reads the BPE models of tokenizer.json (a SentencePiece model from tokenizer.model)");
  if (r.flag(model, "byte_fallback", "model", false))
    r.fail("model.byte_fallback is true: a SentencePiece-style BPE, not a byte-level one (Scalify reads those from tokenizer.model)");
  if (const auto d = model.find("dropout"); d != model.end() && !d->is_null())
    r.fail("model.dropout is " + io::json_excerpt(*d) + ": a BPE with dropout gives random ids");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const auto it = model.find(key); it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      r.fail(std::string("model.") + key + " is " + io::json_excerpt(*it) + ", which a byte-level BPE does not have");
  parts.fuse_unk = r.flag(model, "fuse_unk", "model", false);
  parts.ignore_merges = r.flag(model, "ignore_merges", "model", false);

  const nlohmann::json& vocab = r.member(model, "vocab", "model");
  if (!vocab.is_object() || vocab.empty()) r.fail("model.vocab is " + io::json_excerpt(vocab) + ", not an object of tokens and their ids");
  // Ids run 0..n-1 over the vocabulary and the added tokens together.
  const nlohmann::json& added =
      doc.contains("added_tokens") && !doc["added_tokens"].is_null() ? doc["added_tokens"] : nlohmann::json::array();
  if (!added.is_array()) r.fail("added_tokens is " + io::json_excerpt(added) + ", not a list");
  const size_t limit = vocab.size() + added.size();
  std::vector<bool> seen(limit, false);
  parts.tokens.resize(limit);
  const auto place = [&](const nlohmann::json& id, const std::string& token, const std::string& where) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= int64_t(limit))
      r.fail(where + ": the id of " + io::json_excerpt(nlohmann::json(token)) + " is " + io::json_excerpt(id) + ", not an integer in [0, " +
             std::to_string(limit) + ")");
    const size_t i = size_t(id.get<int64_t>());
    if (seen[i] && parts.tokens[i] != token)
      r.fail(where + ": tokens " + io::json_excerpt(nlohmann::json(parts.tokens[i])) + " and " + io::json_excerpt(nlohmann::json(token)) +
             " have the same id " + std::to_string(i));
    seen[i] = true;
    parts.tokens[i] = token;
    return int32_t(i);
  };
  for (const auto& [token, id] : vocab.items()) place(id, token, "model.vocab");
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const nlohmann::json& a = added[i];
    if (!a.is_object()) r.fail(where + " is " + io::json_excerpt(a) + ", not an object");
    for (const char* option : {"single_word", "lstrip", "rstrip"})
      if (r.flag(a, option, where, false)) r.fail(where + " has " + option + " set, which Scalify does not read");
    const std::string content = r.string_of(r.member(a, "content", where), where + ".content");
    if (content.empty()) r.fail(where + " has an empty content");
    // tokenizers' AddedToken: normalized defaults to !special.
    const bool normalized = r.flag(a, "normalized", where, !r.flag(a, "special", where, false));
    (normalized ? parts.added_normalized : parts.added).push_back(place(r.member(a, "id", where), content, where));
  }
  size_t size = limit;
  while (size > 0 && !seen[size - 1]) --size;
  for (size_t i = 0; i < size; ++i)
    if (!seen[i])
      r.fail("no token has id " + std::to_string(i) + " (the ids of model.vocab and added_tokens must run 0.." + std::to_string(size - 1) +
             ")");
  parts.tokens.resize(size);

  const nlohmann::json& merges = r.member(model, "merges", "model");
  if (!merges.is_array()) r.fail("model.merges is " + io::json_excerpt(merges) + ", not a list");
  parts.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& m = merges[i];
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    if (m.is_array() && m.size() == 2) {
      parts.merges.emplace_back(r.string_of(m[0], where + "[0]"), r.string_of(m[1], where + "[1]"));
      continue;
    }
    const std::string s = m.is_string() ? m.get<std::string>() : std::string();
    const size_t space = s.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
      r.fail(where + " is " + io::json_excerpt(m) + ", not two tokens (\"a b\" or [\"a\", \"b\"])");
    parts.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
  }
  if (const auto unk = model.find("unk_token"); unk != model.end() && !unk->is_null()) {
    const std::string name = r.string_of(*unk, "model.unk_token");
    const auto it = vocab.find(name);
    if (it == vocab.end()) r.fail("model.unk_token " + io::json_excerpt(*unk) + " is not in model.vocab");
    parts.unk = it->get<int32_t>();
  }

  if (const auto n = doc.find("normalizer"); n != doc.end() && !n->is_null())
    r.fail("normalizer is a " + io::text_excerpt(r.type_of(*n, "normalizer")) +
           ", which Scalify does not read (it reads tokenizers without a normalizer)");
  parts.pre.clear();
  const auto pre = doc.find("pre_tokenizer");
  if (pre == doc.end() || pre->is_null() || !r.pre_tokenizer(*pre, "pre_tokenizer", parts.pre))
    r.fail("the pre_tokenizer has no ByteLevel: not a byte-level BPE");
  return std::make_unique<BpeTokenizer>(std::move(parts));
}

}  // namespace scalify::tokenize
