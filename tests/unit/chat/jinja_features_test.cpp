// One small template per interpreter feature (whitespace control, operators, scoping, macros,
// filters, tests, methods, undefined semantics), 1500 random expressions and 600 random
// templates of nested blocks with random whitespace control and 300 with macros, call blocks
// and namespaces, each checked
// against Python jinja2's output recorded in tests/golden/chat/features.json by
// tools/chat_golden.py.
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

// Parsed once per process: test discovery names every case, and the file is large.
const ordered_json& load_cases() {
  static const ordered_json all = [] {
    std::ifstream in(std::filesystem::path(test::source_dir()) / "tests/golden/chat/features.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return ordered_json::parse(ss.str());
  }();
  return all;
}

class JinjaFeature : public ::testing::TestWithParam<std::size_t> {
 protected:
  static const ordered_json& cases() { return load_cases(); }
};

// Renders one case; returns "" when it agrees with jinja2, else what differs.
std::string check_case(const ordered_json& c) {
  RenderOptions options;
  options.now = 1721989800;
  std::string got;
  std::string error;
  try {
    ChatTemplate tmpl(c["template"].get<std::string>());
    got = tmpl.render(c["context"], options);
  } catch (const Error& e) {
    error = e.what();
  }
  if (c.contains("output")) {
    if (!error.empty()) return "raised " + error + ", jinja2 rendered " + c["output"].dump();
    if (got != c["output"].get<std::string>())
      return "rendered " + ordered_json(got).dump() + ", jinja2 rendered " + c["output"].dump();
    return "";
  }
  std::string want = c["error"];
  if (error.empty()) return "rendered " + ordered_json(got).dump() + ", jinja2 raised " + want;
  if (error.rfind("template:", 0) != 0) return "error without position: " + error;
  // Random expressions: Python's exact TypeError wording is not required, only the refusal;
  // undefined-value errors must still match.
  std::string kind = c.value("error_kind", "");
  if (!kind.empty() && kind != "UndefinedError") return "";
  if (error.size() < want.size() ||
      error.compare(error.size() - want.size(), want.size(), want) != 0)
    return "raised " + error + ", jinja2 raised " + want;
  return "";
}

void use_utc() {
  setenv("TZ", "UTC", 1);
  tzset();
}

TEST_P(JinjaFeature, MatchesPythonJinja2) {
  use_utc();
  const ordered_json& c = cases().at(GetParam());
  EXPECT_EQ(check_case(c), "") << c["name"].get<std::string>() << ": "
                               << c["template"].get<std::string>();
}

TEST(JinjaRandomExpressions, MatchPythonJinja2) {
  use_utc();
  int total = 0, passed = 0;
  for (const auto& c : load_cases()) {
    if (c["name"].get<std::string>().rfind("random_", 0) != 0) continue;
    ++total;
    std::string diff = check_case(c);
    if (diff.empty())
      ++passed;
    else
      ADD_FAILURE() << c["name"].get<std::string>() << ": " << c["template"].get<std::string>()
                    << "\n  " << diff;
  }
  std::cout << "random expressions and templates: " << passed << " / " << total
            << " agree with Python jinja2\n";
  EXPECT_GE(total, 1000);
}

// Named cases only: the random ones run as one test above.
std::vector<std::size_t> named_case_indices() {
  std::vector<std::size_t> out;
  const ordered_json& all = load_cases();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]["name"].get<std::string>().rfind("random_", 0) != 0) out.push_back(i);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Features, JinjaFeature, ::testing::ValuesIn(named_case_indices()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return load_cases().at(info.param)["name"].get<std::string>();
                         });

}  // namespace
}  // namespace hablar::chat
