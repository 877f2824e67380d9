// DRY sequence breakers (engine/dry_penalty.h) resolved against the served model's vocabulary,
// as llama-server resolves them: every token whose text holds a breaker is a breaker by
// itself; a token whose text ends with the start of a breaker is one when the tokens of the
// breaker's rest follow it (at most 20 of them; a breaker is cut to 40 bytes).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/dry_penalty.h"
#include "tokenizer/tokenizer.h"

namespace hablar::server {

// llama-server's default breakers: newline, colon, double quote, asterisk.
const std::vector<std::string>& default_dry_breakers();

// Resolved once per vocabulary and breaker list (a scan of the vocabulary), then shared.
std::shared_ptr<const engine::DryBreakers> resolve_dry_breakers(
    const tokenizer::Tokenizer& tok, const std::vector<std::string>& breakers);

}  // namespace hablar::server
