// Internal entry of the output parser, shared by parse_model_output and the streaming parser.
#pragma once

#include "chat/chat.h"

namespace hablar::chat {

// final == false: return only what is certain for a text that may still grow.
ParsedMessage parse_output(std::string_view text, ToolFormat format, bool extract_reasoning,
                           bool reasoning_started, bool final);

}  // namespace hablar::chat
