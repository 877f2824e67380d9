// The pre-tokenizer of each tokenizer.ggml.pre value llama.cpp knows (llama-vocab.cpp): its
// chain of patterns and the options it ties to the name. Names that llama.cpp gives one
// pre-tokenizer type share a row when their options agree too.
#include <algorithm>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"

namespace hablar::tokenizer {

std::string detail_deepseek_letter_class();  // pretokenizer.cpp

namespace {

PrePattern pattern(PrePattern::Kind kind, std::string regex) {
  PrePattern p;
  p.kind = kind;
  p.regex = std::move(regex);
  return p;
}
PrePattern gpt2() {
  return pattern(PrePattern::Kind::kGpt2,
                 R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
}
PrePattern llama3(int max_digits) {
  std::string digits = max_digits == 1 ? "" : "{1," + std::to_string(max_digits) + "}";
  PrePattern p = pattern(
      PrePattern::Kind::kLlama3,
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})" +
          digits + R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  p.max_digits = max_digits;
  return p;
}
PrePattern run(PrePattern::Class cls, bool ws_prefix, int count, std::string regex) {
  PrePattern p = pattern(PrePattern::Kind::kClassRun, std::move(regex));
  p.cls = cls;
  p.ws_prefix = ws_prefix;
  p.count = count;
  return p;
}
PrePattern qwen35() {
  PrePattern p = llama3(1);
  p.marks = true;
  p.regex =
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N})"
      R"(| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return p;
}
PrePattern scanner(PrePattern::Kind kind, std::string regex) {
  return pattern(kind, std::move(regex));
}
// A regex run with llama.cpp's rules (LlamaRegex).
PrePattern re(std::string regex) {
  PrePattern p;
  p.kind = PrePattern::Kind::kRegex;
  p.re = std::make_shared<const LlamaRegex>(regex);
  p.regex = std::move(regex);
  return p;
}

// [一-龥ࠀ-一가-퟿]+ without the white space inside those ranges (see class_has).
constexpr const char* kCjkHangulRegex = R"((?:(?!\p{Z})[\x{800}-\x{9FA5}\x{AC00}-\x{D7FF}])+)";

// llama.cpp's names of the Llama 3 pre-tokenizer (vocabularies that also ignore merges when
// a word is one token and add BOS).
const std::vector<std::string_view> kLlama3Names = {"llama-bpe", "llama3",    "llama-v3",
                                                    "falcon3",   "falcon-h1", "pixtral",
                                                    "midm-2.0",  "lfm2",      "jina-v5-nano"};

// English contractions, case-insensitive without (?i:...).
#define HABLAR_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
// Words as upper-then-lower or upper-only runs (GPT-4o family), letters written through
// lookaheads as llama.cpp adapts them: L is the letter class of the lookaheads.
std::string cased_words(const std::string& L, const std::string& digits) {
  const std::string upper = "((?=[" + L + "])([^a-z]))", lower = "((?=[" + L + "])([^A-Z]))";
  const std::string lead = R"([^\r\n\p{L}\p{N}]?)";
  return lead + upper + "*" + lower + "+" HABLAR_CONTRACTIONS "?|" + lead + upper + "+" + lower +
         "*" HABLAR_CONTRACTIONS "?|\\p{N}" + digits +
         R"(| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}
// The same words through the category names (Tiny Aya, Youtu).
std::string category_words(const std::string& digits) {
  const std::string lead = R"([^\r\n\p{L}\p{N}]?)";
  const std::string upper = R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])";
  const std::string lower = R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])";
  return lead + upper + "*" + lower + "+" HABLAR_CONTRACTIONS "?|" + lead + upper + "+" + lower +
         "*" HABLAR_CONTRACTIONS "?|\\p{N}" + digits +
         R"(| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}
// DeepSeek-V3's words: ASCII punctuation may lead ASCII letters; letters take marks.
std::string deepseek3_words(const char* newline_part) {
  return std::string(R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+)re"
                     R"(|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+)") +
         newline_part + R"(|\s+(?!\S)|\s+)";
}
constexpr const char* kKanaHan = R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)";
constexpr const char* kBloom =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

using Chain = std::vector<PrePattern>;
using C = PrePattern::Class;

Chain gpt2_chain() {
  return {gpt2()};
}
Chain starcoder_chain() {
  return {run(C::kNumber, false, 1, R"(\p{N})"), gpt2()};
}
Chain llama3_chain() {
  return {llama3(3)};
}
Chain newline_runs_chain() {
  return {scanner(PrePattern::Kind::kNewlineRuns, R"([^\n]+|[\n]+)")};
}

struct NamedChain {
  std::vector<std::string_view> names;
  Chain (*make)();
  PreOptions options;
};

constexpr PreOptions kPlain{};
constexpr PreOptions kIgnoreMerges{.ignore_merges = true};
constexpr PreOptions kLlama3Options{.ignore_merges = true, .add_bos = true};

const std::vector<NamedChain>& chains() {
  static const std::vector<NamedChain> kChains = {
      {{"gpt-2", "mpt", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
        "a.x-4.0", "mellum", "modern-bert", "olmo", "jais", "trillion", "granite-docling",
        "exaone4"},
       gpt2_chain,
       kPlain},
      {{"jina-v1-en", "jina-v2-code", "roberta-bpe"}, gpt2_chain, PreOptions{.add_sep = true}},
      {kLlama3Names, llama3_chain, kLlama3Options},
      {{"dbrx", "smaug-bpe"}, llama3_chain, kPlain},
      {{"chatglm-bpe"}, llama3_chain, kPlain},
      {{"glm4", "glm5"}, llama3_chain, kIgnoreMerges},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open",
        "megrez", "grok-2"},
       [] { return Chain{llama3(1)}; },
       kPlain},
      {{"qwen35"}, [] { return Chain{qwen35()}; }, kPlain},
      {{"starcoder", "refact", "smollm", "command-r", "codeshell", "exaone", "minerva-7b",
        "mellum2"},
       starcoder_chain,
       kPlain},
      {{"falcon"},
       [] {
         return Chain{run(C::kPunctSymbolsFalcon, false, 0, R"([\p{P}\$\+<=>\^~\|`]+)"), gpt2(),
                      run(C::kAsciiDigit, false, 3, "[0-9][0-9][0-9]")};
       },
       kPlain},
      {{"default"},
       [] {
         return Chain{run(C::kPunctSymbolsDefault, false, 0, R"([\p{P}\$\+<=>\^~\|]+)"), gpt2(),
                      run(C::kNumber, false, 0, R"(\p{N}+)"),
                      run(C::kAsciiDigit, false, 3, "[0-9][0-9][0-9]")};
       },
       kPlain},
      {{"deepseek-llm"},
       [] {
         PrePattern trailing = pattern(PrePattern::Kind::kTrailingWs, R"(\s+$)");
         return Chain{
             run(C::kNewline, false, 1, "[\\r\\n]"),
             run(C::kDeepseekLetters, true, 0, "\\s?" + detail_deepseek_letter_class() + "+"),
             run(C::kDeepseekPunct, true, 0, R"(\s?[!-/:-~！-／：-～‘-‟、-。]+)"),
             trailing,
             run(C::kCjkHangul, false, 0, kCjkHangulRegex),
             run(C::kNumber, false, 0, R"(\p{N}+)")};
       },
       kPlain},
      {{"deepseek-coder"},
       [] {
         return Chain{
             run(C::kNewline, false, 1, "[\\r\\n]"), run(C::kLetter, true, 0, R"(\s?\p{L}+)"),
             run(C::kPunct, true, 0, R"(\s?\p{P}+)"), run(C::kCjkHangul, false, 0, kCjkHangulRegex),
             run(C::kNumber, false, 1, R"(\p{N})")};
       },
       kPlain},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"},
       [] {
         return Chain{re(R"(\p{N}{1,3})"), re(kKanaHan),
                      re(deepseek3_words(R"([\r\n]*|\s*[\r\n]+)"))};
       },
       kPlain},
      {{"spark2_5"},
       [] {
         return Chain{re(R"(\p{N}{1,3})"), re(kKanaHan), re(deepseek3_words(R"(|[\r\n])")),
                      re(R"(\p{N})")};
       },
       kPlain},
      {{"youtu"},
       [] {
         return Chain{
             re(R"([\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+)"
                R"(|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B})"
                R"(\x{FF0C}\x{3001}-\x{303F}\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|)" +
                std::string(kKanaHan)),
             re(category_words(""))};
       },
       kIgnoreMerges},
      {{"jais-2"},
       [] {
         return Chain{
             re(HABLAR_CONTRACTIONS
                R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
                R"(|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S))"
                R"(|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})")};
       },
       kPlain},
      {{"poro-chat", "bloom", "gpt3-finnish"}, [] { return Chain{re(kBloom)}; }, kPlain},
      {{"viking"},
       [] {
         return Chain{re(kBloom), re(R"(\p{N})")};
       },
       kPlain},
      {{"tekken"},
       [] {
         // Tekken's words are GPT-4o's without contractions, one digit at a time.
         const std::string upper = R"(((?=[\p{L}])([^a-z])))", lower = R"(((?=[\p{L}])([^A-Z])))";
         const std::string lead = R"([^\r\n\p{L}\p{N}]?)";
         return Chain{re(lead + upper + "*" + lower + "+|" + lead + upper + "+" + lower +
                         R"(*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)")};
       },
       kLlama3Options},
      {{"chameleon"},
       [] {
         return Chain{re("<sentinel:[0-9]+>"),       re("(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"),
                      re("([\\t\\n]|    |  )"),      re(R"(\p{N})"),
                      re(R"([\p{P}!-/:-@\[-`{-~])"), gpt2()};
       },
       PreOptions{.add_bos = true}},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"},
       [] { return Chain{re(cased_words(R"(\p{L})", "{1,3}"))}; },
       kPlain},
      {{"granite-embed-multi-97m"},
       [] { return Chain{re(cased_words(R"(\p{L}\p{M})", "{1,3}"))}; },
       kIgnoreMerges},
      {{"tiny_aya", "cohere2moe"},
       [] {
         return Chain{scanner(PrePattern::Kind::kDigitGroups, R"(\d{1,3}(?=(?:\d{3})*\b))"),
                      re(category_words("{1,3}"))};
       },
       kPlain},
      {{"kimi-k2"},
       [] { return Chain{scanner(PrePattern::Kind::kKimiK2, R"(\p{Han}+|...)")}; },
       kPlain},
      {{"superbpe"},
       [] {
         return Chain{re(R"(\p{N}+)"), re(R"((?=(\d{3})+(?!\d)))")};
       },
       kPlain},
      {{"bailingmoe", "bailingmoe2", "llada-moe"},
       [] {
         return Chain{re(R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+)"
                         R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)")};
       },
       kPlain},
      {{"seed-coder"},
       [] {
         return Chain{re(HABLAR_CONTRACTIONS
                         R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1})"
                         R"(| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)")};
       },
       kPlain},
      {{"ufakzeka"},
       [] {
         return Chain{re(R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
                         R"(|\s*[\r\n]+|\s+(?!\S)|\s+)")};
       },
       kPlain},
      {{"afmoe"},
       [] {
         return Chain{scanner(PrePattern::Kind::kDigitGroups, "AFMoE digits"),
                      re(R"([\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{8C48}-\x{FAFF}\x{3040}-\x{309F})"
                         R"(\x{30A0}-\x{30FF}\x{FF65}-\x{FF9F}\x{2F00}-\x{2FDF}\x{E40}-\x{E7F})"
                         R"(\x{E80}-\x{EFF}\x{1780}-\x{17FF}\x{1000}-\x{109F}\x{AA60}-\x{AA7F})"
                         R"(\x{A9E0}-\x{A9FF}\x{AC00}-\x{D7AF}\x{1100}-\x{11FF}]+)"),
                      re(deepseek3_words(R"([\r\n]*|\s*[\r\n]+)"))};
       },
       kPlain},
      {{"laguna"},
       [] {
         return Chain{newline_runs_chain()[0], llama3(1)};
       },
       kPlain},
      {{"exaone-moe"},
       [] {
         return Chain{re(HABLAR_CONTRACTIONS
                         R"(|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N})"
                         R"(| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)")};
       },
       kPlain},
      {{"gemma4", "granite-embed-multi-311m"},
       newline_runs_chain,
       PreOptions{.byte_level = false, .escape_spaces = true, .newline_words = true}},
      {{"sarvam-moe"}, newline_runs_chain, PreOptions{.byte_level = false, .escape_spaces = true}},
      {{"minicpm5"},
       [] {
         return Chain{
             re(R"(\p{N}{1,3})"),
             re(HABLAR_CONTRACTIONS R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+)"
                                    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")};
       },
       kIgnoreMerges},
      {{"whitespace"}, [] { return Chain{re(R"(\S+)")}; }, PreOptions{.byte_level = false}},
  };
  return kChains;
}

#undef HABLAR_CONTRACTIONS

}  // namespace

bool PreTokenizer::is_llama3_name(std::string_view pre) {
  return std::find(kLlama3Names.begin(), kLlama3Names.end(), pre) != kLlama3Names.end();
}

std::vector<std::string> PreTokenizer::supported_names() {
  std::vector<std::string> names;
  for (const auto& c : chains())
    for (auto n : c.names) names.emplace_back(n);
  return names;
}

PreTokenizer PreTokenizer::for_name(std::string_view pre) {
  for (const auto& c : chains()) {
    if (std::find(c.names.begin(), c.names.end(), pre) != c.names.end()) {
      PreTokenizer p;
      p.patterns_ = c.make();
      p.options_ = c.options;
      return p;
    }
  }
  std::string list;
  for (const auto& n : supported_names()) list += (list.empty() ? "" : ", ") + n;
  throw_error(ErrorKind::kUnsupported,
              "tokenizer: unsupported pre-tokenizer (tokenizer.ggml.pre) '" + std::string(pre) +
                  "'; supported: " + list);
}

}  // namespace hablar::tokenizer
