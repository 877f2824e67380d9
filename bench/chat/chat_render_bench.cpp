// Rendering a 20-message conversation with two tools (bench/chat/conversation_20.json) through
// real chat templates, and parsing a streamed tool-call answer. After the Google Benchmark
// table it prints each template's time next to Python jinja2's for the same render (the peer,
// tools/chat_bench_peer.py run with $HABLAR_PYTHON or python3), with the ratio.
//
//   build/bench/chat/chat_bench [--benchmark_filter=...]
#include "chat/chat.h"

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using nlohmann::ordered_json;

const char* const kTemplates[] = {
    "Qwen-Qwen2.5-7B-Instruct",         "Qwen-Qwen3-0.6B",
    "meta-llama-Llama-3.1-8B-Instruct", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "ibm-granite-granite-4.0",          "openai-gpt-oss-120b",
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string testdata_dir() {
  const char* env = std::getenv("HABLAR_TESTDATA");
  return env ? env : std::string(HABLAR_SOURCE_DIR) + "/../shared/testdata";
}

std::string template_path(const std::string& name) {
  return testdata_dir() + "/chat-templates/" + name + ".jinja";
}

std::string context_path() {
  return std::string(HABLAR_SOURCE_DIR) + "/bench/chat/conversation_20.json";
}

void BM_Render(benchmark::State& state, std::string name) {
  hablar::chat::ChatTemplate tmpl(read_file(template_path(name)));
  ordered_json context = ordered_json::parse(read_file(context_path()));
  hablar::chat::RenderOptions options;
  options.now = 1721989800;
  std::size_t bytes = 0;
  for (auto _ : state) {
    std::string out = tmpl.render(context, options);
    bytes = out.size();
    benchmark::DoNotOptimize(out);
  }
  state.counters["prompt_bytes"] = static_cast<double>(bytes);
}

void BM_Parse(benchmark::State& state) {
  hablar::chat::ChatTemplate tmpl(read_file(template_path("Qwen-Qwen2.5-7B-Instruct")));
  std::string answer =
      "Let me check the weather for you.\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"location\": \"Paris, France\", \"unit\": \"celsius\"}}\n</tool_call>";
  for (auto _ : state) {
    hablar::chat::StreamingOutputParser parser(hablar::chat::ToolFormat::kHermes);
    std::size_t calls = 0;
    for (std::size_t i = 0; i < answer.size(); i += 4)  // about one token per 4 bytes
      calls += parser.push(std::string_view(answer).substr(i, 4)).tool_calls.size();
    calls += parser.finish().tool_calls.size();
    benchmark::DoNotOptimize(calls);
  }
}

// A long streamed answer (reasoning, then about 16 KB of text) fed in 4-byte pieces: the cost a
// server pays per generated token for output parsing.
void BM_ParseLong(benchmark::State& state, hablar::chat::ToolFormat format) {
  std::string answer = "<think>\nThe user wants a long essay; plan it first.\n</think>\n\n";
  while (answer.size() < 16384) answer += "Paragraph about llamas, alpacas and <b>markup</b> [1]. ";
  for (auto _ : state) {
    hablar::chat::StreamingOutputParser parser(format);
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < answer.size(); i += 4)
      bytes += parser.push(std::string_view(answer).substr(i, 4)).content.size();
    bytes += parser.finish().content.size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["pieces"] = static_cast<double>(answer.size() / 4);
}

// CPU microseconds per render of `name`, measured like the peer measures itself (process time,
// at least half a second of renders): the machine is often shared, so wall time would mostly
// measure the other tenants.
double cpu_micros_per_render(const std::string& name) {
  hablar::chat::ChatTemplate tmpl(read_file(template_path(name)));
  ordered_json context = ordered_json::parse(read_file(context_path()));
  hablar::chat::RenderOptions options;
  options.now = 1721989800;
  auto cpu_seconds = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  benchmark::DoNotOptimize(tmpl.render(context, options));
  std::size_t runs = 0;
  double start = cpu_seconds(), elapsed = 0;
  while (elapsed < 0.5) {
    for (int i = 0; i < 20; ++i) benchmark::DoNotOptimize(tmpl.render(context, options));
    runs += 20;
    elapsed = cpu_seconds() - start;
  }
  return elapsed / static_cast<double>(runs) * 1e6;
}

// Runs the Python peer; empty when Python or jinja2 is unavailable.
std::map<std::string, double> run_peer() {
  const char* python = std::getenv("HABLAR_PYTHON");
  std::string cmd = std::string(python ? python : "python3") + " " + HABLAR_SOURCE_DIR +
                    "/tools/chat_bench_peer.py " + context_path();
  for (const char* name : kTemplates) {
    cmd.push_back(' ');
    cmd += template_path(name);
  }
  cmd += " 2>/dev/null";
  std::map<std::string, double> out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return out;
  std::string text;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) text.append(buf, n);
  if (pclose(pipe) != 0) return out;
  auto j = ordered_json::parse(text, nullptr, false);
  if (!j.is_object()) return out;
  for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value().get<double>();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  for (const char* name : kTemplates)
    benchmark::RegisterBenchmark(("render/" + std::string(name)).c_str(), BM_Render,
                                 std::string(name))
        ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("parse_streamed/long_answer_none", BM_ParseLong,
                               hablar::chat::ToolFormat::kNone)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("parse_streamed/long_answer_hermes", BM_ParseLong,
                               hablar::chat::ToolFormat::kHermes)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("parse_streamed/long_answer_llama3", BM_ParseLong,
                               hablar::chat::ToolFormat::kLlama3)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("parse_streamed/hermes_tool_call", BM_Parse)
      ->Unit(benchmark::kMicrosecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();

  std::map<std::string, double> peer = run_peer();
  std::printf("\n20-message conversation with 2 tools, CPU microseconds per render\n");
  std::printf("%-46s %10s %14s %8s\n", "template", "hablar", "python jinja2", "speedup");
  for (const char* name : kTemplates) {
    double ours = cpu_micros_per_render(name);
    auto theirs = peer.find(name);
    if (theirs == peer.end())
      std::printf("%-46s %10.1f %14s %8s\n", name, ours, "n/a", "n/a");
    else
      std::printf("%-46s %10.1f %14.1f %7.1fx\n", name, ours, theirs->second,
                  theirs->second / ours);
  }
  if (peer.empty())
    std::printf("(peer unavailable: set HABLAR_PYTHON to a Python with jinja2 3.1.6)\n");
  benchmark::Shutdown();
  return 0;
}
