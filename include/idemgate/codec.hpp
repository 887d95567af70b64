// SPDX-License-Identifier: MIT
// How requests and outcomes become the bytes a store keeps, and back.
#pragma once

#include "errors.hpp"

#include <charconv>
#include <concepts>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace idemgate {

/**
 * How a request or outcome type becomes the bytes a store keeps, and back.
 *
 * Specialise it for your own types. `encode` must be canonical: the same value always gives the
 * same bytes, because the request's fingerprint (SHA-256 of these bytes) decides whether a
 * redelivery is a duplicate or a conflict.
 *
 * Example:
 *   struct SlotRequest {
 *     std::string container, window;
 *   };
 *   template <>
 *   struct idemgate::codec<SlotRequest> {
 *     static void encode(const SlotRequest& r, std::string& out) {
 *       out = r.container + '\n' + r.window;  // one value, one encoding
 *     }
 *     static SlotRequest decode(std::string_view in) {
 *       const auto split = in.find('\n');
 *       if (split == std::string_view::npos) throw idemgate::CodecError("no newline");
 *       return {std::string(in.substr(0, split)), std::string(in.substr(split + 1))};
 *     }
 *   };
 */
template <class T>
struct codec;

/// Concept: `codec<T>` can encode a `T` to bytes and decode it back.
template <class T>
concept codable = requires(const T& value, std::string& out, std::string_view in) {
  codec<T>::encode(value, out);
  { codec<T>::decode(in) } -> std::same_as<T>;
};

/// Strings are stored as they are.
template <>
struct codec<std::string> {
  /// Copies the string.
  static void encode(const std::string& value, std::string& out) { out.assign(value); }
  /// Copies the bytes.
  static std::string decode(std::string_view in) { return std::string(in); }
};

/// Integers are stored as decimal text.
template <std::integral T>
requires(!std::same_as<T, bool>) struct codec<T> {
  /// Writes the decimal digits.
  static void encode(T value, std::string& out) { out = std::to_string(value); }
  /// Parses the decimal digits; throws `CodecError` on anything else.
  static T decode(std::string_view in) {
    T value{};
    const auto [end, error] = std::from_chars(in.data(), in.data() + in.size(), value);
    if (error != std::errc() || end != in.data() + in.size())
      throw CodecError("idemgate: stored value \"" + std::string(in) + "\" is not an integer");
    return value;
  }
};

}  // namespace idemgate
