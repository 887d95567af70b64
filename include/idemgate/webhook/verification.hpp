// SPDX-License-Identifier: MIT
// What the webhook verifiers share: rejections, results, replay window, headers.
#pragma once

/// What the webhook verifiers share: the rejection reasons, the verification result, the replay
/// window and the ways a caller can hand over request headers.

#include "../detail/crypto/hex.hpp"
#include "../detail/durations.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <ranges>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace idemgate {

/// Why a webhook delivery was refused at the signed edge.
enum class WebhookRejection {
  missing_header,       ///< A required header is absent or empty: not a delivery from this kind
                        ///< of sender, or a proxy dropped it.
  malformed_timestamp,  ///< The timestamp is not unix seconds (ASCII digits that fit in 64 bits).
  stale,                ///< Genuine signature, but the timestamp is older than the tolerance: a
                        ///< replay, or a delivery held up too long.
  future,               ///< Genuine signature, but the timestamp is further ahead than the
                        ///< tolerance: a clock is wrong.
  bad_signature,        ///< No signature of the verifier's scheme (v1, v1a) matches: forged,
                        ///< body altered, or wrong secret or public key.
  unusable_secret,      ///< The configured secret (or public key) is empty or does not decode:
                        ///< fix the configuration; the sender is not at fault.
};

/// The lowercase name of a rejection, as used in logs and metrics.
[[nodiscard]] constexpr std::string_view to_string(WebhookRejection reason) noexcept {
  switch (reason) {
    case WebhookRejection::missing_header:
      return "missing_header";
    case WebhookRejection::malformed_timestamp:
      return "malformed_timestamp";
    case WebhookRejection::stale:
      return "stale";
    case WebhookRejection::future:
      return "future";
    case WebhookRejection::bad_signature:
      return "bad_signature";
    case WebhookRejection::unusable_secret:
      return "unusable_secret";
  }
  return "unknown";
}

/**
 * What a webhook verifier answers: verified (with the delivery's id and timestamp) or rejected
 * (with a reason and a message an operator can act on). Rejections are values, not exceptions.
 *
 * Example:
 *   auto verified = verifier.verify(request.headers, request.body);
 *   if (!verified) return respond(400, verified.message());
 *   auto key = idemgate::derive_key("billing.webhook", verified.id());
 */
class WebhookVerification {
 public:
  /// A verified delivery.
  [[nodiscard]] static WebhookVerification verified(std::string id, std::int64_t timestamp) {
    WebhookVerification result;
    result.id_ = std::move(id);
    result.timestamp_ = timestamp;
    return result;
  }
  /// A rejected delivery.
  [[nodiscard]] static WebhookVerification rejected(WebhookRejection reason, std::string message) {
    WebhookVerification result;
    result.rejection_ = reason;
    result.message_ = std::move(message);
    return result;
  }

  /// Whether the signature is genuine and the timestamp inside the replay window.
  [[nodiscard]] bool ok() const noexcept { return !rejection_.has_value(); }
  /// Same as `ok()`.
  explicit operator bool() const noexcept { return ok(); }

  /// Why the delivery was rejected; throws `std::logic_error` when it was verified.
  [[nodiscard]] WebhookRejection rejection() const {
    if (!rejection_)
      throw std::logic_error(
          "idemgate: the webhook was verified, so there is no rejection; check ok() first");
    return *rejection_;
  }
  /// What went wrong and what to check, for logs and error responses; empty when verified.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

  /// The sender's delivery id (`webhook-id`), stable across retries: derive the idempotency key
  /// from it. Empty for Stripe, whose event id is inside the body. Throws `std::logic_error`
  /// when the delivery was rejected.
  [[nodiscard]] const std::string& id() const {
    require_verified("id");
    return id_;
  }
  /// The signed timestamp, unix seconds. Throws `std::logic_error` when rejected.
  [[nodiscard]] std::int64_t timestamp() const {
    require_verified("timestamp");
    return timestamp_;
  }

 private:
  WebhookVerification() = default;

  void require_verified(const char* what) const {
    if (rejection_)
      throw std::logic_error(std::string("idemgate: a webhook rejected as '") +
                             std::string(to_string(*rejection_)) + "' has no verified " + what +
                             "; check ok() first");
  }

  std::optional<WebhookRejection> rejection_;
  std::string message_;
  std::string id_;
  std::int64_t timestamp_ = 0;
};

/// The current unix time in whole seconds from the system clock.
[[nodiscard]] inline std::int64_t system_unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/**
 * How strict the replay window is, and where "now" comes from.
 *
 * Example:
 *   idemgate::WebhookOptions options;
 *   options.tolerance = std::chrono::seconds(60);
 *   options.clock = [] { return std::int64_t{1614265330}; };  // tests only
 *   idemgate::StandardWebhookVerifier verifier(secret, options);
 */
struct WebhookOptions {
  /// How far a signed timestamp may lie from now, in either direction; the edges pass. From 0
  /// to `max_tolerance`; a verifier refuses anything else with `std::invalid_argument`.
  std::chrono::seconds tolerance = std::chrono::seconds(300);
  /// Returns the current unix time in seconds; empty means the system clock. Tests inject a
  /// fixed clock here.
  std::function<std::int64_t()> clock;

  /// Longest `tolerance`. Senders sign every retry afresh, so a window of minutes suffices; a
  /// window longer than the idempotency log keeps its rows would let a replay through.
  static constexpr std::chrono::hours max_tolerance{24};
};

namespace detail {

/// A log-safe excerpt of an untrusted value for messages: quoted, control and non-ASCII
/// bytes escaped (so a value cannot forge log lines), cut after `limit` bytes.
[[nodiscard]] inline std::string quoted_excerpt(std::string_view value, std::size_t limit = 40) {
  std::string out = "\"";
  for (std::size_t i = 0; i < value.size() && i < limit; ++i) {
    const auto byte = static_cast<unsigned char>(value[i]);
    if (byte < 0x20 || byte >= 0x7f || byte == '"' || byte == '\\') {
      out += "\\x";
      char pair[2];
      hex_pair(byte, pair);
      out.append(pair, 2);
    } else {
      out += static_cast<char>(byte);
    }
  }
  out += value.size() > limit ? "\"..." : "\"";
  return out;
}

/// Parses unix seconds: one or more ASCII digits that fit in `std::int64_t`, nothing else (no
/// sign, no spaces, no fraction). Leading zeros are accepted.
[[nodiscard]] constexpr std::optional<std::int64_t> parse_unix_seconds(
    std::string_view text) noexcept {
  if (text.empty()) return std::nullopt;
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  std::int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    if (value > (max - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

/// ASCII case-insensitive equality, as HTTP header names compare.
[[nodiscard]] constexpr bool header_name_equal(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i];
    char y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

/// Concept: what a header lookup may return: empty-testable, and dereferencing to the value
/// (`std::optional<std::string_view>`, `std::optional<std::string>`, `const std::string*`).
template <class R>
concept header_value_result = std::default_initializable<R> && std::move_constructible<R> &&
    requires(const R& found) {
  static_cast<bool>(found);
  { *found } -> std::convertible_to<std::string_view>;
};

}  // namespace detail

/**
 * Concept: a callable that returns a request header's value by name, or nothing when absent.
 *
 * It is called with lowercase names ("webhook-id"); HTTP names are case-insensitive, and so
 * should the lookup be (every mainstream HTTP library's is). Owning results such as
 * `std::optional<std::string>` are kept alive for the whole verification.
 *
 * Example:
 *   auto lookup = [&](std::string_view name) -> std::optional<std::string_view> {
 *     auto it = request.headers.find(name);
 *     if (it == request.headers.end()) return std::nullopt;
 *     return it->second;
 *   };
 */
template <class F>
concept header_lookup = std::invocable<const F&, std::string_view> &&
    detail::header_value_result<std::decay_t<std::invoke_result_t<const F&, std::string_view>>>;

/// Concept: a container of (name, value) pairs, such as `std::map<std::string, std::string>`,
/// `std::multimap` or `std::vector<std::pair<std::string_view, std::string_view>>`; names are
/// matched case-insensitively, and the first match wins.
template <class R>
concept header_list = std::ranges::input_range<const R> &&
    std::is_lvalue_reference_v<std::ranges::range_reference_t<const R>> &&
    requires(std::ranges::range_reference_t<const R> entry) {
  { std::get<0>(entry) } -> std::convertible_to<std::string_view>;
  { std::get<1>(entry) } -> std::convertible_to<std::string_view>;
};

/// Concept: anything the verifiers accept as request headers: a lookup or a list of pairs.
template <class H>
concept header_source = header_lookup<H> || header_list<H>;

namespace detail {

/// A case-insensitive lookup over a list of (name, value) pairs.
template <header_list Headers>
[[nodiscard]] auto list_lookup(const Headers& headers) {
  return [&headers](std::string_view name) -> std::optional<std::string_view> {
    for (const auto& entry : headers)
      if (header_name_equal(std::string_view(std::get<0>(entry)), name))
        return std::string_view(std::get<1>(entry));
    return std::nullopt;
  };
}

/// A header source as a lookup: a lookup as it is, a list wrapped in `list_lookup`.
template <header_source Headers>
[[nodiscard]] decltype(auto) as_lookup(const Headers& headers) {
  if constexpr (header_lookup<Headers>)
    return (headers);
  else
    return list_lookup(headers);
}

/// What a lookup returned for a header name and its alternative name (e.g. `svix-id` for
/// `webhook-id`), held so that the views into it stay valid while the delivery is verified.
template <class Lookup>
struct FoundHeader {
  using result_type = std::decay_t<std::invoke_result_t<const Lookup&, std::string_view>>;

  result_type primary{};
  result_type alternative{};

  /// The value under the primary name, else under the alternative name, else nothing.
  [[nodiscard]] std::optional<std::string_view> value() const {
    if (primary) return std::string_view(*primary);
    if (alternative) return std::string_view(*alternative);
    return std::nullopt;
  }
};

/// Looks a header up under `name`, then under `alternative` when that is not empty.
template <header_lookup Lookup>
[[nodiscard]] FoundHeader<Lookup> find_header(const Lookup& lookup, std::string_view name,
                                              std::string_view alternative = {}) {
  FoundHeader<Lookup> found{lookup(name), {}};
  if (!found.primary && !alternative.empty()) found.alternative = lookup(alternative);
  return found;
}

}  // namespace detail

/**
 * The replay window: a signed timestamp passes when it lies within `tolerance` of now, in
 * either direction, both edges included. Shared by every verifier.
 */
class ReplayWindow {
 public:
  /// Throws `std::invalid_argument` for a tolerance outside 0 to
  /// `WebhookOptions::max_tolerance`.
  explicit ReplayWindow(WebhookOptions options = {})
      : tolerance_(options.tolerance), clock_(std::move(options.clock)) {
    detail::require_in_range("WebhookOptions::tolerance", tolerance_, std::chrono::seconds(0),
                             WebhookOptions::max_tolerance,
                             "It is how far a signed timestamp may lie from now (default 300 s).");
    if (!clock_) clock_ = system_unix_seconds;
  }

  /// How far a timestamp may lie from now, in either direction.
  [[nodiscard]] std::chrono::seconds tolerance() const noexcept { return tolerance_; }
  /// The current unix time in seconds, from the configured clock.
  [[nodiscard]] std::int64_t now() const { return clock_(); }

  /// Verified (with `id` and `timestamp`) when `timestamp` is inside the window, otherwise
  /// rejected as `stale` or `future`.
  [[nodiscard]] WebhookVerification check(std::string_view id, std::int64_t timestamp) const {
    const std::int64_t current = now();
    // Unsigned differences are exact here: any two int64 values differ by less than 2^64.
    const auto limit = static_cast<std::uint64_t>(tolerance_.count());
    if (timestamp < current) {
      const std::uint64_t age =
          static_cast<std::uint64_t>(current) - static_cast<std::uint64_t>(timestamp);
      if (age > limit)
        return WebhookVerification::rejected(
            WebhookRejection::stale,
            "webhook timestamp " + std::to_string(timestamp) + " is " + std::to_string(age) +
                " s old, beyond the " + std::to_string(limit) +
                " s tolerance: a replayed or long-delayed delivery; if every delivery is stale, "
                "check this host's clock");
    } else if (timestamp > current) {
      const std::uint64_t ahead =
          static_cast<std::uint64_t>(timestamp) - static_cast<std::uint64_t>(current);
      if (ahead > limit)
        return WebhookVerification::rejected(
            WebhookRejection::future,
            "webhook timestamp " + std::to_string(timestamp) + " is " + std::to_string(ahead) +
                " s ahead of this host's clock, beyond the " + std::to_string(limit) +
                " s tolerance; check the clocks of the sender and of this host");
    }
    return WebhookVerification::verified(std::string(id), timestamp);
  }

 private:
  std::chrono::seconds tolerance_;
  std::function<std::int64_t()> clock_;
};

}  // namespace idemgate
