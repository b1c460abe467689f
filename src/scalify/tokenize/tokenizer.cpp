#include "scalify/tokenize/tokenizer.hpp"

#include <filesystem>

#include "scalify/error.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/tokenize/bpe.hpp"
#include "scalify/tokenize/sentencepiece.hpp"
#include "scalify/tokenize/tokenizer_json.hpp"

namespace scalify::tokenize {

namespace {
// The files of a folder its tokenizer is read from, in the order looked for: GPT-2's two files,
// else tokenizer.model, else tokenizer.json; none when it has none of them.
std::vector<std::string> files_read(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto has = [&](const char* name) { return fs::exists(fs::path(model_dir) / name, ec); };
  if (has("vocab.json") && has("merges.txt")) return {"vocab.json", "merges.txt"};
  for (const char* name : {"tokenizer.model", "tokenizer.json"})
    if (has(name)) return {name};
  return {};
}
}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(model_dir, ec)) throw FileError("tokenizer: model folder '" + model_dir + "' does not exist");
  // A GGUF file holds its tokenizer in its metadata, which hub::load_model_tokenizer reads.
  if (!fs::is_directory(model_dir, ec) &&
      (fs::path(model_dir).extension() == ".gguf" || io::read_input_head(model_dir, "tokenizer", 4) == "GGUF"))
    throw Error("tokenizer: '" + model_dir + "' is a GGUF file, not a model folder (hub::load_model_tokenizer reads its tokenizer)");
  if (!fs::is_directory(model_dir, ec)) throw FileError("tokenizer: model folder '" + model_dir + "' is not a folder");
  const std::vector<std::string> files = files_read(model_dir);
  const auto path = [&](const std::string& name) { return (fs::path(model_dir) / name).string(); };
  if (files.size() == 2) return std::make_unique<BpeTokenizer>(path(files[0]), path(files[1]));
  if (files.size() == 1 && files[0] == "tokenizer.model") return std::make_unique<SentencePieceTokenizer>(path(files[0]));
  if (files.size() == 1) return read_tokenizer_json(path(files[0]));
  // One of the pair alone is a folder copied in part: say which half is missing.
  const bool has_vocab = fs::exists(path("vocab.json"), ec), has_merges = fs::exists(path("merges.txt"), ec);
  if (has_vocab || has_merges)
    throw Error("tokenizer: '" + model_dir + "' has " + (has_vocab ? "vocab.json but no merges.txt" : "merges.txt but no vocab.json") +
                " (GPT-2's BPE needs both)");
  throw Error("tokenizer: '" + model_dir +
              "' holds no tokenizer Scalify reads: looked for vocab.json + merges.txt (GPT-2 byte-level BPE) and "
              "tokenizer.model (SentencePiece) and tokenizer.json (byte-level BPE)");
}

std::vector<std::string> tokenizer_files_read(const std::string& model_dir) { return files_read(model_dir); }

const char* gguf_tokenizer_not_read() {
  return "a GGUF file's tokenizer is read where its tokenizer.ggml.model is \"gpt2\" (give other models' text as an llm.c .bin "
         "token file, tokenised elsewhere)";
}

bool has_tokenizer_files(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : tokenizer_file_names())
    if (fs::exists(fs::path(model_dir) / name, ec)) return true;
  return false;
}

const std::vector<const char*>& tokenizer_file_names() {
  static const std::vector<const char*> names = {"vocab.json", "merges.txt", "tokenizer.model", "tokenizer.json"};
  return names;
}

}  // namespace scalify::tokenize
