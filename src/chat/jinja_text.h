// Python's string operations on UTF-8 text (indexing and case by code point), shared by the
// filters and the str methods of the Jinja interpreter.
#pragma once

#include "chat/jinja_value.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hablar::chat::jinja::text {

enum class StripSide { kBoth, kLeft, kRight };
// str.strip([chars]): `chars` unset strips Python white space.
std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side);
// str.split(sep=None, maxsplit=-1) and str.rsplit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               std::int64_t maxsplit, bool from_right);
std::vector<std::string> splitlines(std::string_view s);
std::string replace(std::string_view s, std::string_view old, std::string_view replacement,
                    std::int64_t count);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string jinja_title(
    std::string_view s);  // the `title` filter (words split on -, space, brackets)
// Code-point index of the first (or last) occurrence, or -1.
std::int64_t find(std::string_view s, std::string_view sub, bool from_right);
std::size_t count(std::string_view s, std::string_view sub);
std::size_t word_count(std::string_view s);

}  // namespace hablar::chat::jinja::text
