// SPDX-License-Identifier: MIT
// Standard Webhooks signatures: verification, replay window and signing.
#pragma once

/// Standard Webhooks 1.0 (https://www.standardwebhooks.com): signature verification, replay
/// window and signing. Also accepts the `svix-` header names. Needs only OpenSSL.

#include "../detail/crypto/base64.hpp"
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

/// The prefix of Standard Webhooks secrets; the base64 key follows it.
inline constexpr std::string_view standard_secret_prefix = "whsec_";

/// The shortest key the Standard Webhooks specification allows for HMAC-SHA256 signing secrets:
/// "at least 24 bytes (192 bits)", counted after base64 decoding.
inline constexpr std::size_t standard_secret_min_bytes = 24;

/// What is wrong with a Standard Webhooks secret.
enum class StandardSecretProblem {
  none,        ///< Usable.
  empty,       ///< Nothing after the optional `whsec_` prefix.
  not_base64,  ///< A character outside standard base64, or `=` in the wrong place.
  inexact,     ///< Base64, but not exactly as encoded: padding missing or a character lost.
  too_short,   ///< Decodes to fewer than `standard_secret_min_bytes` bytes.
};

/// The base64 part of a secret: `secret` without its optional `whsec_` prefix.
[[nodiscard]] constexpr std::string_view standard_secret_base64(std::string_view secret) noexcept {
  if (secret.starts_with(standard_secret_prefix))
    secret.remove_prefix(standard_secret_prefix.size());
  return secret;
}

/// The HMAC key of a Standard Webhooks secret (`whsec_` + base64, prefix optional) and what is
/// wrong with the secret; the key is empty unless the problem is `none`.
///
/// The base64 must decode exactly: length a multiple of four with the `=` padding it needs and
/// zero unused bits (RFC 4648 sections 3.2 and 3.5), so a secret that lost a character when it
/// was copied is refused instead of silently becoming another key. The key must be at least
/// `standard_secret_min_bytes` long, as the specification requires.
[[nodiscard]] inline std::pair<std::string, StandardSecretProblem> decode_standard_secret_checked(
    std::string_view secret) {
  const std::string_view text = standard_secret_base64(secret);
  if (text.empty()) return {{}, StandardSecretProblem::empty};
  const std::size_t last_digit = text.find_last_not_of('=');
  const std::size_t digits = last_digit == std::string_view::npos ? 0 : last_digit + 1;
  if (digits == 0 || text.size() - digits > 2) return {{}, StandardSecretProblem::not_base64};
  for (std::size_t i = 0; i < digits; ++i)
    if (base64_value(text[i]) < 0) return {{}, StandardSecretProblem::not_base64};
  std::optional<std::string> key = base64_decode(text);
  if (!key || text.size() % 4 != 0 || base64_encode(*key) != text)
    return {{}, StandardSecretProblem::inexact};
  if (key->size() < standard_secret_min_bytes) return {{}, StandardSecretProblem::too_short};
  return {std::move(*key), StandardSecretProblem::none};
}

/// The HMAC key inside a Standard Webhooks secret, or nullopt when the secret is unusable (see
/// `decode_standard_secret_checked`).
[[nodiscard]] inline std::optional<std::string> decode_standard_secret(std::string_view secret) {
  auto [key, problem] = decode_standard_secret_checked(secret);
  if (problem != StandardSecretProblem::none) return std::nullopt;
  return std::move(key);
}

/// Why a secret is unusable, without ever repeating the secret itself.
[[nodiscard]] inline std::string unusable_standard_secret_message(std::string_view secret) {
  const std::string_view text = standard_secret_base64(secret);
  switch (decode_standard_secret_checked(secret).second) {
    case StandardSecretProblem::empty:
      return "the Standard Webhooks secret is empty; configure the endpoint's signing secret, "
             "\"whsec_\" followed by base64";
    case StandardSecretProblem::inexact:
      return "the Standard Webhooks secret does not decode exactly: its " +
             std::to_string(text.size()) +
             " base64 characters after \"whsec_\" are not a whole number of 4-character groups "
             "with the padding they need, so a character was probably lost or added when it was "
             "copied; copy the endpoint's signing secret again, whole";
    case StandardSecretProblem::too_short:
      return "the Standard Webhooks secret decodes to " +
             std::to_string(base64_decoded_size(text).value_or(0)) +
             " bytes, fewer than the 24 bytes (192 bits) the specification requires; generate a "
             "new endpoint secret at the sender (e.g. 32 random bytes, base64, after \"whsec_\")";
    case StandardSecretProblem::not_base64:
    case StandardSecretProblem::none:
      break;
  }
  return "the Standard Webhooks secret is not \"whsec_\" followed by standard base64 "
         "(A-Z a-z 0-9 + /, = padding); copy the endpoint's signing secret exactly as the sender "
         "shows it, without surrounding spaces or a trailing newline";
}

/// The HMAC key of a secret, or `std::invalid_argument` saying what is wrong with it.
[[nodiscard]] inline std::string require_standard_secret(std::string_view secret) {
  auto [key, problem] = decode_standard_secret_checked(secret);
  if (problem != StandardSecretProblem::none)
    throw std::invalid_argument("idemgate: " + unusable_standard_secret_message(secret));
  return std::move(key);
}

/// The raw v1 signature of one delivery: HMAC-SHA256 over `id.timestamp.body`.
[[nodiscard]] inline HmacSha256::mac_type standard_mac(std::string_view key, std::string_view id,
                                                       std::string_view timestamp,
                                                       std::string_view body) {
  return hmac_sha256(key, {id, ".", timestamp, ".", body});
}

/// Whether a `webhook-signature` value holds a v1 entry equal to `expected`; counts the v1
/// entries seen. Entries are space-separated `version,base64`; other versions are skipped.
[[nodiscard]] inline bool standard_signature_matches(std::string_view header,
                                                     const HmacSha256::mac_type& expected,
                                                     std::size_t& v1_entries) {
  v1_entries = 0;
  while (!header.empty()) {
    const std::size_t space = header.find(' ');
    const std::string_view entry = header.substr(0, space);
    header.remove_prefix(space == std::string_view::npos ? header.size() : space + 1);
    const std::size_t comma = entry.find(',');
    if (comma == std::string_view::npos || entry.substr(0, comma) != "v1") continue;
    ++v1_entries;
    HmacSha256::mac_type candidate{};
    const std::optional<std::size_t> size =
        base64_decode_into(entry.substr(comma + 1), candidate.data(), candidate.size());
    if (size == candidate.size() && mac_equal(candidate, expected)) return true;
  }
  return false;
}

/// Verifies one delivery under an already decoded key.
[[nodiscard]] inline WebhookVerification verify_standard(std::string_view key,
                                                         const ReplayWindow& window,
                                                         std::optional<std::string_view> id,
                                                         std::optional<std::string_view> timestamp,
                                                         std::optional<std::string_view> signature,
                                                         std::string_view body) {
  std::string missing;
  const auto note_missing = [&missing](const std::optional<std::string_view>& value,
                                       std::string_view name, std::string_view alternative) {
    if (value && !value->empty()) return;
    if (!missing.empty()) missing += ", ";
    missing.append(name).append(" (or ").append(alternative).append(")");
  };
  note_missing(id, "webhook-id", "svix-id");
  note_missing(timestamp, "webhook-timestamp", "svix-timestamp");
  note_missing(signature, "webhook-signature", "svix-signature");
  if (!missing.empty())
    return WebhookVerification::rejected(
        WebhookRejection::missing_header,
        "missing or empty header " + missing +
            ": not a Standard Webhooks delivery, or a proxy in front of this service dropped it");

  const std::optional<std::int64_t> seconds = parse_unix_seconds(*timestamp);
  if (!seconds)
    return WebhookVerification::rejected(
        WebhookRejection::malformed_timestamp,
        "webhook-timestamp " + quoted_excerpt(*timestamp) +
            " is not unix seconds (ASCII digits only, at most 2^63-1)");

  // The signature is checked before the window, so `stale` and `future` only ever describe
  // genuine deliveries (replays, clock skew) and every forgery reads `bad_signature`.
  std::size_t v1_entries = 0;
  if (!standard_signature_matches(*signature, standard_mac(key, *id, *timestamp, body),
                                  v1_entries)) {
    if (v1_entries == 0)
      return WebhookVerification::rejected(
          WebhookRejection::bad_signature,
          "webhook-signature has no v1 entry (expected space-separated \"v1,<base64>\")");
    return WebhookVerification::rejected(
        WebhookRejection::bad_signature,
        "none of the " + std::to_string(v1_entries) +
            " v1 signatures matches: the secret is wrong, or the body was changed (verify the "
            "raw body bytes as received, before any parsing or re-encoding)");
  }
  return window.check(*id, *seconds);
}

/// Verifies one delivery from any header source under an already decoded key.
template <header_source Headers>
[[nodiscard]] WebhookVerification verify_standard_headers(std::string_view key,
                                                          const ReplayWindow& window,
                                                          const Headers& headers,
                                                          std::string_view body) {
  // The found values own what the lookup returned; the views passed on point into them.
  const auto& lookup = as_lookup(headers);
  const auto id = find_header(lookup, "webhook-id", "svix-id");
  const auto timestamp = find_header(lookup, "webhook-timestamp", "svix-timestamp");
  const auto signature = find_header(lookup, "webhook-signature", "svix-signature");
  return verify_standard(key, window, id.value(), timestamp.value(), signature.value(), body);
}

/// `v1,<base64>` for one delivery under an already decoded key.
[[nodiscard]] inline std::string sign_standard(std::string_view key, std::string_view id,
                                               std::int64_t timestamp, std::string_view body) {
  if (timestamp < 0)
    throw std::invalid_argument("idemgate: webhook timestamp " + std::to_string(timestamp) +
                                " is negative; pass the current unix time in seconds");
  const HmacSha256::mac_type mac = standard_mac(key, id, std::to_string(timestamp), body);
  return "v1," + base64_encode(mac.data(), mac.size());
}

}  // namespace detail

/**
 * Verifies Standard Webhooks deliveries for one endpoint secret, and signs them.
 *
 * A delivery passes when one `v1` entry of `webhook-signature` is the HMAC-SHA256, under the
 * secret's key, of `webhook-id + "." + webhook-timestamp + "." + body` (compared in constant
 * time), and the timestamp is inside the replay window. The body must be the raw bytes as
 * received. Several space-separated signatures are allowed (key rotation); entries of other
 * versions are ignored. Header names are matched case-insensitively, and `svix-id`,
 * `svix-timestamp` and `svix-signature` are accepted where the `webhook-` names are absent.
 *
 * An unusable secret (empty, not base64, base64 that does not decode exactly, or a key shorter
 * than the specification's 24 bytes) throws `std::invalid_argument` from the constructor, so a
 * misconfigured service fails at startup instead of rejecting every delivery;
 * `verify_standard_webhook` reports it as `unusable_secret` instead, for secrets looked up per
 * request. Safe to share between threads when the injected clock is.
 *
 * Example:
 *   idemgate::StandardWebhookVerifier verifier(std::getenv("WEBHOOK_SECRET"));
 *   auto verified = verifier.verify(request.headers, request.body);
 *   if (!verified) return respond(400, verified.message());
 *   auto key = idemgate::derive_key("messages.webhook", verified.id());
 */
class StandardWebhookVerifier {
 public:
  /// Decodes `secret` (`whsec_` + base64, or the base64 alone); throws `std::invalid_argument`
  /// when it is unusable (empty, not exactly base64, under 24 bytes decoded) or when the
  /// tolerance is negative.
  explicit StandardWebhookVerifier(std::string_view secret, WebhookOptions options = {})
      : key_(detail::require_standard_secret(secret)), window_(std::move(options)) {}

  /// Verifies a delivery from its headers (a `header_lookup` or a `header_list`) and raw body.
  template <header_source Headers>
  [[nodiscard]] WebhookVerification verify(const Headers& headers, std::string_view body) const {
    return detail::verify_standard_headers(key_, window_, headers, body);
  }

  /// Verifies a delivery from the three header values and the raw body.
  [[nodiscard]] WebhookVerification verify(std::string_view id, std::string_view timestamp,
                                           std::string_view signature,
                                           std::string_view body) const {
    return detail::verify_standard(key_, window_, id, timestamp, signature, body);
  }

  /// The `webhook-signature` value (`v1,<base64>`) a sender attaches to this delivery.
  /// Throws `std::invalid_argument` for a negative timestamp.
  [[nodiscard]] std::string sign(std::string_view id, std::int64_t timestamp,
                                 std::string_view body) const {
    return detail::sign_standard(key_, id, timestamp, body);
  }

  /// The replay window in use.
  [[nodiscard]] const ReplayWindow& window() const noexcept { return window_; }

 private:
  std::string key_;
  ReplayWindow window_;
};

/// Verifies one delivery under `secret`, reporting an unusable secret as `unusable_secret`
/// instead of throwing (for secrets looked up per request, e.g. one per tenant).
template <header_source Headers>
[[nodiscard]] WebhookVerification verify_standard_webhook(std::string_view secret,
                                                          const Headers& headers,
                                                          std::string_view body,
                                                          WebhookOptions options = {}) {
  const std::optional<std::string> key = detail::decode_standard_secret(secret);
  if (!key)
    return WebhookVerification::rejected(WebhookRejection::unusable_secret,
                                         detail::unusable_standard_secret_message(secret));
  return detail::verify_standard_headers(*key, ReplayWindow(std::move(options)), headers, body);
}

/// Verifies one delivery from its three header values under `secret`, reporting an unusable
/// secret as `unusable_secret` instead of throwing.
[[nodiscard]] inline WebhookVerification verify_standard_webhook(
    std::string_view secret, std::string_view id, std::string_view timestamp,
    std::string_view signature, std::string_view body, WebhookOptions options = {}) {
  const std::optional<std::string> key = detail::decode_standard_secret(secret);
  if (!key)
    return WebhookVerification::rejected(WebhookRejection::unusable_secret,
                                         detail::unusable_standard_secret_message(secret));
  return detail::verify_standard(*key, ReplayWindow(std::move(options)), id, timestamp, signature,
                                 body);
}

/// The `webhook-signature` value (`v1,<base64>`) for one delivery; throws
/// `std::invalid_argument` for an unusable secret or a negative timestamp.
[[nodiscard]] inline std::string sign_standard_webhook(std::string_view secret, std::string_view id,
                                                       std::int64_t timestamp,
                                                       std::string_view body) {
  return detail::sign_standard(detail::require_standard_secret(secret), id, timestamp, body);
}

}  // namespace idemgate
