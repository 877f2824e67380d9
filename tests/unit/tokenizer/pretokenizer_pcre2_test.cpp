// Each hand-written pre-tokenizer scanner against PCRE2 (UTF + UCP) running the regex it
// stands for, on every document of the tokenizer corpus. White space is the Unicode
// White_Space property in both (\s is spelled out for PCRE2, whose own \s omits U+0085).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <gtest/gtest.h>
#include <pcre2.h>

#include <set>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace hablar::tokenizer::test {
namespace {

// \s -> White_Space, inside and outside character classes.
std::string spell_out_space(const std::string& re) {
  const std::string ws = R"(\t-\r\x{85}\p{Z})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    if (re[i] == '\\' && i + 1 < re.size()) {
      const char c = re[i + 1];
      if (c == 's')
        out += in_class ? ws : "[" + ws + "]";
      else if (c == 'S')
        out += in_class ? "" : "[^" + ws + "]";
      else
        out += re.substr(i, 2);
      ++i;
      continue;
    }
    if (re[i] == '[') in_class = true;
    if (re[i] == ']') in_class = false;
    out += re[i];
  }
  return out;
}

// Matches and the gaps between them, as code-point lengths.
std::vector<uint32_t> pcre2_split(pcre2_code* code, const std::string& text) {
  std::vector<uint32_t> lengths;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  auto cps_between = [&](size_t a, size_t b) {
    return static_cast<uint32_t>(unicode::decode(std::string_view(text).substr(a, b - a)).size());
  };
  size_t pos = 0, gap = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0,
                               md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > gap) lengths.push_back(cps_between(gap, ov[0]));
    lengths.push_back(cps_between(ov[0], ov[1]));
    gap = pos = ov[1];
  }
  if (text.size() > gap) lengths.push_back(cps_between(gap, text.size()));
  pcre2_match_data_free(md);
  return lengths;
}

TEST(PreTokenizer, ScannersMatchPcre2OnCorpus) {
  const std::string all =
      read_file(hablar::test::source_dir() + "/tests/data/tokenizer-corpus/corpus.txt");
  ASSERT_GT(all.size(), 1000000u);
  // Documents of the corpus, as separate subjects.
  std::vector<std::string> docs;
  const std::string sep = "\n__hablar_corpus_doc__\n";
  size_t p = 0;
  for (size_t hit; (hit = all.find(sep, p)) != std::string::npos; p = hit + sep.size())
    docs.push_back(all.substr(p, hit - p));
  size_t checked = 0;
  std::set<std::string> seen;  // aliases share their patterns: each is checked once
  for (const auto& name : PreTokenizer::supported_names()) {
    const PreTokenizer pre = PreTokenizer::for_name(name);
    for (const PrePattern& pattern : pre.patterns()) {
      // Only the scanners that stand for their regex; llama.cpp's own scanners and
      // LlamaRegex follow llama.cpp's rules instead (checked by PreTokenizerGolden).
      using K = PrePattern::Kind;
      if (pattern.kind != K::kGpt2 && pattern.kind != K::kLlama3 && pattern.kind != K::kClassRun &&
          pattern.kind != K::kTrailingWs)
        continue;
      if (!seen.insert(pattern.regex).second) continue;
      const std::string re = spell_out_space(pattern.regex);
      int err = 0;
      PCRE2_SIZE err_off = 0;
      pcre2_code* code =
          pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.c_str()), PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
      ASSERT_NE(code, nullptr) << name << ": PCRE2 rejects " << re << " at " << err_off;
      for (size_t d = 0; d < docs.size(); d += 3) {
        const auto cps = unicode::decode(docs[d]);
        std::vector<uint8_t> flags(cps.size());
        for (size_t i = 0; i < cps.size(); ++i) flags[i] = unicode::flags_of(cps[i]);
        std::vector<uint32_t> ours;
        PreTokenizer::split_piece(pattern, cps.data(), flags.data(), 0, cps.size(), ours);
        EXPECT_EQ(ours, pcre2_split(code, docs[d]))
            << name << " pattern " << pattern.regex << " on document " << d;
        ++checked;
      }
      pcre2_code_free(code);
    }
  }
  EXPECT_GT(checked, 100u);
}

}  // namespace
}  // namespace hablar::tokenizer::test
