// The acceptance matrix: every real chat template in <testdata>/chat-templates/ rendered with
// every conversation of tests/golden/chat/conversations.json must match Python jinja2's output
// byte for byte (golden files written by tools/chat_golden.py), or raise the same message.
#include "chat/chat.h"
#include "core/error.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace hablar::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

constexpr std::time_t kFixedNow = 1721989800;  // tools/chat_golden.py pins the same instant

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path golden_dir() {
  return fs::path(test::source_dir()) / "tests" / "golden" / "chat";
}

// The context the golden script passes to jinja2 for one conversation.
ordered_json context_of(const ordered_json& conversation) {
  ordered_json context;
  context["messages"] = conversation["messages"];
  context["add_generation_prompt"] = conversation.value("add_generation_prompt", true);
  context["bos_token"] = conversation.value("bos_token", "<|bos|>");
  context["eos_token"] = conversation.value("eos_token", "<|eos|>");
  if (conversation.contains("tools") && !conversation["tools"].is_null())
    context["tools"] = conversation["tools"];
  if (conversation.contains("extra"))
    for (auto it = conversation["extra"].begin(); it != conversation["extra"].end(); ++it)
      context[it.key()] = it.value();
  return context;
}

std::string first_difference(const std::string& got, const std::string& want) {
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::size_t from = i > 60 ? i - 60 : 0;
  return "at byte " + std::to_string(i) +
         "\n  got:  " + ordered_json(got.substr(from, 140)).dump() +
         "\n  want: " + ordered_json(want.substr(from, 140)).dump();
}

TEST(ChatTemplateMatrix, MatchesPythonJinja2) {
  setenv("TZ", "UTC", 1);
  tzset();
  fs::path template_dir = fs::path(test::testdata_dir()) / "chat-templates";
  ASSERT_TRUE(fs::is_directory(template_dir)) << template_dir;
  ordered_json conversations = ordered_json::parse(read_file(golden_dir() / "conversations.json"));
  ASSERT_GE(conversations.size(), 12u);

  std::vector<fs::path> templates;
  for (const auto& entry : fs::directory_iterator(template_dir))
    if (entry.path().extension() == ".jinja") templates.push_back(entry.path());
  std::sort(templates.begin(), templates.end());
  ASSERT_EQ(templates.size(), 34u);

  RenderOptions options;
  options.now = kFixedNow;
  int total = 0, passed = 0;
  std::vector<std::string> failures;
  for (const auto& path : templates) {
    std::string stem = path.stem().string();
    ordered_json expected =
        ordered_json::parse(read_file(golden_dir() / "expected" / (stem + ".json")));
    std::unique_ptr<ChatTemplate> tmpl;
    try {
      tmpl = std::make_unique<ChatTemplate>(read_file(path));
    } catch (const Error& e) {
      failures.push_back(stem + ": parse error: " + e.what());
      total += static_cast<int>(conversations.size());
      continue;
    }
    for (const auto& conversation : conversations) {
      std::string name = conversation["name"];
      const ordered_json& want = expected.at(name);
      ++total;
      std::string label = stem + " x " + name;
      try {
        std::string got = tmpl->render(context_of(conversation), options);
        if (!want.contains("output")) {
          failures.push_back(label +
                             ": rendered, but jinja2 raised: " + want["error"].get<std::string>());
        } else if (got != want["output"].get<std::string>()) {
          failures.push_back(label + ": differs " + first_difference(got, want["output"]));
        } else {
          ++passed;
        }
      } catch (const Error& e) {
        std::string message = e.what();
        if (!want.contains("error")) {
          failures.push_back(label + ": raised " + message);
        } else {
          std::string python = want["error"];
          bool same = message.size() >= python.size() &&
                      message.compare(message.size() - python.size(), python.size(), python) == 0 &&
                      message.rfind("template:", 0) == 0;
          if (same)
            ++passed;
          else
            failures.push_back(label + ": raised '" + message + "', jinja2 raised '" + python +
                               "'");
        }
      }
    }
  }
  for (const auto& f : failures) std::cout << "FAIL " << f << "\n";
  std::cout << "chat template matrix: " << passed << " / " << total << " match Python jinja2 ("
            << templates.size() << " templates x " << conversations.size() << " conversations)\n";
  EXPECT_EQ(passed, total);
}

}  // namespace
}  // namespace hablar::chat
