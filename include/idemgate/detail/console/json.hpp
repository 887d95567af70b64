// SPDX-License-Identifier: MIT
// The console's JSON: writing strings, numbers and times, and reading the flat objects its
// requests carry.
#pragma once

#include "../json_string.hpp"

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

using json::utf8_sequence;

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

// The string token at `at`; throws `JsonError` saying what is wrong with it.
inline std::string string(std::string_view text, std::size_t& at) {
  std::string out;
  const std::string_view wrong = json::read_string(text, at, out);
  if (!wrong.empty()) throw JsonError(std::string(wrong));
  return out;
}

}  // namespace json_parse

/**
 * Reads a JSON object whose members are strings (the console's request bodies): member name to
 * value. Throws `JsonError` for anything else (nested values, numbers, duplicate names,
 * trailing text).
 */
[[nodiscard]] inline std::map<std::string, std::string> parse_flat_object(std::string_view text) {
  using json::skip_space;
  using json_parse::string;
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
