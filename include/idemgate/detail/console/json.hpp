// SPDX-License-Identifier: MIT
// The console's JSON: writing strings, numbers and times, and reading the flat objects its
// requests carry. Includes nothing of idemgate.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate::detail::console {

/// Thrown by `parse_flat_object` for text that is not a flat JSON object.
class JsonError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

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

/// Whether `text` is valid UTF-8.
[[nodiscard]] inline bool is_utf8(std::string_view text) noexcept {
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t n = utf8_sequence(text, at);
    if (n == 0) return false;
    at += n;
  }
  return true;
}

/// Appends `text` as a JSON string; bytes that are not UTF-8 become U+FFFD. `<`, `>` and `&`
/// are escaped too, so the text is inert wherever it lands.
inline void append_string(std::string& out, std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (std::size_t at = 0; at < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[at]);
    const std::size_t n = utf8_sequence(text, at);
    if (n == 0) {
      out += "\\ufffd";
      ++at;
      continue;
    }
    if (n > 1) {
      out.append(text.substr(at, n));
      at += n;
      continue;
    }
    ++at;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0x7F) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

/// `text` as a JSON string.
[[nodiscard]] inline std::string quote(std::string_view text) {
  std::string out;
  append_string(out, text);
  return out;
}

/// A time as an RFC 3339 string in UTC with microseconds, e.g. "2026-06-09T07:15:02.123456Z".
[[nodiscard]] inline std::string format_time(std::chrono::system_clock::time_point at) {
  using namespace std::chrono;
  const auto micros = time_point_cast<microseconds>(at);
  auto seconds = time_point_cast<std::chrono::seconds>(micros);
  if (seconds > micros) seconds -= std::chrono::seconds(1);
  const auto fraction = (micros - seconds).count();
  const std::time_t t = system_clock::to_time_t(seconds);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[40];
  const std::size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  char tail[16];
  std::snprintf(tail, sizeof tail, ".%06lldZ", static_cast<long long>(fraction));
  return std::string(text, n) + tail;
}

namespace json_parse {

inline void skip_space(std::string_view text, std::size_t& at) {
  while (at < text.size() &&
         (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r'))
    ++at;
}

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

inline std::uint32_t hex4(std::string_view text, std::size_t& at) {
  if (at + 4 > text.size()) throw JsonError("a \\u escape ends early");
  std::uint32_t code = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = text[at++];
    code <<= 4;
    if (c >= '0' && c <= '9')
      code |= static_cast<std::uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      code |= static_cast<std::uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      code |= static_cast<std::uint32_t>(c - 'A' + 10);
    else
      throw JsonError("a \\u escape holds a character that is not a hex digit");
  }
  return code;
}

inline std::string string(std::string_view text, std::size_t& at) {
  if (at >= text.size() || text[at] != '"') throw JsonError("expected a string");
  ++at;
  std::string out;
  while (true) {
    if (at >= text.size()) throw JsonError("a string is not closed");
    const char c = text[at];
    if (c == '"') {
      ++at;
      return out;
    }
    if (static_cast<unsigned char>(c) < 0x20)
      throw JsonError("a string holds a control character; escape it");
    if (c != '\\') {
      const std::size_t n = utf8_sequence(text, at);
      if (n == 0) throw JsonError("a string is not UTF-8");
      out.append(text.substr(at, n));
      at += n;
      continue;
    }
    if (++at >= text.size()) throw JsonError("an escape ends early");
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
        std::uint32_t code = hex4(text, at);
        if (code >= 0xD800 && code <= 0xDBFF) {
          if (at + 2 > text.size() || text[at] != '\\' || text[at + 1] != 'u')
            throw JsonError("a \\u escape holds half a surrogate pair");
          at += 2;
          const std::uint32_t low = hex4(text, at);
          if (low < 0xDC00 || low > 0xDFFF)
            throw JsonError("a \\u escape holds half a surrogate pair");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if (code >= 0xDC00 && code <= 0xDFFF) {
          throw JsonError("a \\u escape holds half a surrogate pair");
        }
        append_utf8(out, code);
        break;
      }
      default:
        throw JsonError("a string holds an unknown escape");
    }
  }
}

}  // namespace json_parse

/**
 * Reads a JSON object whose members are strings (the console's request bodies): member name to
 * value. Throws `JsonError` for anything else (nested values, numbers, duplicate names,
 * trailing text).
 */
[[nodiscard]] inline std::map<std::string, std::string> parse_flat_object(std::string_view text) {
  using namespace json_parse;
  std::map<std::string, std::string> members;
  std::size_t at = 0;
  skip_space(text, at);
  if (at >= text.size() || text[at] != '{') throw JsonError("expected a JSON object");
  ++at;
  skip_space(text, at);
  if (at < text.size() && text[at] == '}') {
    ++at;
  } else {
    while (true) {
      skip_space(text, at);
      std::string name = string(text, at);
      skip_space(text, at);
      if (at >= text.size() || text[at] != ':') throw JsonError("expected ':' after a name");
      ++at;
      skip_space(text, at);
      if (at >= text.size() || text[at] != '"')
        throw JsonError("the member \"" + name + "\" is not a string");
      std::string value = string(text, at);
      if (!members.emplace(std::move(name), std::move(value)).second)
        throw JsonError("a member name appears twice");
      skip_space(text, at);
      if (at < text.size() && text[at] == ',') {
        ++at;
        continue;
      }
      if (at < text.size() && text[at] == '}') {
        ++at;
        break;
      }
      throw JsonError("expected ',' or '}'");
    }
  }
  skip_space(text, at);
  if (at != text.size()) throw JsonError("text follows the object");
  return members;
}

}  // namespace idemgate::detail::console
