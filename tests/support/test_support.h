// Helpers shared by the unit tests.
#pragma once

#include <cmath>
#include <span>
#include <string>

namespace hablar::test {

// ../shared/testdata beside the repo, or $HABLAR_TESTDATA.
std::string testdata_dir();
// The repository root (for golden files committed under tests/).
std::string source_dir();
// Path of the default model in the cache, or "" when it is not there.
std::string default_model_path_or_empty();
// The path of `file_name` in the model cache, or "" when it is not there.
std::string cached_model_path_or_empty(const std::string& file_name);
// A fresh temporary directory for one test, removed with its contents when the process exits.
std::string make_temp_dir(const std::string& prefix);

// The cosine of the angle between two vectors of equal length, summed in double.
inline double cosine(std::span<const float> a, std::span<const float> b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i)
    ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
  return ab / std::sqrt(aa * bb);
}

}  // namespace hablar::test
