// Hostile and broken templates end in a clear hablar::Error naming the position, never a hang,
// a crash or unbounded memory: syntax errors, endless macro recursion, huge ranges, deep nesting,
// exponential fan-out and output bombs.
#include "chat/chat.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace hablar::chat {
namespace {

// Renders `source` and returns the error message (fails the test when none is raised).
std::string render_error(const std::string& source,
                         const nlohmann::json& context = nlohmann::json::object()) {
  try {
    ChatTemplate tmpl(source);
    std::string out = tmpl.render(context);
    ADD_FAILURE() << "rendered " << out.size() << " bytes without an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(JinjaLimits, SyntaxErrorsCarryLineAndColumn) {
  EXPECT_EQ(render_error("Hello\n  {{ name + }}"),
            "template:2:13: unexpected end of print statement");
  EXPECT_EQ(render_error("{% if x %}never closed"),
            "template:1:23: unexpected end of template, expected 'elif' or 'else' or 'endif'");
  EXPECT_EQ(render_error("a\nb {% for x in %}{% endfor %}"),
            "template:2:15: unexpected end of statement block");
  EXPECT_EQ(render_error("{% frobnicate %}"),
            "template:1:4: Encountered unknown tag 'frobnicate'.");
  EXPECT_EQ(render_error("{{ 'unterminated }}"), "template:1:4: unexpected end of string");
  EXPECT_EQ(render_error("{% break %}"), "template:1:4: 'break' outside of a loop");
  EXPECT_EQ(render_error("{{ x | nosuchfilter }}"),
            "template:1:8: No filter named 'nosuchfilter'.");
  EXPECT_EQ(render_error("{% for i in [] %}{{ i is nosuchtest }}{% endfor %}"),
            "template:1:23: No test named 'nosuchtest'.");
  // Inside an if statement or a conditional expression an unknown name is an error only when
  // it runs, as jinja2 (3.x) compiles it.
  EXPECT_EQ(render_error("{% if x | nosuchfilter %}{% endif %}"),
            "template:1:11: No filter named 'nosuchfilter' found.");
  EXPECT_EQ(render_error("{{ 1 if false else (x | nosuchfilter) }}"),
            "template:1:25: No filter named 'nosuchfilter' found.");
  EXPECT_EQ(render_error("{# open comment"),
            "template:1:1: unexpected end of template: unclosed comment");
}

TEST(JinjaLimits, RuntimeErrorsCarryPosition) {
  EXPECT_EQ(render_error("line one\n{{ raise_exception('nope') }}"), "template:2:4: nope");
  EXPECT_EQ(render_error("{% for m in messages %}\n  {{ m.content.strip() }}{% endfor %}",
                         {{"messages", {{{"role", "user"}}}}}),
            "template:2:15: 'dict object' has no attribute 'content'");
}

TEST(JinjaLimits, EndlessMacroRecursionStops) {
  std::string message = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(message.find("maximum recursion depth exceeded"), std::string::npos) << message;
}

TEST(JinjaLimits, ExponentialMacroFanOutStops) {
  std::string message = render_error(
      "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) "
      "}}");
  EXPECT_NE(message.find("loop iterations and macro calls"), std::string::npos) << message;
}

TEST(JinjaLimits, HugeRangesAndRepetitionsAreRefused) {
  std::string message = render_error("{% for i in range(10**9) %}{{ i }}{% endfor %}");
  EXPECT_NE(message.find("exceeds the limit"), std::string::npos) << message;
  message = render_error("{{ 'x' * 10**9 }}");
  EXPECT_NE(message.find("exceeds the limit"), std::string::npos) << message;
  message = render_error("{{ [0] * 10**9 }}");
  EXPECT_NE(message.find("exceeds the limit"), std::string::npos) << message;
  message = render_error("{{ 10 ** 100 }}");
  EXPECT_NE(message.find("integer overflow"), std::string::npos) << message;
}

TEST(JinjaLimits, NestedLoopsHitTheIterationBudget) {
  std::string message = render_error(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(message.find("loop iterations"), std::string::npos) << message;
}

TEST(JinjaLimits, OutputBombIsRefused) {
  std::string message =
      render_error("{% set s = 'x' * 5000000 %}{% for i in range(100) %}{{ s }}{% endfor %}");
  EXPECT_NE(message.find("rendered output exceeds"), std::string::npos) << message;
}

TEST(JinjaLimits, DeepNestingIsASyntaxErrorNotAStackOverflow) {
  const int depth = 100000;
  std::string parens = "{{ " + std::string(depth, '(') + "1" + std::string(depth, ')') + " }}";
  EXPECT_NE(render_error(parens).find("nested too deeply"), std::string::npos);
  std::string lists = "{{ " + std::string(depth, '[') + std::string(depth, ']') + " }}";
  EXPECT_NE(render_error(lists).find("nested too deeply"), std::string::npos);
  std::string nots = "{{ ";
  for (int i = 0; i < depth; ++i) nots += "not ";
  EXPECT_NE(render_error(nots + "x }}").find("nested too deeply"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < depth; ++i) ifs += "{% if true %}";
  EXPECT_NE(render_error(ifs).find("blocks nested too deeply"), std::string::npos);
  std::string minus = "{{ " + std::string(depth, '-') + "1 }}";
  EXPECT_NE(render_error(minus).find("nested too deeply"), std::string::npos);
}

TEST(JinjaLimits, ModerateNestingStillRenders) {
  std::string parens = "{{ " + std::string(100, '(') + "1" + std::string(100, ')') + " }}";
  EXPECT_EQ(ChatTemplate(parens).render(nlohmann::json::object()), "1");
  std::string ifs, ends;
  for (int i = 0; i < 100; ++i) {
    ifs += "{% if true %}";
    ends += "{% endif %}";
  }
  EXPECT_EQ(ChatTemplate(ifs + "deep" + ends).render(nlohmann::json::object()), "deep");
}

TEST(JinjaLimits, LimitsAreConfigurable) {
  RenderOptions options;
  options.limits.max_output_bytes = 10;
  ChatTemplate tmpl("{{ 'x' * 11 }}");
  EXPECT_THROW(tmpl.render(nlohmann::json::object(), options), Error);
  options.limits.max_output_bytes = 11;
  EXPECT_EQ(tmpl.render(nlohmann::json::object(), options), "xxxxxxxxxxx");
}

}  // namespace
}  // namespace hablar::chat
