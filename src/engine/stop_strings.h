// Stop strings over streamed text. Generated text arrives in pieces (one token's text at a
// time) and a stop string may span several pieces, so text that could be the start of a stop
// string is held back until it is known not to be one.
//
//   StopStringMatcher m({"\n\n", "END"});
//   auto r = m.push("foo EN");   // r.text == "foo ", "EN" held back
//   r = m.push("D bar");         // r.text == "", r.stopped, r.matched == "END"
//
// The text before the stop string is emitted; the stop string and everything after it are not.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hablar::engine {

class StopStringMatcher {
 public:
  // Empty strings are ignored.
  explicit StopStringMatcher(std::vector<std::string> stops = {});

  struct Result {
    std::string text;  // safe to emit now
    bool stopped = false;
    std::string matched;  // the stop string found (when stopped)
  };
  // Feeds more generated text. After a stop, further pushes return nothing.
  Result push(std::string_view text);
  // End of generation: releases the held-back text (nothing if stopped).
  std::string flush();

  bool stopped() const { return stopped_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace hablar::engine
