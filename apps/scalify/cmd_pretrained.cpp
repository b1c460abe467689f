// `scalify tokenize` and `scalify export`: between Scalify and Hugging Face model folders or GGUF files
// (train/pretrained.hpp). `scalify eval --model` is in cmd_train.cpp beside `eval`.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
#include "scalify/error.hpp"
#include "scalify/hub/hf_config.hpp"
#include "scalify/train/pretrained.hpp"

namespace scalify::cli {

void add_pretrained_commands(CLI::App& app) {
  struct TokenizeArgs {
    std::string model, data, out;
  };
  auto ta = std::make_shared<TokenizeArgs>();
  auto* t = app.add_subcommand("tokenize", "Text to an llm.c token file (.bin) with a Hugging Face model folder's tokenizer");
  t->add_option("--model", ta->model, "model folder holding vocab.json + merges.txt, tokenizer.model or tokenizer.json")->required();
  t->add_option("--data", ta->data, "text file")->required();
  t->add_option("--out", ta->out, "token file to write")->required();
  t->callback([ta] {
    const train::Tokenized r = train::tokenize_file(ta->model, ta->data, ta->out);
    std::printf("%s\n%zu bytes -> %zu tokens (%.3f bytes per token): %s\n", r.tokenizer.c_str(), r.bytes, r.tokens,
                r.tokens ? double(r.bytes) / double(r.tokens) : 0.0, ta->out.c_str());
  });

  struct ExportArgs {
    std::string checkpoint, out, format = "hf", dtype = "f32";
  };
  auto xa = std::make_shared<ExportArgs>();
  auto* x = app.add_subcommand("export",
                               "A checkpoint as a Hugging Face model folder (config.json, model.safetensors) that transformers opens, "
                               "or as one GGUF file that llama.cpp (and transformers' GGUF loader) reads");
  x->add_option("checkpoint", xa->checkpoint, "checkpoint .safetensors or run folder")->required();
  x->add_option("--out", xa->out, "model folder to write (hf: a new or empty folder), or the .gguf file (gguf: written atomically)")
      ->required();
  x->add_option("--format", xa->format,
                "hf (default): a Hugging Face folder; gguf: GGUF v3, architecture \"llama\" for Llama-shaped models, \"gpt2\" for "
                "GPT-2-shaped ones, the tokenizer as metadata (byte-level BPE: a model fine-tuned from a folder with vocab.json + "
                "merges.txt or tokenizer.json, its own; from a GGUF file, that file's; the byte-level GPT, its 256 bytes; a "
                "SentencePiece tokenizer is refused, a folder without one gives none)")
      ->check(CLI::IsMember({"hf", "gguf"}));
  x->add_option("--dtype", xa->dtype,
                "weights stored as f32 (default), f16 or bf16 (rounded to nearest even); gguf also q8_0 (ggml's 8-bit blocks of 32; "
                "a matrix whose rows are not a multiple of 32 is stored as f16, as llama.cpp's converter does); GGUF keeps norms and "
                "biases in f32")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  x->callback([xa] {
    if (xa->format == "gguf") {
      const train::GgufExport r = train::export_gguf(xa->checkpoint, xa->out, xa->dtype);
      std::printf("%s model written to %s (GGUF, %s weights, %s)\n", hub::family_name(r.family), xa->out.c_str(), xa->dtype.c_str(),
                  r.with_tokenizer ? "with its tokenizer" : "no tokenizer: the model it was fine-tuned from has none");
      if (!r.f16_fallback.empty()) {
        std::string names;
        for (const std::string& n : r.f16_fallback) names += (names.empty() ? "" : ", ") + n;
        std::printf("stored as F16, their rows not a multiple of Q8_0's 32-value blocks (as llama.cpp's converter does): %s\n",
                    names.c_str());
      }
      return;
    }
    if (xa->dtype == "q8_0") throw Error("export: --dtype q8_0 is for --format gguf; a Hugging Face folder holds f32, f16 or bf16");
    const DType dtype = xa->dtype == "bf16" ? DType::bf16 : xa->dtype == "f16" ? DType::f16 : DType::f32;
    const hub::Family f = train::export_checkpoint(xa->checkpoint, xa->out, dtype);
    std::printf("%s model written to %s (config.json, model.safetensors)\n", hub::family_name(f), xa->out.c_str());
  });
}

}  // namespace scalify::cli
