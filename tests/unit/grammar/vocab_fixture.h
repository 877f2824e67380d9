// The grammar tests' vocabularies: llama.cpp's test vocabulary files
// (testdata/vocab/ggml-vocab-NAME.gguf) as grammar Vocabs, each loaded once per process.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "formats/gguf.h"
#include "grammar/matcher.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"

namespace hablar::grammar::test_vocab {

inline std::shared_ptr<const Vocab> gguf_vocab(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Vocab>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& v = cache[name];
  if (!v) {
    auto file = gguf::GgufFile::open(test::testdata_dir() + "/vocab/ggml-vocab-" + name + ".gguf");
    v = Vocab::from_tokenizer(*tokenizer::Tokenizer::from_gguf(file));
  }
  return v;
}

}  // namespace hablar::grammar::test_vocab
