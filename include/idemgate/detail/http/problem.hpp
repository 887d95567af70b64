// SPDX-License-Identifier: MIT
// What class of problem a far side's error answer names: the `type` (or else the `title`) of an
// RFC 9457 problem details body. A failure's cause carries it, so that the failures of one kind
// group however their details differ.
#pragma once

#include "../json_string.hpp"

#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::detail::http {

/// Moves `at` past one JSON value whose first byte is at `text[at]` (strings read as strings, so
/// brackets inside them do not count); false when the text ends inside it or a string is
/// malformed.
inline bool skip_json_value(std::string_view text, std::size_t& at) {
  int depth = 0;
  std::string scratch;
  while (at < text.size()) {
    const char c = text[at];
    if (depth == 0 && (c == ',' || c == '}' || c == ']')) return true;  // a scalar ended
    if (c == '"') {
      scratch.clear();
      if (!json::read_string(text, at, scratch, json::RawBytes::any).empty()) return false;
      if (depth == 0) return true;
      continue;
    }
    if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) {
        ++at;
        return true;
      }
    }
    ++at;
  }
  return false;
}

/// Whether `content_type` is `application/problem+json` (parameters and case aside).
[[nodiscard]] inline bool is_problem_json(std::string_view content_type) {
  constexpr std::string_view media = "application/problem+json";
  if (content_type.size() < media.size()) return false;
  for (std::size_t i = 0; i < media.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(content_type[i])) != media[i]) return false;
  const std::string_view rest = content_type.substr(media.size());
  return rest.empty() || rest.front() == ';' || rest.front() == ' ';
}

/// The class of problem a problem details body names: its `type` unless absent or
/// "about:blank", else its `title`; none for a body that is not a JSON object or names neither.
/// At most 200 bytes are kept, so that a far side cannot fill a cause.
[[nodiscard]] inline std::optional<std::string> problem_class(std::string_view body) {
  std::size_t at = 0;
  json::skip_space(body, at);
  if (at >= body.size() || body[at] != '{') return std::nullopt;
  ++at;
  std::optional<std::string> type, title;
  for (;;) {
    json::skip_space(body, at);
    if (at >= body.size() || body[at] == '}') break;
    std::string name;
    if (!json::read_string(body, at, name, json::RawBytes::any).empty()) return std::nullopt;
    json::skip_space(body, at);
    if (at >= body.size() || body[at] != ':') return std::nullopt;
    ++at;
    json::skip_space(body, at);
    if (at < body.size() && body[at] == '"' && (name == "type" || name == "title")) {
      std::string value;
      if (!json::read_string(body, at, value, json::RawBytes::any).empty()) return std::nullopt;
      (name == "type" ? type : title) = std::move(value);
    } else if (!skip_json_value(body, at)) {
      return std::nullopt;
    }
    json::skip_space(body, at);
    if (at < body.size() && body[at] == ',') ++at;
  }
  std::optional<std::string> named =
      type && !type->empty() && *type != "about:blank" ? type : title;
  if (!named || named->empty()) return std::nullopt;
  for (char& c : *named)
    if (c == '\n' || c == '\r') c = ' ';  // a cause is one line
  if (named->size() > 200) {
    std::size_t cut = 200;
    while (cut > 0 && (static_cast<unsigned char>((*named)[cut]) & 0xC0) == 0x80) --cut;
    named->resize(cut);
  }
  return named;
}

}  // namespace idemgate::detail::http
