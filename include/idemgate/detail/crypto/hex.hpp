// SPDX-License-Identifier: MIT
// Lowercase hex encoding and hex decoding of bytes; includes nothing of idemgate.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace idemgate::detail {

/// The lowercase hex digits, by value.
inline constexpr char hex_digits[] = "0123456789abcdef";

/// Writes the two lowercase hex digits of `byte`, high first, to `out[0]` and `out[1]`.
constexpr void hex_pair(unsigned char byte, char* out) noexcept {
  out[0] = hex_digits[byte >> 4];
  out[1] = hex_digits[byte & 0x0f];
}

/// Appends `bytes` as lowercase hex digits, two per byte.
inline void append_hex(std::string& out, std::string_view bytes) {
  for (unsigned char byte : bytes) {
    out += hex_digits[byte >> 4];
    out += hex_digits[byte & 0x0f];
  }
}

/// The value of one hex digit (either case); -1 for anything else.
[[nodiscard]] constexpr int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Decodes `2 * size` hex digits (either case) into `out[0..size)`; false, with `out` partly
/// written, when `text` has another length or a character that is not a hex digit.
[[nodiscard]] constexpr bool decode_hex(std::string_view text, unsigned char* out,
                                        std::size_t size) noexcept {
  if (text.size() != size * 2) return false;
  for (std::size_t i = 0; i < size; ++i) {
    const int high = hex_value(text[2 * i]);
    const int low = hex_value(text[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    out[i] = static_cast<unsigned char>((high << 4) | low);
  }
  return true;
}

}  // namespace idemgate::detail
