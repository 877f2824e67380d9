#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/tokenizer_impl.h"

namespace hablar::tokenizer {

// ---- PairTable / hashing ----------------------------------------------------------------

void PairTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) insert(s.key, s.value);
}

void PairTable::grow() {
  reserve(slots_.empty() ? 16 : slots_.size());
}

void PairTable::insert(uint64_t key, uint64_t value) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) return;
    if (s.key == kEmpty) {
      s.key = key;
      s.value = value;
      ++size_;
      return;
    }
  }
}

size_t StringViewHash::operator()(std::string_view s) const noexcept {
  // FNV-1a over 8-byte words: short keys (token texts) hash in a few steps.
  uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < s.size(); ++k)
    tail |= static_cast<uint64_t>(static_cast<uint8_t>(s[i + k])) << (8 * k);
  h = (h ^ tail) * 0x100000001b3ULL;
  h ^= h >> 32;
  return static_cast<size_t>(h);
}

// ---- Tokenizer --------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->eog_ids.clear();
  for (size_t id = 0; id < impl_->eog.size(); ++id)
    if (impl_->eog[id]) impl_->eog_ids.push_back((int32_t)id);
}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  // A tokenizer.json travels as tokenizer.huggingface.json (Hugging Face directories); a
  // GGUF vocabulary (tokenizer.ggml.*) takes precedence where both are present.
  if (!file.has("tokenizer.ggml.model") && file.has("tokenizer.huggingface.json"))
    return std::unique_ptr<Tokenizer>(new Tokenizer(load_hf_vocab(file)));
  return std::unique_ptr<Tokenizer>(new Tokenizer(load_vocab(file)));
}

namespace {

std::string escape_spaces(std::string_view text, bool prefix) {
  std::string s;
  s.reserve(text.size() + text.size() / 4 + 3);
  if (prefix) s += "\xE2\x96\x81";
  for (char c : text) {
    if (c == ' ')
      s += "\xE2\x96\x81";
    else
      s.push_back(c);
  }
  return s;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  return encode(text, add_special, parse_special, {});
}

std::vector<size_t> Tokenizer::control_token_starts(std::string_view text) const {
  std::vector<size_t> starts;
  for (const Fragment& f : impl_->partition(text, true))
    if (f.token >= 0 && impl_->types[f.token] != TokenType::kUserDefined)
      starts.push_back(f.offset);
  return starts;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special,
                                       std::span<const uint32_t> text_only) const {
  const Impl& v = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && v.hf) out.insert(out.end(), v.hf->prefix.begin(), v.hf->prefix.end());
  if (add_special && !v.hf && v.add_bos && v.bos >= 0) out.push_back(v.bos);
  bool prev_special = true;  // SentencePiece: a space prefix starts the text and follows specials
  for (const Fragment& f : v.partition(text, parse_special, text_only)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.offset, f.length);
    switch (v.kind) {
      case ModelKind::kSpm:
        v.encode_spm(escape_spaces(raw, v.add_space_prefix && prev_special), out);
        break;
      case ModelKind::kBpe:
        v.encode_bpe(raw, out);
        break;
      case ModelKind::kWpm:
        v.encode_wpm(raw, out);
        break;
      case ModelKind::kUgm:
        v.encode_ugm(raw, out);
        break;
      case ModelKind::kHf:
        v.hf->encode(raw, f.offset == 0, out);
        break;
    }
    prev_special = false;
  }
  if (add_special && v.hf) out.insert(out.end(), v.hf->suffix.begin(), v.hf->suffix.end());
  if (add_special && !v.hf && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  if (add_special && !v.hf && v.add_sep && v.sep >= 0) out.push_back(v.sep);
  return out;
}

std::string Tokenizer::token_text(int32_t id, bool show_special, bool first) const {
  const Impl& v = *impl_;
  if (id < 0 || id >= v.n_vocab())
    throw_error(ErrorKind::kInvalidArgument, "tokenizer: token id " + std::to_string(id) +
                                                 " is out of range [0, " +
                                                 std::to_string(v.n_vocab()) + ")");
  const TokenType t = v.types[id];
  if (!show_special && (t == TokenType::kControl || t == TokenType::kUnknown)) return {};
  const std::string& piece = v.pieces[id];
  if (first && v.add_space_prefix && !piece.empty() && piece[0] == ' ') return piece.substr(1);
  return piece;
}

bool Tokenizer::is_hidden(int32_t id, bool show_special) const {
  const TokenType t = token_type(id);
  return !show_special && (t == TokenType::kControl || t == TokenType::kUnknown);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool show_special) const {
  std::string out;
  bool first = true;  // the first token that is not hidden drops the inserted leading space
  for (int32_t id : ids) {
    out += token_text(id, show_special, first);
    if (!is_hidden(id, show_special)) first = false;
  }
  return out;
}

std::string Tokenizer::token_piece(int32_t id) const {
  if (id < 0 || id >= impl_->n_vocab())
    throw_error(ErrorKind::kInvalidArgument, "tokenizer: token id " + std::to_string(id) +
                                                 " is out of range [0, " +
                                                 std::to_string(impl_->n_vocab()) + ")");
  return impl_->texts[id];
}

int32_t Tokenizer::n_vocab() const {
  return impl_->n_vocab();
}
int32_t Tokenizer::fim_id(FimRole role) const {
  return impl_->fim[(size_t)role];
}

int32_t Tokenizer::bos_id() const {
  return impl_->bos;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->add_eos;
}
bool Tokenizer::is_eog(int32_t id) const {
  return id >= 0 && id < impl_->n_vocab() && impl_->eog[id] != 0;
}
std::span<const int32_t> Tokenizer::eog_ids() const {
  return impl_->eog_ids;
}
bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < impl_->n_vocab() && impl_->types[id] == TokenType::kControl;
}
TokenType Tokenizer::token_type(int32_t id) const {
  return id >= 0 && id < impl_->n_vocab() ? impl_->types[id] : TokenType::kUndefined;
}
std::optional<int32_t> Tokenizer::find_token(std::string_view piece) const {
  const int32_t id = impl_->lookup(piece);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}
std::string_view Tokenizer::model_name() const {
  return impl_->model_name;
}
std::string_view Tokenizer::pre_name() const {
  return impl_->pre_name;
}

}  // namespace hablar::tokenizer
