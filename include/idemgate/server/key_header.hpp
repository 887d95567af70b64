// SPDX-License-Identifier: MIT
// Reading an Idempotency-Key header value: a Structured Field string, with limits.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace idemgate::server {

/// How an `Idempotency-Key` value is read.
struct KeyHeaderRules {
  /// Accept a bare value (`abc-123`) besides the draft's sf-string (`"abc-123"`); both then name
  /// the same key. On by default: many clients send the bare form. A bare value may hold only
  /// visible ASCII other than `"`, `\`, `,` and `;`.
  bool accept_bare = true;
  /// The longest key accepted, in characters after unquoting (1 to 4096).
  std::size_t max_length = 255;
};

/// What an `Idempotency-Key` value was read as: the key, or why it was refused.
struct KeyHeader {
  /// True when the value is an acceptable key.
  bool ok = false;
  /// The key, unquoted and unescaped (when `ok`).
  std::string key;
  /// Why the value was refused, for a problem's `detail` (when not `ok`).
  std::string error;
};

/**
 * Reads an `Idempotency-Key` field value as an RFC 8941 sf-string: `"` printable ASCII, with
 * `\"` and `\\` as the only escapes, `"`, surrounded by optional spaces. Parameters and other
 * item types are refused. With `rules.accept_bare`, a bare token is taken as the key itself. The
 * key must be 1 to `rules.max_length` characters.
 *
 * Example:
 *   const auto header = idemgate::server::read_key_header(R"( "8e03978e-40d5" )");
 *   // header.ok, and header.key == "8e03978e-40d5"
 */
[[nodiscard]] inline KeyHeader read_key_header(std::string_view value,
                                               const KeyHeaderRules& rules) {
  KeyHeader out;
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  const auto refuse = [&](std::string why) {
    out.ok = false;
    out.key.clear();
    out.error = std::move(why);
    return out;
  };
  if (value.empty()) return refuse("the Idempotency-Key header is empty; send a unique key");
  if (value.front() == '"') {
    std::size_t i = 1;
    for (;; ++i) {
      if (i >= value.size()) return refuse("the Idempotency-Key string is not closed with '\"'");
      const auto c = static_cast<unsigned char>(value[i]);
      if (c == '"') break;
      if (c == '\\') {
        if (i + 1 >= value.size() || (value[i + 1] != '"' && value[i + 1] != '\\'))
          return refuse("the Idempotency-Key string has a '\\' that escapes neither '\"' nor '\\'");
        out.key += value[++i];
        continue;
      }
      if (c < 0x20 || c > 0x7E)
        return refuse(
            "the Idempotency-Key string may hold only printable ASCII (a Structured Field "
            "string)");
      out.key += static_cast<char>(c);
    }
    if (i + 1 != value.size())
      return refuse(
          "the Idempotency-Key header holds more than one string (parameters and lists are not "
          "accepted)");
  } else {
    if (!rules.accept_bare)
      return refuse(
          "the Idempotency-Key header must be a quoted Structured Field string, e.g. "
          "Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
    for (const char ch : value) {
      const auto c = static_cast<unsigned char>(ch);
      if (c <= 0x20 || c > 0x7E || ch == '"' || ch == '\\' || ch == ',' || ch == ';')
        return refuse(
            "the Idempotency-Key value holds a character a bare key may not (spaces, quotes, "
            "'\\', ',', ';' or non-ASCII); send it as a quoted string");
    }
    out.key = std::string(value);
  }
  if (out.key.empty()) return refuse("the Idempotency-Key is empty; send a unique key");
  if (out.key.size() > rules.max_length)
    return refuse("the Idempotency-Key is " + std::to_string(out.key.size()) +
                  " characters long; at most " + std::to_string(rules.max_length) +
                  " are accepted (a UUID is 36)");
  out.ok = true;
  return out;
}

/// `read_key_header` with the default rules.
[[nodiscard]] inline KeyHeader read_key_header(std::string_view value) {
  return read_key_header(value, KeyHeaderRules{});
}

}  // namespace idemgate::server
