#pragma once
// Hugging Face's tokenizer.json (what transformers saves today, often without vocab.json and
// merges.txt): a byte-level BPE model, its pre-tokenizer and its added tokens, read into the BPE
// of bpe.hpp so that the ids are those of the `tokenizers` library, token for token.
//
// Read: model "BPE" (vocab, merges as "a b" strings or [a, b] pairs, unk_token, fuse_unk,
// ignore_merges); pre_tokenizer ByteLevel (add_prefix_space false, with or without its regex),
// Digits, Split by GPT-2's or Llama 3's pattern, or a Sequence of them, with a ByteLevel among them;
// added_tokens, found whole in the text (<|im_start|> is one token). No normalizer. Anything else
// (another model type, byte_fallback, dropout, a Split by another pattern such as Qwen's, a normalizer) is an
// error naming it, never a tokenizer that gives other ids.
#include <memory>
#include <string>

#include "scalify/tokenize/bpe.hpp"

namespace scalify::tokenize {

std::unique_ptr<BpeTokenizer> read_tokenizer_json(const std::string& path);

}  // namespace scalify::tokenize
