// SPDX-License-Identifier: MIT
// The text the log keeps of a reason, a label or a mismatch's source: whatever bytes it is
// given, stored as valid UTF-8 without NUL and of bounded length, the same way by every store.
#pragma once

#include "../../record.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace idemgate {

/// The longest reason, label or mismatch source the log keeps, in bytes. A longer text is cut at
/// a character boundary and ends with ` … [cut: N bytes in all]`.
inline constexpr std::size_t max_stored_text = 8192;

namespace detail {

/// The length of the valid UTF-8 sequence at the start of `s` (1 to 4), or 0 when it is not one
/// (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short) or NUL.
[[nodiscard]] constexpr std::size_t utf8_sequence(std::string_view s) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(0);
  if (b0 == 0) return 0;
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) low = 0xA0;   // no overlong form
    if (b0 == 0xED) high = 0x9F;  // no surrogate
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) low = 0x90;   // no overlong form
    if (b0 == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < n; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  return n;
}

/// Whether the log keeps `text` as it is: valid UTF-8, no NUL, at most `max_stored_text` bytes.
[[nodiscard]] constexpr bool stored_as_is(std::string_view text) noexcept {
  if (text.size() > max_stored_text) return false;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence(text.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// `text` as the log keeps it: each byte that is not part of valid UTF-8, and each NUL, written
/// as `\xHH`; then cut to `max_stored_text` bytes at a character boundary, ending with
/// ` … [cut: N bytes in all]` (N the length of `text`). Text that is already valid UTF-8 without
/// NUL and short enough comes back unchanged, so a stored reason looked up again matches itself.
[[nodiscard]] inline std::string stored_text(std::string_view text) {
  if (stored_as_is(text)) return std::string(text);
  static constexpr char hex[] = "0123456789abcdef";
  const std::string marker = " … [cut: " + std::to_string(text.size()) + " bytes in all]";
  const std::size_t room = max_stored_text - marker.size();
  std::string out;
  out.reserve(std::min(text.size(), max_stored_text));
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence(text.substr(i));
    const std::size_t width = n == 0 ? 4 : n;
    if (out.size() + width > room) return out + marker;
    if (n == 0) {
      const auto b = static_cast<unsigned char>(text[i]);
      out += {'\\', 'x', hex[b >> 4], hex[b & 0xF]};
      i += 1;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

/// `stored_text(text)` without a copy when the log keeps `text` as it is: a view of `text`, or of
/// `buffer` holding the stored form.
[[nodiscard]] inline std::string_view stored_view(std::string_view text, std::string& buffer) {
  if (stored_as_is(text)) return text;
  buffer = stored_text(text);
  return buffer;
}

/// `query` with its reason and label filters as the log keeps such texts, so that a reason or
/// label given as it was first written finds the rows that keep it.
[[nodiscard]] inline RowQuery stored_query(RowQuery query) {
  if (query.reason) query.reason = stored_text(*query.reason);
  query.label_contains = stored_text(query.label_contains);
  return query;
}

/// The reason a release keeps: `reason` as stored text. A release that holds the key for a
/// back-off always keeps one: its history entry is how the takeover after the hold tells it
/// from a lease that ran out.
inline std::string held_reason(std::string_view reason, std::chrono::milliseconds hold) {
  if (reason.empty() && hold.count() > 0) return "a transient failure";
  return stored_text(reason);
}

}  // namespace detail
}  // namespace idemgate
