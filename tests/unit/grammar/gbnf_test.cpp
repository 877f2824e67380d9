// GBNF parsing and the recognizer: accept/reject lists per grammar, the errors the parser
// must raise, and UTF-8 handling across bytes.
#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/recognizer.h"

namespace hablar::grammar {
namespace {

bool accepts(const Grammar& g, std::string_view text) {
  Recognizer rec(g);
  RecState s = rec.initial();
  if (!rec.advance_bytes(s, text)) return false;
  return Recognizer::can_end(s);
}

// A prefix the grammar can still complete.
bool viable(const Grammar& g, std::string_view text) {
  Recognizer rec(g);
  RecState s = rec.initial();
  return rec.advance_bytes(s, text);
}

void expect_error(std::string_view text, const std::string& fragment) {
  try {
    parse_gbnf(text);
    ADD_FAILURE() << "no error for: " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Gbnf, LiteralsAndAlternatives) {
  Grammar g = parse_gbnf("root ::= \"yes\" | \"no\"\n");
  EXPECT_TRUE(accepts(g, "yes"));
  EXPECT_TRUE(accepts(g, "no"));
  EXPECT_FALSE(accepts(g, "ye"));
  EXPECT_TRUE(viable(g, "ye"));
  EXPECT_FALSE(viable(g, "yess"));
  EXPECT_FALSE(accepts(g, ""));
}

TEST(Gbnf, Repetitions) {
  Grammar g = parse_gbnf(R"(root ::= "a"* "b"+ "c"? d{2} e{1,3} f{2,}
d ::= "d"
e ::= "e"
f ::= "f"
)");
  EXPECT_TRUE(accepts(g, "bddeff"));
  EXPECT_TRUE(accepts(g, "aaabbbcddeeefffff"));
  EXPECT_FALSE(accepts(g, "ddeff"));      // b+ needs one
  EXPECT_FALSE(accepts(g, "bdeff"));      // d{2}
  EXPECT_FALSE(accepts(g, "bddeeeeff"));  // e{1,3}
  EXPECT_FALSE(accepts(g, "bddef"));      // f{2,}
  EXPECT_FALSE(accepts(g, "bccddeff"));   // c?
}

TEST(Gbnf, RepeatedLiteralIsWhole) {
  Grammar g = parse_gbnf("root ::= \"ab\"{2} \"x\"*\n");
  EXPECT_TRUE(accepts(g, "abab"));
  EXPECT_TRUE(accepts(g, "ababxx"));
  EXPECT_FALSE(accepts(g, "abb"));
}

TEST(Gbnf, ClassesRangesNegation) {
  Grammar g = parse_gbnf("root ::= [a-cx] [^0-9\\n] [\\x41-\\x43]\n");
  EXPECT_TRUE(accepts(g, "a!A"));
  EXPECT_TRUE(accepts(g,
                      "x\xC3\xA9"
                      "C"));  // é as the negated class's character
  EXPECT_FALSE(accepts(g, "d!A"));
  EXPECT_FALSE(accepts(g, "a5A"));
  EXPECT_FALSE(accepts(g, "a\nA"));
  EXPECT_FALSE(accepts(g, "a!D"));
}

TEST(Gbnf, EscapesAndUnicode) {
  Grammar g = parse_gbnf(R"(root ::= "\t\"\\" "\u00e9" "\U0001F600" [\[\]] "ñ")");
  EXPECT_TRUE(accepts(g, "\t\"\\\xC3\xA9\xF0\x9F\x98\x80]\xC3\xB1"));
  EXPECT_FALSE(accepts(g, "\t\"\\e\xF0\x9F\x98\x80]\xC3\xB1"));
  // A partial character is viable only when some completion is allowed.
  EXPECT_TRUE(viable(g, "\t\"\\\xC3"));
  EXPECT_FALSE(viable(g, "\t\"\\\xC4"));
}

TEST(Gbnf, OverlongAndInvalidUtf8Refused) {
  Grammar g = parse_gbnf("root ::= \"{\" [^\"]*\n");
  EXPECT_FALSE(viable(g, "\xE0"));  // no 3-byte form of '{'
  EXPECT_FALSE(viable(g, "\xF0"));
  EXPECT_FALSE(viable(g, "\xC1\xBB"));           // overlong '{'
  EXPECT_FALSE(viable(g, "{\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(viable(g, "{\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_TRUE(viable(g, "{\xE0\xA0\x80"));
  EXPECT_FALSE(viable(g, "{\xE0\x80"));
}

TEST(Gbnf, AnyCharAndGroupsAcrossLines) {
  Grammar g = parse_gbnf(R"(# a comment
root ::= ( "a" |
  # a comment inside a group, across lines
  "b" )? item ("," item)*   # trailing
item ::= . .
)");
  EXPECT_TRUE(accepts(g, "xy"));
  EXPECT_TRUE(accepts(g, "axy,z\xE2\x82\xAC"));
  EXPECT_FALSE(accepts(g, "axy,"));
}

TEST(Gbnf, NewlineEndsRuleOutsideParens) {
  // The second line is a new rule, not a continuation: "x" alone is the root.
  Grammar g = parse_gbnf("root ::= \"x\"\nother ::= \"y\"\n");
  EXPECT_TRUE(accepts(g, "x"));
  EXPECT_FALSE(accepts(g, "xy"));
  // After '|' a newline is allowed.
  Grammar h = parse_gbnf("root ::= \"x\" |\n  \"y\"\n");
  EXPECT_TRUE(accepts(h, "y"));
}

TEST(Gbnf, EmptyAlternativeAndNullableRules) {
  Grammar g = parse_gbnf("root ::= a b \"!\"\na ::= \"a\" | \"\"\nb ::= \"b\"?\n");
  EXPECT_TRUE(accepts(g, "!"));
  EXPECT_TRUE(accepts(g, "ab!"));
  EXPECT_TRUE(accepts(g, "b!"));
  EXPECT_FALSE(accepts(g, "ba!"));
}

TEST(Gbnf, RightRecursionStaysShort) {
  Grammar g = parse_gbnf("root ::= \"[\" list \"]\"\nlist ::= \"x\" list | \"\"\n");
  Recognizer rec(g);
  RecState s = rec.initial();
  ASSERT_TRUE(rec.advance_bytes(s, "["));
  ASSERT_TRUE(rec.advance_bytes(s, "x"));
  const RecState after_one = s;
  ASSERT_TRUE(rec.advance_bytes(s, "xxxxxxxx"));
  EXPECT_EQ(s, after_one);  // the same hash-consed stacks: state repeats exactly
  ASSERT_TRUE(rec.advance_bytes(s, "]"));
  EXPECT_TRUE(Recognizer::must_end(s));
}

TEST(Gbnf, AmbiguityDoesNotExplode) {
  Grammar g = parse_gbnf("root ::= (\"a\"? ){30} \"a\"{30}\n");
  EXPECT_TRUE(accepts(g, std::string(45, 'a')));
  EXPECT_FALSE(accepts(g, std::string(61, 'a')));
}

TEST(Gbnf, NullableAlternativesDoNotMultiplyPaths) {
  // 2^40 ways to match the empty prefix; each (element, continuation) is expanded once.
  Grammar g = parse_gbnf("root ::= a{40} \"x\"\na ::= \"\" | \"\" | \"y\"\n");
  EXPECT_TRUE(accepts(g, "x"));
  EXPECT_TRUE(accepts(g, "yyyx"));
  EXPECT_FALSE(accepts(g, std::string(41, 'y') + "x"));
}

TEST(Gbnf, Errors) {
  expect_error("root ::= foo\n", "undefined rule 'foo'");
  expect_error("foo ::= \"x\"\n", "no 'root'");
  expect_error("root ::= \"x\n", "end of input");
  expect_error("root ::= [abc\n", "end of input");
  expect_error("root ::= \"\\q\"\n", "unknown escape");
  expect_error("root ::= root \"x\" | \"y\"\n", "left recursion");
  expect_error("root ::= a\na ::= b? root\nb ::= \"b\"\n", "left recursion");
  expect_error("root ::= *\n", "expecting something");
  expect_error("root ::= \"x\"{3,2}\n", "below its minimum");
  expect_error("root ::= (\"x\"\n", "expecting ')'");
  expect_error("root = \"x\"\n", "expecting ::=");
  expect_error("root ::= \"x\"{1000001}\n", "above 2000");
  expect_error("root ::= \"x\"{2001}\n", "above 2000");
  expect_error("root ::= (\"x\"{0,3}){700}\n", "repetition too large");
  expect_error("root ::= \"x\"**\n", "left recursion");  // (x*)* as in llama.cpp
  // A nullable loop body reached again through a reference that is followed by more of its
  // alternative would stack return positions without end: refused.
  expect_error("root ::= a \"y\"\na ::= ( \"x\"? )* a \"z\" | \"w\"\n", "left recursion");
}

TEST(Gbnf, NestedRepetitionOfANullableGroupIsTaken) {
  // ( [x]* )*: the loop can match nothing, but its self-reference ends its alternative, so
  // the recognizer meets the same position again and stops (llama.cpp takes it too).
  Grammar g = parse_gbnf("root ::= ( [x]* )*\n");
  EXPECT_TRUE(accepts(g, ""));
  EXPECT_TRUE(accepts(g, "x"));
  EXPECT_TRUE(accepts(g, "xxx"));
  EXPECT_FALSE(accepts(g, "y"));
  EXPECT_FALSE(accepts(g, "xy"));
  Grammar words = parse_gbnf("root ::= ( [a-z]* \" \"? )* \".\"\n");
  EXPECT_TRUE(accepts(words, "a b  cd."));
  EXPECT_TRUE(accepts(words, "."));
  EXPECT_FALSE(accepts(words, "a b"));
}

TEST(Gbnf, HelperRulesNeverClashWithLaterRules) {
  // Repetitions in rule a make helper rules; rules named like them come later in the text.
  Grammar g =
      parse_gbnf("root ::= a a-1 a-2\na ::= \"x\"* (\"y\")?\na-1 ::= \"1\"\na-2 ::= \"2\"\n");
  EXPECT_TRUE(accepts(g, "xxy12"));
  EXPECT_FALSE(accepts(g, "xxy1"));
}

TEST(Gbnf, LiteralQuoting) {
  const std::string text = "a\"b\\c\nd\x01";
  Grammar g = parse_gbnf("root ::= " + gbnf_literal(text) + "\n");
  EXPECT_TRUE(accepts(g, text));
}

}  // namespace
}  // namespace hablar::grammar
