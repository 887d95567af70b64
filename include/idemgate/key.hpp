// SPDX-License-Identifier: MIT
// Idempotency keys: SHA-256 over an unambiguous encoding of the upstream's fields.
#pragma once

#include "detail/crypto/hex.hpp"
#include "detail/crypto/sha256.hpp"
#include "errors.hpp"

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate {

/// An idempotency key: the 32 raw bytes of a SHA-256 digest.
///
/// Derive it with `derive_key` from what the upstream controls (an event id, a notification id,
/// the equipment number it is about), never from a queue's delivery or message id: a queue gives
/// every redelivery a new message id, so a key built from it deduplicates nothing.
class Key {
 public:
  /// Number of bytes in a key.
  static constexpr std::size_t size = 32;
  /// The raw bytes.
  using bytes_type = std::array<unsigned char, size>;
  /// Lowercase hex form, without terminator.
  using hex_type = std::array<char, size * 2>;

  /// The all-zero key; only useful as a placeholder.
  constexpr Key() noexcept = default;
  /// Wraps 32 raw bytes.
  constexpr explicit Key(const bytes_type& bytes) noexcept : bytes_(bytes) {}

  /// The raw bytes.
  [[nodiscard]] constexpr const bytes_type& bytes() const noexcept { return bytes_; }

  /// The raw bytes as a string view (for drivers that take byte strings).
  [[nodiscard]] std::string_view view() const noexcept {
    return {reinterpret_cast<const char*>(bytes_.data()), bytes_.size()};
  }

  /// Lowercase hex without allocating.
  [[nodiscard]] hex_type hex_chars() const noexcept {
    hex_type out{};
    for (std::size_t i = 0; i < size; ++i) detail::hex_pair(bytes_[i], &out[2 * i]);
    return out;
  }

  /// Lowercase hex, the form sent in `Idempotency-Key` headers and written to logs.
  [[nodiscard]] std::string hex() const {
    const hex_type chars = hex_chars();
    return {chars.data(), chars.size()};
  }

  /// Parses 64 hex digits (either case); nullopt for anything else.
  [[nodiscard]] static std::optional<Key> from_hex(std::string_view text) noexcept {
    bytes_type bytes{};
    if (!detail::decode_hex(text, bytes.data(), bytes.size())) return std::nullopt;
    return Key(bytes);
  }

  /// Keys are equal when their bytes are.
  friend constexpr bool operator==(const Key&, const Key&) noexcept = default;
  /// Keys order by their bytes, lexicographically (for ordered containers). Written out: not
  /// every standard library gives `std::array` a three-way comparison yet (libc++ 16 does not).
  friend constexpr std::strong_ordering operator<=>(const Key& a, const Key& b) noexcept {
    for (std::size_t i = 0; i < size; ++i)
      if (a.bytes_[i] != b.bytes_[i]) return a.bytes_[i] <=> b.bytes_[i];
    return std::strong_ordering::equal;
  }

 private:
  bytes_type bytes_{};
};

namespace detail {

inline void hash_length_prefixed(Sha256& hasher, std::string_view part) {
  // An 8-byte big-endian length before every part makes the encoding unambiguous:
  // ("a:b", "c") and ("a", "b:c") hash different byte strings.
  std::array<unsigned char, 8> length{};
  std::uint64_t n = part.size();
  for (int i = 7; i >= 0; --i) {
    length[static_cast<std::size_t>(i)] = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  hasher.update(length.data(), length.size());
  hasher.update(part);
}

[[noreturn]] inline void throw_empty_part(std::string_view scope, std::size_t index) {
  if (index == 0)
    throw KeyError(
        "idemgate: empty key scope; name the operation the key guards, e.g. \"ect.claim_slot\"");
  throw KeyError("idemgate: key part " + std::to_string(index) + " of scope \"" +
                 std::string(scope) +
                 "\" is empty; derive keys only from fields the upstream always sets "
                 "(e.g. its event or notification id), and reject events that lack them");
}

}  // namespace detail

/**
 * Derives the idempotency key of one upstream event.
 *
 * The key is SHA-256 over the scope and every part, each length-prefixed, so no two different
 * part lists share an encoding. Every part must be non-empty. Allocates nothing.
 *
 * Example:
 *   auto key = idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number);
 */
template <class... Parts>
requires(sizeof...(Parts) > 0 && (std::is_convertible_v<const Parts&, std::string_view> && ...))
    [[nodiscard]] Key derive_key(std::string_view scope, const Parts&... parts) {
  if (scope.empty()) detail::throw_empty_part(scope, 0);
  std::size_t index = 0;
  ((++index, std::string_view(parts).empty() ? detail::throw_empty_part(scope, index) : void()),
   ...);
  detail::Sha256& hasher = detail::thread_sha256();
  detail::hash_length_prefixed(hasher, scope);
  (detail::hash_length_prefixed(hasher, std::string_view(parts)), ...);
  return Key(hasher.finish());
}

/// Derives a key from a runtime list of parts; same encoding as the variadic form.
[[nodiscard]] inline Key derive_key_from(std::string_view scope,
                                         std::initializer_list<std::string_view> parts) {
  if (scope.empty()) detail::throw_empty_part(scope, 0);
  if (parts.size() == 0)
    throw KeyError("idemgate: no key parts for scope \"" + std::string(scope) +
                   "\"; pass the upstream's event id (and what the event is about)");
  std::size_t index = 0;
  for (std::string_view part : parts)
    if (++index, part.empty()) detail::throw_empty_part(scope, index);
  detail::Sha256& hasher = detail::thread_sha256();
  detail::hash_length_prefixed(hasher, scope);
  for (std::string_view part : parts) detail::hash_length_prefixed(hasher, part);
  return Key(hasher.finish());
}

/// A key with a readable label of the event it names (see `derive_labelled_key`).
struct LabelledKey {
  /// The key: the same as `derive_key` gives for the same scope and parts.
  Key key;
  /// The scope and the parts, separated by spaces, e.g.
  /// "ect.claim_slot CIS-2025-06-09-1001 MSKU7000037".
  std::string label;
};

/**
 * Derives the key of one upstream event, as `derive_key` does, and a readable label of it: the
 * scope and the parts, separated by spaces. The gate keeps the label with the event's row only
 * when `GateOptions::keep_labels` is on. Allocates the label; `derive_key` allocates nothing.
 *
 * Example:
 *   auto key = idemgate::derive_labelled_key("ect.claim_slot", n.notification_id,
 *                                            n.equipment_number);
 *   // key.key == idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number)
 */
template <class... Parts>
requires(sizeof...(Parts) > 0 && (std::is_convertible_v<const Parts&, std::string_view> && ...))
    [[nodiscard]] LabelledKey derive_labelled_key(std::string_view scope, const Parts&... parts) {
  LabelledKey labelled{derive_key(scope, parts...), std::string(scope)};
  ((labelled.label += ' ', labelled.label += std::string_view(parts)), ...);
  return labelled;
}

/// Hash functor for unordered containers keyed by `Key`.
struct KeyHash {
  /// The first 8 bytes of the digest are already uniformly distributed.
  std::size_t operator()(const Key& key) const noexcept {
    std::size_t h = 0;
    std::memcpy(&h, key.bytes().data(), sizeof(h));
    return h;
  }
};

}  // namespace idemgate

/// \cond
// Lets `Key` be used in `std::unordered_map` without naming `KeyHash`.
template <>
struct std::hash<idemgate::Key> : idemgate::KeyHash {};
/// \endcond
