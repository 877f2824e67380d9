// Tool-call and reasoning parsing on realistic model outputs of each format, whole and streamed
// in arbitrary chunks: the streamed deltas must add up to the whole parse, never showing part
// of a tag.
#include "chat/chat.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace hablar::chat {
namespace {

using nlohmann::json;

struct ExpectedCall {
  std::string name;
  std::string arguments;  // JSON text; compared as JSON
  std::string id;
};

struct Case {
  std::string label;
  ToolFormat format;
  std::string text;
  std::string content;
  std::string reasoning;
  std::vector<ExpectedCall> calls;
  bool reasoning_started = false;
};

const std::string kWeatherArgs = R"j({"location": "Paris, France", "unit": "celsius"})j";

std::vector<Case> cases() {
  const std::string b = "<｜tool▁calls▁begin｜>", e = "<｜tool▁calls▁end｜>";
  const std::string cb = "<｜tool▁call▁begin｜>", ce = "<｜tool▁call▁end｜>",
                    sep = "<｜tool▁sep｜>";
  return {
      {"hermes_single",
       ToolFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + kWeatherArgs +
           "}\n</tool_call>",
       "",
       "",
       {{"get_weather", kWeatherArgs, ""}}},
      {"hermes_text_and_two_calls",
       ToolFormat::kHermes,
       "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
       "\"Rome\"}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"gelato <b>\", \"limit\": "
       "3}}\n</tool_call>",
       "Let me check both.",
       "",
       {{"get_weather", R"j({"location": "Rome"})j", ""},
        {"search", R"j({"query": "gelato <b>", "limit": 3})j", ""}}},
      {"qwen3_think_then_call",
       ToolFormat::kHermes,
       "<think>\nThe user wants the weather; I should call the "
       "tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " +
           kWeatherArgs + "}\n</tool_call>",
       "",
       "The user wants the weather; I should call the tool.",
       {{"get_weather", kWeatherArgs, ""}}},
      {"qwen3_prompt_opened_think",
       ToolFormat::kHermes,
       "7 times 6 is 42.\n</think>\n\nThe answer is **42**.",
       "The answer is **42**.",
       "7 times 6 is 42.",
       {},
       true},
      {"qwen3_coder_xml",
       ToolFormat::kHermes,
       "I'll look it up.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, "
       "France\n</parameter>\n"
       "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
       "I'll look it up.",
       "",
       {{"get_weather", R"j({"location": "Paris, France", "days": 3})j", ""}}},
      {"glm_arg_tags",
       ToolFormat::kHermes,
       "<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n</"
       "tool_call>",
       "",
       "",
       {{"get_weather", R"j({"location": "Paris"})j", ""}}},
      {"hermes_bad_json_stays_text",
       ToolFormat::kHermes,
       "Hi <tool_call>{oops</tool_call> there",
       "Hi <tool_call>{oops</tool_call> there",
       "",
       {}},
      {"hermes_plain_angle_brackets",
       ToolFormat::kHermes,
       "Use a < b and <b>bold</b>; <tool is not a tag.",
       "Use a < b and <b>bold</b>; <tool is not a tag.",
       "",
       {}},
      {"hermes_unclosed_at_end",
       ToolFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}",
       "",
       "",
       {{"get_time", "{}", ""}}},
      {"llama3_json",
       ToolFormat::kLlama3,
       "{\"name\": \"get_weather\", \"parameters\": " + kWeatherArgs + "}",
       "",
       "",
       {{"get_weather", kWeatherArgs, ""}}},
      {"llama3_two_json_calls",
       ToolFormat::kLlama3,
       "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": [1, "
       "\"}\"]}}",
       "",
       "",
       {{"a", "{}", ""}, {"b", R"j({"x": [1, "}"]})j", ""}}},
      {"llama3_builtin_python_tag",
       ToolFormat::kLlama3,
       "<|python_tag|>brave_search.call(query=\"weather in Paris\", count=3)",
       "",
       "",
       {{"brave_search", R"j({"query": "weather in Paris", "count": 3})j", ""}}},
      {"llama3_python_tag_json",
       ToolFormat::kLlama3,
       "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Oslo\"}}",
       "",
       "",
       {{"get_weather", R"j({"location": "Oslo"})j", ""}}},
      {"llama3_code_interpreter",
       ToolFormat::kLlama3,
       "<|python_tag|>import math\nprint(math.pi)",
       "",
       "",
       {{"python", R"j({"code": "import math\nprint(math.pi)"})j", ""}}},
      {"llama3_plain_text",
       ToolFormat::kLlama3,
       "It is sunny in Paris today.",
       "It is sunny in Paris today.",
       "",
       {}},
      {"llama3_json_not_a_call",
       ToolFormat::kLlama3,
       "{\"answer\": 42}",
       "{\"answer\": 42}",
       "",
       {}},
      {"mistral_array",
       ToolFormat::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + kWeatherArgs +
           ", \"id\": \"abc123DEF\"}]",
       "",
       "",
       {{"get_weather", kWeatherArgs, "abc123DEF"}}},
      {"mistral_name_args",
       ToolFormat::kMistral,
       "Sure.[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
       "Sure.",
       "",
       {{"get_weather", R"j({"location": "Paris"})j", ""}, {"get_time", "{}", ""}}},
      {"mistral_think",
       ToolFormat::kMistral,
       "[THINK]Short plan.[/THINK]Here you go.",
       "Here you go.",
       "Short plan.",
       {}},
      {"functionary31_calls",
       ToolFormat::kFunctionaryV3_1,
       "Checking.<function=get_weather>{\"location\": "
       "\"Paris\"}</function><function=get_time>{}</function>",
       "Checking.",
       "",
       {{"get_weather", R"j({"location": "Paris"})j", ""}, {"get_time", "{}", ""}}},
      {"functionary31_python",
       ToolFormat::kFunctionaryV3_1,
       "<|python_tag|>print(1 + 1)",
       "",
       "",
       {{"python", R"j({"code": "print(1 + 1)"})j", ""}}},
      {"functionary32_content",
       ToolFormat::kFunctionaryV3_2,
       "all\nHello there! How can I help?",
       "Hello there! How can I help?",
       "",
       {}},
      {"functionary32_content_and_calls",
       ToolFormat::kFunctionaryV3_2,
       "all\nLet me check.>>>get_weather\n{\"location\": \"Paris\"}>>>get_time\n{}",
       "Let me check.",
       "",
       {{"get_weather", R"j({"location": "Paris"})j", ""}, {"get_time", "{}", ""}}},
      {"functionary32_python",
       ToolFormat::kFunctionaryV3_2,
       ">>>python\nprint('hi')",
       "",
       "",
       {{"python", R"j({"code": "print('hi')"})j", ""}}},
      {"command_r7b_action",
       ToolFormat::kCommandR,
       "<|START_THINKING|>I will look up the weather.<|END_THINKING|><|START_ACTION|>[\n    "
       "{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": " +
           kWeatherArgs + "}\n]<|END_ACTION|>",
       "",
       "I will look up the weather.",
       {{"get_weather", kWeatherArgs, "0"}}},
      {"command_r7b_response",
       ToolFormat::kCommandR,
       "<|START_RESPONSE|>It is sunny.<|END_RESPONSE|>",
       "It is sunny.",
       "",
       {}},
      {"command_r_plus_action",
       ToolFormat::kCommandR,
       "Action: ```json\n[\n    {\n        \"tool_name\": \"internet_search\",\n        "
       "\"parameters\": {\n            \"query\": \"weather Paris\"\n        }\n    }\n]\n```",
       "",
       "",
       {{"internet_search", R"j({"query": "weather Paris"})j", ""}}},
      {"command_r_action_word_in_text",
       ToolFormat::kCommandR,
       "Action: none needed, it is sunny.",
       "Action: none needed, it is sunny.",
       "",
       {}},
      {"deepseek_r1",
       ToolFormat::kDeepSeek,
       "<think>\nI need the weather tool.\n</think>\n\n" + b + cb + "function" + sep +
           "get_weather\n```json\n" + kWeatherArgs + "\n```" + ce + e,
       "",
       "I need the weather tool.",
       {{"get_weather", kWeatherArgs, ""}}},
      {"deepseek_v31_two_calls",
       ToolFormat::kDeepSeek,
       "Checking." + b + cb + "get_weather" + sep + "{\"location\": \"Paris\"}" + ce + cb +
           "get_time" + sep + "{}" + ce + e,
       "Checking.",
       "",
       {{"get_weather", R"j({"location": "Paris"})j", ""}, {"get_time", "{}", ""}}},
      {"generic_tool_call",
       ToolFormat::kGenericJson,
       "{\"tool_call\": {\"name\": \"get_weather\", \"arguments\": " + kWeatherArgs + "}}",
       "",
       "",
       {{"get_weather", kWeatherArgs, ""}}},
      {"generic_tool_calls",
       ToolFormat::kGenericJson,
       "{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": "
       "{\"x\": 1}}]}",
       "",
       "",
       {{"a", "{}", ""}, {"b", R"j({"x": 1})j", ""}}},
      {"generic_response",
       ToolFormat::kGenericJson,
       "{\"response\": \"Hello!\"}",
       "Hello!",
       "",
       {}},
      {"generic_plain", ToolFormat::kGenericJson, "Plain answer.", "Plain answer.", "", {}},
      {"none_with_think",
       ToolFormat::kNone,
       "<think>hmm, easy</think>\n\nParis.",
       "Paris.",
       "hmm, easy",
       {}},
      {"none_unicode", ToolFormat::kNone, "  Grüße 👋 — 日本語  ", "Grüße 👋 — 日本語", "", {}},
  };
}

void expect_calls(const std::vector<ToolCall>& got, const std::vector<ExpectedCall>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(json::parse(got[i].arguments), json::parse(want[i].arguments)) << got[i].arguments;
    EXPECT_EQ(got[i].id, want[i].id);
  }
}

class OutputParser : public ::testing::TestWithParam<Case> {};

TEST_P(OutputParser, WholeText) {
  const Case& c = GetParam();
  ParsedMessage m = parse_model_output(c.text, c.format, true, c.reasoning_started);
  EXPECT_EQ(m.content, c.content);
  EXPECT_EQ(m.reasoning, c.reasoning);
  expect_calls(m.tool_calls, c.calls);
}

// Feeds the text in chunks cut by `cut` and checks that deltas add up to the whole parse.
void check_stream(const Case& c, const std::vector<std::size_t>& cuts) {
  StreamingOutputParser parser(c.format, true, c.reasoning_started);
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  auto take = [&](const ParsedMessage& d) {
    content += d.content;
    reasoning += d.reasoning;
    calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    // Whatever was emitted so far must be a prefix of the final answer: no half tags.
    EXPECT_EQ(c.content.compare(0, content.size(), content), 0) << "content leaked: " << content;
    EXPECT_EQ(c.reasoning.compare(0, reasoning.size(), reasoning), 0)
        << "reasoning leaked: " << reasoning;
  };
  std::size_t prev = 0;
  for (std::size_t cut : cuts) {
    take(parser.push(std::string_view(c.text).substr(prev, cut - prev)));
    prev = cut;
  }
  take(parser.push(std::string_view(c.text).substr(prev)));
  take(parser.finish());
  EXPECT_EQ(content, c.content);
  EXPECT_EQ(reasoning, c.reasoning);
  expect_calls(calls, c.calls);
}

TEST_P(OutputParser, StreamedInFixedChunks) {
  const Case& c = GetParam();
  for (std::size_t size : {1, 2, 3, 5, 8, 13}) {
    SCOPED_TRACE("chunk size " + std::to_string(size));
    std::vector<std::size_t> cuts;
    for (std::size_t i = size; i < c.text.size(); i += size) cuts.push_back(i);
    check_stream(c, cuts);
  }
}

TEST_P(OutputParser, StreamedInRandomChunks) {
  const Case& c = GetParam();
  std::mt19937 rng(1234);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::size_t> cuts;
    for (std::size_t i = 0; i < c.text.size();) {
      i += 1 + rng() % 9;
      if (i < c.text.size()) cuts.push_back(i);
    }
    SCOPED_TRACE("round " + std::to_string(round));
    check_stream(c, cuts);
  }
}

TEST_P(OutputParser, CallsArriveBeforeTheEndWhenComplete) {
  // A streamed tool call is emitted once its closing tag (or JSON) is in, not only at finish().
  const Case& c = GetParam();
  if (c.calls.empty()) return;
  StreamingOutputParser parser(c.format, true, c.reasoning_started);
  std::size_t before_finish = 0;
  for (char ch : c.text) before_finish += parser.push(std::string_view(&ch, 1)).tool_calls.size();
  std::size_t at_finish = parser.finish().tool_calls.size();
  EXPECT_EQ(before_finish + at_finish, c.calls.size());
  // Only calls whose end is the end of the message (code after a python tag, a whole-message
  // JSON answer, an unclosed tag) have to wait for finish().
  bool ends_with_message = c.label.find("python") != std::string::npos ||
                           c.label.find("generic") != std::string::npos ||
                           c.label.find("unclosed") != std::string::npos ||
                           c.label.find("code_interpreter") != std::string::npos;
  if (!ends_with_message) {
    EXPECT_EQ(at_finish, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, OutputParser, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.label;
                         });

TEST(OutputParserOptions, ReasoningLeftInContentWhenNotExtracted) {
  ParsedMessage m = parse_model_output("<think>plan</think>Answer", ToolFormat::kNone, false);
  EXPECT_EQ(m.content, "<think>plan</think>Answer");
  EXPECT_EQ(m.reasoning, "");
}

TEST(OutputParserOptions, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

TEST(DetectToolFormat, RealTemplates) {
  const std::vector<std::pair<std::string, ToolFormat>> expected = {
      {"Qwen-Qwen2.5-7B-Instruct", ToolFormat::kHermes},
      {"Qwen-Qwen3-0.6B", ToolFormat::kHermes},
      {"Qwen3-Coder", ToolFormat::kHermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolFormat::kHermes},
      {"meta-llama-Llama-3.1-8B-Instruct", ToolFormat::kLlama3},
      {"meta-llama-Llama-3.2-3B-Instruct", ToolFormat::kLlama3},
      {"mistralai-Mistral-Nemo-Instruct-2407", ToolFormat::kMistral},
      {"Mistral-Small-3.2-24B-Instruct-2506", ToolFormat::kMistral},
      {"meetkai-functionary-medium-v3.1", ToolFormat::kFunctionaryV3_1},
      {"meetkai-functionary-medium-v3.2", ToolFormat::kFunctionaryV3_2},
      {"CohereForAI-c4ai-command-r-plus-tool_use", ToolFormat::kCommandR},
      {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", ToolFormat::kCommandR},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", ToolFormat::kDeepSeek},
      {"deepseek-ai-DeepSeek-V3.1", ToolFormat::kDeepSeek},
      {"google-gemma-2-2b-it", ToolFormat::kNone},
      {"microsoft-Phi-3.5-mini-instruct", ToolFormat::kNone},
      {"google-gemma-4-31B-it", ToolFormat::kGenericJson},
  };
  for (const auto& [name, format] : expected) {
    std::ifstream in(std::filesystem::path(test::testdata_dir()) / "chat-templates" /
                     (name + ".jinja"));
    ASSERT_TRUE(in) << name;
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(tool_format_name(detect_tool_format(ss.str())), std::string(tool_format_name(format)))
        << name;
  }
}

}  // namespace
}  // namespace hablar::chat
