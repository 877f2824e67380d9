#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "chat/chat.h"

namespace hablar::chat {
namespace {

ChatInput conversation() {
  ChatInput in;
  in.messages = nlohmann::ordered_json::array({{{"role", "system"}, {"content", "SYS-TEXT"}},
                                               {{"role", "user"}, {"content", "USER-ONE"}},
                                               {{"role", "assistant"}, {"content", "BOT-ONE"}},
                                               {{"role", "user"}, {"content", "USER-TWO"}}});
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  return in;
}

// Every built-in format renders a conversation with each message once, in order.
TEST(BuiltinTemplates, EveryNameRendersEveryMessageInOrder) {
  std::stringstream names(builtin_chat_template_names());
  int count = 0;
  for (std::string name; std::getline(names, name, ',');) {
    if (name.front() == ' ') name.erase(0, 1);
    const std::string* source = builtin_chat_template(name);
    ASSERT_NE(source, nullptr) << name;
    const std::string out = apply_chat_template(ChatTemplate(*source), conversation());
    size_t at = 0;
    for (const char* part : {"SYS-TEXT", "USER-ONE", "BOT-ONE", "USER-TWO"}) {
      const size_t found = out.find(part, at);
      ASSERT_NE(found, std::string::npos) << name << " lacks " << part << ":\n" << out;
      at = found;
    }
    ++count;
  }
  EXPECT_GE(count, 23);
  EXPECT_EQ(builtin_chat_template("no-such-format"), nullptr);
}

// --chat-template as llama-server reads it: a name, Jinja source, or text that renders as
// itself; a single unknown word is a misspelt name.
TEST(BuiltinTemplates, FlagTextIsANameOrATemplate) {
  EXPECT_EQ(chat_template_from_flag("chatml"), *builtin_chat_template("chatml"));
  EXPECT_EQ(chat_template_from_flag("{{ messages[0].content }}"), "{{ messages[0].content }}");
  EXPECT_EQ(chat_template_from_flag("{% if true %}x{% endif %}"), "{% if true %}x{% endif %}");
  EXPECT_EQ(chat_template_from_flag("This is not a chat template, it is"),
            "This is not a chat template, it is");
  EXPECT_EQ(chat_template_from_flag("chatml2"), std::nullopt);
  EXPECT_EQ(chat_template_from_flag("llama-3"), std::nullopt);
  ChatInput in;
  in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(apply_chat_template(ChatTemplate(*chat_template_from_flag("plain text")), in),
            "plain text");
}

TEST(BuiltinTemplates, Llama3AndChatmlExactly) {
  ChatInput in;
  in.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(apply_chat_template(ChatTemplate(*builtin_chat_template("chatml")), in),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(ChatTemplate(*builtin_chat_template("llama3")), in),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(apply_chat_template(ChatTemplate(*builtin_chat_template("command-r")), in),
            "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
}

// The formats whose details vary within a family: how a system message is written, where a
// turn's [INST] goes, which messages are trimmed (llama.cpp's built-in formats by these names).
TEST(BuiltinTemplates, FamilyVariantsExactly) {
  ChatInput in;
  in.messages = nlohmann::ordered_json::array({{{"role", "system"}, {"content", "Be brief"}},
                                               {{"role", "user"}, {"content", "Hi"}},
                                               {{"role", "assistant"}, {"content", "  Yes  "}},
                                               {{"role", "user"}, {"content", "More"}}});
  in.eos_token = "</s>";
  auto render = [&](const char* name) {
    return apply_chat_template(ChatTemplate(*builtin_chat_template(name)), in);
  };
  EXPECT_EQ(render("llama2"), "[INST] Be brief\nHi [/INST]  Yes  </s>[INST] More [/INST]");
  EXPECT_EQ(render("llama2-sys"),
            "[INST] <<SYS>>\nBe brief\n<</SYS>>\n\nHi [/INST]  Yes  </s>[INST] More [/INST]");
  EXPECT_EQ(render("llama2-sys-bos"),
            "[INST] <<SYS>>\nBe brief\n<</SYS>>\n\nHi [/INST]  Yes  </s><s>[INST] More [/INST]");
  EXPECT_EQ(render("llama2-sys-strip"),
            "[INST] <<SYS>>\nBe brief\n<</SYS>>\n\nHi [/INST]Yes</s>[INST] More [/INST]");
  EXPECT_EQ(render("mistral-v1"), " [INST] Be brief\n\nHi [/INST]   Yes  </s> [INST] More [/INST]");
  EXPECT_EQ(render("mistral-v3"), "[INST] Be brief\n\nHi[/INST] Yes</s>[INST] More[/INST]");
  EXPECT_EQ(render("mistral-v3-tekken"), "[INST]Be brief\n\nHi[/INST]  Yes  </s>[INST]More[/INST]");
  in.add_generation_prompt = true;
  EXPECT_EQ(
      render("deepseek"),
      "Be brief### Instruction:\nHi\n### Response:\n  Yes  \n<|EOT|>\n### Instruction:\nMore\n"
      "### Response:\n");
}

}  // namespace
}  // namespace hablar::chat
