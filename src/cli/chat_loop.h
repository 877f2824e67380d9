// The interactive chat loop of `hablar chat` and `hablar run -cnv` (cmd_chat.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "cli/device_options.h"
#include "engine/sampler.h"

namespace hablar::cli {

struct ChatOptions {
  std::string model;
  std::string system;
  std::string chat_template_file;
  int n_predict = -1;  // per reply; -1: until the context is full or the model ends its turn
  int n_ctx = 0;       // 0: 4096, or the model's context when smaller
  int n_threads = 0;
  int n_batch = 512;
  int64_t seed = -1;  // -1: random, printed
  engine::SamplingParams sampling;
  DeviceFlags device;
};

// Chats on the terminal until /exit, end of input or Ctrl-C at the prompt; returns 0.
int run_chat(ChatOptions o);

}  // namespace hablar::cli
