#!/usr/bin/env python3
"""Builds the tokenizer parity corpus: a deterministic set of hard documents.

Sources (all on a Debian 12 machine): licence texts (English prose), Python standard
library modules, C and C++ headers, Perl modules and CMake scripts (source code), message
catalogues of many languages (gettext .mo files: CJK, Arabic, Hindi, Cyrillic, ...), plus
generated stress text: emoji with ZWJ / skin tones / flags, combining marks, runs of spaces,
tabs and newlines, long numbers, contractions, and rarely seen but valid UTF-8 (astral
planes, noncharacters, format and separator characters).

Output: one UTF-8 file; documents separated by the line DOC_SEPARATOR. Each document is at
most MAX_DOC bytes so that a reference regex engine never sees one huge match.

Usage: tokenizer_corpus.py OUT_FILE
"""
import glob
import gettext
import os
import random
import sys

DOC_SEPARATOR = "\n__hablar_corpus_doc__\n"
MAX_DOC = 4096
TARGET_BYTES = 1_250_000


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return ""


def chunk(text, limit=MAX_DOC):
    """Splits text into documents of at most `limit` bytes, at line ends when possible."""
    docs, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode())
        if n > limit:
            line = line.encode()[:limit].decode("utf-8", "ignore")
            n = len(line.encode())
        if size + n > limit and cur:
            docs.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += n
    if cur:
        docs.append("".join(cur))
    return docs


def prose():
    names = ["GPL-3", "Apache-2.0", "LGPL-2.1", "MPL-2.0", "Artistic", "GFDL-1.3", "CC0-1.0"]
    return [d for n in names for d in chunk(read("/usr/share/common-licenses/" + n))]


def code():
    files = [
        "/usr/lib/python3.11/textwrap.py", "/usr/lib/python3.11/argparse.py",
        "/usr/lib/python3.11/json/decoder.py", "/usr/lib/python3.11/difflib.py",
        "/usr/lib/python3.11/string.py", "/usr/lib/python3.11/fractions.py",
        "/usr/include/stdio.h", "/usr/include/string.h", "/usr/include/math.h",
        "/usr/include/c++/12/bits/stl_algo.h", "/usr/include/c++/12/optional",
        "/usr/share/perl/5.36/Benchmark.pm", "/usr/share/perl/5.36/Text/Balanced.pm",
        "/usr/share/cmake-3.25/Modules/FindPkgConfig.cmake",
        "/usr/share/cmake-3.25/Modules/CheckCSourceCompiles.cmake",
    ]
    docs = []
    for f in files:
        text = read(f)
        docs += chunk(text[:120_000])
    return docs


def catalogues():
    """Translated messages of apt and glib in every language present."""
    docs = []
    for path in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/glib20.mo")) + sorted(
            glob.glob("/usr/share/locale/*/LC_MESSAGES/apt.mo")):
        try:
            with open(path, "rb") as f:
                cat = gettext.GNUTranslations(f)
        except Exception:
            continue
        msgs = [v for k, v in sorted(cat._catalog.items(), key=lambda kv: str(kv[0])) if k and v]
        text = "\n".join(m for m in msgs if isinstance(m, str))
        docs += chunk(text[:20_000])
    return docs


EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇦", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "🤷‍♀️", "🐈‍⬛",
         "✈️", "☕", "🫠", "🧠", "#️⃣", "1️⃣", "©️", "🔥🔥🔥", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
COMBINING = ["e\u0301", "a\u0300\u0316", "Z\u0351\u0362\u0334\u0359", "n\u0303", "o\u0308\u0304",
             "\u1ea1\u0302", "\u0915\u094d\u0937", "\u0e01\u0e34\u0e4a", "\u05e9\u05c1\u05b8",
             "\u0627\u064e\u0644\u0652"]
RARE = ["\U0001d400\U0001d401\U0001d7d8", "\U00010330\U00010331", "\U00012000\U00012001",
        "\ue000\uf8ff", "\ufdd0\ufffe", "\ufeff", "\u200b", "\u200c\u200d", "\u00a0", "\u2028",
        "\u2029", "\u0085", "\u3000", "\u202f", "\u2060", "\u00ad", "\U000e0041", "\U0010fffd",
        "\x00", "\x01", "\x1b[31m", "\x7f", "\x0b\x0c", "\u1680", "\u2000\u200a", "\U0001f9ff",
        "\u0378", "\U00020000\U0002a6d6", "\uac00\ud7a3", "\u3042\u30a2\u4e00\uff21"]
WORDS = ["the", "The", "I'm", "you're", "they've", "we'll", "it's", "don't", "IT'S", "WE'LL",
         "O'Neil", "rock'n'roll", "naïve", "café", "straße", "Ελλάδα", "Москва", "東京", "서울",
         "القاهرة", "दिल्ली", "Hà Nội", "ภาษาไทย", "hello", "world", "foo_bar", "camelCase",
         "x86_64", "3.14159", "1e-10", "0xDEADBEEF", "v1.2.3", "<|im_start|>", "<s>", "</s>",
         "[INST]", "@user", "#tag", "https://example.com/a?b=c&d=e", "C++", "a->b", "i++",
         "¿Qué?", "¡Hola!", "«quote»", "„Zitat“", "“smart”", "‘single’", "—", "…", "№5"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", "   \n\n  ",
          "\t \t", "\n\n\n\n", " " * 17, "\t" * 9, "\u00a0 ", "\u3000"]


def stress(rng, n_docs):
    docs = []
    for _ in range(n_docs):
        parts = []
        size = 0
        limit = rng.randint(200, MAX_DOC - 200)
        while size < limit:
            r = rng.random()
            if r < 0.35:
                p = rng.choice(WORDS)
            elif r < 0.55:
                p = rng.choice(SPACES)
            elif r < 0.65:
                p = rng.choice(EMOJI) * rng.randint(1, 3)
            elif r < 0.73:
                p = rng.choice(COMBINING)
            elif r < 0.80:
                p = rng.choice(RARE)
            elif r < 0.88:
                p = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
            elif r < 0.93:
                p = rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "''"])
            else:
                p = rng.choice(["!!!", "?!", "...", "::", "->", "=>", "{}", "[]();", "/*", "*/",
                                "<<=", "&&", "||", "%%", "$$", "@@", "~~", "^^", "``", "##"])
            parts.append(p)
            size += len(p.encode())
        docs.append("".join(parts))
    return docs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rng = random.Random(20261130)
    docs = prose() + code() + catalogues()
    docs += stress(rng, 120)
    docs = [d for d in docs if d and DOC_SEPARATOR.strip() not in d]
    order = list(range(len(docs)))
    rng.shuffle(order)
    out, total = [], 0
    for i in order:
        out.append(docs[i])
        total += len(docs[i].encode())
        if total >= TARGET_BYTES:
            break
    with open(sys.argv[1], "w", encoding="utf-8", newline="") as f:
        f.write(DOC_SEPARATOR.join(out))
    print(f"{len(out)} documents, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
