// tool_call_opening: an assistant turn that starts with the opening and goes on as a model
// would parses back (parse_model_output) as exactly one call of the named function.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/chat.h"

namespace hablar::chat {
namespace {

struct OpeningCase {
  const char* label;
  ToolFormat format;
  bool named;                // the opening names get_weather
  std::string continuation;  // what the model writes after the opening
};

const std::string kArgs = R"({"location": "Paris"})";
const std::string kDeepSeekRest = "function<｜tool▁sep｜>get_weather\n```json\n" + kArgs +
                                  "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

std::vector<OpeningCase> cases() {
  return {
      {"hermes_named", ToolFormat::kHermes, true, kArgs + "}\n</tool_call>"},
      {"hermes_required", ToolFormat::kHermes, false,
       R"({"name": "get_weather", "arguments": )" + kArgs + "}\n</tool_call>"},
      {"llama3_named", ToolFormat::kLlama3, true, kArgs + "}"},
      {"llama3_required", ToolFormat::kLlama3, false,
       R"(get_weather", "parameters": )" + kArgs + "}"},
      {"mistral_named", ToolFormat::kMistral, true, kArgs + "}]"},
      {"mistral_required", ToolFormat::kMistral, false,
       R"([{"name": "get_weather", "arguments": )" + kArgs + "}]"},
      {"functionary31_named", ToolFormat::kFunctionaryV3_1, true, kArgs + "</function>"},
      {"functionary31_required", ToolFormat::kFunctionaryV3_1, false,
       "get_weather>" + kArgs + "</function>"},
      {"deepseek_named", ToolFormat::kDeepSeek, true, kDeepSeekRest},
      {"deepseek_required", ToolFormat::kDeepSeek, false, kDeepSeekRest},
      {"command_r_named", ToolFormat::kCommandR, true,
       "    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": " + kArgs +
           "\n    }\n]\n```"},
      {"command_r_required", ToolFormat::kCommandR, false,
       "    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": " + kArgs +
           "\n    }\n]\n```"},
      {"generic_named", ToolFormat::kGenericJson, true, kArgs + "}}"},
      {"generic_required", ToolFormat::kGenericJson, false,
       R"(get_weather", "arguments": )" + kArgs + "}}"},
  };
}

class ToolCallOpening : public ::testing::TestWithParam<OpeningCase> {};

TEST_P(ToolCallOpening, CompletedTurnParsesAsOneCall) {
  const OpeningCase& c = GetParam();
  const std::string opening = tool_call_opening(c.format, c.named ? "get_weather" : "");
  ASSERT_FALSE(opening.empty());
  const ParsedMessage p = parse_model_output(opening + c.continuation, c.format);
  ASSERT_EQ(p.tool_calls.size(), 1u) << opening + c.continuation;
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(p.tool_calls[0].arguments), nlohmann::json::parse(kArgs));
  EXPECT_EQ(p.content, "");
}

INSTANTIATE_TEST_SUITE_P(Formats, ToolCallOpening, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(ToolCallOpeningText, NoOpeningWhereTheFormatHasNone) {
  EXPECT_EQ(tool_call_opening(ToolFormat::kNone, "f"), "");
  EXPECT_EQ(tool_call_opening(ToolFormat::kFunctionaryV3_2, "f"), "");
}

TEST(GenericToolPrompt, DescribesTheToolsInTheSystemMessage) {
  const auto tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])");
  auto with_system = with_generic_tool_prompt(
      nlohmann::ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Hi"}])"),
      tools);
  ASSERT_EQ(with_system.size(), 2u);
  const std::string sys = with_system[0]["content"];
  EXPECT_EQ(sys.rfind("Be brief.", 0), 0u);
  EXPECT_NE(sys.find("\"name\":\"get_weather\""), std::string::npos) << sys;
  EXPECT_NE(sys.find("tool_call"), std::string::npos);
  EXPECT_NE(sys.find("response"), std::string::npos);
  auto without = with_generic_tool_prompt(
      nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])"), tools);
  ASSERT_EQ(without.size(), 2u);
  EXPECT_EQ(without[0]["role"], "system");
  EXPECT_EQ(without[1]["content"], "Hi");
}

TEST(ToolCallOpeningText, FunctionNamesAreJsonEscaped) {
  EXPECT_EQ(tool_call_opening(ToolFormat::kHermes, "a\"b"),
            "<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": ");
}

}  // namespace
}  // namespace hablar::chat
