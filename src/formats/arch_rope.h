// Which RoPE pairing a GGUF architecture's files use, as llama.cpp rotates them: adjacent
// pairs (2i, 2i + 1; llama.cpp's NORM RoPE) for llama and the families it turns alike, NeoX
// halves (i, i + n_dims / 2) for every other family hablar reads. One list for the model's
// configuration, the Hugging Face import and the APR writer.
#pragma once

#include <string_view>

namespace hablar::formats {

inline bool adjacent_pair_rope(std::string_view arch) {
  return arch == "llama" || arch == "ernie4_5" || arch == "smollm3" || arch == "granite" ||
         arch == "granitemoe" || arch == "glm4" || arch == "arcee" || arch == "mistral3" ||
         arch == "xverse" || arch == "command-r" || arch == "cohere2" || arch == "minicpm" ||
         arch == "internlm2";
}

}  // namespace hablar::formats
