#include "scalify/tokenize/sentencepiece.hpp"

#include <sentencepiece_processor.h>

#include "scalify/error.hpp"
#include "scalify/io/input_file.hpp"

namespace scalify::tokenize {

namespace {
// Llama's tokenizer.model is 0.5 MB; models of 256k pieces a few MB.
constexpr uint64_t kMaxModelBytes = uint64_t(256) << 20;

size_t piece_bytes(const std::string& piece) {
  static const std::string kWordStart = "\xE2\x96\x81";  // U+2581, what SentencePiece writes for a space
  size_t n = 0;
  for (size_t i = 0; i < piece.size();) {
    const bool mark = piece.compare(i, kWordStart.size(), kWordStart) == 0;
    n += 1;
    i += mark ? kWordStart.size() : 1;
  }
  return n;
}
}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : model_path_(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  // Read here rather than by the library, so that a missing or unreadable file gets the
  // project's message and limits.
  const std::string bytes = io::read_input_file(model_path, "tokenizer", kMaxModelBytes);
  const sentencepiece::util::Status status = processor_->LoadFromSerializedProto(bytes);
  if (!status.ok() || processor_->GetPieceSize() <= 0)
    throw Error("tokenizer: '" + model_path + "' is not a SentencePiece model (" + status.ToString() + ")");
  bytes_.resize(size_t(processor_->GetPieceSize()));
  for (int id = 0; id < processor_->GetPieceSize(); ++id) {
    if (processor_->IsControl(id) || processor_->IsUnknown(id))
      bytes_[size_t(id)] = 0;
    else if (processor_->IsByte(id))
      bytes_[size_t(id)] = 1;
    else
      bytes_[size_t(id)] = piece_bytes(processor_->IdToPiece(id));
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status status = processor_->Encode(text, &ids);
  if (!status.ok()) throw Error("tokenizer: '" + model_path_ + "' cannot encode the text: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids) check_id(id);
  std::string text;
  const sentencepiece::util::Status status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) throw Error("tokenizer: '" + model_path_ + "' cannot decode the ids: " + status.ToString());
  return text;
}

size_t SentencePieceTokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return bytes_[size_t(id)];
}

void SentencePieceTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ") of '" +
                model_path_ + "'");
}

std::string SentencePieceTokenizer::description() const {
  return "SentencePiece, " + std::to_string(vocab_size()) + " tokens (" + model_path_ + ")";
}

}  // namespace scalify::tokenize
