// Tokens and syntax tree of the Jinja interpreter.
//
// The lexer (jinja_lexer.cpp) applies whitespace control while it splits the source, so the
// parser sees data tokens already trimmed. The parser (jinja_parser.cpp) builds a Program: a
// list of statements whose expressions are small trees; the evaluator walks them.
#pragma once

#include "chat/jinja_error.h"
#include "chat/jinja_value.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::chat::jinja {

enum class TokenKind {
  kData,        // literal template text
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOperator,
  kEnd,
};

struct Token {
  TokenKind kind;
  std::string text;  // data, name, operator, or the decoded string literal
  std::int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Splits a template into tokens; throws JinjaError with the position of a lexical error.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options);

enum class ExprKind {
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,       // children: key0, value0, key1, value1, ...
  kAttribute,  // children[0].name
  kItem,       // children[0][children[1]]
  kSlice,      // children[0][children[1]:children[2]:children[3]] (null parts omitted)
  kCall,       // children[0](children[1..], keywords)
  kFilter,     // children[0] | name(children[1..], keywords); children[0] null in a filter block
  kTest,       // children[0] is [not] name(children[1..])
  kNot,
  kNegate,
  kPlus,
  kBinary,  // op: + - * / // % ** ~ == != < > <= >= in notin
  kAnd,
  kOr,
  kConditional,  // children: value_if_true, condition, value_if_false (may be null)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  SourcePos pos;
  Value literal;
  std::string name;  // variable, attribute, filter or test name; operator for kBinary
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  SourcePos pos;
  std::string text;   // kText
  ExprPtr expr;       // kOutput value; kFor iterable; kSet value; kCallBlock call
  ExprPtr condition;  // kFor inline filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (condition, body)
  std::vector<std::string> targets;                // kFor / kSet names; kMacro: [name]
  std::string attribute;                           // kSet / kSetBlock of namespace.attribute
  std::vector<ExprPtr> filters;                    // kSetBlock / kFilterBlock filter chain
  std::vector<MacroParam> params;                  // kMacro, kCallBlock caller params
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // kWith
  Body body;
  Body else_body;
  bool recursive = false;
};

struct Program {
  Body body;
};

// Parses a whole template; throws JinjaError with the position of the first syntax error.
std::unique_ptr<Program> parse_template(std::string_view source);

}  // namespace hablar::chat::jinja
