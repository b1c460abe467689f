// `scalify train`, `scalify eval`, `scalify sample`: the GPT trainer on real text (train/).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "scalify/error.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/train/evaluate.hpp"
#include "scalify/train/pretrained.hpp"
#include "scalify/train/trainer.hpp"

namespace scalify::cli {

namespace {
train::Progress progress_printer() {
  return [print = status_printer()](const train::StepProgress& p) { print(p.line()); };
}
}  // namespace

std::function<void(const std::string&)> status_printer() {
  if (!platform::world().root()) return [](const std::string&) {};  // rank 0 reports for the run
  const bool tty = ::isatty(STDERR_FILENO);
  return [tty, n = 0](const std::string& line) mutable {
    if (tty)
      std::fprintf(stderr, "\r%-120s", line.c_str());
    else if (++n % 50 == 0)
      std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  };
}

void ConfigOptions::add_to(CLI::App* command) {
  command->add_option("--config", config, "TOML file with any of the train config keys");
  command->add_option("--data", data,
                      "text file or folder of text files (default: Debian's fortunes); with --init also an llm.c token file");
  command->add_option(
      "--init", init,
      "fine-tune a pretrained Hugging Face model folder or .gguf file (its shape, weights and tokenizer) instead of a new byte-level GPT; "
      "lr "
      "defaults to 5e-5 there (Hugging Face Trainer's AdamW default; 2e-3, the pre-training one, moves the weights far in a few "
      "steps), min_lr to 5e-6; --set seq=N trains on windows shorter than the model's context");
  steps_option = command->add_option("--steps", steps, "optimizer steps (per recipe for compare)")->transform(integer());
  command->add_option("--set", set, "KEY=VALUE override of any train config key (repeatable)");
}

void ConfigOptions::apply(train::TrainConfig& c, bool load_file) const {
  if (load_file && !config.empty()) c = train::load_config_file(config);
  if (!data.empty()) c.data = data;
  if (!init.empty()) c.init = init;
  if (steps_option->count() > 0) c.steps = steps;
  for (const std::string& kv : set) c.set(kv);
}

void add_train_commands(CLI::App& app) {
  struct Opts {
    ConfigOptions config;
    std::string out, recipe, resume;
    bool save_initial = false;
  };
  auto o = std::make_shared<Opts>();
  auto* t = app.add_subcommand("train", "Train the GPT on text under a recipe; writes a run folder");
  o->config.add_to(t);
  auto* out = t->add_option("--out", o->out, "run folder (default runs/train)");
  auto* recipe = t->add_option("--recipe", o->recipe, "recipe preset (f32, scalify_fp8_3, delayed, mxfp8, ...) or recipe .json file");
  t->add_flag("--save-initial", o->save_initial,
              "also write the model at step 0 (before any update) as initial.safetensors, for another tool to start from");
  auto* resume =
      t->add_option("--resume", o->resume, "continue the run in this folder from its checkpoint (its config, --steps to extend)");
  t->callback([o, out, recipe, resume] {
    train::TrainConfig c;
    platform::every_rank_agrees(platform::world(), [&] {  // each rank reads the same arguments and files
      if (resume->count() > 0) {
        if (out->count() > 0) throw Error("train: --resume names the run folder to continue; --out has no place beside it");
        if (!o->config.config.empty())
          throw Error(
              "train: --resume continues the run under its own config.toml; --config has no place beside it (--steps and --set override "
              "keys)");
        if (o->resume.empty()) throw Error("train: --resume needs a run folder");
        if (!o->config.init.empty()) throw Error("train: --resume continues from the run's checkpoint; --init has no place beside it");
      }
      auto apply_options = [&](train::TrainConfig& config) {
        o->config.apply(config, resume->count() == 0);
        if (out->count() > 0) config.out = o->out;
        if (recipe->count() > 0) {
          if (o->recipe.empty()) throw Error("train: --recipe is empty; give a preset name or a recipe .json file");
          config.recipe = o->recipe;
        }
      };
      if (resume->count() > 0)
        c = train::resume_config(o->resume, apply_options);
      else
        apply_options(c);
    });
    const train::TrainResult r = train::train(c, resume->count() > 0, progress_printer(), 0, o->save_initial);
    if (platform::world().root()) std::fprintf(stderr, "\n");
    std::printf("run folder: %s\nsteps: %lld (skipped %lld)\n", r.run_dir.c_str(), (long long)r.steps, (long long)r.skipped);
    if (std::isfinite(r.train_loss)) std::printf("final train loss: %.4f\n", r.train_loss);
    std::printf("validation loss: %.4f nats, %.4f bits per byte\nunigram entropy of the training %s: %.4f bits per %s\n", r.val_loss,
                r.val_bpb, r.tokenized ? "tokens" : "bytes", r.unigram_bits, r.tokenized ? "token" : "byte");
    if (r.tokens_per_s > 0) std::printf("median speed: %.0f tokens/s\n", r.tokens_per_s);
    if (r.state_bytes_per_parameter > 0) std::printf("training state: %.2f bytes per parameter\n", r.state_bytes_per_parameter);
    std::printf("peak memory: %.0f MB\n", r.peak_memory_mb);
    if (r.world_size > 1)
      std::printf("data parallel: %d ranks, gradient all-reduce %.3g MB sent per rank per step, %.1f%% of the step time\n", r.world_size,
                  r.allreduce_bytes_per_step / 1e6, 100 * r.allreduce_share);
  });

  struct EvalArgs {
    std::string checkpoint, model, data;
    int64_t context = 0, windows = 0;
    bool json = false;
  };
  auto ea = std::make_shared<EvalArgs>();
  auto* e = app.add_subcommand("eval", "Validation loss and bits per byte of a checkpoint (file or run folder) or of a Hugging Face model");
  auto* ckpt = e->add_option("checkpoint", ea->checkpoint, "checkpoint .safetensors or run folder");
  auto* model =
      e->add_option("--model", ea->model, "a Hugging Face model folder (config.json, *.safetensors, tokenizer) or a .gguf file instead")
          ->excludes(ckpt);
  e->add_option("--data", ea->data, "corpus (default: the run's); with --model: a text file or an llm.c token file (.bin)");
  e->add_option("--context", ea->context, "with --model: tokens per window (default: the model's longest, at most 2048)")
      ->transform(integer())
      ->needs(model);
  e->add_option("--windows", ea->windows, "with --model: evaluate at most this many windows (default: all)")
      ->transform(integer())
      ->needs(model);
  e->add_flag("--json", ea->json, "print one JSON object with every digit");
  e->callback([ea] {
    if (ea->model.empty()) {
      if (ea->checkpoint.empty()) throw CLI::ValidationError("eval", "give a checkpoint or --model DIR");
      const train::EvalResult r = train::evaluate(ea->checkpoint, ea->data);
      if (ea->json) {           // %.17g: the double itself, read back bit for bit
        char bpb[32] = "null";  // JSON has no NaN: null without a tokenizer (a quantised pretrained model on a token file)
        if (std::isfinite(r.bits_per_byte)) std::snprintf(bpb, sizeof bpb, "%.17g", r.bits_per_byte);
        std::printf("{\"val_loss\": %.17g, \"val_bpb\": %s, \"windows\": %zu}\n", r.loss, bpb, r.windows);
      } else {
        std::printf("validation loss: %.6f nats, %.6f bits per byte (%zu windows)\n", r.loss, r.bits_per_byte, r.windows);
      }
      return;
    }
    if (ea->data.empty()) throw CLI::ValidationError("eval", "--model needs --data FILE (text or an llm.c token file)");
    if (ea->context < 0 || ea->windows < 0) throw CLI::ValidationError("eval", "--context and --windows must be >= 0");
    const train::Pretrained p = train::load_pretrained(ea->model);
    const std::vector<int32_t> tokens = train::read_tokens(ea->data, p.tokenizer.get(), p.hf.model.vocab);
    const int64_t context = ea->context > 0 ? ea->context : train::default_context(p.hf.model);
    // A tenth at a time on stderr, for evaluations long enough to wonder about.
    const auto progress = [shown = size_t(0)](size_t done, size_t total) mutable {
      if (total < 20 || done * 10 / total <= shown) return;
      shown = done * 10 / total;
      std::fprintf(stderr, "eval: %zu / %zu windows\n", done, total);
    };
    const train::TokenEval r = train::evaluate_tokens(*p.session, tokens, p.tokenizer.get(), context, size_t(ea->windows), progress);
    if (ea->json) {           // the checkpoint's keys first, then what a pretrained model's evaluation adds
      char bpb[32] = "null";  // JSON has no NaN: null without a tokenizer
      if (std::isfinite(r.bits_per_byte)) std::snprintf(bpb, sizeof bpb, "%.17g", r.bits_per_byte);
      std::printf("{\"val_loss\": %.17g, \"val_bpb\": %s, \"windows\": %zu, \"perplexity\": %.17g, \"tokens\": %zu, \"context\": %lld}\n",
                  r.loss, bpb, r.windows, r.perplexity, r.tokens, (long long)r.context);
    } else {
      std::printf("%s model, %s\n", hub::family_name(p.hf.family), p.tokenizer ? p.tokenizer->description().c_str() : "no tokenizer");
      std::printf("loss: %.6f nats per token, perplexity %.4f, ", r.loss, r.perplexity);
      if (std::isfinite(r.bits_per_byte)) std::printf("%.6f bits per byte ", r.bits_per_byte);
      std::printf("(%zu tokens in %zu windows of %lld)\n", r.tokens, r.windows, (long long)r.context);
    }
  });

  struct SampleArgs {
    std::string checkpoint, model, prompt;
    train::SampleOptions o;
  };
  auto sa = std::make_shared<SampleArgs>();
  auto* s = app.add_subcommand("sample", "Generate text from a checkpoint");
  auto* sample_ckpt = s->add_option("checkpoint", sa->checkpoint, "checkpoint .safetensors or run folder");
  s->add_option("--model", sa->model, "a Hugging Face model folder or .gguf file instead (its tokenizer reads the prompt)")
      ->excludes(sample_ckpt);
  s->add_option("--prompt", sa->prompt, "text to continue");
  s->add_option("--tokens", sa->o.tokens,
                "at most this many tokens (bytes for the byte-level GPT) to generate (default 200); past the model's context the window "
                "slides, each token from the last context's worth, recomputed")
      ->transform(integer());
  s->add_flag("--ignore-eos", sa->o.ignore_eos, "run to --tokens through the model's end-of-sequence token (default: stop there)");
  s->add_option("--temperature", sa->o.temperature, "0: greedy (default 0.8)")->transform(finite_number());
  s->add_option("--top-k", sa->o.top_k, "sample among the k most likely (0: all; default 40)")->transform(integer());
  s->add_option("--seed", sa->o.seed, "sampling seed (>= 0)")->transform(non_negative_integer());
  s->callback([sa] {
    std::string text;
    if (!sa->model.empty()) {
      const train::Pretrained p = train::load_pretrained(sa->model);
      if (!p.tokenizer)
        throw Error("sample: '" + sa->model + "' holds no tokenizer (vocab.json + merges.txt, tokenizer.model or tokenizer.json; " +
                    tokenize::gguf_tokenizer_not_read() + ")");
      train::SampleOptions o = sa->o;
      o.eos_ids = p.hf.eos_ids;
      text = train::sample_text(*p.session, p.tokenizer.get(), sa->prompt, o, sa->model);
    } else {
      if (sa->checkpoint.empty()) throw CLI::ValidationError("sample", "give a checkpoint or --model DIR");
      text = train::sample(sa->checkpoint, sa->prompt, sa->o);
    }
    std::printf("%s%s\n", sa->prompt.c_str(), text.c_str());
  });
}

}  // namespace scalify::cli
