#include "scalify/tokenize/tokenizer.hpp"

#include <filesystem>

#include "scalify/error.hpp"
#include "scalify/hub/gguf_file.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/gguf_tokenizer.hpp"
#include "scalify/tokenize/sentencepiece.hpp"
#include "scalify/tokenize/tokenizer_json.hpp"

namespace scalify::tokenize {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(model_dir, ec)) throw FileError("tokenizer: model folder '" + model_dir + "' does not exist");
  // A GGUF file holds its tokenizer in its metadata.
  if (hub::is_gguf(model_dir)) return read_gguf_tokenizer(model_dir);
  if (!fs::is_directory(model_dir, ec)) throw FileError("tokenizer: model folder '" + model_dir + "' is not a folder");
  const std::string vocab = (fs::path(model_dir) / "vocab.json").string();
  const std::string merges = (fs::path(model_dir) / "merges.txt").string();
  const std::string model = (fs::path(model_dir) / "tokenizer.model").string();
  const std::string json = (fs::path(model_dir) / "tokenizer.json").string();
  const bool has_vocab = fs::exists(vocab, ec), has_merges = fs::exists(merges, ec);
  if (has_vocab && has_merges) return std::make_unique<BpeTokenizer>(vocab, merges);
  if (fs::exists(model, ec)) return std::make_unique<SentencePieceTokenizer>(model);
  if (fs::exists(json, ec)) return read_tokenizer_json(json);
  // One of the pair alone is a folder copied in part: say which half is missing.
  if (has_vocab || has_merges)
    throw Error("tokenizer: '" + model_dir + "' has " + (has_vocab ? "vocab.json but no merges.txt" : "merges.txt but no vocab.json") +
                " (GPT-2's BPE needs both)");
  throw Error("tokenizer: '" + model_dir +
              "' holds no tokenizer Scalify reads: looked for vocab.json + merges.txt (GPT-2 byte-level BPE) and "
              "tokenizer.model (SentencePiece) and tokenizer.json (byte-level BPE)");
}

const char* gguf_tokenizer_not_read() {
  return "a GGUF file's tokenizer is read where its tokenizer.ggml.model is \"gpt2\" (give other models' text as an llm.c .bin "
         "token file, tokenised elsewhere)";
}

bool has_tokenizer_files(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (hub::is_gguf(model_dir)) {
    const hub::GgufFile file = hub::GgufFile::open(model_dir);
    return file.has("tokenizer.ggml.model") && gguf_tokenizer_is_read(file.get_text("tokenizer.ggml.model"));
  }
  for (const char* name : tokenizer_file_names())
    if (fs::exists(fs::path(model_dir) / name, ec)) return true;
  return false;
}

const std::vector<const char*>& tokenizer_file_names() {
  static const std::vector<const char*> names = {"vocab.json", "merges.txt", "tokenizer.model", "tokenizer.json"};
  return names;
}

}  // namespace scalify::tokenize
