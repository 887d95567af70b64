// SPDX-License-Identifier: MIT
// Reading a JSON string token (RFC 8259 section 7): its escapes, surrogate pairs and UTF-8. The
// one reader behind every JSON text the library parses (the console's requests, the canonical
// form of a server's request bodies, a row's history). Includes nothing of idemgate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace idemgate::detail::json {

/// Moves `at` past JSON whitespace (space, tab, line feed, carriage return).
inline void skip_space(std::string_view text, std::size_t& at) noexcept {
  while (at < text.size() &&
         (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r'))
    ++at;
}

/// The length of the valid UTF-8 sequence at `text[at]`, or 0 when none starts there.
[[nodiscard]] inline std::size_t utf8_sequence(std::string_view text, std::size_t at) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  std::uint32_t code = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code = lead & 0x1Fu;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code = lead & 0x0Fu;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code = lead & 0x07u;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(at + i) & 0x3Fu);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  static constexpr std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < least[length] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return 0;
  return length;
}

/// Appends the code point `code` (at most U+10FFFF) encoded in UTF-8.
inline void append_utf8(std::string& out, std::uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

/// What a string token's unescaped bytes must be.
enum class RawBytes {
  /// UTF-8, as RFC 8259 requires of JSON exchanged between systems.
  utf8,
  /// Anything but `"`, `\` and control characters: kept as they are (text the library wrote).
  any,
};

namespace string_detail {

// Four hex digits at `at` as a UTF-16 code unit; false when they are not there.
inline bool hex4(std::string_view text, std::size_t& at, std::uint32_t& unit) noexcept {
  if (at + 4 > text.size()) return false;
  unit = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    const char c = text[at + i];
    unit <<= 4;
    if (c >= '0' && c <= '9')
      unit |= static_cast<std::uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      unit |= static_cast<std::uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      unit |= static_cast<std::uint32_t>(c - 'A' + 10);
    else
      return false;
  }
  at += 4;
  return true;
}

}  // namespace string_detail

/**
 * Reads the string token whose opening quote is at `text[at]`: appends its value, escapes
 * resolved (a surrogate pair to its code point), to `out` and moves `at` past the closing quote.
 * Answers an empty view when it read one, or else what is wrong, with `at` on the offending byte:
 * no opening quote, no closing quote, an unescaped control character, an unknown or cut-short
 * escape, half a surrogate pair, or (with `RawBytes::utf8`) bytes that are not UTF-8.
 */
[[nodiscard]] inline std::string_view read_string(std::string_view text, std::size_t& at,
                                                  std::string& out, RawBytes raw = RawBytes::utf8) {
  using string_detail::hex4;
  if (at >= text.size() || text[at] != '"') return "a string is expected";
  ++at;
  for (;;) {
    if (at >= text.size()) return "a string is not closed";
    const auto c = static_cast<unsigned char>(text[at]);
    if (c == '"') {
      ++at;
      return {};
    }
    if (c < 0x20) return "a control character inside a string must be escaped";
    if (c != '\\') {
      std::size_t n = 1;
      if (raw == RawBytes::utf8 && (n = utf8_sequence(text, at)) == 0)
        return "a string is not UTF-8";
      out.append(text.substr(at, n));
      at += n;
      continue;
    }
    const std::size_t escape = at++;
    if (at >= text.size()) return "an escape is cut short";
    switch (text[at++]) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '/':
        out += '/';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        std::uint32_t code = 0;
        if (!hex4(text, at, code)) return "a \\u escape needs four hex digits";
        if (code >= 0xDC00 && code <= 0xDFFF) {
          at = escape;
          return "a \\u escape holds a lone low surrogate";
        }
        if (code >= 0xD800 && code <= 0xDBFF) {
          std::uint32_t low = 0;
          if (text.substr(at, 2) != "\\u") {
            at = escape;
            return "a \\u escape holds a lone high surrogate";
          }
          at += 2;
          if (!hex4(text, at, low)) return "a \\u escape needs four hex digits";
          if (low < 0xDC00 || low > 0xDFFF) {
            at = escape;
            return "a \\u escape holds a lone high surrogate";
          }
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        append_utf8(out, code);
        break;
      }
      default:
        at = escape;
        return "a string holds an unknown escape";
    }
  }
}

}  // namespace idemgate::detail::json
