#pragma once
// The model a GGUF file holds, as the engine takes a Hugging Face folder's: llama.cpp's "llama"
// architecture (the only one read; any other is refused, named) as an HfConfig, and its tensors
// under the Hugging Face names in the Hugging Face layout, so hf_weights places them as it places
// a folder's.
//   metadata (llama.*)                         HfConfig.model
//     context_length, embedding_length         seq, d_model
//     block_count, feed_forward_length         layers, mlp_hidden
//     attention.head_count, .head_count_kv     heads, kv_heads (default: heads)
//     rope.freq_base (default 10000)           rope_theta
//     attention.layer_norm_rms_epsilon         norm_eps
//     vocab_size (else the token list's size)  vocab
//   tensors                                    Hugging Face names ("model." prefix)
//     token_embd, output_norm, output          embed_tokens, norm, lm_head (no output: tied head)
//     blk.L.attn_norm, ffn_norm                layers.L.input_layernorm, post_attention_layernorm
//     blk.L.attn_q, attn_k, attn_v, attn_output   layers.L.self_attn.q_proj, k_proj, v_proj, o_proj
//     blk.L.ffn_gate, ffn_up, ffn_down         layers.L.mlp.gate_proj, up_proj, down_proj
// llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute) reorders the rows of q_proj
// and k_proj within each head, from rotate-half order to interleaved pairs; it is undone here.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "scalify/hub/gguf_file.hpp"
#include "scalify/tokenize/gguf_tokenizer.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::hub {

// The engine's configuration of FILE's model (family llama, dtype f32). Errors name the file and
// the key: another architecture, a missing or out-of-range size, rope scaling, mixture of experts,
// a head width other than embedding_length / head_count.
HfConfig gguf_config(const GgufFile& file);

// FILE's tensors dequantised to f32, by Hugging Face name, q/k rows un-permuted. A tensor with
// no Hugging Face counterpart keeps its GGUF name (load_hf_weights then names it as having no place).
std::map<std::string, Tensor> gguf_hf_tensors(const GgufFile& file, const HfConfig& config);

// The tokenizer metadata of a GGUF file (llama.cpp's tokenizer.ggml.* keys), checked for
// consistency (every list as long as the token list, ids inside it): what a tokenizer is built from.
using GgufTokenizerMetadata = tokenize::GgufTokenizerMetadata;  // defined beside the tokenizer it makes
// Errors name the file and the key: no tokenizer.ggml.model or tokens, a list of another length,
// an id outside the vocabulary.
GgufTokenizerMetadata gguf_tokenizer_metadata(const GgufFile& file);

}  // namespace scalify::hub
