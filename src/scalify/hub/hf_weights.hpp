#pragma once
// A Hugging Face model's weights as nn::Gpt's parameters, and back. Names and layouts:
//   GPT-2  (optional "transformer." prefix)   engine
//     wte.weight [V, D], wpe.weight [seq, D]    wte, wpe
//     h.L.ln_1 / ln_2 .weight .bias             hL.ln1 / hL.ln2 .w .b
//     h.L.attn.c_attn .weight [D, 3D] .bias     hL.attn.qkv .w .b   (Conv1D: already [in, out])
//     h.L.attn.c_proj, h.L.mlp.c_fc, .c_proj    hL.attn.proj, hL.mlp.fc, hL.mlp.out
//     ln_f, lm_head.weight [V, D] (untied)      lnf, head [D, V]
//     h.L.attn.bias, .masked_bias               causal-mask buffers, skipped
//   Llama ("model." prefix; nn.Linear weights are [out, in], so every matrix is transposed)
//     embed_tokens.weight [V, D]                wte
//     layers.L.input_layernorm / post_attention_layernorm .weight   hL.ln1.w / hL.ln2.w
//     layers.L.self_attn.q_proj, k_proj, v_proj  hL.attn.qkv.w = [q^T | k^T | v^T]  (and biases)
//     layers.L.self_attn.o_proj                  hL.attn.proj.w
//     layers.L.mlp.gate_proj, up_proj, down_proj hL.mlp.fc.w = [gate^T | up^T], hL.mlp.out.w
//     norm.weight, lm_head.weight (untied)       lnf.w, head
//     layers.L.self_attn.rotary_emb.inv_freq     buffer, skipped
// Weights are read from model.safetensors or the shards model.safetensors.index.json lists (F32,
// F16 or BF16), and become f32 parameters. A GGUF file given in the folder's place (is_gguf) gives
// its tensors under these names (gguf_model.hpp), dequantised to f32.
#include <map>
#include <string>

#include "scalify/hub/hf_config.hpp"
#include "scalify/tensor/tensor.hpp"

namespace scalify::hub {

// The engine's parameters by name (every one of nn::Gpt(config.model).parameters(), f32). Errors
// name the file: no weights file, a shard the index names that is missing, a tensor missing or
// of the wrong shape for config.json, a tensor no parameter takes, a dtype other than F32 / F16 /
// BF16, and whatever io/safetensors finds wrong with a file (truncation, bad header).
std::map<std::string, Tensor> load_hf_weights(const std::string& dir, const HfConfig& config);

// The weight files of DIR that load_hf_weights reads: the shards model.safetensors.index.json names
// (each tensor's file into *listed), or model.safetensors.
std::vector<std::string> weight_files(const std::string& dir, std::map<std::string, std::string>* listed);

// The family whose layout holds a model of this configuration; an error naming what has no
// Hugging Face counterpart (unit scaling, a GPT-2-shaped model with rotary positions, ...).
Family family_of(const nn::GptConfig& model);

// Writes DIR/config.json and DIR/model.safetensors (atomically each; DIR is created) holding the
// engine's parameters in `config.family`'s layout, stored as config.dtype, so transformers opens it.
void save_hf_model(const std::string& dir, const HfConfig& config, const std::map<std::string, Tensor>& params);

}  // namespace scalify::hub
