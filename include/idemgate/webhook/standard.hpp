// SPDX-License-Identifier: MIT
// Standard Webhooks signatures: verification, replay window and signing.
#pragma once

/// Standard Webhooks 1.0 (https://www.standardwebhooks.com): signature verification, replay
/// window and signing. `StandardWebhookVerifier` checks symmetric `v1` signatures (HMAC-SHA256,
/// `whsec_` secrets), `StandardWebhookEd25519Verifier` asymmetric `v1a` ones (Ed25519, `whpk_`
/// public keys). Also accepts the `svix-` header names. Needs only OpenSSL.

#include "../detail/crypto/base64.hpp"
#include "../detail/crypto/ed25519.hpp"
#include "../detail/crypto/hmac.hpp"
#include "verification.hpp"

#include <algorithm>
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

/// The bytes of `text` when it is standard base64 exactly as an encoder writes it: length a
/// multiple of four with the `=` padding it needs and zero unused bits (RFC 4648 sections 3.2
/// and 3.5). The problem is `none`, `empty`, `not_base64` or `inexact`; the bytes are empty
/// unless it is `none`.
[[nodiscard]] inline std::pair<std::string, StandardSecretProblem> decode_exact_base64(
    std::string_view text) {
  if (text.empty()) return {{}, StandardSecretProblem::empty};
  const std::size_t last_digit = text.find_last_not_of('=');
  const std::size_t digits = last_digit == std::string_view::npos ? 0 : last_digit + 1;
  if (digits == 0 || text.size() - digits > 2) return {{}, StandardSecretProblem::not_base64};
  for (std::size_t i = 0; i < digits; ++i)
    if (base64_value(text[i]) < 0) return {{}, StandardSecretProblem::not_base64};
  std::optional<std::string> bytes = base64_decode(text);
  if (!bytes || text.size() % 4 != 0 || base64_encode(*bytes) != text)
    return {{}, StandardSecretProblem::inexact};
  return {std::move(*bytes), StandardSecretProblem::none};
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
  auto [key, problem] = decode_exact_base64(standard_secret_base64(secret));
  if (problem != StandardSecretProblem::none) return {{}, problem};
  if (key.size() < standard_secret_min_bytes) return {{}, StandardSecretProblem::too_short};
  return {std::move(key), StandardSecretProblem::none};
}

/// The HMAC key inside a Standard Webhooks secret, or nullopt when the secret is unusable (see
/// `decode_standard_secret_checked`).
[[nodiscard]] inline std::optional<std::string> decode_standard_secret(std::string_view secret) {
  auto [key, problem] = decode_standard_secret_checked(secret);
  if (problem != StandardSecretProblem::none) return std::nullopt;
  return std::move(key);
}

/// Why a secret is unusable, without ever repeating the secret itself: what is wrong (nothing
/// after the prefix, not base64, not exactly as encoded, too short), whether the `whsec_` prefix
/// was there, and what to do.
[[nodiscard]] inline std::string unusable_standard_secret_message(std::string_view secret) {
  const bool prefixed = secret.starts_with(standard_secret_prefix);
  const std::string_view text = standard_secret_base64(secret);
  // Where the base64 was read from: after the prefix, or the whole secret when it has none.
  const std::string read = std::to_string(text.size()) +
                           (prefixed ? " base64 characters after \"whsec_\""
                                     : " characters (the secret has no \"whsec_\" prefix, so all "
                                       "of it was read as base64)");
  const std::string_view copy_again =
      prefixed ? "copy the endpoint's signing secret again, whole"
               : "give the endpoint's signing secret exactly as the sender shows it, \"whsec_\" "
                 "followed by base64";
  switch (decode_standard_secret_checked(secret).second) {
    case StandardSecretProblem::empty:
      return prefixed ? "the Standard Webhooks secret has nothing after its \"whsec_\" prefix; "
                        "configure the endpoint's signing secret whole, \"whsec_\" followed by "
                        "base64"
                      : "the Standard Webhooks secret is empty; configure the endpoint's signing "
                        "secret, \"whsec_\" followed by base64";
    case StandardSecretProblem::inexact:
      return "the Standard Webhooks secret does not decode exactly: its " + read +
             " are not a whole number of 4-character groups with the padding they need, so a "
             "character was probably lost or added when it was copied; " +
             std::string(copy_again);
    case StandardSecretProblem::too_short:
      return "the Standard Webhooks secret decodes to " +
             std::to_string(base64_decoded_size(text).value_or(0)) + " bytes (from its " + read +
             "), fewer than the 24 bytes (192 bits) the specification requires; " +
             (prefixed ? std::string("generate a new endpoint secret at the sender (e.g. 32 random "
                                     "bytes, base64, after \"whsec_\")")
                       : std::string(copy_again) +
                             " (or generate a new one: 32 random bytes, base64, after \"whsec_\")");
    case StandardSecretProblem::not_base64:
    case StandardSecretProblem::none:
      break;
  }
  if (secret.starts_with("whpk_") || secret.starts_with("whsk_"))
    return "the Standard Webhooks secret is an Ed25519 key (\"" + std::string(secret.substr(0, 5)) +
           "\"), not a \"whsec_\" HMAC secret; verify v1a deliveries with "
           "StandardWebhookEd25519Verifier and the sender's \"whpk_\" public key, or give this "
           "verifier the endpoint's \"whsec_\" secret";
  if (prefixed)
    return "the Standard Webhooks secret is not standard base64 after \"whsec_\" (A-Z a-z 0-9 + /, "
           "= padding); copy the endpoint's signing secret exactly as the sender shows it, "
           "without surrounding spaces or a trailing newline";
  return "the Standard Webhooks secret does not start with \"whsec_\" and is not standard base64 "
         "either (A-Z a-z 0-9 + /, = padding); give the endpoint's signing secret exactly as the "
         "sender shows it, \"whsec_\" followed by base64, without surrounding spaces or a "
         "trailing newline";
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

/// The next space-separated entry of a `webhook-signature` value, removed from `header`, split
/// at its first comma into version and signature (a missing comma leaves the version whole).
[[nodiscard]] constexpr std::pair<std::string_view, std::string_view> next_standard_entry(
    std::string_view& header) noexcept {
  const std::size_t space = header.find(' ');
  const std::string_view entry = header.substr(0, space);
  header.remove_prefix(space == std::string_view::npos ? header.size() : space + 1);
  const std::size_t comma = entry.find(',');
  if (comma == std::string_view::npos) return {entry, {}};
  return {entry.substr(0, comma), entry.substr(comma + 1)};
}

/// How many entries of `version` (`v1`, `v1a`) a `webhook-signature` value holds.
[[nodiscard]] constexpr std::size_t count_standard_entries(std::string_view header,
                                                           std::string_view version) noexcept {
  std::size_t count = 0;
  while (!header.empty()) {
    const std::string_view entry = header.substr(0, header.find(' '));
    if (entry.size() > version.size() && entry.starts_with(version) && entry[version.size()] == ',')
      ++count;
    header.remove_prefix(std::min(header.size(), entry.size() + 1));
  }
  return count;
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

/// Why no v1 entry of `signature` is the HMAC of the delivery under `key`, or nothing when one
/// is.
[[nodiscard]] inline std::optional<std::string> standard_v1_signature_error(
    std::string_view key, std::string_view id, std::string_view timestamp,
    std::string_view signature, std::string_view body) {
  std::size_t v1_entries = 0;
  if (standard_signature_matches(signature, standard_mac(key, id, timestamp, body), v1_entries))
    return std::nullopt;
  if (v1_entries == 0 && count_standard_entries(signature, "v1a") != 0)
    return "webhook-signature has no v1 entry, only v1a (Ed25519) signatures: the sender signs "
           "with an asymmetric key; verify its deliveries with StandardWebhookEd25519Verifier and "
           "the sender's \"whpk_\" public key instead of a \"whsec_\" secret";
  if (v1_entries == 0)
    return "webhook-signature has no v1 entry (expected space-separated \"v1,<base64>\")";
  return "none of the " + std::to_string(v1_entries) +
         " v1 signatures matches: the secret is wrong, or the body was changed (verify the raw "
         "body bytes as received, before any parsing or re-encoding)";
}

/**
 * Verifies one delivery: the three headers present, the timestamp unix seconds, then the
 * signature, then the replay window. `signature_error(id, timestamp, signature, body)` returns
 * why no signature of the header is genuine, or nothing when one is.
 */
template <class SignatureError>
[[nodiscard]] WebhookVerification verify_standard_with(const ReplayWindow& window,
                                                       std::optional<std::string_view> id,
                                                       std::optional<std::string_view> timestamp,
                                                       std::optional<std::string_view> signature,
                                                       std::string_view body,
                                                       const SignatureError& signature_error) {
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
  if (std::optional<std::string> why = signature_error(*id, *timestamp, *signature, body))
    return WebhookVerification::rejected(WebhookRejection::bad_signature, std::move(*why));
  return window.check(*id, *seconds);
}

/// Verifies one delivery's v1 signatures under an already decoded key.
[[nodiscard]] inline WebhookVerification verify_standard(std::string_view key,
                                                         const ReplayWindow& window,
                                                         std::optional<std::string_view> id,
                                                         std::optional<std::string_view> timestamp,
                                                         std::optional<std::string_view> signature,
                                                         std::string_view body) {
  return verify_standard_with(
      window, id, timestamp, signature, body,
      [key](std::string_view i, std::string_view t, std::string_view s, std::string_view b) {
        return standard_v1_signature_error(key, i, t, s, b);
      });
}

/// Looks up the three Standard Webhooks headers (or their `svix-` names) in any header source
/// and hands their values to `verify(id, timestamp, signature)`.
template <header_source Headers, class Verify>
[[nodiscard]] WebhookVerification with_standard_headers(const Headers& headers,
                                                        const Verify& verify) {
  // The found values own what the lookup returned; the views passed on point into them.
  const auto& lookup = as_lookup(headers);
  const auto id = find_header(lookup, "webhook-id", "svix-id");
  const auto timestamp = find_header(lookup, "webhook-timestamp", "svix-timestamp");
  const auto signature = find_header(lookup, "webhook-signature", "svix-signature");
  return verify(id.value(), timestamp.value(), signature.value());
}

/// Verifies one delivery from any header source under an already decoded key.
template <header_source Headers>
[[nodiscard]] WebhookVerification verify_standard_headers(std::string_view key,
                                                          const ReplayWindow& window,
                                                          const Headers& headers,
                                                          std::string_view body) {
  return with_standard_headers(headers, [&](auto id, auto timestamp, auto signature) {
    return verify_standard(key, window, id, timestamp, signature, body);
  });
}

// --- v1a: Ed25519 ---------------------------------------------------------------------------

/// The prefix of Standard Webhooks Ed25519 public keys; the base64 of the raw key follows it.
inline constexpr std::string_view standard_public_key_prefix = "whpk_";
/// The prefix of Standard Webhooks Ed25519 signing (private) keys, which only the sender holds.
inline constexpr std::string_view standard_signing_key_prefix = "whsk_";

/// Most v1a entries one delivery may carry. A sender signs with one key, two while it rotates;
/// each entry costs an Ed25519 verification, so a header stuffed with entries is refused before
/// any of them is checked.
inline constexpr std::size_t standard_max_v1a_entries = 8;

/// What is wrong with a Standard Webhooks public key.
enum class StandardPublicKeyProblem {
  none,              ///< Usable.
  empty,             ///< Nothing at all.
  signing_key,       ///< A `whsk_` signing key: the sender's secret, never the receiver's.
  symmetric_secret,  ///< A `whsec_` secret: it verifies v1, not v1a.
  missing_prefix,    ///< Does not start with `whpk_`.
  not_base64,        ///< A character outside standard base64 after `whpk_`.
  inexact,           ///< Base64, but not exactly as encoded.
  wrong_length,      ///< Decodes to something other than the 32 bytes of an Ed25519 key.
};

/// The raw Ed25519 key of a Standard Webhooks public key (`whpk_` + base64 of the 32-byte key,
/// prefix required, base64 exact) and what is wrong with it; the key is zero unless the problem
/// is `none`. The prefix is required so that a `whsec_` secret or a `whsk_` signing key given by
/// mistake is refused instead of being read as a public key.
[[nodiscard]] inline std::pair<Ed25519PublicKey::key_type, StandardPublicKeyProblem>
decode_standard_public_key_checked(std::string_view text) {
  Ed25519PublicKey::key_type key{};
  if (text.empty()) return {key, StandardPublicKeyProblem::empty};
  if (text.starts_with(standard_signing_key_prefix))
    return {key, StandardPublicKeyProblem::signing_key};
  if (text.starts_with(standard_secret_prefix))
    return {key, StandardPublicKeyProblem::symmetric_secret};
  if (!text.starts_with(standard_public_key_prefix))
    return {key, StandardPublicKeyProblem::missing_prefix};
  text.remove_prefix(standard_public_key_prefix.size());
  const auto [bytes, problem] = decode_exact_base64(text);
  switch (problem) {
    case StandardSecretProblem::none:
      break;
    case StandardSecretProblem::empty:
      return {key, StandardPublicKeyProblem::empty};
    case StandardSecretProblem::inexact:
      return {key, StandardPublicKeyProblem::inexact};
    case StandardSecretProblem::not_base64:
    case StandardSecretProblem::too_short:
      return {key, StandardPublicKeyProblem::not_base64};
  }
  if (bytes.size() != key.size()) return {key, StandardPublicKeyProblem::wrong_length};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<unsigned char>(bytes[i]);
  return {key, StandardPublicKeyProblem::none};
}

/// Why a public key is unusable, without ever repeating the key (it may be a secret given by
/// mistake).
[[nodiscard]] inline std::string unusable_standard_public_key_message(std::string_view text) {
  std::string_view base64 = text;
  if (base64.starts_with(standard_public_key_prefix))
    base64.remove_prefix(standard_public_key_prefix.size());
  switch (decode_standard_public_key_checked(text).second) {
    case StandardPublicKeyProblem::empty:
      return "the Standard Webhooks public key is empty; configure the sender's Ed25519 public "
             "key, \"whpk_\" followed by base64";
    case StandardPublicKeyProblem::signing_key:
      return "a Standard Webhooks signing key (\"whsk_\") was given where the public key "
             "(\"whpk_\") belongs; the signing key is the sender's secret and must never reach a "
             "receiver: configure the sender's \"whpk_\" public key, and have the sender rotate "
             "its signing key if it was copied out";
    case StandardPublicKeyProblem::symmetric_secret:
      return "a Standard Webhooks symmetric secret (\"whsec_\") was given to the Ed25519 (v1a) "
             "verifier; verify v1 signatures with StandardWebhookVerifier and that secret, or "
             "configure the sender's \"whpk_\" public key here";
    case StandardPublicKeyProblem::missing_prefix:
      return "the Standard Webhooks public key does not start with \"whpk_\"; copy the sender's "
             "Ed25519 public key exactly as it shows it, \"whpk_\" followed by the base64 of the "
             "32-byte key";
    case StandardPublicKeyProblem::inexact:
      return "the Standard Webhooks public key does not decode exactly: its " +
             std::to_string(base64.size()) +
             " base64 characters after \"whpk_\" are not a whole number of 4-character groups "
             "with the padding they need, so a character was probably lost or added when it was "
             "copied; copy the sender's public key again, whole";
    case StandardPublicKeyProblem::wrong_length:
      return "the Standard Webhooks public key decodes to " +
             std::to_string(base64_decoded_size(base64).value_or(0)) +
             " bytes, but an Ed25519 public key is exactly 32 bytes (44 base64 characters after "
             "\"whpk_\"); copy the sender's public key again, whole (not a certificate, a PEM or "
             "DER key, or a signature)";
    case StandardPublicKeyProblem::not_base64:
    case StandardPublicKeyProblem::none:
      break;
  }
  return "the Standard Webhooks public key is not \"whpk_\" followed by standard base64 (A-Z a-z "
         "0-9 + /, = padding); copy the sender's public key exactly as it shows it, without "
         "surrounding spaces or a trailing newline";
}

/// The Ed25519 key of a Standard Webhooks public key, or `std::invalid_argument` saying what is
/// wrong with it.
[[nodiscard]] inline Ed25519PublicKey require_standard_public_key(std::string_view text) {
  const auto [key, problem] = decode_standard_public_key_checked(text);
  if (problem != StandardPublicKeyProblem::none)
    throw std::invalid_argument("idemgate: " + unusable_standard_public_key_message(text));
  return Ed25519PublicKey(key);
}

/// Why no v1a entry of `signature` is a valid Ed25519 signature of the delivery under `key`,
/// or nothing when one is. v1 (HMAC) entries are never accepted here, whatever they hold.
[[nodiscard]] inline std::optional<std::string> standard_v1a_signature_error(
    const Ed25519PublicKey& key, std::string_view id, std::string_view timestamp,
    std::string_view signature, std::string_view body) {
  const std::size_t entries = count_standard_entries(signature, "v1a");
  if (entries == 0 && count_standard_entries(signature, "v1") != 0)
    return "webhook-signature has no v1a entry, only v1 (HMAC-SHA256) signatures: this endpoint "
           "is configured with an Ed25519 public key and never accepts v1; have the sender sign "
           "with its Ed25519 key (v1a), or verify with StandardWebhookVerifier and the endpoint's "
           "\"whsec_\" secret";
  if (entries == 0)
    return "webhook-signature has no v1a entry (expected space-separated \"v1a,<base64>\")";
  if (entries > standard_max_v1a_entries)
    return "webhook-signature carries " + std::to_string(entries) + " v1a entries, more than " +
           std::to_string(standard_max_v1a_entries) +
           " (a sender signs with one key, two while it rotates); none was checked";

  std::string message;
  message.reserve(id.size() + timestamp.size() + body.size() + 2);
  message.append(id).append(".").append(timestamp).append(".").append(body);
  std::size_t malformed = 0;
  while (!signature.empty()) {
    const auto [version, value] = next_standard_entry(signature);
    if (version != "v1a") continue;
    Ed25519PublicKey::signature_type candidate{};
    const std::optional<std::size_t> size =
        base64_decode_into(value, candidate.data(), candidate.size());
    if (size != candidate.size()) {
      ++malformed;
      continue;
    }
    if (key.verify(candidate, message)) return std::nullopt;
  }
  if (malformed == entries)
    return "none of the " + std::to_string(entries) +
           " v1a entries is a 64-byte Ed25519 signature in standard base64 (88 characters with "
           "padding): the header was cut or altered on its way, or the sender does not sign v1a "
           "as Standard Webhooks defines it";
  return "none of the " + std::to_string(entries) + " v1a signatures verifies" +
         (malformed == 0 ? std::string()
                         : " (" + std::to_string(malformed) + " of them not even decodable)") +
         ": the configured \"whpk_\" public key is not the sender's, or the body was changed "
         "(verify the raw body bytes as received, before any parsing or re-encoding)";
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
 * versions are ignored (`v1a` ones included: Ed25519 deliveries are for
 * `StandardWebhookEd25519Verifier`). Header names are matched case-insensitively, and `svix-id`,
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

/**
 * Verifies Standard Webhooks deliveries signed with Ed25519 (`v1a`) under one sender public key.
 *
 * A delivery passes when one `v1a` entry of `webhook-signature` is a valid Ed25519 signature,
 * under the configured public key, of `webhook-id + "." + webhook-timestamp + "." + body`, and
 * the timestamp is inside the replay window. As with `StandardWebhookVerifier`, the body must
 * be the raw bytes as received, several space-separated signatures are allowed (key rotation;
 * at most `detail::standard_max_v1a_entries` v1a entries), entries of other versions are
 * ignored, and the `svix-` header names are accepted. `v1` (HMAC) entries are never accepted by
 * this verifier, and `v1a` entries never by `StandardWebhookVerifier`: the algorithm is the
 * endpoint's configuration, never the sender's choice. Ed25519 verification works on public
 * values only, so it needs no constant-time comparison; OpenSSL does it.
 *
 * The public key is `whpk_` followed by the standard base64 of the raw 32-byte key, exactly as
 * encoded. An unusable key (empty, without `whpk_`, a `whsec_` secret or a `whsk_` signing key,
 * not exactly base64, not 32 bytes) throws `std::invalid_argument` from the constructor;
 * `verify_standard_webhook_ed25519` reports it as `unusable_secret` instead, for keys looked up
 * per request. Safe to share between threads when the injected clock is.
 *
 * Example:
 *   idemgate::StandardWebhookEd25519Verifier verifier(std::getenv("WEBHOOK_PUBLIC_KEY"));
 *   auto verified = verifier.verify(request.headers, request.body);  // whpk_…
 *   if (!verified) return respond(400, verified.message());
 *   auto key = idemgate::derive_key("messages.webhook", verified.id());
 */
class StandardWebhookEd25519Verifier {
 public:
  /// Decodes `public_key` (`whpk_` + base64 of 32 bytes); throws `std::invalid_argument` when it
  /// is unusable or when the tolerance is out of range.
  explicit StandardWebhookEd25519Verifier(std::string_view public_key, WebhookOptions options = {})
      : key_(detail::require_standard_public_key(public_key)), window_(std::move(options)) {}

  /// Verifies a delivery from its headers (a `header_lookup` or a `header_list`) and raw body.
  template <header_source Headers>
  [[nodiscard]] WebhookVerification verify(const Headers& headers, std::string_view body) const {
    return detail::with_standard_headers(headers, [&](auto id, auto timestamp, auto signature) {
      return verify_values(id, timestamp, signature, body);
    });
  }

  /// Verifies a delivery from the three header values and the raw body.
  [[nodiscard]] WebhookVerification verify(std::string_view id, std::string_view timestamp,
                                           std::string_view signature,
                                           std::string_view body) const {
    return verify_values(id, timestamp, signature, body);
  }

  /// The replay window in use.
  [[nodiscard]] const ReplayWindow& window() const noexcept { return window_; }

 private:
  [[nodiscard]] WebhookVerification verify_values(std::optional<std::string_view> id,
                                                  std::optional<std::string_view> timestamp,
                                                  std::optional<std::string_view> signature,
                                                  std::string_view body) const {
    return detail::verify_standard_with(
        window_, id, timestamp, signature, body,
        [this](std::string_view i, std::string_view t, std::string_view s, std::string_view b) {
          return detail::standard_v1a_signature_error(key_, i, t, s, b);
        });
  }

  detail::Ed25519PublicKey key_;
  ReplayWindow window_;
};

/// Verifies one v1a delivery under `public_key` (`whpk_`…), reporting an unusable key as
/// `unusable_secret` instead of throwing (for keys looked up per request, e.g. one per sender).
template <header_source Headers>
[[nodiscard]] WebhookVerification verify_standard_webhook_ed25519(std::string_view public_key,
                                                                  const Headers& headers,
                                                                  std::string_view body,
                                                                  WebhookOptions options = {}) {
  if (detail::decode_standard_public_key_checked(public_key).second !=
      detail::StandardPublicKeyProblem::none)
    return WebhookVerification::rejected(WebhookRejection::unusable_secret,
                                         detail::unusable_standard_public_key_message(public_key));
  return StandardWebhookEd25519Verifier(public_key, std::move(options)).verify(headers, body);
}

/// Verifies one v1a delivery from its three header values under `public_key` (`whpk_`…),
/// reporting an unusable key as `unusable_secret` instead of throwing.
[[nodiscard]] inline WebhookVerification verify_standard_webhook_ed25519(
    std::string_view public_key, std::string_view id, std::string_view timestamp,
    std::string_view signature, std::string_view body, WebhookOptions options = {}) {
  if (detail::decode_standard_public_key_checked(public_key).second !=
      detail::StandardPublicKeyProblem::none)
    return WebhookVerification::rejected(WebhookRejection::unusable_secret,
                                         detail::unusable_standard_public_key_message(public_key));
  return StandardWebhookEd25519Verifier(public_key, std::move(options))
      .verify(id, timestamp, signature, body);
}

}  // namespace idemgate
