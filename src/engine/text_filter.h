// The engine's output filter over a tokenizer: incremental detokenization (UTF-8 safe) and
// stop strings across token boundaries, on the step thread.
#pragma once

#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace hablar::engine {

class TextFilter : public OutputFilter {
 public:
  TextFilter(const tokenizer::Tokenizer& tok, std::vector<std::string> stops)
      : detok_(tok), stops_(std::move(stops)) {}
  Result push(int32_t token) override {
    StopStringMatcher::Result r = stops_.push(detok_.push(token));
    return {std::move(r.text), r.stopped, std::move(r.matched)};
  }
  std::string flush() override {
    StopStringMatcher::Result r = stops_.push(detok_.flush());
    if (r.stopped) return r.text;
    return r.text + stops_.flush();
  }

 private:
  tokenizer::IncrementalDetokenizer detok_;
  StopStringMatcher stops_;
};

}  // namespace hablar::engine
