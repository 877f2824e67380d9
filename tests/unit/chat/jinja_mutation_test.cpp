// Broken variants of the real templates (truncated, spans deleted, stray syntax inserted) must
// either render or fail with hablar::Error: no other exception, no crash, no hang.
#include "chat/chat.h"
#include "core/error.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace hablar::chat {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string mutate(const std::string& source, std::mt19937& rng) {
  static const char* const kInserts[] = {"{%",
                                         "%}",
                                         "{{",
                                         "}}",
                                         "{#",
                                         "(",
                                         ")",
                                         "[",
                                         "]",
                                         "'",
                                         "\"",
                                         "|",
                                         "-",
                                         "endif",
                                         "endfor",
                                         "{% else %}",
                                         "{% endmacro %}",
                                         ".",
                                         ",",
                                         "not ",
                                         " is ",
                                         "**",
                                         "\\"};
  std::string s = source;
  std::size_t at = s.empty() ? 0 : rng() % s.size();
  switch (rng() % 3) {
    case 0:
      s.resize(at);
      break;
    case 1:
      s.erase(at, 1 + rng() % 40);
      break;
    default:
      s.insert(at, kInserts[rng() % std::size(kInserts)]);
      break;
  }
  return s;
}

TEST(JinjaMutation, BrokenTemplatesFailCleanly) {
  fs::path dir = fs::path(test::testdata_dir()) / "chat-templates";
  ASSERT_TRUE(fs::is_directory(dir));
  nlohmann::ordered_json context = {
      {"messages",
       {{{"role", "system"}, {"content", "S"}},
        {{"role", "user"}, {"content", "U"}},
        {{"role", "assistant"},
         {"content", ""},
         {"tool_calls",
          {{{"id", "abcdefghi"},
            {"type", "function"},
            {"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "abcdefghi"}, {"content", "r"}}}},
      {"tools",
       {{{"type", "function"},
         {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}}},
      {"add_generation_prompt", true}};
  std::mt19937 rng(7);
  int rendered = 0, failed = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string source = read_file(entry.path());
    for (int i = 0; i < 60; ++i) {
      std::string broken = mutate(source, rng);
      try {
        ChatTemplate tmpl(broken);
        tmpl.render(context, RenderOptions{});
        ++rendered;
      } catch (const Error&) {
        ++failed;
      } catch (const std::exception& e) {
        ADD_FAILURE() << entry.path().filename() << " mutation " << i << ": non-hablar exception "
                      << e.what();
      }
    }
  }
  std::cout << "mutated templates: " << rendered << " rendered, " << failed
            << " refused with an Error\n";
  EXPECT_GT(failed, 0);
}

}  // namespace
}  // namespace hablar::chat
