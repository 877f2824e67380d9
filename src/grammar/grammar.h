// Grammars for constrained sampling: the compiled form every front end (GBNF text, JSON
// Schema, regex, choice lists) lowers to, and the GBNF parser.
//
// Shape of a compiled Grammar: every rule is a list of alternatives; an alternative is a run
// of elements in `elems` that ends with a kEnd element. An element is a terminal (a character
// class over Unicode code points) or a reference to a rule. Repetitions and groups of the
// source are lowered to helper rules when parsing (x* becomes r ::= x r | ""), so matching
// only ever sees classes, references and ends.
//
// GBNF as llama.cpp defines it: `name ::= alternatives`, `|`, `( ... )`, `* + ?`, `{m}`,
// `{m,}`, `{m,n}`, "literals" and [classes] with ranges and [^negation], `.` for any
// character, escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH, `#` comments; a rule's
// body ends at a newline outside parentheses; the start rule is `root`. Left recursion is
// refused, as llama.cpp refuses it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::grammar {

struct CharRange {
  uint32_t lo = 0;
  uint32_t hi = 0;  // inclusive
};

// A set of code points: the union of ranges, or everything outside it when negated.
struct CharClass {
  bool negated = false;
  std::vector<CharRange> ranges;
  uint64_t ascii[2] = {0, 0};  // membership of code points 0..127 (negation applied)

  void finish();  // computes `ascii` once the ranges are final
  bool matches(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    return matches_slow(cp);
  }
  bool matches_slow(uint32_t cp) const;
  // Whether some code point in [lo, hi] is in the set.
  bool intersects(uint32_t lo, uint32_t hi) const;
};

enum class ElemKind : uint8_t { kEnd, kRule, kClass };

struct Elem {
  ElemKind kind = ElemKind::kEnd;
  uint32_t id = 0;  // rule id for kRule, class id for kClass
};

struct Grammar {
  std::vector<Elem> elems;                       // alternatives back to back, each ends in kEnd
  std::vector<std::vector<uint32_t>> rule_alts;  // rule -> offsets of its alternatives in elems
  std::vector<std::string> rule_names;
  std::vector<CharClass> classes;
  uint32_t root = 0;

  size_t n_rules() const { return rule_alts.size(); }
};

// Who wrote the GBNF text. kUser: llama.cpp's repetition bounds apply as llama.cpp applies
// them (a count above 2000 is refused as a minimum and means "no maximum" as a maximum; a
// repeated unit of k rules may be copied at most 2000/k times). kGenerated (our JSON Schema,
// regex and tool-call front ends): counts up to 10000, maxima always kept.
enum class GbnfSource { kUser, kGenerated };

// Parses GBNF text. Throws Error(kInvalidArgument) with the line and column of the fault:
// syntax errors, unknown escapes, undefined rules, no `root`, left recursion, repetitions
// beyond the size limits. As in llama.cpp, a rule defined twice takes its last definition.
Grammar parse_gbnf(std::string_view text, GbnfSource source = GbnfSource::kUser);

// Text quoted as a GBNF literal ("..." with the escapes GBNF reads back).
std::string gbnf_literal(std::string_view text);

}  // namespace hablar::grammar
