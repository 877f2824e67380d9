// The Jinja parser: tokens -> Program. Expression precedence follows jinja2's parser:
//   conditional (x if c else y) < or < and < not < comparisons (== != < > <= >= in, not in)
//   < + - < ~ < * / // % < ** < unary - + < postfix (.attr [item] (call)) then | filter, is test.
#include "chat/jinja_ast.h"

#include <set>

namespace hablar::chat::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::unique_ptr<Program> parse() {
    auto program = std::make_unique<Program>();
    std::string stop = parse_body(program->body, {});
    if (!stop.empty()) fail(peek().pos, "unexpected '" + stop + "'");
    return program;
  }

 private:
  // --- token helpers -------------------------------------------------------------------------
  const Token& peek(std::size_t ahead = 0) const {
    std::size_t i = std::min(index_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& next() {
    const Token& t = peek();
    if (index_ < tokens_.size() - 1) ++index_;
    return t;
  }
  bool is_op(const char* op, std::size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.kind == TokenKind::kOperator && t.text == op;
  }
  bool is_name(const char* name, std::size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.kind == TokenKind::kName && t.text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(SourcePos pos, const std::string& message) const {
    throw JinjaError(message, pos);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEnd:
        return "end of template";
      case TokenKind::kBlockEnd:
        return "end of statement block";
      case TokenKind::kVarEnd:
        return "end of print statement";
      case TokenKind::kData:
        return "template data";
      case TokenKind::kString:
        return "string";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!accept_op(op))
      fail(peek().pos, std::string("expected '") + op + "', got " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::kName)
      fail(peek().pos, "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd)
      fail(peek().pos, "expected end of statement block, got " + describe(peek()));
    next();
  }

  // --- statements ----------------------------------------------------------------------------
  // Parses statements until a block tag named in `stops` (consumed up to and including its
  // name); returns that name, or "" at the end of the template.
  std::string parse_body(Body& body, const std::set<std::string>& stops) {
    while (true) {
      const Token& t = peek();
      switch (t.kind) {
        case TokenKind::kEnd:
          if (!stops.empty())
            fail(t.pos, "unexpected end of template, expected '" + join(stops) + "'");
          return "";
        case TokenKind::kData: {
          auto s = make_stmt(StmtKind::kText, t.pos);
          s->text = t.text;
          body.push_back(std::move(s));
          next();
          break;
        }
        case TokenKind::kVarBegin: {
          next();
          auto s = make_stmt(StmtKind::kOutput, t.pos);
          s->expr = parse_tuple_or_expression();
          if (peek().kind != TokenKind::kVarEnd)
            fail(peek().pos, "expected end of print statement, got " + describe(peek()));
          next();
          body.push_back(std::move(s));
          break;
        }
        case TokenKind::kBlockBegin: {
          next();
          const Token& name = peek();
          if (name.kind != TokenKind::kName) fail(name.pos, "tag name expected");
          if (stops.count(name.text)) {
            next();
            return name.text;
          }
          body.push_back(parse_statement());
          break;
        }
        default:
          fail(t.pos, "unexpected " + describe(t));
      }
    }
  }

  static std::string join(const std::set<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : "' or '") + n;
    return out;
  }

  static StmtPtr make_stmt(StmtKind kind, SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->pos = pos;
    return s;
  }

  StmtPtr parse_statement() {
    const Token& tag = next();
    if (++block_depth_ > kMaxNesting) fail(tag.pos, "blocks nested too deeply");
    StmtPtr stmt = parse_tag(tag);
    --block_depth_;
    return stmt;
  }

  StmtPtr parse_tag(const Token& tag) {
    const std::string& name = tag.text;
    if (name == "if") return parse_if(tag.pos);
    if (name == "for") return parse_for(tag.pos);
    if (name == "set") return parse_set(tag.pos);
    if (name == "macro") return parse_macro(tag.pos);
    if (name == "call") return parse_call_block(tag.pos);
    if (name == "filter") return parse_filter_block(tag.pos);
    if (name == "with") return parse_with(tag.pos);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail(tag.pos, "'" + name + "' outside of a loop");
      expect_block_end();
      return make_stmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, tag.pos);
    }
    fail(tag.pos, "Encountered unknown tag '" + name + "'.");
  }

  StmtPtr parse_if(SourcePos pos) {
    auto s = make_stmt(StmtKind::kIf, pos);
    while (true) {
      ExprPtr cond = parse_tuple_or_expression();
      expect_block_end();
      Body body;
      std::string stop = parse_body(body, {"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "elif") continue;
      if (stop == "else") {
        expect_block_end();
        parse_body(s->else_body, {"endif"});
      }
      expect_block_end();
      return s;
    }
  }

  void parse_assign_targets(std::vector<std::string>& targets) {
    bool parens = accept_op("(");
    do {
      targets.push_back(expect_name());
    } while (accept_op(","));
    if (parens) expect_op(")");
  }

  StmtPtr parse_for(SourcePos pos) {
    auto s = make_stmt(StmtKind::kFor, pos);
    parse_assign_targets(s->targets);
    if (!accept_name("in")) fail(peek().pos, "expected 'in', got " + describe(peek()));
    s->expr = parse_tuple_or_expression(/*allow_condition=*/false);
    if (accept_name("if")) s->condition = parse_expression();
    if (accept_name("recursive")) s->recursive = true;
    expect_block_end();
    ++loop_depth_;
    std::string stop = parse_body(s->body, {"else", "endfor"});
    --loop_depth_;
    if (stop == "else") {
      expect_block_end();
      parse_body(s->else_body, {"endfor"});
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(SourcePos pos) {
    std::vector<std::string> targets;
    std::string attribute;
    std::string first = expect_name();
    if (accept_op(".")) {
      attribute = expect_name();
      targets.push_back(first);
    } else {
      targets.push_back(first);
      while (accept_op(",")) targets.push_back(expect_name());
    }
    if (accept_op("=")) {
      auto s = make_stmt(StmtKind::kSet, pos);
      s->targets = std::move(targets);
      s->attribute = std::move(attribute);
      s->expr = parse_tuple_or_expression();
      expect_block_end();
      return s;
    }
    auto s = make_stmt(StmtKind::kSetBlock, pos);
    if (targets.size() != 1) fail(pos, "a block set assigns one name");
    s->targets = std::move(targets);
    s->attribute = std::move(attribute);
    while (accept_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    parse_body(s->body, {"endset"});
    expect_block_end();
    return s;
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!accept_op(")")) {
      if (!params.empty()) expect_op(",");
      if (accept_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (accept_op("=")) p.default_value = parse_expression();
      params.push_back(std::move(p));
    }
  }

  StmtPtr parse_macro(SourcePos pos) {
    auto s = make_stmt(StmtKind::kMacro, pos);
    s->targets.push_back(expect_name());
    parse_params(s->params);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    parse_body(s->body, {"endmacro"});
    loop_depth_ = saved;
    if (peek().kind == TokenKind::kName) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(SourcePos pos) {
    auto s = make_stmt(StmtKind::kCallBlock, pos);
    if (is_op("(")) parse_params(s->params);
    s->expr = parse_expression();
    if (s->expr->kind != ExprKind::kCall) fail(s->expr->pos, "expected call");
    expect_block_end();
    parse_body(s->body, {"endcall"});
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(SourcePos pos) {
    auto s = make_stmt(StmtKind::kFilterBlock, pos);
    do {
      s->filters.push_back(parse_filter(nullptr));
    } while (accept_op("|"));
    expect_block_end();
    parse_body(s->body, {"endfilter"});
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(SourcePos pos) {
    auto s = make_stmt(StmtKind::kWith, pos);
    while (peek().kind != TokenKind::kBlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      s->assignments.emplace_back(name, parse_expression());
    }
    expect_block_end();
    parse_body(s->body, {"endwith"});
    expect_block_end();
    return s;
  }

  // --- expressions ---------------------------------------------------------------------------
  static ExprPtr make_expr(ExprKind kind, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // `a, b` without brackets is a tuple where jinja2 allows it ({{ }}, for ... in, set).
  ExprPtr parse_tuple_or_expression(bool allow_condition = true) {
    SourcePos pos = peek().pos;
    ExprPtr first = allow_condition ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto tuple = make_expr(ExprKind::kTuple, pos);
    tuple->children.push_back(std::move(first));
    while (accept_op(",")) {
      if (at_expression_end()) break;
      tuple->children.push_back(allow_condition ? parse_expression() : parse_or());
    }
    return tuple;
  }

  bool at_expression_end() const {
    TokenKind k = peek().kind;
    return k == TokenKind::kBlockEnd || k == TokenKind::kVarEnd || is_op(")") || is_op("]") ||
           is_op("}") || is_name("if");
  }

  ExprPtr parse_expression() {
    if (++nesting_ > kMaxNesting) fail(peek().pos, "expression nested too deeply");
    ExprPtr value = parse_or();
    while (is_name("if")) {
      auto cond = make_expr(ExprKind::kConditional, peek().pos);
      next();
      ExprPtr test = parse_or();
      ExprPtr otherwise;
      if (accept_name("else")) otherwise = parse_expression();
      cond->children.push_back(std::move(value));
      cond->children.push_back(std::move(test));
      cond->children.push_back(std::move(otherwise));
      value = std::move(cond);
    }
    --nesting_;
    return value;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto e = make_expr(ExprKind::kOr, next().pos);
      e->children.push_back(std::move(left));
      e->children.push_back(parse_and());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto e = make_expr(ExprKind::kAnd, next().pos);
      e->children.push_back(std::move(left));
      e->children.push_back(parse_not());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto e = make_expr(ExprKind::kNot, next().pos);
      if (++nesting_ > kMaxNesting) fail(e->pos, "expression nested too deeply");
      e->children.push_back(parse_not());
      --nesting_;
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    while (true) {
      std::string op;
      SourcePos pos = peek().pos;
      if (peek().kind == TokenKind::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        return left;
      }
      left = binary(op, pos, std::move(left), parse_math1());
    }
  }

  static ExprPtr binary(const std::string& op, SourcePos pos, ExprPtr l, ExprPtr r) {
    auto e = make_expr(ExprKind::kBinary, pos);
    e->name = op;
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = binary(t.text, t.pos, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      left = binary("~", t.pos, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = binary(t.text, t.pos, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      left = binary("**", t.pos, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    if (++nesting_ > kMaxNesting) fail(peek().pos, "expression nested too deeply");
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      node = make_expr(t.text == "-" ? ExprKind::kNegate : ExprKind::kPlus, t.pos);
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    --nesting_;
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kName: {
        next();
        auto e = make_expr(ExprKind::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::kString: {
        auto e = make_expr(ExprKind::kLiteral, t.pos);
        std::string s;
        while (peek().kind == TokenKind::kString) s += next().text;  // adjacent literals join
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenKind::kInt:
      case TokenKind::kFloat: {
        next();
        auto e = make_expr(ExprKind::kLiteral, t.pos);
        e->literal = t.kind == TokenKind::kInt ? Value(t.int_value) : Value(t.float_value);
        return e;
      }
      case TokenKind::kOperator:
        if (t.text == "(") return parse_paren();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        [[fallthrough]];
      default:
        fail(t.pos, "unexpected " + describe(t));
    }
  }

  ExprPtr parse_paren() {
    SourcePos pos = next().pos;
    if (accept_op(")")) return make_expr(ExprKind::kTuple, pos);
    ExprPtr first = parse_expression();
    if (accept_op(")")) return first;
    auto tuple = make_expr(ExprKind::kTuple, pos);
    tuple->children.push_back(std::move(first));
    while (accept_op(",")) {
      if (is_op(")")) break;
      tuple->children.push_back(parse_expression());
    }
    expect_op(")");
    return tuple;
  }

  ExprPtr parse_list() {
    auto e = make_expr(ExprKind::kList, next().pos);
    while (!accept_op("]")) {
      if (!e->children.empty()) {
        expect_op(",");
        if (accept_op("]")) break;
      }
      e->children.push_back(parse_expression());
    }
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make_expr(ExprKind::kDict, next().pos);
    while (!accept_op("}")) {
      if (!e->children.empty()) {
        expect_op(",");
        if (accept_op("}")) break;
      }
      e->children.push_back(parse_expression());
      expect_op(":");
      e->children.push_back(parse_expression());
    }
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        SourcePos pos = next().pos;
        auto e = make_expr(ExprKind::kAttribute, pos);
        if (peek().kind == TokenKind::kInt) {  // foo.0 is foo[0]
          e->kind = ExprKind::kItem;
          e->children.push_back(std::move(node));
          auto index = make_expr(ExprKind::kLiteral, peek().pos);
          index->literal = Value(next().int_value);
          e->children.push_back(std::move(index));
        } else {
          e->name = expect_name();
          e->children.push_back(std::move(node));
        }
        node = std::move(e);
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    SourcePos pos = next().pos;
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (accept_op(":")) {
        is_slice = true;
        if (++part > 2) fail(pos, "invalid slice");
        continue;
      }
      if (parts[part]) fail(peek().pos, "expected ']'");
      parts[part] = parse_expression();
    }
    next();
    if (!is_slice) {
      if (!parts[0]) fail(pos, "expected subscript expression");
      auto e = make_expr(ExprKind::kItem, pos);
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make_expr(ExprKind::kSlice, pos);
    e->children.push_back(std::move(node));
    for (auto& p : parts) e->children.push_back(std::move(p));
    return e;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      first = false;
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        std::string name = next().text;
        next();
        call.keywords.emplace_back(std::move(name), parse_expression());
      } else {
        if (!call.keywords.empty())
          fail(peek().pos, "positional argument follows keyword argument");
        call.children.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make_expr(ExprKind::kCall, callee->pos);
    e->children.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr operand) {
    auto e = make_expr(ExprKind::kFilter, peek().pos);
    e->name = expect_name();
    while (accept_op(".")) {
      e->name.push_back('.');
      e->name += expect_name();
    }
    e->children.push_back(std::move(operand));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        next();
        node = parse_filter(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr operand) {
    auto e = make_expr(ExprKind::kTest, next().pos);
    e->negated = accept_name("not");
    e->name = expect_name();
    while (accept_op(".")) {
      e->name.push_back('.');
      e->name += expect_name();
    }
    e->children.push_back(std::move(operand));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if (starts_test_argument()) {
      ExprPtr arg = parse_primary();
      e->children.push_back(parse_postfix(std::move(arg)));
    }
    return e;
  }

  bool starts_test_argument() const {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kString:
      case TokenKind::kInt:
      case TokenKind::kFloat:
        return true;
      case TokenKind::kName:
        return t.text != "else" && t.text != "or" && t.text != "and" && t.text != "if" &&
               t.text != "in" && t.text != "is" && t.text != "not";
      case TokenKind::kOperator:
        return t.text == "[" || t.text == "{";
      default:
        return false;
    }
  }

  static constexpr int kMaxNesting = 300;
  std::vector<Token> tokens_;
  std::size_t index_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
  int block_depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse_template(std::string_view source) {
  return Parser(tokenize(source, LexerOptions{})).parse();
}

}  // namespace hablar::chat::jinja
