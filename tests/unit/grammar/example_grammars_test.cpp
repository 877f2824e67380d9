// GBNF example grammars of our own in the style of llama.cpp's grammars/ folder (arithmetic,
// JSON, lists, chess moves, a C-like language), each with accept and reject lists checked by
// hand against the GBNF rules. A string is accepted when the whole of it is a sentence of
// the grammar. The same kinds of grammars checked against llama.cpp's own grammar sampler:
// gbnf_parity_test.cpp.
#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/recognizer.h"

namespace hablar::grammar {
namespace {

bool accepts(const Grammar& g, std::string_view text) {
  Recognizer rec(g);
  RecState s = rec.initial();
  return rec.advance_bytes(s, text) && Recognizer::can_end(s);
}

struct Case {
  const char* name;
  const char* gbnf;
  std::vector<std::string> accept, reject;
};

const char* kArithmetic = R"gbnf(# integer arithmetic with precedence
root  ::= expr
expr  ::= term (ws [-+] ws term)*
term  ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+
ws ::= [ ]*
)gbnf";

const char* kJson = R"gbnf(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)gbnf";

const char* kList = R"gbnf(root ::= item+
# a markdown-ish list: one item a line
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
)gbnf";

const char* kChess = R"gbnf(root   ::= "1. " move " " move ("\n" [1-9] [0-9]? ". " move " " move)*
move   ::= (pawn | nonpawn | castle) [+#]?
pawn   ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" ("-O")?
)gbnf";

const char* kCLike = R"gbnf(root ::= (declaration ws)*
declaration ::= type ws ident ws "(" ws params? ws ")" ws block
type ::= "int" | "void" | "float"
params ::= type ws ident (ws "," ws type ws ident)*
block ::= "{" ws (statement ws)* "}"
statement ::= ident ws "=" ws expr ws ";" | "return" (ws expr)? ws ";" | block |
  "while" ws "(" ws expr ws ")" ws statement
expr ::= operand (ws [-+*/<>] ws operand)*
operand ::= ident | [0-9]+ | "(" ws expr ws ")"
ident ::= [a-zA-Z_] [a-zA-Z_0-9]*
ws ::= [ \t\n]*
)gbnf";

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"arithmetic",
       kArithmetic,
       {"1", "1+2", "(1 + 2) * 3", "-4/-(2-1)", "((7))", "12 * 3 - 4 / 5"},
       {"", "1+", "(1+2", "1 ++ 2", "a+1", "1 + 2)", "* 3"}},
      {"json",
       kJson,
       {"{}", R"({"a": 1})", R"({"a":[1, 2.5e3, true, null, {"b": "x\n\u00e9"}]})",
        "{\n  \"k\": -0.5\n}", R"({"s": "quote \" slash \\"})"},
       {"[]", R"({"a": 1,})", R"({'a': 1})", R"({"a": 01})", R"({"a": "\x"})", "{\"a\": \"\x01\"}",
        R"({"a" 1})", R"({"a": tru})"}},
      {"list",
       kList,
       {"- one\n", "- one\n- two and three\n", "- ünïcode ✓\n"},
       {"", "- \n", "- one", "one\n", "-one\n", "- one\n\n"}},
      {"chess",
       kChess,
       {"1. e4 e5", "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6", "1. d4 d5\n2. c4 dxc4", "1. O-O O-O-O",
        "1. exd8=Q+ Kxd8#", "1. Nbd2 R1e1"},
       {"1. e9 e5", "1. e4", "2. e4 e5", "1. Ze4 e5", "1. O-O-O-O e5", "1. e4 e5\n0. d4 d5",
        "1. e4  e5"}},
      {"c-like",
       kCLike,
       {"", "int main() { return 0; }",
        "void f(int a, float b) {\n  a = a + 1;\n  while (a < b) { a = a * 2; }\n  return;\n}",
        "int g(){x=(1+2)*y;}"},
       {"int main() { return 0 }", "main() {}", "int f(int) {}", "int f() { x = ; }",
        "int f() { return 0; } }", "int 2x() {}"}},
  };
  return c;
}

TEST(ExampleGrammars, LeadingBarOnANewLineEndsTheRule) {
  // As in llama.cpp: outside parentheses a newline ends the rule, so a '|' that starts the
  // next line is a syntax error; after a '|' (or inside parentheses) newlines are fine.
  EXPECT_THROW(parse_gbnf("root ::= \"a\"\n  | \"b\"\n"), Error);
  EXPECT_TRUE(accepts(parse_gbnf("root ::= \"a\" |\n  \"b\"\n"), "b"));
  EXPECT_TRUE(accepts(parse_gbnf("root ::= (\"a\"\n  | \"b\")\n"), "b"));
}

TEST(ExampleGrammars, AcceptAndRejectLists) {
  for (const Case& c : cases()) {
    Grammar g = parse_gbnf(c.gbnf);
    for (const std::string& s : c.accept) EXPECT_TRUE(accepts(g, s)) << c.name << ": " << s;
    for (const std::string& s : c.reject) EXPECT_FALSE(accepts(g, s)) << c.name << ": " << s;
  }
}

}  // namespace
}  // namespace hablar::grammar
