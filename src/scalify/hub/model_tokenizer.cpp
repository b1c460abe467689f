#include "scalify/hub/model_tokenizer.hpp"

#include "scalify/hub/gguf_file.hpp"
#include "scalify/hub/gguf_model.hpp"
#include "scalify/tokenize/gguf_tokenizer.hpp"

namespace scalify::hub {

std::unique_ptr<tokenize::Tokenizer> load_model_tokenizer(const std::string& path) {
  if (!is_gguf(path)) return tokenize::load_tokenizer(path);
  return tokenize::gguf_bpe_tokenizer(gguf_tokenizer_metadata(GgufFile::open(path)), path);
}

bool has_model_tokenizer(const std::string& path) {
  if (!is_gguf(path)) return tokenize::has_tokenizer_files(path);
  const GgufFile file = GgufFile::open(path);
  return file.has("tokenizer.ggml.model") && tokenize::gguf_tokenizer_is_read(file.get_text("tokenizer.ggml.model"));
}

}  // namespace scalify::hub
