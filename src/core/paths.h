// Where hablar finds things on disk: the model cache and the shared test data.
#pragma once

#include <string>
#include <string_view>

namespace hablar {

// Name of the default model (a file in the model cache).
inline constexpr std::string_view kDefaultModelName = "SmolLM2-135M-Instruct.Q4_1.gguf";

// $HABLAR_HOME/models if HABLAR_HOME is set, else ~/.cache/hablar/models.
std::string model_cache_dir();

// Resolves a model argument: an existing path is returned as is; otherwise a file name
// (with or without .gguf) in the model cache; an empty argument means the default model.
// Throws Error(kNotFound) that says how to fetch the default model when it is absent.
std::string resolve_model_path(std::string_view name_or_path);

// The command that fetches the default model into the cache.
inline constexpr std::string_view kFetchModelCommand = "scripts/fetch-model.sh";

}  // namespace hablar
