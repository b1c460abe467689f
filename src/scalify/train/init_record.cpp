#include "scalify/train/init_record.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/hub/model_tokenizer.hpp"
#include "scalify/hub/gguf_file.hpp"
#include "scalify/hub/hf_weights.hpp"
#include "scalify/io/input_file.hpp"
#include "scalify/io/json_text.hpp"
#include "scalify/platform/crc32c.hpp"

namespace scalify::train {

namespace fs = std::filesystem;

namespace {

using Record = std::map<std::string, std::string>;  // file name -> CRC-32C

std::string crc_of(const fs::path& file) { return platform::crc32c_text(io::input_file_crc32c(file.string(), "init")); }

// The files a run reads again after its start: config.json and the tokenizer's.
Record files_record(const fs::path& dir) {
  Record r;
  std::error_code ec;
  for (const char* name : {"config.json"})
    if (fs::exists(dir / name, ec)) r[name] = crc_of(dir / name);
  // Every tokenizer file present, but tokenizer.json only where it is the one read: a folder with
  // GPT-2's files and tokenizer.json records what it recorded before tokenizer.json was read.
  const std::vector<std::string> read = tokenize::tokenizer_files_read(dir.string());
  for (const char* name : tokenize::tokenizer_file_names())
    if (fs::exists(dir / name, ec) && (std::string(name) != "tokenizer.json" || read == std::vector<std::string>{name}))
      r[name] = crc_of(dir / name);
  return r;
}
// The weight files load_hf_weights reads, and the index naming them.
Record weights_record(const fs::path& dir) {
  Record r;
  std::map<std::string, std::string> listed;
  for (const std::string& file : hub::weight_files(dir.string(), &listed)) r[fs::path(file).filename().string()] = crc_of(file);
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors.index.json", ec))
    r["model.safetensors.index.json"] = crc_of(dir / "model.safetensors.index.json");
  return r;
}

// A record as config text (a JSON object: file names may hold any character) and back.
std::string to_text(const Record& r) { return nlohmann::json(r).dump(); }
Record from_text(const std::string& text, const std::string& key) {
  const nlohmann::json j = io::parse_json(text, "config: '" + key + "'");
  if (!j.is_object()) throw Error("config: '" + key + "' must be a JSON object of file names and CRC-32Cs");
  Record r;
  for (const auto& [name, crc] : j.items()) {
    if (!crc.is_string()) throw Error("config: '" + key + "' holds " + io::json_excerpt(crc) + " for '" + io::text_excerpt(name) + "'");
    r[name] = crc.get<std::string>();
  }
  return r;
}

}  // namespace

TrainConfig record_init(const TrainConfig& config) {
  if (config.init.empty()) return config;
  TrainConfig c = config;
  c.init = fs::absolute(c.init).lexically_normal().string();
  if (c.init.size() > 1 && c.init.back() == '/') c.init.pop_back();
  std::error_code ec;
  // with_pretrained_model names a missing folder; a GGUF file is its own config and weights.
  if (!fs::is_directory(c.init, ec) && !hub::is_gguf(c.init)) return c;
  c.init_files = to_text(files_record(c.init));
  c.init_weights = to_text(weights_record(c.init));
  return c;
}

void check_init_files(const TrainConfig& config, const std::string& run) {
  if (config.init.empty() || config.init_files.empty()) return;
  const Record recorded = from_text(config.init_files, "init_files");
  std::error_code ec;
  if (!fs::is_directory(config.init, ec) && !(hub::is_gguf(config.init) && fs::exists(config.init, ec)))
    throw Error("init: the model folder '" + config.init + "' that '" + run +
                "' was fine-tuned from no longer exists; its config.json and tokenizer are part of the run");
  const Record now = files_record(config.init);
  std::vector<std::string> names;
  for (const auto& [n, c] : recorded) names.push_back(n);
  for (const auto& [n, c] : now) names.push_back(n);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const auto was = recorded.find(n), is = now.find(n);
    const std::string file = (fs::path(config.init) / n).string();
    const std::string tail =
        " since '" + run + "' was fine-tuned from it; the run reads it again (the model's shape, its text): restore the folder as it was";
    if (is == now.end()) throw Error("init: '" + file + "' is missing" + tail);
    if (was == recorded.end()) throw Error("init: '" + file + "' appeared" + tail);
    if (was->second != is->second)
      throw Error("init: '" + file + "' changed (CRC-32C " + is->second + ", recorded " + was->second + ")" + tail);
  }
}

std::unique_ptr<tokenize::Tokenizer> run_tokenizer(const TrainConfig& config, const std::string& run) {
  if (config.init.empty()) return nullptr;
  check_init_files(config, run);
  return hub::has_model_tokenizer(config.init) ? hub::load_model_tokenizer(config.init) : nullptr;
}

}  // namespace scalify::train
