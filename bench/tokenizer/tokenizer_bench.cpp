// tokenizer_bench VOCAB.gguf CORPUS [--repeat N] [--dump OUT]
//
// Loads the vocabulary, reads the corpus (documents separated by the line
// "__hablar_corpus_doc__"), encodes every document (no BOS/EOS, specials as plain text)
// N times and prints one line: `vocab bytes tokens seconds MB/s load_seconds`. --dump writes
// one line of space-separated ids per document.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr std::string_view kSeparator = "\n__hablar_corpus_doc__\n";

std::vector<std::string> read_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw hablar::Error(hablar::ErrorKind::kIo, "cannot read corpus " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  std::vector<std::string> docs;
  size_t pos = 0;
  for (size_t hit; (hit = all.find(kSeparator, pos)) != std::string::npos;
       pos = hit + kSeparator.size())
    docs.push_back(all.substr(pos, hit - pos));
  docs.push_back(all.substr(pos));
  return docs;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench VOCAB.gguf CORPUS [--repeat N] [--dump OUT]\n");
    return 2;
  }
  int repeat = 3;
  std::string dump;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string opt = argv[i];
    if (opt == "--repeat")
      repeat = std::atoi(argv[i + 1]);
    else if (opt == "--dump")
      dump = argv[i + 1];
  }
  try {
    const auto docs = read_documents(argv[2]);
    const auto t_load = std::chrono::steady_clock::now();
    const auto file = hablar::gguf::GgufFile::open(argv[1]);
    const auto tok = hablar::tokenizer::Tokenizer::from_gguf(file);
    const double load_s = seconds_since(t_load);
    size_t bytes = 0;
    for (const auto& d : docs) bytes += d.size();
    size_t tokens = 0;
    double best = 1e30;
    for (int r = 0; r < std::max(1, repeat); ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      size_t n = 0;
      for (const auto& d : docs) n += tok->encode(d, false, false).size();
      best = std::min(best, seconds_since(t0));
      tokens = n;
    }
    if (!dump.empty()) {
      std::ofstream out(dump, std::ios::binary);
      for (const auto& d : docs) {
        const auto ids = tok->encode(d, false, false);
        for (size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
        out << "\n";
      }
    }
    std::printf("%s %zu %zu %.6f %.3f %.3f\n", argv[1], bytes, tokens, best,
                static_cast<double>(bytes) / best / 1e6, load_s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
