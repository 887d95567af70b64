// libFuzzer target for the signed edge: header parsing, Standard Webhooks and Stripe
// verification (v1 HMAC and v1a Ed25519), secret and public key decoding and the event contract.
// Build and run it with scripts/fuzz.
//
// The input is split at the first four newlines into
//   webhook-id \n webhook-timestamp \n signature header \n secret or public key \n body
// (missing fields are empty; the body keeps any further newlines). Besides "no crash, no UB",
// it checks properties that must hold for every input, and aborts when one does not.

#include <idemgate/detail/crypto/base64.hpp>
#include <idemgate/webhook/contract.hpp>
#include <idemgate/webhook/standard.hpp>
#include <idemgate/webhook/stripe.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr std::int64_t now = 1614265330;
constexpr std::string_view standard_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr std::string_view stripe_secret = "whsec_plJ3nmyCDGBKInavdOK15jsO";
// RFC 8032 section 7.1, test 1: its public key, and the published delivery signed with its
// secret key (the seed in scripts/fuzz).
constexpr std::string_view ed25519_public_key = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";

void require(bool property, const char* what) {
  if (property) return;
  std::fprintf(stderr, "fuzz_webhook: property violated: %s\n", what);
  std::abort();
}

idemgate::WebhookOptions fixed_clock(std::int64_t at) {
  return idemgate::WebhookOptions{std::chrono::seconds(300), [at] { return at; }};
}

bool same_outcome(const idemgate::WebhookVerification& a, const idemgate::WebhookVerification& b) {
  if (a.ok() != b.ok()) return false;
  if (!a.ok()) return a.rejection() == b.rejection();
  return a.id() == b.id() && a.timestamp() == b.timestamp();
}

void fuzz_standard(std::string_view id, std::string_view timestamp, std::string_view signature,
                   std::string_view secret, std::string_view body) {
  const idemgate::StandardWebhookVerifier verifier(standard_secret, fixed_clock(now));
  const idemgate::WebhookVerification direct = verifier.verify(id, timestamp, signature, body);
  if (direct.ok()) {
    require(direct.id() == id, "a verified delivery carries its webhook-id");
    require(idemgate::detail::parse_unix_seconds(timestamp) == direct.timestamp(),
            "a verified delivery carries its parsed timestamp");
  } else {
    require(!idemgate::to_string(direct.rejection()).empty(), "every rejection has a name");
    require(!direct.message().empty(), "every rejection has a message");
    require(direct.rejection() != idemgate::WebhookRejection::unusable_secret,
            "a constructed verifier never reports its secret as unusable");
  }

  // Header lists with any casing and the svix- names must agree with the explicit values.
  const std::vector<std::pair<std::string_view, std::string_view>> headers{
      {"Webhook-Id", id}, {"SVIX-TIMESTAMP", timestamp}, {"webhook-signature", signature}};
  require(same_outcome(direct, verifier.verify(headers, body)),
          "header list and explicit values agree");
  const auto lookup = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "svix-id") return std::string(id);
    if (name == "webhook-timestamp") return std::string(timestamp);
    if (name == "svix-signature") return std::string(signature);
    return std::nullopt;
  };
  require(same_outcome(direct, verifier.verify(lookup, body)),
          "header lookup and explicit values agree");

  // A fuzzed secret: decodes, or is reported as unusable, never crashes.
  const idemgate::WebhookVerification one_shot =
      idemgate::verify_standard_webhook(secret, id, timestamp, signature, body, fixed_clock(now));
  const bool usable = idemgate::detail::decode_standard_secret(secret).has_value();
  require(usable || (!one_shot.ok() &&
                     one_shot.rejection() == idemgate::WebhookRejection::unusable_secret),
          "an undecodable secret is reported as unusable_secret");

  // Whatever the sender signs under a usable secret verifies, within the window.
  if (usable && !id.empty()) {
    const std::int64_t at = idemgate::detail::parse_unix_seconds(timestamp).value_or(now);
    const idemgate::StandardWebhookVerifier signer(secret, fixed_clock(at));
    const std::string signed_header = signer.sign(id, at, body);
    require(signer.verify(id, std::to_string(at), signed_header, body).ok(),
            "a Standard Webhooks signature made by sign() verifies");
    require(
        signer.verify(id, std::to_string(at), std::string(signature) + " " + signed_header, body)
            .ok(),
        "a valid v1 entry after fuzzed entries verifies");
  }
}

void fuzz_ed25519(std::string_view id, std::string_view timestamp, std::string_view signature,
                  std::string_view key, std::string_view body) {
  const idemgate::StandardWebhookEd25519Verifier verifier(ed25519_public_key, fixed_clock(now));
  const idemgate::WebhookVerification direct = verifier.verify(id, timestamp, signature, body);
  if (direct.ok()) {
    require(direct.id() == id, "a verified v1a delivery carries its webhook-id");
    require(idemgate::detail::count_standard_entries(signature, "v1a") != 0,
            "a v1a verifier accepts nothing without a v1a entry");
  } else {
    require(!direct.message().empty(), "every v1a rejection has a message");
    require(direct.rejection() != idemgate::WebhookRejection::unusable_secret,
            "a constructed v1a verifier never reports its key as unusable");
  }
  const std::vector<std::pair<std::string_view, std::string_view>> headers{
      {"svix-id", id}, {"Webhook-Timestamp", timestamp}, {"WEBHOOK-SIGNATURE", signature}};
  require(same_outcome(direct, verifier.verify(headers, body)),
          "v1a: header list and explicit values agree");

  // Entries of the other scheme never verify, whatever the key: no algorithm confusion.
  std::string only_v1;
  std::string only_v1a;
  for (std::string_view rest = signature; !rest.empty();) {
    const auto [version, value] = idemgate::detail::next_standard_entry(rest);
    std::string& into = version == "v1a" ? only_v1a : only_v1;
    into.append(version).append(",").append(value).append(" ");
  }
  require(!verifier.verify(id, timestamp, only_v1, body).ok(),
          "the v1a verifier never accepts a header without v1a entries");
  const idemgate::StandardWebhookVerifier hmac(standard_secret, fixed_clock(now));
  require(!hmac.verify(id, timestamp, only_v1a, body).ok(),
          "the v1 verifier never accepts a header of v1a entries only");

  // A fuzzed public key: decodes, or is reported as unusable, never crashes.
  const idemgate::WebhookVerification one_shot = idemgate::verify_standard_webhook_ed25519(
      key, id, timestamp, signature, body, fixed_clock(now));
  const bool usable = idemgate::detail::decode_standard_public_key_checked(key).second ==
                      idemgate::detail::StandardPublicKeyProblem::none;
  require(usable || (!one_shot.ok() &&
                     one_shot.rejection() == idemgate::WebhookRejection::unusable_secret),
          "an undecodable public key is reported as unusable_secret");
}

void fuzz_stripe(std::string_view signature, std::string_view timestamp, std::string_view secret,
                 std::string_view body) {
  const idemgate::StripeWebhookVerifier verifier(stripe_secret, fixed_clock(now));
  const idemgate::WebhookVerification direct = verifier.verify(signature, body);
  if (direct.ok()) {
    require(direct.id().empty(), "Stripe results carry no delivery id");
  } else {
    require(!direct.message().empty(), "every rejection has a message");
  }
  const std::array<std::pair<std::string_view, std::string_view>, 1> headers{
      {{"STRIPE-signature", signature}}};
  require(same_outcome(direct, verifier.verify(headers, body)),
          "header list and explicit value agree");

  const idemgate::WebhookVerification one_shot =
      idemgate::verify_stripe_webhook(secret, signature, body, fixed_clock(now));
  require(!secret.empty() || (!one_shot.ok() &&
                              one_shot.rejection() == idemgate::WebhookRejection::unusable_secret),
          "an empty Stripe secret is reported as unusable_secret");

  if (!secret.empty()) {
    const std::int64_t at = idemgate::detail::parse_unix_seconds(timestamp).value_or(now);
    const idemgate::StripeWebhookVerifier signer(secret, fixed_clock(at));
    const std::string signed_header = signer.sign(at, body);
    require(signer.verify(signed_header, body).ok(), "a Stripe signature made by sign() verifies");
  }
}

void fuzz_base64(std::string_view text) {
  const std::optional<std::string> decoded = idemgate::detail::base64_decode(text);
  if (!decoded) return;
  const std::string encoded = idemgate::detail::base64_encode(*decoded);
  require(idemgate::detail::base64_decode(encoded) == decoded, "base64 round-trips");
}

void fuzz_contract(std::string_view type) {
  static const idemgate::EventContract contract{"message.sent", "message.received"};
  const idemgate::ContractCheck check = contract.check(type);
  require(check.ok() == (type == "message.sent" || type == "message.received"),
          "the contract accepts exactly the declared types");
  require(check.ok() || check.message().find('\n') == std::string::npos,
          "contract messages stay on one line");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::array<std::string_view, 4> fields{};
  for (std::string_view& field : fields) {
    const std::size_t newline = input.find('\n');
    field = input.substr(0, newline);
    input.remove_prefix(newline == std::string_view::npos ? input.size() : newline + 1);
  }
  const auto [id, timestamp, signature, secret] = fields;
  const std::string_view body = input;

  fuzz_standard(id, timestamp, signature, secret, body);
  fuzz_ed25519(id, timestamp, signature, secret, body);
  fuzz_stripe(signature, timestamp, secret, body);
  fuzz_base64(signature);
  fuzz_base64(secret);
  fuzz_contract(id);
  return 0;
}
