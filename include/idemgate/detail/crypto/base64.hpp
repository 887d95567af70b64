// SPDX-License-Identifier: MIT
// Base64 encoding and strict decoding; includes nothing of idemgate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::detail {

/// The standard base64 alphabet (RFC 4648 section 4), as used by webhook secrets and signatures.
inline constexpr std::string_view base64_alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes bytes as standard base64 with `=` padding.
[[nodiscard]] inline std::string base64_encode(const unsigned char* data, std::size_t size) {
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= size; i += 3) {
    const std::uint32_t group = (std::uint32_t{data[i]} << 16) | (std::uint32_t{data[i + 1]} << 8) |
                                std::uint32_t{data[i + 2]};
    out += base64_alphabet[(group >> 18) & 0x3f];
    out += base64_alphabet[(group >> 12) & 0x3f];
    out += base64_alphabet[(group >> 6) & 0x3f];
    out += base64_alphabet[group & 0x3f];
  }
  const std::size_t rest = size - i;
  if (rest != 0) {
    std::uint32_t group = std::uint32_t{data[i]} << 16;
    if (rest == 2) group |= std::uint32_t{data[i + 1]} << 8;
    out += base64_alphabet[(group >> 18) & 0x3f];
    out += base64_alphabet[(group >> 12) & 0x3f];
    out += rest == 2 ? base64_alphabet[(group >> 6) & 0x3f] : '=';
    out += '=';
  }
  return out;
}

/// Encodes a byte string as standard base64 with `=` padding.
[[nodiscard]] inline std::string base64_encode(std::string_view bytes) {
  return base64_encode(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

/// The 6-bit value of a base64 character, or -1 for anything outside the standard alphabet.
[[nodiscard]] constexpr int base64_value(char c) noexcept {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/// Number of bytes `text` decodes to, or nullopt when it is not standard base64.
///
/// Padding is optional, but when present it must complete the last group of four; whitespace,
/// URL-safe characters and a lone trailing character are rejected.
[[nodiscard]] constexpr std::optional<std::size_t> base64_decoded_size(
    std::string_view text) noexcept {
  std::size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  if (padding != 0 && text.size() % 4 != 0) return std::nullopt;
  const std::size_t digits = text.size() - padding;
  if (digits % 4 == 1) return std::nullopt;
  for (std::size_t i = 0; i < digits; ++i)
    if (base64_value(text[i]) < 0) return std::nullopt;
  return digits / 4 * 3 + (digits % 4 == 0 ? 0 : digits % 4 - 1);
}

/// Decodes standard base64 into `out`, which must hold `base64_decoded_size(text)` bytes.
/// Returns the number of bytes written, or nullopt when `text` is not base64 or `out` is too
/// small. Allocates nothing.
[[nodiscard]] inline std::optional<std::size_t> base64_decode_into(std::string_view text,
                                                                   unsigned char* out,
                                                                   std::size_t capacity) noexcept {
  const std::optional<std::size_t> size = base64_decoded_size(text);
  if (!size || *size > capacity) return std::nullopt;
  std::size_t written = 0;
  std::uint32_t group = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    group = (group << 6) | static_cast<std::uint32_t>(base64_value(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[written++] = static_cast<unsigned char>((group >> bits) & 0xff);
    }
  }
  return written;
}

/// Decodes standard base64 (padding optional); nullopt when `text` is not base64.
[[nodiscard]] inline std::optional<std::string> base64_decode(std::string_view text) {
  const std::optional<std::size_t> size = base64_decoded_size(text);
  if (!size) return std::nullopt;
  std::string out(*size, '\0');
  if (!base64_decode_into(text, reinterpret_cast<unsigned char*>(out.data()), out.size()))
    return std::nullopt;
  return out;
}

}  // namespace idemgate::detail
