// Request data from outside: the JSON depth limit, short error excerpts, and the chat
// message checks on hostile shapes (deep, huge, wrong-typed), without a model.
#include <gtest/gtest.h>

#include "core/json_depth.h"
#include "server/api_error.h"
#include "server/openai_chat.h"
#include "server/request_fields.h"

namespace hablar::server {
namespace {

std::string deep(size_t n) {
  return std::string(n, '[') + std::string(n, ']');
}

TEST(RequestLimits, NestingDepthIsMeasuredWithoutParsing) {
  EXPECT_EQ(json_nesting_depth("1"), 0u);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})"), 4u);
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[\"[["})"), 1u);  // brackets inside strings
  EXPECT_EQ(json_nesting_depth(deep(100000), 64), 65u);       // stops counting early
}

TEST(RequestLimits, DeepBodiesAre400NamingTheLimit) {
  const std::string body = R"({"max_tokens": )" + deep(60000) + "}";
  try {
    parse_body_object(body);
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(parse_body_object(R"({"a": )" + deep(63) + "}"));
  EXPECT_THROW(parse_body_object(R"({"a": )" + deep(64) + "}"), ApiError);
  EXPECT_THROW(
      chat_parts(R"({"messages": [{"role": "user", "content": "x", "e": )" + deep(5000) + "}]}"),
      ApiError);
}

TEST(RequestLimits, NumbersPastDoubleRangeAre400) {
  // Found by fuzz/chat_request_fuzz: nlohmann throws out_of_range (not parse_error) here.
  try {
    parse_body_object(R"({"max_tokens": 44444e44444})");
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
  }
}

TEST(RequestLimits, HugeIntegralFloatsAreRangeErrors) {
  // Found by fuzz/chat_request_fuzz (UBSan): a double past int64's range was cast first.
  const auto body = parse_body_object(R"({"a": 4.4e86, "b": 3.0, "c": 9.3e18, "d": 1.5})");
  EXPECT_THROW(opt_integer(body, "a", 1, INT64_MAX), ApiError);
  EXPECT_EQ(opt_integer(body, "b", 1, 10), 3);
  EXPECT_THROW(opt_integer(body, "c", INT64_MIN, INT64_MAX), ApiError);
  EXPECT_THROW(opt_integer(body, "d", 1, 10), ApiError);
}

TEST(RequestLimits, ErrorsQuoteShortExcerpts) {
  const nlohmann::json body = {{"max_tokens", std::string(5 << 20, 'x')},
                               {"temperature", nlohmann::json::array({1, 2, 3})}};
  try {
    opt_integer(body, "max_tokens", 1, 10);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u) << e.what();
    EXPECT_NE(std::string(e.what()).find("xxx\"..."), std::string::npos);
  }
  try {
    opt_number(body, "temperature", 0, 2);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("a list of 3 items"), std::string::npos) << e.what();
  }
  // Cut at a character boundary, escaped, valid JSON text.
  const std::string s = text_excerpt(std::string(47, 'a') + "\xc3\xa9\"tail", 48);
  EXPECT_EQ(s, "\"" + std::string(47, 'a') + "\"...");
  EXPECT_EQ(text_excerpt("a\"b\n", 48), "\"a\\\"b\\n\"");
}

TEST(RequestLimits, HostileMessagesAre400) {
  const char* bodies[] = {
      R"({"messages": [{"role": "user", "content": {"a": 1}}]})",
      R"({"messages": [{"role": ["user"], "content": "x"}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
      R"({"messages": [{"role": "assistant", "tool_calls": [5]}]})",
      R"({"messages": "x"})",
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": 1}]})",
  };
  for (const char* b : bodies) EXPECT_THROW(chat_parts(b), ApiError) << b;
  // Tool-call arguments are client JSON text too: the same depth limit.
  const std::string args = nlohmann::json(deep(1000)).dump();
  EXPECT_THROW(chat_parts(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": )"
                          R"({"name": "f", "arguments": )" +
                          args + "}}]}]}"),
               ApiError);
}

}  // namespace
}  // namespace hablar::server
