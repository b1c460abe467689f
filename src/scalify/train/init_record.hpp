#pragma once
// What a fine-tuned run was trained from, recorded so that nothing can change it silently. A run
// started with `init` records the folder's absolute path (the run may later be used from another
// directory), a CRC-32C of each tokenizer file (eval, sample, export and resume read text through
// that tokenizer long after the start) and one of the weight files (the step-0 weights). Every
// later use checks the record and refuses a folder that changed, naming the file.
#include <memory>
#include <string>

#include "scalify/tokenize/tokenizer.hpp"
#include "scalify/train/config.hpp"

namespace scalify::train {

// config with its init recorded (init made absolute; init_tokenizer and init_weights set), for a
// new run. A config without init, or one already recorded, is returned as it is.
TrainConfig record_init(const TrainConfig& config);

// Throws unless config's init folder still holds the tokenizer files it recorded ("" records
// nothing: runs of earlier versions), naming the file that changed, appeared or went missing.
// `run` names the run in the message.
void check_init_tokenizer(const TrainConfig& config, const std::string& run);
// The same for the weight files, before the weights are read again.
void check_init_weights(const TrainConfig& config, const std::string& run);

// The tokenizer a fine-tuned run reads text with (checked against its record), or null for the
// byte-level GPT and for an init folder that holds none.
std::unique_ptr<tokenize::Tokenizer> run_tokenizer(const TrainConfig& config, const std::string& run);

}  // namespace scalify::train
