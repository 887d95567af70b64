// SPDX-License-Identifier: MIT
// Stripe webhook signatures: verification, replay window and signing.
#pragma once

/// Stripe webhook signatures (`Stripe-Signature: t=...,v1=...`): verification, replay window
/// and signing. Needs only OpenSSL.

#include "../detail/crypto/hex.hpp"
#include "../detail/crypto/hmac.hpp"
#include "verification.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace idemgate {

namespace detail {

/// What is wrong with an empty Stripe secret, and where to find the right one.
inline constexpr std::string_view empty_stripe_secret_message =
    "the Stripe webhook secret is empty; configure the endpoint's signing secret "
    "(\"whsec_...\", shown for each endpoint in the Stripe dashboard)";

/// The Stripe HMAC key: the whole secret string, `whsec_` included, or `std::invalid_argument`
/// when it is empty.
[[nodiscard]] inline std::string require_stripe_secret(std::string_view secret) {
  if (secret.empty())
    throw std::invalid_argument("idemgate: " + std::string(empty_stripe_secret_message));
  return std::string(secret);
}

/// The raw v1 signature of one delivery: HMAC-SHA256 over `timestamp.body`.
[[nodiscard]] inline HmacSha256::mac_type stripe_mac(std::string_view key,
                                                     std::string_view timestamp,
                                                     std::string_view body) {
  return hmac_sha256(key, {timestamp, ".", body});
}

/// Calls `visit(name, value)` for every comma-separated `name=value` item of a
/// `Stripe-Signature` value, spaces around items trimmed; items without `=` are skipped.
template <class Visit>
void for_each_stripe_item(std::string_view header, Visit&& visit) {
  while (!header.empty()) {
    const std::size_t comma = header.find(',');
    std::string_view item = header.substr(0, comma);
    header.remove_prefix(comma == std::string_view::npos ? header.size() : comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    const std::size_t equals = item.find('=');
    if (equals == std::string_view::npos) continue;
    visit(item.substr(0, equals), item.substr(equals + 1));
  }
}

/// Decodes 64 hex digits (either case) into a MAC; false for anything else.
[[nodiscard]] constexpr bool decode_hex_mac(std::string_view text,
                                            HmacSha256::mac_type& out) noexcept {
  return detail::decode_hex(text, out.data(), out.size());
}

/// Lowercase hex of a MAC, as Stripe sends it.
[[nodiscard]] inline std::string hex_mac(const HmacSha256::mac_type& mac) {
  std::string out;
  out.reserve(mac.size() * 2);
  detail::append_hex(out, {reinterpret_cast<const char*>(mac.data()), mac.size()});
  return out;
}

/// Verifies one delivery from its `Stripe-Signature` value under the secret `key`.
[[nodiscard]] inline WebhookVerification verify_stripe(std::string_view key,
                                                       const ReplayWindow& window,
                                                       std::optional<std::string_view> header,
                                                       std::string_view body) {
  if (!header || header->empty())
    return WebhookVerification::rejected(
        WebhookRejection::missing_header,
        "missing or empty header Stripe-Signature: not a Stripe delivery, or a proxy in front "
        "of this service dropped it");

  std::optional<std::string_view> timestamp;
  bool repeated_timestamp = false;
  for_each_stripe_item(*header, [&](std::string_view name, std::string_view value) {
    if (name != "t") return;
    repeated_timestamp = repeated_timestamp || timestamp.has_value();
    timestamp = value;
  });
  if (!timestamp)
    return WebhookVerification::rejected(WebhookRejection::malformed_timestamp,
                                         "Stripe-Signature has no t= element");
  // Which of two timestamps the signature covers would be ambiguous: refuse rather than pick.
  if (repeated_timestamp)
    return WebhookVerification::rejected(WebhookRejection::malformed_timestamp,
                                         "Stripe-Signature has more than one t= element");
  const std::optional<std::int64_t> seconds = parse_unix_seconds(*timestamp);
  if (!seconds)
    return WebhookVerification::rejected(
        WebhookRejection::malformed_timestamp,
        "Stripe-Signature t=" + quoted_excerpt(*timestamp) +
            " is not unix seconds (ASCII digits only, at most 2^63-1)");

  // Signature before window: `stale` and `future` then only describe genuine deliveries.
  const HmacSha256::mac_type expected = stripe_mac(key, *timestamp, body);
  std::size_t v1_entries = 0;
  bool matched = false;
  for_each_stripe_item(*header, [&](std::string_view name, std::string_view value) {
    if (matched || name != "v1") return;
    ++v1_entries;
    HmacSha256::mac_type candidate{};
    matched = decode_hex_mac(value, candidate) && mac_equal(candidate, expected);
  });
  if (!matched) {
    if (v1_entries == 0)
      return WebhookVerification::rejected(
          WebhookRejection::bad_signature,
          "Stripe-Signature has no v1 signature (v0 and other schemes are not accepted)");
    return WebhookVerification::rejected(
        WebhookRejection::bad_signature,
        "none of the " + std::to_string(v1_entries) +
            " v1 signatures matches: the secret is wrong (each endpoint has its own whsec_ "
            "secret), or the body was changed (verify the raw body bytes as received, before "
            "any parsing or re-encoding)");
  }
  return window.check({}, *seconds);
}

/// Verifies one delivery from any header source under the secret `key`.
template <header_source Headers>
[[nodiscard]] WebhookVerification verify_stripe_headers(std::string_view key,
                                                        const ReplayWindow& window,
                                                        const Headers& headers,
                                                        std::string_view body) {
  const auto& lookup = as_lookup(headers);
  const auto signature = find_header(lookup, "stripe-signature");
  return verify_stripe(key, window, signature.value(), body);
}

/// `t=<timestamp>,v1=<hex>` for one delivery under the secret `key`.
[[nodiscard]] inline std::string sign_stripe(std::string_view key, std::int64_t timestamp,
                                             std::string_view body) {
  if (timestamp < 0)
    throw std::invalid_argument("idemgate: webhook timestamp " + std::to_string(timestamp) +
                                " is negative; pass the current unix time in seconds");
  const std::string t = std::to_string(timestamp);
  return "t=" + t + ",v1=" + hex_mac(stripe_mac(key, t, body));
}

}  // namespace detail

/**
 * Verifies Stripe webhook deliveries for one endpoint secret, and signs them.
 *
 * A delivery passes when one `v1` entry of `Stripe-Signature: t=...,v1=...[,v1=...]` is the
 * lowercase hex HMAC-SHA256, keyed with the whole secret string (`whsec_` included, not
 * decoded), of `t + "." + body` (compared in constant time), and `t` is inside the replay
 * window. `v0` entries (test mode) are ignored. The body must be the raw bytes as received.
 * The header name is matched case-insensitively.
 *
 * Stripe sends no delivery id in its headers: `id()` of the result is empty, and the
 * idempotency key comes from the event's `id` inside the verified body.
 *
 * An empty secret throws `std::invalid_argument` from the constructor; `verify_stripe_webhook`
 * reports it as `unusable_secret` instead. Safe to share between threads when the injected
 * clock is.
 *
 * Example:
 *   idemgate::StripeWebhookVerifier verifier(std::getenv("STRIPE_WEBHOOK_SECRET"));
 *   auto verified = verifier.verify(request.headers, request.body);
 *   if (!verified) return respond(400, verified.message());
 *   auto key = idemgate::derive_key("payments.stripe", parse(request.body).id);
 */
class StripeWebhookVerifier {
 public:
  /// Keeps `secret` as the HMAC key; throws `std::invalid_argument` when it is empty, or when
  /// the tolerance is negative.
  explicit StripeWebhookVerifier(std::string_view secret, WebhookOptions options = {})
      : key_(detail::require_stripe_secret(secret)), window_(std::move(options)) {}

  /// Verifies a delivery from its headers (a `header_lookup` or a `header_list`) and raw body.
  template <header_source Headers>
  [[nodiscard]] WebhookVerification verify(const Headers& headers, std::string_view body) const {
    return detail::verify_stripe_headers(key_, window_, headers, body);
  }

  /// Verifies a delivery from its `Stripe-Signature` value and raw body.
  [[nodiscard]] WebhookVerification verify(std::string_view signature_header,
                                           std::string_view body) const {
    return detail::verify_stripe(key_, window_, signature_header, body);
  }

  /// The `Stripe-Signature` value (`t=<timestamp>,v1=<hex>`) Stripe would send for this body.
  /// Throws `std::invalid_argument` for a negative timestamp.
  [[nodiscard]] std::string sign(std::int64_t timestamp, std::string_view body) const {
    return detail::sign_stripe(key_, timestamp, body);
  }

  /// The replay window in use.
  [[nodiscard]] const ReplayWindow& window() const noexcept { return window_; }

 private:
  std::string key_;
  ReplayWindow window_;
};

/// Verifies one delivery under `secret`, reporting an empty secret as `unusable_secret`
/// instead of throwing (for secrets looked up per request, e.g. one per connected account).
template <header_source Headers>
[[nodiscard]] WebhookVerification verify_stripe_webhook(std::string_view secret,
                                                        const Headers& headers,
                                                        std::string_view body,
                                                        WebhookOptions options = {}) {
  if (secret.empty())
    return WebhookVerification::rejected(WebhookRejection::unusable_secret,
                                         std::string(detail::empty_stripe_secret_message));
  return detail::verify_stripe_headers(secret, ReplayWindow(std::move(options)), headers, body);
}

/// Verifies one delivery from its `Stripe-Signature` value under `secret`, reporting an empty
/// secret as `unusable_secret` instead of throwing.
[[nodiscard]] inline WebhookVerification verify_stripe_webhook(std::string_view secret,
                                                               std::string_view signature_header,
                                                               std::string_view body,
                                                               WebhookOptions options = {}) {
  if (secret.empty())
    return WebhookVerification::rejected(WebhookRejection::unusable_secret,
                                         std::string(detail::empty_stripe_secret_message));
  return detail::verify_stripe(secret, ReplayWindow(std::move(options)), signature_header, body);
}

/// The `Stripe-Signature` value (`t=<timestamp>,v1=<hex>`) for one delivery; throws
/// `std::invalid_argument` for an empty secret or a negative timestamp.
[[nodiscard]] inline std::string sign_stripe_webhook(std::string_view secret,
                                                     std::int64_t timestamp,
                                                     std::string_view body) {
  return detail::sign_stripe(detail::require_stripe_secret(secret), timestamp, body);
}

}  // namespace idemgate
