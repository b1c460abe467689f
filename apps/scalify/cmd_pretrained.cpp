// `scalify tokenize` and `scalify export`: between Scalify and Hugging Face model folders
// (train/pretrained.hpp). `scalify eval --model` is in cmd_train.cpp beside `eval`.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
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
    std::string checkpoint, out, dtype = "f32";
  };
  auto xa = std::make_shared<ExportArgs>();
  auto* x =
      app.add_subcommand("export", "A checkpoint as a Hugging Face model folder (config.json, model.safetensors) that transformers opens");
  x->add_option("checkpoint", xa->checkpoint, "checkpoint .safetensors or run folder")->required();
  x->add_option("--out", xa->out, "model folder to write")->required();
  x->add_option("--dtype", xa->dtype, "weights stored as f32 (default), f16 or bf16")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  x->callback([xa] {
    const DType dtype = xa->dtype == "bf16" ? DType::bf16 : xa->dtype == "f16" ? DType::f16 : DType::f32;
    const hub::Family f = train::export_checkpoint(xa->checkpoint, xa->out, dtype);
    std::printf("%s model written to %s (config.json, model.safetensors)\n", hub::family_name(f), xa->out.c_str());
  });
}

}  // namespace scalify::cli
