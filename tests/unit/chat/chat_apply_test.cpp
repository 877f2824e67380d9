// apply_chat_template and ChatML: the variables a template sees, the fallback template, and
// concurrent rendering of one parsed template.
#include "chat/chat.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <thread>

namespace hablar::chat {
namespace {

using nlohmann::json;

ChatInput two_turns() {
  ChatInput in;
  in.messages = json::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  return in;
}

TEST(ApplyChatTemplate, ChatmlFallback) {
  ChatTemplate chatml(chatml_template_source());
  ChatInput in = two_turns();
  EXPECT_EQ(apply_chat_template(chatml, in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  in.add_generation_prompt = false;
  EXPECT_EQ(apply_chat_template(chatml, in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  in.messages[1]["content"] = json::array({{{"type", "text"}, {"text", "A"}},
                                           {{"type", "image_url"}},
                                           {{"type", "text"}, {"text", "B"}}});
  EXPECT_EQ(apply_chat_template(chatml, in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAB<|im_end|>\n");
}

TEST(ApplyChatTemplate, VariablesTheTemplateSees) {
  ChatTemplate t(
      "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is defined }}|"
      "{{ enable_thinking }}|{{ messages | length }}");
  ChatInput in = two_turns();
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.extra = {{"enable_thinking", false}};
  EXPECT_EQ(apply_chat_template(t, in), "<s>|</s>|True|False|False|2");
  in.tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(apply_chat_template(t, in), "<s>|</s>|True|True|False|2");
}

TEST(ApplyChatTemplate, RejectsMalformedInput) {
  ChatTemplate t("{{ messages }}");
  ChatInput in;
  in.messages = json::object();
  EXPECT_THROW(apply_chat_template(t, in), Error);
  in.messages = json::array();
  in.tools = "not a list";
  EXPECT_THROW(apply_chat_template(t, in), Error);
  EXPECT_THROW(t.render(json::array()), Error);
}

TEST(ApplyChatTemplate, OrderedContextKeepsKeyOrder) {
  ChatTemplate t("{% for k in d %}{{ k }}{% endfor %}|{{ d | tojson }}");
  nlohmann::ordered_json ordered = {{"d", {{"z", 1}, {"a", 2}}}};
  EXPECT_EQ(t.render(ordered, RenderOptions{}), R"(za|{"z": 1, "a": 2})");
  json sorted = {{"d", {{"z", 1}, {"a", 2}}}};  // nlohmann::json sorts keys
  EXPECT_EQ(t.render(sorted), R"(az|{"a": 2, "z": 1})");
}

TEST(ApplyChatTemplate, StrftimeNowUsesTheGivenTime) {
  setenv("TZ", "UTC", 1);
  tzset();
  ChatTemplate t("{{ strftime_now('%Y-%m-%d %H:%M') }}");
  RenderOptions options;
  options.now = 0;
  EXPECT_EQ(t.render(json::object(), options), "1970-01-01 00:00");
  options.now = 1721989800;
  EXPECT_EQ(t.render(json::object(), options), "2024-07-26 10:30");
}

TEST(ApplyChatTemplate, ConcurrentRendersOfOneTemplateAgree) {
  ChatTemplate t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "[{{ m.role | upper }}:{{ m.content }}:{{ ns.n }}]{% endfor %}");
  ChatInput in = two_turns();
  const std::string expected = apply_chat_template(t, in);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 500; ++i) mismatches[k] += apply_chat_template(t, in) != expected;
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) EXPECT_EQ(mismatches[k], 0) << "thread " << k;
  EXPECT_EQ(expected, "[SYSTEM:Be brief.:1][USER:Hi:2]");
}

// Templates that render no system message: Gemma 2's refuses one (raise_exception), a
// template may also drop it silently; ChatML and Llama 3's render it. The fold puts its text
// in front of the next message's, as llama-server does.
TEST(ApplyChatTemplate, SystemRoleProbeAndFold) {
  ChatInput probe;
  EXPECT_TRUE(template_renders_system_role(ChatTemplate(chatml_template_source()), probe));
  const ChatTemplate refuses(
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
      "}}{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}");
  EXPECT_FALSE(template_renders_system_role(refuses, probe));
  const ChatTemplate drops(
      "{% for m in messages if m['role'] != 'system' %}<{{ m['role'] }}>{{ m['content'] }}"
      "{% endfor %}");
  EXPECT_FALSE(template_renders_system_role(drops, probe));

  const json folded = fold_system_into_next_message(two_turns().messages);
  ASSERT_EQ(folded.size(), 1u);
  EXPECT_EQ(folded[0]["role"], "user");
  EXPECT_EQ(folded[0]["content"], "Be brief.\nHi");
  ChatInput in;
  in.messages = folded;
  EXPECT_EQ(apply_chat_template(refuses, in), "<user>Be brief.\nHi");
  // Alone, it is dropped; a conversation not opened by a system message is left as it is.
  EXPECT_TRUE(fold_system_into_next_message(json::array({two_turns().messages[0]})).empty());
  const json plain = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(fold_system_into_next_message(plain), plain);
}

TEST(ApplyChatTemplate, DeveloperRoleBecomesSystemUnlessTheTemplateKnowsIt) {
  const json msgs = json::array(
      {{{"role", "developer"}, {"content", "Rules"}}, {{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(developer_as_system(msgs)[0]["role"], "system");
  EXPECT_EQ(developer_as_system(msgs)[1]["role"], "user");
  EXPECT_FALSE(template_knows_developer_role(ChatTemplate(chatml_template_source())));
  EXPECT_TRUE(template_knows_developer_role(
      ChatTemplate("{{ '<|start|>developer<|message|>' }}{{ '<|channel|>final' }}")));
}

}  // namespace
}  // namespace hablar::chat
