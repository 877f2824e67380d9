// One small template per interpreter feature (whitespace control, operators, scoping, macros,
// filters, tests, methods, undefined semantics), each checked against Python jinja2's output
// recorded in tests/golden/chat/features.json by tools/chat_golden.py.
#include "chat/chat.h"
#include "core/error.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace hablar::chat {
namespace {

using nlohmann::ordered_json;

ordered_json load_cases() {
  std::ifstream in(std::filesystem::path(test::source_dir()) / "tests/golden/chat/features.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ordered_json::parse(ss.str());
}

class JinjaFeature : public ::testing::TestWithParam<std::size_t> {
 protected:
  static const ordered_json& cases() {
    static const ordered_json all = load_cases();
    return all;
  }
};

TEST_P(JinjaFeature, MatchesPythonJinja2) {
  setenv("TZ", "UTC", 1);
  tzset();
  const ordered_json& c = cases().at(GetParam());
  SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
  RenderOptions options;
  options.now = 1721989800;
  if (c.contains("output")) {
    ChatTemplate tmpl(c["template"].get<std::string>());
    EXPECT_EQ(tmpl.render(c["context"], options), c["output"].get<std::string>());
  } else {
    std::string want = c["error"];
    try {
      ChatTemplate tmpl(c["template"].get<std::string>());
      std::string got = tmpl.render(c["context"], options);
      ADD_FAILURE() << "rendered " << got << ", jinja2 raised " << want;
    } catch (const Error& e) {
      std::string message = e.what();
      EXPECT_EQ(message.rfind("template:", 0), 0u) << message;
      ASSERT_GE(message.size(), want.size()) << message;
      EXPECT_EQ(message.substr(message.size() - want.size()), want) << message;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Features, JinjaFeature,
                         ::testing::Range<std::size_t>(0, load_cases().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return load_cases().at(info.param)["name"].get<std::string>();
                         });

}  // namespace
}  // namespace hablar::chat
