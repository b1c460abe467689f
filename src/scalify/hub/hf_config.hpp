#pragma once
// A Hugging Face model folder's config.json for the two families nn::Gpt can be: GPT-2 (learned
// positions, LayerNorm, tanh GELU, biases, tied head) and Llama (rotary positions, RMSNorm, SwiGLU,
// no biases, grouped-query attention, untied head), read into the engine's configuration and
// written back from it.
#include <cstdint>
#include <string>

#include "scalify/nn/gpt.hpp"
#include "scalify/tensor/dtype.hpp"

namespace scalify::hub {

enum class Family : uint8_t { gpt2, llama };
const char* family_name(Family f);

struct HfConfig {
  Family family = Family::gpt2;
  nn::GptConfig model;       // vocab, seq = the longest context, widths, layers, heads, norms, head
  DType dtype = DType::f32;  // config.json's "dtype" (or "torch_dtype"): what the weights are stored in
};

// Reads DIR/config.json. Errors (scalify::Error, naming the file and the field): not a folder or no
// config.json, invalid JSON, a model_type other than gpt2 / llama, a missing or out-of-range size,
// and any option this engine would compute differently (an activation other than tanh GELU or
// SiLU, rope scaling, a head width other than hidden_size / heads, biases on only some layers).
// A GGUF file in the folder's place (gguf_file.hpp's is_gguf) is read by gguf_model.hpp's gguf_config.
HfConfig read_hf_config(const std::string& dir);
// config.json's text for a model of `family` (the fields transformers needs to build it).
std::string hf_config_json(const HfConfig& config);

}  // namespace scalify::hub
