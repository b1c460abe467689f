#pragma once
// A run in memory (model with its quantised layers, recipe, optimizer, loss scaler) and its checkpoints:
// what the trainer, evaluation, inspection and post-training quantisation share.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scalify/autograd/scaling.hpp"
#include "scalify/io/safetensors.hpp"
#include "scalify/nn/gpt.hpp"
#include "scalify/optim/adamw.hpp"
#include "scalify/platform/world.hpp"
#include "scalify/quant/loss_scaler.hpp"
#include "scalify/quant/recipe.hpp"
#include "scalify/train/config.hpp"
#include "scalify/train/corpus.hpp"
#include "scalify/train/evaluate.hpp"

namespace scalify::train {

// Everything a run holds in memory: model, recipe state, optimizer, loss scaler.
struct Session {
  TrainConfig cfg;
  quant::Recipe recipe;
  nn::Gpt model;
  std::vector<std::string> names;
  std::vector<Var> params;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<quant::LossScaler> scaler;

  Session(const TrainConfig& c, quant::Recipe r, nn::Weights weights = nn::Weights::random)
      : cfg(c), recipe(std::move(r)), model(model_config(c, recipe), c.seed, recipe, weights) {}
  // A unit-scaling recipe trains the unit-scaled variant of the configured model; a u-μP one its
  // u-μP variant, with unit-scaling's TransformerDecoder's pieces: RMSNorm, SwiGLU, no biases, an
  // untied readout.
  static nn::GptConfig model_config(const TrainConfig& c, const quant::Recipe& r) {
    nn::GptConfig m = c.model;
    m.unit_scaled = m.unit_scaled || r.unit_scaled;
    if (r.umup) {
      m.umup = true;
      set_umup_model_keys(m);
    }
    return m;
  }
  // The model the forward pass runs: the recipe's data storage narrower than a parameter's means
  // the parameter is cast to it at use; its gradient comes back in that storage too (f16 data for
  // an f32 master under SCALIFY #1), and the optimizer reads it from there.
  nn::Gpt forward_model() const {
    const std::optional<Format> f = dtype_format(recipe.data_storage);
    if (!f || recipe.data_storage == DType::f32) return model;
    nn::Gpt m = model;
    nn::NamedParams cast = model.parameters();
    for (auto& [name, p] : cast)
      if (p.scaled().data.dtype() == DType::f32) p = cast_on_forward(p, *f);
    m.set_parameters(cast);
    return m;
  }
};

// The memory a session needs, a lower bound: with an optimizer (training, and checkpoints loaded
// with their state) the parameters and their gradients in the master-weight storage and AdamW's
// two moments in the recipe's state storage, and per token of a batch at least 16 activations of
// d_model values per layer (in the data storage), attention's f32 probabilities (heads x seq per
// token, every layer's kept for the backward) and the f32 logits with their softmax and gradient;
// without one (an inference session, Python's Gpt), the f32 parameter values, one batch's logits
// and one layer's attention probabilities.
double estimated_memory_bytes(const TrainConfig& cfg, const quant::Recipe& r, bool with_optimizer);
// Refuses a model whose estimate exceeds this process's memory before any of it is allocated
// (std::bad_alloc minutes into the allocation otherwise, or the machine's memory eaten).
void check_fits_in_memory(const TrainConfig& cfg, const quant::Recipe& r, bool with_optimizer);
// A new session (ckpt null: initialised from the config's seed) or one restored from a training
// checkpoint (parameters, optimizer and quantiser state, loss scaler).
std::unique_ptr<Session> make_session(const TrainConfig& cfg, const io::SafeTensors* ckpt);
// Whether load_session accepts parameters holding NaN or infinities: only inspection looks at
// such a model; training, evaluation and quantisation refuse it (and non-finite optimizer state)
// by name. A scale that is not finite and positive is refused either way.
enum class NonFinite : uint8_t { refuse, allow };
// make_session from a checkpoint, with corrupt state reported against the file.
std::unique_ptr<Session> load_session(const io::SafeTensors& st, const TrainConfig& cfg, const std::string& file,
                                      NonFinite nonfinite = NonFinite::refuse);
// What a checkpoint file holds: everything a resume continues from (checkpoint.safetensors), or
// the model alone (a run's final model.safetensors): parameters, quantiser state and metadata,
// without the optimizer's moments (twice the parameters' size under AdamW).
enum class CheckpointContents : uint8_t { resumable, model };
// Writes the session atomically as a checkpoint at `step`.
void save_checkpoint(const Session& s, const std::string& path, int64_t step, int64_t skipped,
                     CheckpointContents contents = CheckpointContents::resumable);
// A run folder's checkpoint.safetensors (an error when it has none), or the path itself when it
// is not a folder.
std::string checkpoint_file(const std::string& path);
// Reads a training checkpoint and its config; errors name the file.
std::pair<io::SafeTensors, TrainConfig> read_checkpoint(const std::string& path);

// The files of a run folder: the trainer's own, which no other command may replace.
const std::vector<const char*>& run_file_names();
// The same checks on a file already read.
TrainConfig training_checkpoint_config(io::SafeTensors& st, const std::string& file);
// A checkpoint's metadata 'step' (the steps it has trained), checked to be a whole number >= 0.
int64_t checkpoint_step(const io::SafeTensors& st, const std::string& file);
// Files of this build's format versions carry checksums: one read without them (its checksum key
// damaged, or stripped) is refused. Older versions load unverified, with io/safetensors' note.
void require_checksums(const io::SafeTensors& st, const std::string& file);
// The config a checkpoint (training or quantised) carries in its metadata, validated.
TrainConfig checkpoint_config(const io::SafeTensors& st, const std::string& file);
// A session for inference: the recipe's model with the given parameter values (every parameter,
// by name; shapes checked), no optimizer.
std::unique_ptr<Session> inference_session(const TrainConfig& cfg, quant::Recipe recipe, const std::map<std::string, Tensor>& values);
// The session's parameters as f32 values by name (scaled ones: their represented values).
std::map<std::string, Tensor> parameter_values(const Session& s);
// Mean loss of the windows starting at `starts` (no gradients recorded by the caller's NoGrad).
double batch_loss(const Session& s, const std::vector<int32_t>& tokens, const std::vector<size_t>& starts);
// Validation loss over the config's eval windows of the corpus's validation tokens (bits per byte
// from its token_bytes when tokenised); with a world of several ranks, each evaluates its share of
// the windows (a collective: every rank calls it), the same double.
EvalResult eval_session(const Session& s, const Corpus& corpus, const platform::World& world = platform::single_process());
// The config's corpus (its data, or the default), split as the trainer splits it: bytes, or with
// `init` (a pretrained model's folder) through that model's tokenizer.
Corpus corpus_for(const TrainConfig& cfg);

}  // namespace scalify::train
