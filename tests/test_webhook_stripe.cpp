#include <idemgate/detail/crypto/base64.hpp>
#include <idemgate/webhook/stripe.hpp>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using idemgate::StripeWebhookVerifier;
using idemgate::WebhookOptions;
using idemgate::WebhookRejection;
using idemgate::WebhookVerification;

namespace {

// Stripe secrets look like Standard Webhooks ones (`whsec_` + base64), but are used verbatim.
constexpr std::string_view secret = "whsec_plJ3nmyCDGBKInavdOK15jsO";
constexpr std::int64_t signed_at = 1700000000;
constexpr std::string_view t = "1700000000";
constexpr std::string_view body =
    R"({"id":"evt_1OZ8Xq2eZvKYlo2C","object":"event","type":"payment_intent.succeeded"})";

// The expected signature, computed with OpenSSL directly rather than through the library.
std::string reference_hex(std::string_view key, std::string_view timestamp,
                          std::string_view payload) {
  const std::string signed_content = std::string(timestamp) + "." + std::string(payload);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const unsigned char* result = HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                                     reinterpret_cast<const unsigned char*>(signed_content.data()),
                                     signed_content.size(), mac, &length);
  EXPECT_NE(result, nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    char digits[3];
    std::snprintf(digits, sizeof(digits), "%02x", mac[i]);
    hex += digits;
  }
  return hex;
}

const std::string expected_v1 = reference_hex(secret, t, body);

WebhookOptions clock_at(std::int64_t now,
                        std::chrono::seconds tolerance = std::chrono::seconds(300)) {
  return WebhookOptions{tolerance, [now] { return now; }};
}

StripeWebhookVerifier verifier_at(std::int64_t now) {
  return StripeWebhookVerifier(secret, clock_at(now));
}

std::string header(std::string_view timestamp, std::string_view v1) {
  return "t=" + std::string(timestamp) + ",v1=" + std::string(v1);
}

WebhookRejection rejection_of(const WebhookVerification& result) {
  EXPECT_FALSE(result.ok()) << "expected a rejection, but the delivery verified";
  return result.rejection();
}

// A delivery signed `offset` seconds away from a clock that reads `signed_at`.
WebhookVerification verify_signed_at_offset(
    std::int64_t offset, std::chrono::seconds tolerance = std::chrono::seconds(300)) {
  const std::string at = std::to_string(signed_at + offset);
  return StripeWebhookVerifier(secret, clock_at(signed_at, tolerance))
      .verify(header(at, reference_hex(secret, at, body)), body);
}

}  // namespace

TEST(StripeWebhook, IndependentlyComputedSignatureVerifies) {
  ASSERT_EQ(expected_v1.size(), 64U);
  const WebhookVerification result = verifier_at(signed_at).verify(header(t, expected_v1), body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.timestamp(), signed_at);
  EXPECT_TRUE(result.id().empty());
}

TEST(StripeWebhook, SignerMatchesIndependentComputation) {
  EXPECT_EQ(verifier_at(signed_at).sign(signed_at, body), header(t, expected_v1));
  EXPECT_EQ(idemgate::sign_stripe_webhook(secret, signed_at, body), header(t, expected_v1));
}

TEST(StripeWebhook, WholeSecretStringIsTheKeyNotItsBase64Decoding) {
  const std::optional<std::string> decoded_key =
      idemgate::detail::base64_decode(secret.substr(std::string_view("whsec_").size()));
  ASSERT_TRUE(decoded_key.has_value());
  const std::string decoded_signature = reference_hex(*decoded_key, t, body);
  EXPECT_EQ(rejection_of(verifier_at(signed_at).verify(header(t, decoded_signature), body)),
            WebhookRejection::bad_signature);
}

TEST(StripeWebhook, AnyOfSeveralV1SignaturesMayMatch) {
  const std::string wrong = reference_hex("whsec_previous_secret", t, body);
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  EXPECT_TRUE(verifier.verify(header(t, wrong) + ",v1=" + expected_v1, body).ok());
  EXPECT_TRUE(verifier.verify(header(t, expected_v1) + ",v1=" + wrong, body).ok());
  EXPECT_EQ(rejection_of(verifier.verify(header(t, wrong) + ",v1=" + wrong, body)),
            WebhookRejection::bad_signature);
}

TEST(StripeWebhook, V0SignaturesAreIgnored) {
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  const WebhookVerification only_v0 =
      verifier.verify("t=" + std::string(t) + ",v0=" + expected_v1, body);
  EXPECT_EQ(rejection_of(only_v0), WebhookRejection::bad_signature);
  EXPECT_NE(only_v0.message().find("no v1"), std::string::npos) << only_v0.message();
  EXPECT_TRUE(verifier.verify(header(t, expected_v1) + ",v0=" + std::string(64, '0'), body).ok());
}

TEST(StripeWebhook, ItemsMayComeInAnyOrderWithSpacesAfterCommas) {
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  EXPECT_TRUE(verifier.verify("v1=" + expected_v1 + ", t=" + std::string(t), body).ok());
  EXPECT_TRUE(verifier.verify("t=" + std::string(t) + ",  v1=" + expected_v1 + " ", body).ok());
}

TEST(StripeWebhook, UppercaseHexSignatureVerifies) {
  std::string upper = expected_v1;
  for (char& c : upper)
    if (c >= 'a' && c <= 'f') c = static_cast<char>(c - 'a' + 'A');
  EXPECT_TRUE(verifier_at(signed_at).verify(header(t, upper), body).ok());
}

TEST(StripeWebhook, HeaderNameMatchesCaseInsensitively) {
  const std::string value = header(t, expected_v1);
  const std::map<std::string, std::string> canonical{{"Stripe-Signature", value}};
  EXPECT_TRUE(verifier_at(signed_at).verify(canonical, body).ok());
  const std::vector<std::pair<std::string, std::string>> shouted{{"Host", "example.com"},
                                                                 {"STRIPE-SIGNATURE", value}};
  EXPECT_TRUE(verifier_at(signed_at).verify(shouted, body).ok());
}

TEST(StripeWebhook, LookupCallableIsAskedForTheLowercaseName) {
  const std::string value = header(t, expected_v1);
  std::vector<std::string> asked;
  const auto lookup = [&](std::string_view name) -> std::optional<std::string_view> {
    asked.emplace_back(name);
    if (name == "stripe-signature") return value;
    return std::nullopt;
  };
  EXPECT_TRUE(verifier_at(signed_at).verify(lookup, body).ok());
  EXPECT_EQ(asked, std::vector<std::string>{"stripe-signature"});
}

TEST(StripeWebhook, MissingOrEmptyHeaderIsRejected) {
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  const std::map<std::string, std::string> none{{"Content-Type", "application/json"}};
  const WebhookVerification result = verifier.verify(none, body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::missing_header);
  EXPECT_NE(result.message().find("Stripe-Signature"), std::string::npos) << result.message();
  EXPECT_EQ(rejection_of(verifier.verify("", body)), WebhookRejection::missing_header);
}

TEST(StripeWebhook, MissingRepeatedOrNonNumericTimestampIsMalformed) {
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  for (const std::string& bad :
       {"v1=" + expected_v1, "t,v1=" + expected_v1, header("", expected_v1),
        header("abc", expected_v1), header("-1700000000", expected_v1),
        header("1700000000.0", expected_v1), header("99999999999999999999", expected_v1),
        header(t, expected_v1) + ",t=" + std::string(t),
        header(t, expected_v1) + ",t=1700000001"}) {
    EXPECT_EQ(rejection_of(verifier.verify(bad, body)), WebhookRejection::malformed_timestamp)
        << bad;
  }
}

TEST(StripeWebhook, OneByteBodyChangeFails) {
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  for (std::size_t i = 0; i < body.size(); ++i) {
    std::string changed(body);
    changed[i] = static_cast<char>(changed[i] ^ 0x20);
    EXPECT_EQ(rejection_of(verifier.verify(header(t, expected_v1), changed)),
              WebhookRejection::bad_signature)
        << "byte " << i;
  }
}

TEST(StripeWebhook, SignatureWithAnyOneByteChangedIsBadSignature) {
  // Every byte of the MAC counts, the last ones as much as the first: a comparison that stopped
  // early would let a forger get away with matching part of a signature.
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  ASSERT_EQ(expected_v1.size(), 64u);
  for (std::size_t i = 0; i < expected_v1.size(); i += 2) {
    std::string changed = expected_v1;
    changed[i + 1] = changed[i + 1] == '0' ? '1' : '0';  // the low four bits of byte i / 2
    EXPECT_EQ(rejection_of(verifier.verify(header(t, changed), body)),
              WebhookRejection::bad_signature)
        << "byte " << i / 2 << " of the MAC changed";
  }
}

TEST(StripeWebhook, SignatureIsBoundToTheTimestamp) {
  EXPECT_EQ(rejection_of(verifier_at(signed_at).verify(header("1700000001", expected_v1), body)),
            WebhookRejection::bad_signature);
}

TEST(StripeWebhook, WrongSecretOrMalformedSignatureIsBadSignature) {
  const StripeWebhookVerifier other("whsec_other", clock_at(signed_at));
  EXPECT_EQ(rejection_of(other.verify(header(t, expected_v1), body)),
            WebhookRejection::bad_signature);
  const StripeWebhookVerifier verifier = verifier_at(signed_at);
  for (const std::string& bad : {expected_v1.substr(1), expected_v1 + "0",
                                 expected_v1.substr(0, 63) + "g", std::string("")}) {
    EXPECT_EQ(rejection_of(verifier.verify(header(t, bad), body)), WebhookRejection::bad_signature)
        << bad;
  }
}

TEST(StripeWebhook, TimestampExactlyAtToleranceInEitherDirectionPasses) {
  EXPECT_TRUE(verify_signed_at_offset(-300).ok());
  EXPECT_TRUE(verify_signed_at_offset(300).ok());
}

TEST(StripeWebhook, TimestampOneSecondPastToleranceFails) {
  EXPECT_EQ(rejection_of(verify_signed_at_offset(-301)), WebhookRejection::stale);
  EXPECT_EQ(rejection_of(verify_signed_at_offset(301)), WebhookRejection::future);
}

TEST(StripeWebhook, ToleranceIsConfigurable) {
  using std::chrono::seconds;
  EXPECT_TRUE(verify_signed_at_offset(-60, seconds(60)).ok());
  EXPECT_EQ(rejection_of(verify_signed_at_offset(-61, seconds(60))), WebhookRejection::stale);
  EXPECT_EQ(rejection_of(verify_signed_at_offset(61, seconds(60))), WebhookRejection::future);
  EXPECT_THROW(StripeWebhookVerifier(secret, clock_at(signed_at, seconds(-5))),
               std::invalid_argument);
}

TEST(StripeWebhook, ForgedAndStaleDeliveryIsBadSignatureNotStale) {
  EXPECT_EQ(
      rejection_of(verifier_at(signed_at + 3600).verify(header(t, std::string(64, 'a')), body)),
      WebhookRejection::bad_signature);
}

TEST(StripeWebhook, EmptySecretIsRefusedAtConstruction) {
  EXPECT_THROW(StripeWebhookVerifier(""), std::invalid_argument);
  EXPECT_THROW((void)idemgate::sign_stripe_webhook("", signed_at, body), std::invalid_argument);
}

TEST(StripeWebhook, OneShotVerifyReportsUnusableSecret) {
  const WebhookVerification result =
      idemgate::verify_stripe_webhook("", header(t, expected_v1), body, clock_at(signed_at));
  EXPECT_EQ(rejection_of(result), WebhookRejection::unusable_secret);
  const std::map<std::string, std::string> headers{{"Stripe-Signature", header(t, expected_v1)}};
  EXPECT_EQ(rejection_of(idemgate::verify_stripe_webhook("", headers, body)),
            WebhookRejection::unusable_secret);
}

TEST(StripeWebhook, OneShotVerifyAcceptsTheSameDeliveries) {
  EXPECT_TRUE(
      idemgate::verify_stripe_webhook(secret, header(t, expected_v1), body, clock_at(signed_at))
          .ok());
  const std::map<std::string, std::string> headers{{"Stripe-Signature", header(t, expected_v1)}};
  EXPECT_TRUE(idemgate::verify_stripe_webhook(secret, headers, body, clock_at(signed_at)).ok());
  EXPECT_EQ(rejection_of(
                idemgate::verify_stripe_webhook(secret, headers, body, clock_at(signed_at - 301))),
            WebhookRejection::future);
}

TEST(StripeWebhook, LargeBodyIsSignedToItsLastByte) {
  std::string large(1 << 20, 'x');
  const std::string signed_large = header(t, reference_hex(secret, t, large));
  EXPECT_TRUE(verifier_at(signed_at).verify(signed_large, large).ok());
  large.back() = 'y';
  EXPECT_EQ(rejection_of(verifier_at(signed_at).verify(signed_large, large)),
            WebhookRejection::bad_signature);
}
