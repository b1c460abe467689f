#include "scalify/train/init_record.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "scalify/error.hpp"
#include "scalify/platform/crc32c.hpp"

namespace scalify::train {

namespace fs = std::filesystem;

namespace {

std::string hex32(uint32_t v) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", v);
  return s;
}

// The CRC-32C of a regular file's bytes, read in chunks (weights can be gigabytes).
std::string file_crc(const fs::path& p) {
  if (!fs::is_regular_file(p)) throw FileError("init: '" + p.string() + "' is not a regular file");
  std::ifstream in(p, std::ios::binary);
  std::vector<char> buf(size_t(1) << 20);
  uint32_t c = 0;
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    c = platform::crc32c(buf.data(), size_t(in.gcount()), c);
  }
  if (in.bad()) throw FileError("init: cannot read '" + p.string() + "'");
  return hex32(c);
}

using Record = std::map<std::string, std::string>;  // file name -> CRC-32C

// "a=crc,b=crc" <-> the map: the config's text form of a record.
std::string to_text(const Record& r) {
  std::string s;
  for (const auto& [name, crc] : r) s += (s.empty() ? "" : ",") + name + "=" + crc;
  return s;
}
Record from_text(const std::string& text, const char* key) {
  Record r;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || item.size() - eq - 1 != 8)
      throw Error(std::string("config: '") + key + "' must be file=crc32c entries separated by commas, got '" + text.substr(0, 80) + "'");
    r[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return r;
}

Record tokenizer_record(const fs::path& dir) {
  Record r;
  for (const char* name : tokenize::tokenizer_file_names())
    if (fs::exists(dir / name)) r[name] = file_crc(dir / name);
  return r;
}
Record weights_record(const fs::path& dir) {
  Record r;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool weights = name.size() > 12 && (name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json"));
    if (weights) r[name] = file_crc(e.path());
  }
  return r;
}

// Throws naming the first file whose CRC, presence or absence differs from the record.
void check(const Record& recorded, const Record& now, const std::string& dir, const std::string& run, const char* what) {
  if (!fs::is_directory(dir))
    throw Error("init: the model folder '" + dir + "' that '" + run + "' was fine-tuned from no longer exists; its " + what +
                " are part of the run");
  std::vector<std::string> names;
  for (const auto& [n, c] : recorded) names.push_back(n);
  for (const auto& [n, c] : now) names.push_back(n);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const auto was = recorded.find(n), is = now.find(n);
    const std::string file = (fs::path(dir) / n).string();
    const std::string tail = " since '" + run + "' was fine-tuned from it; the run's " + what + " must be the ones it was trained with";
    if (is == now.end()) throw Error("init: '" + file + "' is missing" + tail);
    if (was == recorded.end()) throw Error("init: '" + file + "' appeared" + tail);
    if (was->second != is->second)
      throw Error("init: '" + file + "' changed (CRC-32C " + is->second + ", recorded " + was->second + ")" + tail);
  }
}

}  // namespace

TrainConfig record_init(const TrainConfig& config) {
  if (config.init.empty() || !config.init_tokenizer.empty() || !config.init_weights.empty()) return config;
  TrainConfig c = config;
  c.init = fs::absolute(c.init).lexically_normal().string();
  if (c.init.size() > 1 && c.init.back() == '/') c.init.pop_back();
  const Record tokenizer = tokenizer_record(c.init), weights = weights_record(c.init);
  // An empty record would read as "nothing recorded": "-" records that there was no tokenizer.
  c.init_tokenizer = tokenizer.empty() ? "-" : to_text(tokenizer);
  c.init_weights = weights.empty() ? "-" : to_text(weights);
  return c;
}

void check_init_tokenizer(const TrainConfig& config, const std::string& run) {
  if (config.init.empty() || config.init_tokenizer.empty()) return;
  const Record recorded = config.init_tokenizer == "-" ? Record{} : from_text(config.init_tokenizer, "init_tokenizer");
  check(recorded, fs::is_directory(config.init) ? tokenizer_record(config.init) : Record{}, config.init, run, "tokenizer files");
}

void check_init_weights(const TrainConfig& config, const std::string& run) {
  if (config.init.empty() || config.init_weights.empty()) return;
  const Record recorded = config.init_weights == "-" ? Record{} : from_text(config.init_weights, "init_weights");
  check(recorded, fs::is_directory(config.init) ? weights_record(config.init) : Record{}, config.init, run, "weight files");
}

std::unique_ptr<tokenize::Tokenizer> run_tokenizer(const TrainConfig& config, const std::string& run) {
  if (config.init.empty()) return nullptr;
  check_init_tokenizer(config, run);
  return tokenize::has_tokenizer_files(config.init) ? tokenize::load_tokenizer(config.init) : nullptr;
}

}  // namespace scalify::train
