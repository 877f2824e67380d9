#!/usr/bin/env python3
"""Regenerates tests/golden/grammar/gbnf_parity.json: llama.cpp's verdicts on GBNF grammars.

The oracle is llama.cpp's grammar sampler (llama-cpp-python's low-level API) over a real
vocabulary (the default model's, loaded with vocab_only). For each grammar of CASES below
(our own grammars in the style of llama.cpp's grammars/ folder, plus edge cases):
  * whether llama.cpp's parser takes it (llama_sampler_init_grammar returns NULL when not);
  * for each test string, fed one character at a time as the token whose text is exactly
    that character (or byte by byte through single-byte tokens where the vocabulary has no
    such token): the first character the sampler refuses (its logit set to -inf by
    llama_sampler_apply), else whether an end-of-generation token is allowed at the end
    ("complete") or not ("prefix": valid so far, unfinished).
A refused token is never passed to llama_sampler_accept (llama.cpp throws there).

PARSE_CASES are grammars whose only question is whether the parser takes them.

tests/unit/grammar/gbnf_parity_test.cpp checks hablar's parser and recognizer against the
golden file, so CI never needs llama.cpp.

Usage: ~/.cache/hablar/oracle-venv/bin/python tools/grammar_oracle.py [--model GGUF]
"""
import argparse
import ctypes
import json
import os
import sys

import llama_cpp as L

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "grammar", "gbnf_parity.json")
DEFAULT_MODEL = os.path.expanduser("~/.cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf")

ARITHMETIC = r"""# integer arithmetic with precedence and unary minus
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws     ::= [ \t]*
"""

JSON = r"""root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x00-\x1F\x7F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= ( " " | "\n" | "\t" ){0,8}
"""

LIST = r"""# one or more list items, each on its own line
root ::= item{1,4}
item ::= ( "- " | "* " | [0-9] ". " ) text "\n"
text ::= [^\n\r]+
"""

CHESS = r"""# a game in short algebraic notation
root    ::= turn ( " " turn )*
turn    ::= [1-9] [0-9]? ". " move ( " " move )?
move    ::= ( pawn | piece | castle ) check?
pawn    ::= ( [a-h] "x" )? [a-h] [1-8] promo?
promo   ::= "=" [NBRQ]
piece   ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle  ::= "O-O" "-O"?
check   ::= [+#]
"""

CLIKE = r"""root  ::= ( func ws )+
func  ::= type " " ident "(" ws params? ws ")" ws block
type  ::= "int" | "void" | "char" "*"?
params ::= type " " ident ( ws "," ws type " " ident )*
block ::= "{" ws ( stmt ws )* "}"
stmt  ::= "return" ( " " expr )? ";" |
          type " " ident ws "=" ws expr ";" |
          "if" ws "(" ws expr ws ")" ws block ( ws "else" ws block )? |
          ident ws "=" ws expr ";"
expr  ::= atom ( ws op ws atom )*
op    ::= "+" | "-" | "*" | "==" | "<" | "&&"
atom  ::= ident | [0-9]+ | "(" ws expr ws ")" | ident "(" ( expr ( "," ws expr )* )? ")"
ident ::= [a-zA-Z] [a-zA-Z0-9]*
ws    ::= [ \n]*
"""

CLASSES = r"""# character classes: ranges, negation, escapes, any-character
root ::= hex " " notdigit " " esc " " dash " " any " " uni
hex  ::= "0x" [0-9a-fA-F]+
notdigit ::= [^0-9\n ]+
esc  ::= [\x41-\x43\]\[\\]+
dash ::= [a-c-]+
any  ::= . .
uni  ::= [α-ω]+ | [\u4e00-\u9fff]{2}
"""

REPEATS = r"""root ::= a " " b " " c " " d " " e
a ::= "x"{3}
b ::= "y"{2,}
c ::= "z"{1,3}
d ::= ( "ab" | "c" ){0,2} "!"
e ::= "q"? "r"* "s"+
"""

NESTED = r"""root ::= ( "a" ( "b" ( "c" | "d" )+ )? "e" )* "."
"""

COMMENTS = r"""# a comment before the first rule
root ::= greeting # the start
  # a comment inside a rule's alternatives? no: the rule ended at the newline
greeting ::= ( "hi" | # after a bar, newlines are fine
   "hello" ) ( ", " name )?   # trailing comment
name ::= [A-Z] [a-z]*
"""

UTF8 = r"""root ::= "héllo " ( "wörld" | "世界" | "🌍" ) [€£¥]? "\u00e9"? "\U0001F600"*
"""

EMPTY_ALTS = r"""root ::= "(" inner ")"
inner ::= | "x" inner | "y"
"""

MULTILINE = "root ::= (\n  \"a\"\n  | \"b\"\n) \"c\"\n"

ALTS_QUIRKS = r"""root ::= "a"+* "b"? "c"{2}{2} "."
"""

EMPTY_CLASS = r"""root ::= "a" [] "b" [^] "c"
"""

LAST_WINS = r"""root ::= x
x ::= "first"
x ::= "second"
"""

ESCAPES = r"""root ::= "\x41\u00e9\t\"\\\[\]\-" [\-a]
"""

REPEAT_CAP = r"""root ::= "a"{0,2001} "b"
"""

CASES = [
    ("arithmetic", ARITHMETIC,
     ["1", "1+2", "(1 + 2) * 3", "-4/-(2-1)", "((7))", "12 * 3 - 4 / 5", "3.25*2", "", "1+",
      "(1+2", "1 ++ 2", "a+1", "1 + 2)", "* 3", "1.", "1..2", "--1", "1 +\t2", "(", "- 1"]),
    ("json", JSON,
     ["{}", "[]", '{"a": 1}', '{"a":[1, 2.5e3, true, null, {"b": "x\\n\\u00e9"}]}',
      '{\n  "k": -0.5\n}', '{"s": "quote \\" slash \\\\"}', '"text"', "-0", "0.5E+10", "{",
      '{"a"', '{"a":', '{"a": 1,', '{"a": 1,}', "{'a': 1}", '{"a": 01}', '{"a": "\\x"}',
      '{"a": "\x01"}', '{"a" 1}', '{"a": tru', '{"a": tru}', "1234567890123456",
      "12345678901234567", '"\\u12"', '"\\u12G4"', "  true  ", "\t\t\t\t\t\t\t\t\t1",
      '{"é": "日本"}', "[1,]", "[,1]", "nul"]),
    ("list", LIST,
     ["- one\n", "* two\n- three\n", "1. first\n2. second\n", "- a\n- b\n- c\n- d\n",
      "- a\n- b\n- c\n- d\n- e\n", "- one", "-one\n", "- \n", "", "- x\r\n", "12. no\n",
      "- ünïcödé\n"]),
    ("chess", CHESS,
     ["1. e4 e5", "1. e4 e5 2. Nf3 Nc6 3. Bb5", "1. e4", "1. exd5", "1. e8=Q+", "1. O-O-O#",
      "1. Nbd7", "1. R1a3", "1. Qh4xe1+", "1. e9", "1. i4", "1. O-O-O-O", "1.e4", "1. e4  e5",
      "10. Kxe2", "100. e4", "1. e8=K", "1. Nb", "1. O-", "0. e4"]),
    ("c-like", CLIKE,
     ["int main() { return 0; }", "void f(int a, char* b) {\n  a = b + 1;\n}",
      "int g(int x) { if (x < 2) { return x; } else { return g(x - 1) + g(x - 2); } }",
      "int a(){}int b(){}", "int main() { return; }", "char* s() { char* t = s(); return t; }",
      "int main() { return 0 }", "int main( { }", "float f() {}", "int 1x() {}", "int",
      "int main() { x = (1 + 2; }", "int main() {", "int f(){ return a && b == c; }",
      "int f(){ return (a; }", "void f() { if(x){} else {} }"]),
    ("classes", CLASSES,
     ["0xBEEF abc A] a-c ab αβγ", "0x1f %%% [\\ --- \n\t 一二", "0x zz A a .. α",
      "0xG q A a .. α", "0x1 9 A a .. α", "0x1 q D a .. α", "0x1 q A d .. α",
      "0x1 q A a . α", "0x1 q A a .. Ω", "0x1 q A a .. 一", "0x1 q A a .. 一二三",
      "0x1 q A a 日本 ω", "0x1 q\nr A a .. α", "0x1 q ABC\\[] abc-cba xy ωω"]),
    ("repeats", REPEATS,
     ["xxx yy z ! s", "xxx yyyyy zzz abc! qrrrsss", "xxx yy zz c! qs", "xx yy z ! s",
      "xxxx yy z ! s", "xxx y z ! s", "xxx yy zzzz ! s", "xxx yy z ababab! s",
      "xxx yy z ! q", "xxx yy z ! qqs", "xxx yy z ! rrrr", "xxx yy z abab! rs", "xxx yy z ",
      "xxx yy z a"]),
    ("nested", NESTED,
     [".", "ae.", "abce.", "abcdcde.", "aeabde.", "ab.", "abe.", "ace.", "aee.", "a", "abcd",
      "abcde", "e."]),
    ("comments", COMMENTS,
     ["hi", "hello", "hi, Bob", "hello, X", "hi,Bob", "hi, bob", "hey", "hello, ", "h"]),
    ("utf8", UTF8,
     ["héllo wörld", "héllo 世界", "héllo 🌍€é", "héllo 世界£😀😀", "héllo wörld¥é😀",
      "hello wörld", "héllo world", "héllo 世", "héllo 世界é€", "héllo 🌍$", "héllo 🌎",
      "héllo wörldéé"]),
    ("empty-alternatives", EMPTY_ALTS,
     ["()", "(x)", "(xxy)", "(y)", "(yy)", "(xyx)", "(", "(xx", "x"]),
    ("multiline-group", MULTILINE, ["ac", "bc", "c", "abc", "a", "ab"]),
    ("repetition-of-repetition", ALTS_QUIRKS,
     ["ab cccc.".replace(" ", ""), "aaaacccc.", "cccc.", "aaabcc.", "abcccccc.", "acccc.",
      "aaa"]),
    ("empty-class", EMPTY_CLASS, ["abc", "abxc", "ac", "a", "ab", "abcc"]),
    ("last-definition-wins", LAST_WINS, ["first", "second", "sec", "f"]),
    ("escapes", ESCAPES,
     ["Aé\t\"\\[]--", "Aé\t\"\\[]-a", "Aé\t\"\\[]-b", "Aé\t\"\\[]", "A", "B"]),
    ("repeat-above-cap", REPEAT_CAP, ["b", "ab", "a" * 2001 + "b", "a" * 2003 + "b"]),
]

PARSE_CASES = [
    ("no-root", 'start ::= "a"\n'),
    ("undefined-rule", 'root ::= a b\na ::= "x"\n'),
    ("left-recursion", 'root ::= root "a" | "b"\n'),
    ("left-recursion-through-empty", 'root ::= e root "a" | "b"\ne ::= "" | "c"\n'),
    ("bar-on-next-line", 'root ::= "a"\n  | "b"\n'),
    ("group-then-newline", 'root ::= ( "a" )\n  "c"\n'),
    ("star-of-star", 'root ::= "a"**\n'),
    ("star-of-optional", 'root ::= "a"?*\n'),
    ("plus-of-plus", 'root ::= "a"++\n'),
    ("leading-star", 'root ::= * "a"\n'),
    ("unclosed-literal", 'root ::= "abc\n'),
    ("unclosed-class", 'root ::= [a-z\n'),
    ("unclosed-group", 'root ::= ( "a" | "b"\n'),
    ("stray-close", 'root ::= "a" )\n'),
    ("unknown-escape", 'root ::= "\\q"\n'),
    ("short-hex", 'root ::= "\\x4"\n'),
    ("short-unicode", 'root ::= "\\u00e"\n'),
    ("dash-escape", 'root ::= "\\-"\n'),
    ("missing-assign", 'root = "a"\n'),
    ("underscore-name", 'my_rule ::= "a"\nroot ::= my_rule\n'),
    ("dashed-name", 'my-rule ::= "a"\nroot ::= my-rule\n'),
    ("digit-name", '1rule ::= "a"\nroot ::= 1rule\n'),
    ("brace-no-min", 'root ::= "a"{,3}\n'),
    ("brace-bad", 'root ::= "a"{x}\n'),
    ("brace-unclosed", 'root ::= "a"{2,3\n'),
    ("brace-spaces", 'root ::= "a"{ 2 , 3 }\n'),
    ("repeat-2000", 'root ::= "a"{2000}\n'),
    ("repeat-2001", 'root ::= "a"{2001}\n'),
    ("repeat-product", 'root ::= ( "a"{50} ){50}\n'),
    ("repeat-product-small", 'root ::= ( "a"{10} ){10}\n'),
    ("empty-rule", 'root ::=\n'),
    ("empty-group", 'root ::= () "a"\n'),
    ("empty-literal", 'root ::= "" "a"\n'),
    ("rule-on-next-line", 'root ::= "a"\n  "b"\n'),
    ("two-rules-one-line", 'root ::= "a" x ::= "b"\n'),
    ("crlf", 'root ::= a\r\na ::= "x"\r\n'),
    ("comment-only-after", 'root ::= "a" # c\n# end'),
    ("class-reversed-range", 'root ::= [z-a] | "b"\n'),
    ("class-trailing-dash", 'root ::= [a-]\n'),
    ("dot", 'root ::= . .\n'),
    ("token-id", 'root ::= <[1234]> "a"\n'),
    ("not-token-id", 'root ::= !<[1234]> "a"\n'),
]


class Oracle:
    def __init__(self, model_path):
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(model_path.encode(), params)
        if not self.model:
            sys.exit(f"cannot load {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.eos = L.llama_vocab_eos(self.vocab)
        buf = ctypes.create_string_buffer(256)
        self.by_text = {}
        for t in range(self.n_vocab):
            if L.llama_vocab_is_control(self.vocab, t) or L.llama_vocab_is_eog(self.vocab, t):
                continue
            k = L.llama_token_to_piece(self.vocab, t, buf, 256, 0, True)
            if k > 0:
                self.by_text.setdefault(buf.raw[:k], t)
        self.data = (L.llama_token_data * 1)()

    def sampler(self, gbnf):
        s = L.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        return s if s else None

    def allowed(self, s, token):
        self.data[0].id = token
        self.data[0].logit = 0.0
        self.data[0].p = 0.0
        arr = L.llama_token_data_array(data=self.data, size=1, selected=-1, sorted=False)
        L.llama_sampler_apply(s, ctypes.byref(arr))
        return self.data[0].logit != float("-inf")

    def tokens_for(self, ch):
        b = ch.encode()
        if b in self.by_text:
            return [self.by_text[b]]
        if all(bytes([x]) in self.by_text for x in b):
            return [self.by_text[bytes([x])] for x in b]
        raise ValueError(f"no tokens for {ch!r}")

    def verdict(self, gbnf, text):
        s = self.sampler(gbnf)
        try:
            offset = 0
            for ch in text:
                for tok in self.tokens_for(ch):
                    if not self.allowed(s, tok):
                        return {"verdict": "reject", "at": offset}
                    L.llama_sampler_accept(s, tok)
                offset += len(ch.encode())
            return {"verdict": "complete" if self.allowed(s, self.eos) else "prefix"}
        finally:
            L.llama_sampler_free(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=GOLDEN)
    args = ap.parse_args()
    oracle = Oracle(args.model)
    out = {"oracle": f"llama.cpp grammar sampler (llama-cpp-python {L.__version__})",
           "vocabulary": os.path.basename(args.model), "grammars": [], "parse_only": []}
    for name, gbnf, strings in CASES:
        s = oracle.sampler(gbnf)
        entry = {"name": name, "gbnf": gbnf, "parses": s is not None, "strings": []}
        if s is not None:
            L.llama_sampler_free(s)
            for text in strings:
                entry["strings"].append({"text": text, **oracle.verdict(gbnf, text)})
        out["grammars"].append(entry)
    for name, gbnf in PARSE_CASES:
        s = oracle.sampler(gbnf)
        if s is not None:
            L.llama_sampler_free(s)
        out["parse_only"].append({"name": name, "gbnf": gbnf, "parses": s is not None})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n = sum(len(g["strings"]) for g in out["grammars"])
    print(f"{args.out}: {len(out['grammars'])} grammars, {n} strings, "
          f"{len(out['parse_only'])} parse cases")


if __name__ == "__main__":
    main()
