#pragma once
// What a fine-tuned run was trained from, recorded so that nothing can change it silently. A new
// run started with `init` records the folder's absolute path (the run may later be used from
// another directory), a CRC-32C of each file the run reads again after its start (config.json,
// which gives the model's shape on a resume, and the tokenizer files, through which eval, sample,
// export and resume read text) and one of each weight file it starts from. Every later use checks
// the files it reads again and refuses a folder that changed, naming the file.
#include <memory>
#include <string>

#include "scalify/tokenize/tokenizer.hpp"
#include "scalify/train/config.hpp"

namespace scalify::train {

// config with its init recorded afresh (init made absolute; init_files and init_weights set), for
// a new run; a config without init as it is.
TrainConfig record_init(const TrainConfig& config);

// Throws unless config's init folder still holds the files it recorded in init_files ("" records
// nothing: runs of earlier versions), naming the file that changed, appeared or went missing.
// `run` names the run in the message.
void check_init_files(const TrainConfig& config, const std::string& run);

// The tokenizer a fine-tuned run reads text with (after check_init_files), or null for the
// byte-level GPT and for an init folder that holds none.
std::unique_ptr<tokenize::Tokenizer> run_tokenizer(const TrainConfig& config, const std::string& run);

}  // namespace scalify::train
