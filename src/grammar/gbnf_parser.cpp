// GBNF text -> Grammar. A recursive-descent parser over the text; groups and repetitions
// become helper rules named after the rule they appear in (name-1, name-2, ...), as the
// lowering in grammar.h describes. Errors name the line and column.
#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/utf8.h"

namespace hablar::grammar {

namespace {

// llama.cpp's bound on repetitions: a minimum above it is refused, a maximum above it means
// no maximum, and a repetition whose unit holds k rules may make at most this many copies.
constexpr uint64_t kRepeatThreshold = 2000;
// Grammars our front ends write (JSON Schema lengths, regex counts) are not bound by it: they
// may repeat up to this many times, and a maximum is always kept.
constexpr uint64_t kGeneratedMaxRepeat = 10000;
constexpr size_t kMaxItems = size_t{1} << 21;  // elements of the lowered grammar

struct Item {
  bool rule = false;
  uint32_t id = 0;
};
using Seq = std::vector<Item>;

class Parser {
 public:
  Parser(std::string_view text, GbnfSource source)
      : s_(text), llama_bounds_(source == GbnfSource::kUser) {}

  Grammar run() {
    skip_space(true);
    while (pos_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
    return finish();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw_error(ErrorKind::kInvalidArgument, "grammar: " + what + " at line " +
                                                 std::to_string(line) + ", column " +
                                                 std::to_string(col));
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  }

  // Spaces, tabs and comments; newlines too when inside parentheses (or between rules).
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && s_[pos_] != '\n' && s_[pos_] != '\r') ++pos_;
      } else if (newlines && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && word_char(s_[pos_])) ++pos_;
    if (pos_ == start) fail("expecting a rule name");
    return std::string(s_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = (uint32_t)rules_.size();
    ++symbols_;
    ids_.emplace(name, id);
    names_.push_back(name);
    rules_.emplace_back();
    defined_.push_back(false);
    first_use_.push_back(pos_);
    return id;
  }
  // Helper rules are not in the name table (a later rule of the text may have any name);
  // their names, for messages only, carry a '~' no GBNF name can hold.
  uint32_t helper_rule(uint32_t parent) {
    const uint32_t id = (uint32_t)rules_.size();
    names_.push_back(names_[parent] + "~" + std::to_string(++helper_count_));
    rules_.emplace_back();
    defined_.push_back(true);
    first_use_.push_back(pos_);
    return id;
  }
  uint32_t add_class(CharClass c) {
    c.finish();
    classes_.push_back(std::move(c));
    return (uint32_t)classes_.size() - 1;
  }
  Item single_char(uint32_t cp) {
    auto it = char_class_ids_.find(cp);
    if (it != char_class_ids_.end()) return {false, it->second};
    CharClass c;
    c.ranges.push_back({cp, cp});
    const uint32_t id = add_class(std::move(c));
    char_class_ids_.emplace(cp, id);
    return {false, id};
  }

  void parse_rule() {
    const std::string name = parse_name();
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") fail("expecting ::=");
    pos_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name);
    defined_[id] = true;  // a later definition replaces an earlier one, as in llama.cpp
    current_ = id;
    rules_[id] = parse_alternates(false);
    if (peek() == '\r') ++pos_;
    if (peek() == '\n') {
      ++pos_;
    } else if (!at_end()) {
      fail("expecting a newline or the end");
    }
  }

  std::vector<Seq> parse_alternates(bool nested) {
    std::vector<Seq> alts;
    alts.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  // One code point of a literal or class, with its escapes.
  uint32_t parse_char() {
    if (at_end()) fail("unexpected end of input");
    if (s_[pos_] == '\\') {
      const char e = peek(1);
      pos_ += 2;
      switch (e) {
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case 'n':
          return '\n';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
          return (uint32_t)(unsigned char)e;
        default:
          pos_ -= 2;
          fail("unknown escape");
      }
    }
    uint32_t cp = 0;
    const size_t n = decode_utf8_lenient(s_.substr(pos_), cp);
    pos_ += n;
    return cp;
  }
  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) fail("expecting " + std::to_string(digits) + " hex digits");
      v = v * 16 + (uint32_t)d;
      ++pos_;
    }
    return v;
  }

  CharClass parse_class() {
    CharClass c;
    ++pos_;  // '['
    if (peek() == '^') {
      c.negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (at_end()) fail("unexpected end of input in a character class");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size()) {
        ++pos_;
        hi = parse_char();
      }
      c.ranges.push_back({lo, hi});
    }
    ++pos_;  // ']'
    return c;
  }

  // A repetition count; saturates (a count that large is refused or unbounded anyway).
  uint64_t parse_count() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9')
      v = std::min<uint64_t>(v * 10 + (uint64_t)(s_[pos_++] - '0'), 1u << 30);
    if (pos_ == start) fail("expecting an integer");
    return v;
  }

  // Replaces seq[from..] (the repeated unit) by its lowering for {min, max} (max < 0: none).
  // `unit_rules` is llama.cpp's count of the rules the unit holds (for its size bound).
  void repeat(Seq& seq, size_t from, uint32_t min, int64_t max, uint64_t& unit_rules) {
    if (from >= seq.size()) fail("expecting something to repeat before the operator");
    const uint64_t copies = max > 0 ? (uint64_t)max : std::max<uint64_t>(min, 1);
    if (llama_bounds_ && unit_rules * copies > kRepeatThreshold)
      fail("repetition too large: " + std::to_string(unit_rules) + " rules repeated " +
           std::to_string(copies) + " times (at most " + std::to_string(kRepeatThreshold) + ")");
    unit_rules *= copies;
    Item unit;
    if (seq.size() - from == 1) {
      unit = seq[from];
    } else {
      unit = {true, helper_rule(current_)};
      rules_[unit.id] = {Seq(seq.begin() + (ptrdiff_t)from, seq.end())};
    }
    seq.resize(from);
    for (uint32_t i = 0; i < min; ++i) seq.push_back(unit);
    if (max < 0) {  // star ::= unit star | ""
      const uint32_t star = helper_rule(current_);
      ++symbols_;
      rules_[star] = {Seq{unit, {true, star}}, Seq{}};
      seq.push_back({true, star});
    } else if (max > (int64_t)min) {  // opt_k ::= unit opt_{k-1} | "", opt_1 ::= unit | ""
      uint32_t inner = 0;
      bool have_inner = false;
      for (int64_t k = 1; k <= max - (int64_t)min; ++k) {
        const uint32_t opt = helper_rule(current_);
        ++symbols_;
        Seq body{unit};
        if (have_inner) body.push_back({true, inner});
        rules_[opt] = {body, Seq{}};
        inner = opt;
        have_inner = true;
      }
      seq.push_back({true, inner});
    }
    total_items_ += seq.size();
    if (total_items_ > kMaxItems) fail("the grammar is too large");
  }

  // One alternative. As in llama.cpp, a repetition applies to the item before it, or to what
  // the repetition before it made of that item ("a"+* is (a+)*); `unit_rules` counts the
  // rules that unit holds, for the size bound.
  Seq parse_sequence(bool nested) {
    Seq seq;
    size_t last_start = 0;
    bool have_last = false;
    uint64_t unit_rules = 1;
    auto start_item = [&] {
      last_start = seq.size();
      have_last = true;
      unit_rules = 1;
    };
    while (!at_end()) {
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        start_item();
        while (peek() != '"') {
          if (at_end()) fail("unexpected end of input in a literal");
          seq.push_back(single_char(parse_char()));
        }
        ++pos_;
      } else if (c == '[') {
        start_item();
        CharClass cls = parse_class();
        // An empty class ([] or [^]) stands for nothing at all in llama.cpp: no element, and
        // nothing a repetition could apply to.
        if (cls.ranges.empty()) {
          have_last = false;
        } else {
          seq.push_back({false, add_class(std::move(cls))});
        }
      } else if (c == '.') {
        ++pos_;
        start_item();
        CharClass any;
        any.negated = true;
        seq.push_back({false, add_class(std::move(any))});
      } else if (word_char(c)) {
        start_item();
        seq.push_back({true, rule_id(parse_name())});
      } else if (c == '(') {
        seq.push_back(parse_group());
        last_start = seq.size() - 1;
        have_last = true;
        unit_rules = group_rules_;
      } else if (c == '*' || c == '+' || c == '?') {
        if (!have_last) fail(std::string("expecting something before '") + c + "'");
        ++pos_;
        repeat(seq, last_start, c == '+' ? 1 : 0, c == '?' ? 1 : -1, unit_rules);
      } else if (c == '{') {
        if (!have_last) fail("expecting something before '{'");
        ++pos_;
        const auto [min, max] = parse_braces(nested);
        repeat(seq, last_start, min, max, unit_rules);
      } else if (c == '<' || c == '!') {
        fail("token references (<...>, !<...>) are not supported");
      } else {
        break;
      }
      skip_space(nested);
    }
    total_items_ += seq.size();
    if (total_items_ > kMaxItems) fail("the grammar is too large");
    return seq;
  }

  // ( alternatives ) -> a helper rule; group_rules_ = the rules it made, itself included.
  Item parse_group() {
    ++pos_;
    skip_space(true);
    const uint64_t before = symbols_++;
    const uint32_t parent = current_;
    const uint32_t group = helper_rule(parent);
    auto alts = parse_alternates(true);
    current_ = parent;
    rules_[group] = std::move(alts);
    if (peek() != ')') fail("expecting ')'");
    ++pos_;
    group_rules_ = std::max<uint64_t>(1, symbols_ - before);
    return {true, group};
  }

  // {m}, {m,}, {m,n} after the '{': {min, max} with max -1 for none.
  std::pair<uint32_t, int64_t> parse_braces(bool nested) {
    skip_space(nested);
    const uint64_t min = parse_count();
    skip_space(nested);
    int64_t max = (int64_t)min;
    if (peek() == ',') {
      ++pos_;
      skip_space(nested);
      max = (peek() >= '0' && peek() <= '9') ? (int64_t)parse_count() : -1;
      skip_space(nested);
    } else if (peek() != '}') {
      fail("expecting ',' or '}'");
    }
    if (peek() != '}') fail("expecting '}'");
    ++pos_;
    const uint64_t limit = llama_bounds_ ? kRepeatThreshold : kGeneratedMaxRepeat;
    if (min > limit) fail("repetition minimum above " + std::to_string(limit));
    if (max > (int64_t)limit) {
      if (!llama_bounds_) fail("repetition maximum above " + std::to_string(limit));
      max = -1;  // llama.cpp: no maximum
    }
    if (max >= 0 && max < (int64_t)min) fail("repetition maximum below its minimum");
    return {(uint32_t)min, max};
  }

  Grammar finish();

  std::string_view s_;
  bool llama_bounds_ = true;
  size_t pos_ = 0;
  uint32_t current_ = 0;
  uint32_t helper_count_ = 0;
  size_t total_items_ = 0;
  uint64_t symbols_ = 0;      // rules llama.cpp would have made so far (for repetition bounds)
  uint64_t group_rules_ = 1;  // those of the group parse_group just read
  std::vector<std::vector<Seq>> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint32_t, uint32_t> char_class_ids_;
  std::vector<CharClass> classes_;
};

// The rules each rule may begin with: the leading reference of every alternative, and the
// next one as long as those before it can match the empty string (`nullable`). `tail` marks
// the references that end their alternative.
struct LeadEdge {
  uint32_t rule;
  bool tail;
};
std::vector<std::vector<LeadEdge>> leading_rules(const Grammar& g,
                                                 const std::vector<bool>& nullable) {
  std::vector<std::vector<LeadEdge>> leads(g.n_rules());
  for (size_t r = 0; r < g.n_rules(); ++r)
    for (uint32_t a : g.rule_alts[r])
      for (uint32_t i = a; g.elems[i].kind == ElemKind::kRule; ++i) {
        leads[r].push_back({g.elems[i].id, g.elems[i + 1].kind == ElemKind::kEnd});
        if (!nullable[g.elems[i].id]) break;
      }
  return leads;
}

// Rules that can match the empty string, through other rules too.
std::vector<bool> nullable_rules(const Grammar& g) {
  std::vector<bool> nullable(g.n_rules(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.n_rules(); ++r) {
      if (nullable[r]) continue;
      for (uint32_t a : g.rule_alts[r]) {
        uint32_t i = a;
        while (g.elems[i].kind == ElemKind::kRule && nullable[g.elems[i].id]) ++i;
        if (g.elems[i].kind == ElemKind::kEnd) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

[[noreturn]] void fail_left_recursion(const Grammar& g, uint32_t rule) {
  throw_error(ErrorKind::kInvalidArgument,
              "grammar: left recursion in rule '" + g.rule_names[rule] + "'");
}

// Strongly connected components of the lead graph (iterative Tarjan): comp[r] per rule.
std::vector<uint32_t> lead_components(const std::vector<std::vector<LeadEdge>>& leads) {
  const uint32_t n = (uint32_t)leads.size(), kNone = UINT32_MAX;
  std::vector<uint32_t> index(n, kNone), low(n, 0), comp(n, kNone), stack;
  std::vector<bool> on_stack(n, false);
  uint32_t next_index = 0, next_comp = 0;
  for (uint32_t start = 0; start < n; ++start) {
    if (index[start] != kNone) continue;
    std::vector<std::pair<uint32_t, size_t>> path{{start, 0}};
    index[start] = low[start] = next_index++;
    stack.push_back(start);
    on_stack[start] = true;
    while (!path.empty()) {
      auto& [r, k] = path.back();
      if (k < leads[r].size()) {
        const uint32_t v = leads[r][k++].rule;
        if (index[v] == kNone) {
          index[v] = low[v] = next_index++;
          stack.push_back(v);
          on_stack[v] = true;
          path.push_back({v, 0});
        } else if (on_stack[v]) {
          low[r] = std::min(low[r], index[v]);
        }
        continue;
      }
      const uint32_t done = r;
      path.pop_back();
      if (!path.empty()) low[path.back().first] = std::min(low[path.back().first], low[done]);
      if (low[done] != index[done]) continue;
      for (uint32_t v = kNone; v != done;) {
        v = stack.back();
        stack.pop_back();
        on_stack[v] = false;
        comp[v] = next_comp;
      }
      ++next_comp;
    }
  }
  return comp;
}

// Refuses rules that can reach themselves before consuming a character, where that would
// make the recognizer build stacks without end: a cycle of leading references in which some
// reference is followed by more of its alternative (each lap would push a new return
// position). A cycle of references that all end their alternatives returns to the same
// (element, continuation) pair, which the recognizer expands once per step, so
// `root ::= ( [x]* )*` is taken. Cycles llama.cpp's own check finds (through rules with an
// empty alternative of their own, e.g. `"x"**`) are refused as llama.cpp refuses them.
void check_left_recursion(const Grammar& g) {
  const size_t n = g.n_rules();
  const std::vector<bool> nullable = nullable_rules(g);
  const auto leads = leading_rules(g, nullable);
  const std::vector<uint32_t> comp = lead_components(leads);
  for (size_t r = 0; r < n; ++r)
    for (const LeadEdge& e : leads[r])
      if (!e.tail && comp[e.rule] == comp[r]) fail_left_recursion(g, e.rule);

  std::vector<bool> has_empty_alt(n, false);  // llama.cpp's notion of a rule that may be empty
  for (size_t r = 0; r < n; ++r)
    for (uint32_t a : g.rule_alts[r])
      has_empty_alt[r] = has_empty_alt[r] || g.elems[a].kind == ElemKind::kEnd;
  const auto shallow = leading_rules(g, has_empty_alt);
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    std::vector<std::pair<uint32_t, size_t>> path{{(uint32_t)start, 0}};
    color[start] = 1;
    while (!path.empty()) {
      auto& [r, k] = path.back();
      if (k == shallow[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t next = shallow[r][k++].rule;
      if (color[next] == 1) fail_left_recursion(g, next);
      if (color[next] == 0) {
        color[next] = 1;
        path.push_back({next, 0});
      }
    }
  }
}

Grammar Parser::finish() {
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (!defined_[r]) {
      pos_ = first_use_[r];
      fail("undefined rule '" + names_[r] + "'");
    }
  }
  auto root = ids_.find("root");
  if (root == ids_.end()) throw_error(ErrorKind::kInvalidArgument, "grammar: no 'root' rule");
  Grammar g;
  g.root = root->second;
  g.rule_names = names_;
  g.classes = std::move(classes_);
  g.rule_alts.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const Seq& alt : rules_[r]) {
      g.rule_alts[r].push_back((uint32_t)g.elems.size());
      for (const Item& it : alt)
        g.elems.push_back({it.rule ? ElemKind::kRule : ElemKind::kClass, it.id});
      g.elems.push_back({ElemKind::kEnd, 0});
    }
  }
  check_left_recursion(g);
  return g;
}

}  // namespace

void CharClass::finish() {
  // Sorted, merged ranges: `intersects` can then walk them in order.
  std::sort(ranges.begin(), ranges.end(),
            [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  std::vector<CharRange> merged;
  for (const CharRange& r : ranges) {
    if (r.hi < r.lo) continue;
    if (!merged.empty() && (uint64_t)merged.back().hi + 1 >= r.lo) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  ranges = std::move(merged);
  ascii[0] = ascii[1] = 0;
  for (uint32_t cp = 0; cp < 128; ++cp)
    if (matches_slow(cp)) ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
}

bool CharClass::matches_slow(uint32_t cp) const {
  bool in = false;
  for (const CharRange& r : ranges) in = in || (cp >= r.lo && cp <= r.hi);
  return in != negated;
}

bool CharClass::intersects(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const CharRange& r : ranges)
      if (r.lo <= hi && lo <= r.hi) return true;
    return false;
  }
  // Some point of [lo, hi] outside every (sorted, merged) range.
  uint64_t next = lo;  // first point not yet known to be covered
  for (const CharRange& r : ranges) {
    if (r.lo > next) break;
    if ((uint64_t)r.hi + 1 > next) next = (uint64_t)r.hi + 1;
  }
  return next <= hi;
}

Grammar parse_gbnf(std::string_view text, GbnfSource source) {
  return Parser(text, source).run();
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          static const char* hex = "0123456789ABCDEF";
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += (char)c;
        }
    }
  }
  return out + "\"";
}

}  // namespace hablar::grammar
