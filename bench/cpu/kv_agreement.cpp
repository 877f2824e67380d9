// What a quantized KV cache costs: one long stretch of a text, teacher-forced through the CPU
// executor once per cache type (F16, BF16, Q8_0, Q4_0 for K and V alike), in one process. For each
// type: its KV bytes per token, the perplexity of the scored positions (the second half, as
// `hablar perplexity` scores a chunk), and the share of those positions whose top-1 token
// (the argmax of the logits; the first on ties) is the F16 cache's.
//
//   build/bench/cpu/kv_agreement --file=TEXT [--model=PATH] [--ctx=4096] [--threads=2]
//
// The first `ctx` tokens of the text are used (BOS first when the vocabulary adds one).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/kv_layout.h"
#include "core/paths.h"
#include "engine/executor_factory.h"
#include "engine/sequence_runner.h"
#include "model/model.h"

namespace hablar::bench {
namespace {

struct Options {
  std::string model, file;
  int ctx = 4096, threads = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? a.c_str() + prefix.size() : nullptr;
    };
    if (const char* v = value("model"))
      o.model = v;
    else if (const char* v = value("file"))
      o.file = v;
    else if (const char* v = value("ctx"))
      o.ctx = std::atoi(v);
    else if (const char* v = value("threads"))
      o.threads = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.file.empty() || o.ctx < 8 || o.threads < 1) {
    std::fprintf(stderr,
                 "usage: kv_agreement --file=TEXT [--model=PATH] [--ctx=N>=8] [--threads=N]\n");
    std::exit(2);
  }
  return o;
}

// Per scored position: the argmax of the logits and the negative log-likelihood of the next
// token.
struct Scores {
  std::vector<int32_t> top1;
  std::vector<double> nll;
};

void score_rows(const float* logits, int n_rows, int n_vocab, const int32_t* next, Scores& s) {
  for (int r = 0; r < n_rows; ++r) {
    const float* l = logits + (size_t)r * n_vocab;
    int best = 0;
    for (int v = 1; v < n_vocab; ++v)
      if (l[v] > l[best]) best = v;
    const double max = l[best];
    double sum = 0.0;
    for (int v = 0; v < n_vocab; ++v) sum += std::exp((double)l[v] - max);
    s.top1.push_back(best);
    s.nll.push_back(std::log(sum) + max - (double)l[next[r]]);
  }
}

Scores run(const model::Model& m, const std::vector<int32_t>& tokens, const Options& o, KvDType t) {
  engine::ExecutorOptions eo;
  eo.device = engine::DeviceKind::kCpu;
  eo.n_threads = o.threads;
  eo.kv_tokens = o.ctx;
  eo.cache_type_k = eo.cache_type_v = t;
  auto ex = engine::make_executor(m, eo);
  engine::SequenceRunner seq(*ex, o.ctx, 512);
  const int first = o.ctx / 2, n_vocab = ex->n_vocab();
  Scores s;
  seq.eval(std::span<const int32_t>(tokens.data(), (size_t)first));
  // The scored half in pieces of 256 tokens (all of a piece's logits at once).
  for (int p = first; p < o.ctx - 1; p += 256) {
    const int n = std::min(256, o.ctx - 1 - p);
    const std::span<const float> logits =
        seq.eval(std::span<const int32_t>(tokens.data() + p, (size_t)n), true);
    score_rows(logits.data(), n, n_vocab, tokens.data() + p + 1, s);
  }
  return s;
}

}  // namespace
}  // namespace hablar::bench

int main(int argc, char** argv) {
  using namespace hablar;
  const bench::Options o = bench::parse(argc, argv);
  std::ifstream in(o.file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", o.file.c_str());
    return 2;
  }
  std::ostringstream text;
  text << in.rdbuf();
  const auto m = model::Model::load(resolve_model_path(o.model));
  const auto& tok = m->tokenizer();
  std::vector<int32_t> tokens = tok.encode(text.str(), tok.add_bos() && tok.bos_id() >= 0, false);
  if ((int)tokens.size() < o.ctx) {
    std::fprintf(stderr, "the text has %zu tokens, fewer than --ctx=%d\n", tokens.size(), o.ctx);
    return 2;
  }
  tokens.resize((size_t)o.ctx);
  std::printf("%d tokens, positions %d..%d scored, %d threads\n\n", o.ctx, o.ctx / 2, o.ctx - 2,
              o.threads);
  std::printf(
      "| KV cache | perplexity | vs F16 | top-1 same as F16 |\n| --- | ---: | ---: | ---: |\n");
  bench::Scores base;
  double base_ppl = 0.0;
  for (KvDType t : {KvDType::F16, KvDType::BF16, KvDType::Q8_0, KvDType::Q4_0}) {
    const bench::Scores s = bench::run(*m, tokens, o, t);
    double nll = 0.0;
    for (double x : s.nll) nll += x;
    const double ppl = std::exp(nll / (double)s.nll.size());
    if (t == KvDType::F16) base = s, base_ppl = ppl;
    int64_t same = 0;
    for (size_t i = 0; i < s.top1.size(); ++i) same += s.top1[i] == base.top1[i];
    std::printf("| %s | %.4f | %+.2f%% | %lld / %zu (%.2f%%) |\n", kv_dtype_name(t), ppl,
                100.0 * (ppl / base_ppl - 1.0), (long long)same, s.top1.size(),
                100.0 * (double)same / (double)s.top1.size());
    std::fflush(stdout);
  }
  return 0;
}
