#pragma once
// An engine model as a GGUF file that llama.cpp reads (and transformers' GGUF loader), the layout
// of llama.cpp's convert_hf_to_gguf.py:
//   Llama-shaped: architecture "llama"; token_embd, blk.N.attn_norm, attn_q, attn_k, attn_v,
//     attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down, output_norm, output (left out when tied:
//     llama.cpp then uses token_embd); attn_q and attn_k rows permuted as LlamaModel.permute does
//     (Hugging Face's rotate-half halves of each head into llama.cpp's interleaved pairs).
//   GPT-2-shaped (tanh GELU): architecture "gpt2"; token_embd, position_embd, blk.N.attn_norm,
//     attn_qkv, attn_output, ffn_norm, ffn_up, ffn_down (weights and biases), output_norm, output
//     (the converter writes a tied head as a copy of token_embd).
// Matrices are stored as the chosen type, 1-D tensors (norms, biases) as F32.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "scalify/hub/gguf_writer.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::hub {

// A byte-level BPE vocabulary as GGUF's tokenizer.ggml.* metadata (model "gpt2").
struct GgufVocabulary {
  std::vector<std::string> tokens;  // by id, in the byte-level alphabet (bytes as GPT-2's printable symbols)
  std::vector<int32_t> types;       // llama.cpp's token types: 1 normal, 3 control (special), 4 user-defined, 5 unused
  std::vector<std::string> merges;  // "left right", by rank
  int32_t bos = -1, eos = -1;       // -1: none
  std::string pre;                  // llama.cpp's pre-tokenizer name
};

// The byte-level GPT's vocabulary: the 256 bytes as themselves (token i is byte i), no merges.
GgufVocabulary byte_vocabulary();

// The tokenizer of a Hugging Face model folder: vocab.json + merges.txt, or tokenizer.json (a BPE
// model with a ByteLevel pre-tokenizer: "gpt-2"), its added tokens (special ones as control
// tokens) and config.json's bos/eos ids; or of a GGUF file (a model fine-tuned from one): its
// tokenizer.ggml.* lists as they are. nullopt when the model holds no tokenizer. Errors
// name what GGUF's "gpt2" tokenizer cannot hold: a SentencePiece tokenizer.model, another
// tokenizer.json model or pre-tokenizer, ids with gaps.
std::optional<GgufVocabulary> read_bpe_vocabulary(const std::string& dir);

// What the weights are stored as: f32, f16, bf16 or q8_0 (an Error names any other).
GgufWriter::Type gguf_type(const std::string& dtype);

// Writes the model (`config.family`'s layout, the engine's parameters by name) to `path`
// atomically; `vocab` becomes tokenizer.ggml.*, padded with unused "[PADi]" tokens up to the
// model's vocabulary as the converter does (null: tokenizer.ggml.model "none", llama.cpp's model
// without a vocabulary, whose size ARCH.vocab_size gives). With Q8_0, a matrix whose rows are not
// a multiple of 32 is stored as F16, as convert_hf_to_gguf.py does; `fell_back` gets its name.
// Errors: a model neither family's GGUF architecture computes (GPT-2 with erf GELU, Llama with
// biases, unit scaling), a vocabulary larger than the model's.
void save_gguf_model(const std::string& path, const HfConfig& config, const std::map<std::string, Tensor>& params,
                     GgufWriter::Type matrices, const GgufVocabulary* vocab, const std::string& name,
                     std::vector<std::string>* fell_back = nullptr);

}  // namespace scalify::hub
