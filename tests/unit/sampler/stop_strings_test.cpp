#include "engine/stop_strings.h"

#include <gtest/gtest.h>

namespace hablar::engine {
namespace {

TEST(StopStrings, StopSpanningPiecesIsHeldBackThenCut) {
  StopStringMatcher m({"END"});
  auto r = m.push("foo E");
  EXPECT_EQ(r.text, "foo ");
  EXPECT_FALSE(r.stopped);
  r = m.push("N");
  EXPECT_EQ(r.text, "");
  r = m.push("D bar");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "END");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.push("more").text, "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, FalseStartIsReleased) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.push("E").text, "");
  EXPECT_EQ(m.push("Nx").text, "ENx");
  EXPECT_EQ(m.push("EN").text, "");
  EXPECT_EQ(m.flush(), "EN");
}

TEST(StopStrings, EarliestOfSeveralWinsAndTextBeforeIsKept) {
  StopStringMatcher m({"\n\n", "bc"});
  const auto r = m.push("abc\n\nd");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "bc");
  EXPECT_EQ(r.text, "a");
}

TEST(StopStrings, NoStopsPassesEverythingThrough) {
  StopStringMatcher m({"", ""});
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.push("hello").text, "hello");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, MultiByteStopAcrossPieces) {
  StopStringMatcher m({"日本"});
  EXPECT_EQ(m.push("x\xe6\x97").text, "x");
  const auto r = m.push("\xa5\xe6\x9c\xac!");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

}  // namespace
}  // namespace hablar::engine
