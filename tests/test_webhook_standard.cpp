#include <idemgate/webhook/standard.hpp>

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using idemgate::StandardWebhookVerifier;
using idemgate::WebhookOptions;
using idemgate::WebhookRejection;
using idemgate::WebhookVerification;

namespace {

// The example published with the Standard Webhooks specification.
constexpr std::string_view secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr std::string_view id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
constexpr std::string_view timestamp = "1614265330";
constexpr std::int64_t signed_at = 1614265330;
constexpr std::string_view body = R"({"test": 2432232314})";
constexpr std::string_view signature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

WebhookOptions clock_at(std::int64_t now,
                        std::chrono::seconds tolerance = std::chrono::seconds(300)) {
  return WebhookOptions{tolerance, [now] { return now; }};
}

StandardWebhookVerifier verifier_at(std::int64_t now) {
  return StandardWebhookVerifier(secret, clock_at(now));
}

WebhookRejection rejection_of(const WebhookVerification& result) {
  EXPECT_FALSE(result.ok()) << "expected a rejection, but the delivery verified";
  return result.rejection();
}

// A signature for the published delivery signed `now_offset` seconds away from `signed_at`,
// verified by a verifier whose clock reads `signed_at`.
WebhookVerification verify_signed_at_offset(
    std::int64_t offset, std::chrono::seconds tolerance = std::chrono::seconds(300)) {
  const StandardWebhookVerifier verifier(secret, clock_at(signed_at, tolerance));
  const std::int64_t at = signed_at + offset;
  return verifier.verify(id, std::to_string(at), verifier.sign(id, at, body), body);
}

}  // namespace

TEST(StandardWebhook, PublishedVectorVerifies) {
  const WebhookVerification result = verifier_at(signed_at).verify(id, timestamp, signature, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.id(), id);
  EXPECT_EQ(result.timestamp(), signed_at);
  EXPECT_TRUE(result.message().empty());
}

TEST(StandardWebhook, SignerReproducesPublishedVector) {
  EXPECT_EQ(verifier_at(signed_at).sign(id, signed_at, body), signature);
  EXPECT_EQ(idemgate::sign_standard_webhook(secret, id, signed_at, body), signature);
}

TEST(StandardWebhook, SecretWithoutPrefixVerifies) {
  const StandardWebhookVerifier verifier(secret.substr(6), clock_at(signed_at));
  EXPECT_TRUE(verifier.verify(id, timestamp, signature, body).ok());
  EXPECT_EQ(verifier.sign(id, signed_at, body), signature);
}

TEST(StandardWebhook, RotatedSecretsPassWhenAnyV1SignatureMatches) {
  const std::string wrong = idemgate::sign_standard_webhook(
      "whsec_" + idemgate::detail::base64_encode("another key of thirty-two bytes!"), id, signed_at,
      body);
  ASSERT_NE(wrong, signature);
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  EXPECT_TRUE(verifier.verify(id, timestamp, wrong + " " + std::string(signature), body).ok());
  EXPECT_TRUE(verifier.verify(id, timestamp, std::string(signature) + " " + wrong, body).ok());
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, wrong, body)),
            WebhookRejection::bad_signature);
}

TEST(StandardWebhook, SignaturesOfOtherVersionsAreIgnored) {
  const std::string valid_bytes_as_v2 = "v2," + std::string(signature.substr(3));
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, valid_bytes_as_v2, body)),
            WebhookRejection::bad_signature);
  EXPECT_TRUE(
      verifier.verify(id, timestamp, valid_bytes_as_v2 + " " + std::string(signature), body).ok());
  EXPECT_TRUE(
      verifier.verify(id, timestamp, "v1a,AAAA " + std::string(signature) + " v2,AAAA", body).ok());
}

TEST(StandardWebhook, MalformedSignatureEntriesAreSkippedNotFatal) {
  const std::string junk = "v1 v1, v1,!!!! v1,AAAA v1,g0hM9SsE+OTPJTGt ,,, v1,g0hM9SsE===";
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, junk, body)),
            WebhookRejection::bad_signature);
  EXPECT_TRUE(verifier.verify(id, timestamp, junk + "  " + std::string(signature), body).ok());
}

TEST(StandardWebhook, UnpaddedSignatureVerifies) {
  const std::string unpadded(signature.substr(0, signature.size() - 1));
  EXPECT_TRUE(verifier_at(signed_at).verify(id, timestamp, unpadded, body).ok());
}

TEST(StandardWebhook, HeaderMapWithWebhookNamesVerifies) {
  const std::map<std::string, std::string> headers{{"webhook-id", std::string(id)},
                                                   {"webhook-timestamp", std::string(timestamp)},
                                                   {"webhook-signature", std::string(signature)}};
  const WebhookVerification result = verifier_at(signed_at).verify(headers, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.id(), id);
}

TEST(StandardWebhook, SvixHeaderNamesAreAccepted) {
  const std::map<std::string, std::string> headers{{"svix-id", std::string(id)},
                                                   {"svix-timestamp", std::string(timestamp)},
                                                   {"svix-signature", std::string(signature)}};
  const WebhookVerification result = verifier_at(signed_at).verify(headers, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.id(), id);
}

TEST(StandardWebhook, WebhookNamesTakePrecedenceOverSvixNames) {
  const std::map<std::string, std::string> headers{{"webhook-id", std::string(id)},
                                                   {"svix-id", "msg_someone_else"},
                                                   {"webhook-timestamp", std::string(timestamp)},
                                                   {"svix-timestamp", "1"},
                                                   {"webhook-signature", std::string(signature)},
                                                   {"svix-signature", "v1,AAAA"}};
  const WebhookVerification result = verifier_at(signed_at).verify(headers, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.id(), id);
}

TEST(StandardWebhook, HeaderNamesMatchCaseInsensitively) {
  const std::vector<std::pair<std::string_view, std::string_view>> headers{
      {"Content-Type", "application/json"},
      {"Webhook-Id", id},
      {"WEBHOOK-TIMESTAMP", timestamp},
      {"wEbHoOk-SiGnAtUrE", signature}};
  const WebhookVerification result = verifier_at(signed_at).verify(headers, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.id(), id);

  const std::vector<std::pair<std::string, std::string>> svix{
      {"Svix-Id", std::string(id)},
      {"SVIX-Timestamp", std::string(timestamp)},
      {"Svix-Signature", std::string(signature)}};
  EXPECT_TRUE(verifier_at(signed_at).verify(svix, body).ok());
}

TEST(StandardWebhook, LookupCallableIsAskedForLowercaseNamesAndMayReturnOwningStrings) {
  const std::map<std::string, std::string> stored{{"webhook-id", std::string(id)},
                                                  {"webhook-timestamp", std::string(timestamp)},
                                                  {"webhook-signature", std::string(signature)}};
  std::set<std::string> asked;
  // Returns copies, so the verifier must keep them alive while it reads them.
  const auto lookup = [&](std::string_view name) -> std::optional<std::string> {
    asked.emplace(name);
    const auto it = stored.find(std::string(name));
    if (it == stored.end()) return std::nullopt;
    return it->second;
  };
  const WebhookVerification result = verifier_at(signed_at).verify(lookup, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(asked, (std::set<std::string>{"webhook-id", "webhook-timestamp", "webhook-signature"}));
}

TEST(StandardWebhook, LookupCallableReturningPointersWorks) {
  const std::map<std::string, std::string, std::less<>> stored{
      {"svix-id", std::string(id)},
      {"svix-timestamp", std::string(timestamp)},
      {"svix-signature", std::string(signature)}};
  const auto lookup = [&](std::string_view name) -> const std::string* {
    const auto it = stored.find(name);
    return it == stored.end() ? nullptr : &it->second;
  };
  EXPECT_TRUE(verifier_at(signed_at).verify(lookup, body).ok());
}

TEST(StandardWebhook, EachMissingHeaderIsRejectedAndNamed) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  const std::vector<std::string> names{"webhook-id", "webhook-timestamp", "webhook-signature"};
  for (const std::string& dropped : names) {
    std::map<std::string, std::string> headers{{"webhook-id", std::string(id)},
                                               {"webhook-timestamp", std::string(timestamp)},
                                               {"webhook-signature", std::string(signature)}};
    headers.erase(dropped);
    const WebhookVerification result = verifier.verify(headers, body);
    EXPECT_EQ(rejection_of(result), WebhookRejection::missing_header) << dropped;
    EXPECT_NE(result.message().find(dropped), std::string::npos) << result.message();
  }
  const std::map<std::string, std::string> none;
  EXPECT_EQ(rejection_of(verifier.verify(none, body)), WebhookRejection::missing_header);
}

TEST(StandardWebhook, EmptyHeaderValuesCountAsMissing) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  EXPECT_EQ(rejection_of(verifier.verify("", timestamp, signature, body)),
            WebhookRejection::missing_header);
  EXPECT_EQ(rejection_of(verifier.verify(id, "", signature, body)),
            WebhookRejection::missing_header);
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, "", body)),
            WebhookRejection::missing_header);
}

TEST(StandardWebhook, NonNumericOrOverflowingTimestampIsMalformed) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  for (const std::string_view bad :
       {"abc", "1614265330.5", " 1614265330", "1614265330 ", "+1614265330", "-1614265330",
        "1614265330s", "0x60379b72", "9223372036854775808", "99999999999999999999999",
        "1614265330\n"}) {
    const WebhookVerification result = verifier.verify(id, bad, signature, body);
    EXPECT_EQ(rejection_of(result), WebhookRejection::malformed_timestamp) << bad;
  }
}

TEST(StandardWebhook, LargestRepresentableTimestampIsParsedNotMalformed) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  const std::int64_t largest = std::numeric_limits<std::int64_t>::max();
  const WebhookVerification result =
      verifier.verify(id, std::to_string(largest), verifier.sign(id, largest, body), body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::future);
}

TEST(StandardWebhook, MalformedTimestampMessageCannotForgeLogLines) {
  const WebhookVerification result =
      verifier_at(signed_at).verify(id, "12\nINFO all good", signature, body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::malformed_timestamp);
  EXPECT_EQ(result.message().find('\n'), std::string::npos);
  EXPECT_NE(result.message().find("\\x0a"), std::string::npos) << result.message();
}

TEST(StandardWebhook, OneByteBodyChangeFails) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  for (std::size_t i = 0; i < body.size(); ++i) {
    std::string changed(body);
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, signature, changed)),
              WebhookRejection::bad_signature)
        << "byte " << i;
  }
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, signature, std::string(body) + " ")),
            WebhookRejection::bad_signature);
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, signature, body.substr(1))),
            WebhookRejection::bad_signature);
}

TEST(StandardWebhook, SignatureWithAnyOneByteChangedIsBadSignature) {
  // Every byte of the MAC counts, the last ones as much as the first: a comparison that stopped
  // early would let a forger get away with matching part of a signature.
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  const std::optional<std::string> mac = idemgate::detail::base64_decode(signature.substr(3));
  ASSERT_TRUE(mac.has_value());
  ASSERT_EQ(mac->size(), 32u);
  for (std::size_t i = 0; i < mac->size(); ++i) {
    std::string changed = *mac;
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    const std::string forged = "v1," + idemgate::detail::base64_encode(changed);
    EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, forged, body)),
              WebhookRejection::bad_signature)
        << "byte " << i << " of the MAC changed";
  }
}

TEST(StandardWebhook, SignatureIsBoundToIdAndTimestamp) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  EXPECT_EQ(rejection_of(verifier.verify("msg_other", timestamp, signature, body)),
            WebhookRejection::bad_signature);
  EXPECT_EQ(rejection_of(verifier.verify(id, "1614265331", signature, body)),
            WebhookRejection::bad_signature);
  // Same number, different text: the signed content is the header as sent.
  EXPECT_EQ(rejection_of(verifier.verify(id, "01614265330", signature, body)),
            WebhookRejection::bad_signature);
  // The same for a signature this verifier made itself: it cannot be moved to another id.
  const std::string own = verifier.sign(id, signed_at, body);
  ASSERT_TRUE(verifier.verify(id, timestamp, own, body).ok());
  EXPECT_EQ(rejection_of(verifier.verify("msg_other", timestamp, own, body)),
            WebhookRejection::bad_signature);
}

TEST(StandardWebhook, WrongSecretIsBadSignature) {
  const StandardWebhookVerifier verifier(
      "whsec_" + idemgate::detail::base64_encode("not it, but twenty-four bytes"),
      clock_at(signed_at));
  const WebhookVerification result = verifier.verify(id, timestamp, signature, body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::bad_signature);
  EXPECT_NE(result.message().find("raw body"), std::string::npos) << result.message();
}

TEST(StandardWebhook, SignatureHeaderWithoutV1EntryIsBadSignature) {
  const WebhookVerification result =
      verifier_at(signed_at).verify(id, timestamp, "v0,abc v2,def", body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::bad_signature);
  EXPECT_NE(result.message().find("no v1"), std::string::npos) << result.message();
}

TEST(StandardWebhook, TimestampExactlyAtToleranceInEitherDirectionPasses) {
  EXPECT_TRUE(verify_signed_at_offset(-300).ok());
  EXPECT_TRUE(verify_signed_at_offset(300).ok());
  EXPECT_TRUE(verify_signed_at_offset(0).ok());
}

TEST(StandardWebhook, TimestampOneSecondPastToleranceFails) {
  EXPECT_EQ(rejection_of(verify_signed_at_offset(-301)), WebhookRejection::stale);
  EXPECT_EQ(rejection_of(verify_signed_at_offset(301)), WebhookRejection::future);
}

TEST(StandardWebhook, PublishedVectorIsStaleOrFutureFarFromItsTimestamp) {
  const WebhookVerification stale =
      verifier_at(signed_at + 3600).verify(id, timestamp, signature, body);
  EXPECT_EQ(rejection_of(stale), WebhookRejection::stale);
  EXPECT_NE(stale.message().find("3600 s old"), std::string::npos) << stale.message();
  const WebhookVerification future =
      verifier_at(signed_at - 3600).verify(id, timestamp, signature, body);
  EXPECT_EQ(rejection_of(future), WebhookRejection::future);
}

TEST(StandardWebhook, ToleranceIsConfigurable) {
  using std::chrono::seconds;
  EXPECT_TRUE(verify_signed_at_offset(-10, seconds(10)).ok());
  EXPECT_TRUE(verify_signed_at_offset(10, seconds(10)).ok());
  EXPECT_EQ(rejection_of(verify_signed_at_offset(-11, seconds(10))), WebhookRejection::stale);
  EXPECT_EQ(rejection_of(verify_signed_at_offset(11, seconds(10))), WebhookRejection::future);
  EXPECT_TRUE(verify_signed_at_offset(0, seconds(0)).ok());
  EXPECT_EQ(rejection_of(verify_signed_at_offset(-1, seconds(0))), WebhookRejection::stale);
  EXPECT_TRUE(verify_signed_at_offset(-3600, seconds(3600)).ok());
}

TEST(StandardWebhook, NegativeToleranceIsRefusedAtConstruction) {
  EXPECT_THROW(StandardWebhookVerifier(secret, clock_at(signed_at, std::chrono::seconds(-1))),
               std::invalid_argument);
}

TEST(StandardWebhook, WindowHandlesExtremeClocksWithoutOverflow) {
  const std::int64_t largest = std::numeric_limits<std::int64_t>::max();
  const std::int64_t smallest = std::numeric_limits<std::int64_t>::min();
  const StandardWebhookVerifier behind(secret, clock_at(smallest));
  EXPECT_EQ(rejection_of(
                behind.verify(id, std::to_string(largest), behind.sign(id, largest, body), body)),
            WebhookRejection::future);
  const StandardWebhookVerifier ahead(secret, clock_at(largest));
  EXPECT_EQ(rejection_of(ahead.verify(id, "0", ahead.sign(id, 0, body), body)),
            WebhookRejection::stale);
}

TEST(StandardWebhook, ForgedAndStaleDeliveryIsBadSignatureNotStale) {
  const WebhookVerification result =
      verifier_at(signed_at + 3600).verify(id, timestamp, "v1,AAAA", body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::bad_signature);
}

TEST(StandardWebhook, DefaultClockIsTheSystemClock) {
  const StandardWebhookVerifier verifier(secret);
  const std::int64_t now = idemgate::system_unix_seconds();
  EXPECT_TRUE(verifier.verify(id, std::to_string(now), verifier.sign(id, now, body), body).ok());
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, signature, body)), WebhookRejection::stale);
  EXPECT_EQ(verifier.window().tolerance(), std::chrono::seconds(300));
}

TEST(StandardWebhook, BodyIsRawBytesIncludingNulAndNonUtf8) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  const std::string raw("a\0b\xff\xfe", 5);
  const std::string signed_raw = verifier.sign(id, signed_at, raw);
  EXPECT_TRUE(verifier.verify(id, timestamp, signed_raw, raw).ok());
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, signed_raw, "a")),
            WebhookRejection::bad_signature);
}

TEST(StandardWebhook, UnusableSecretIsRefusedAtConstructionWithoutEchoingIt) {
  for (const std::string_view unusable :
       {"", "whsec_", "whsec_not*base64!", "whsec_abcde", "whsec_ab=c", "whsec_MfKQ 9r8G"}) {
    try {
      const StandardWebhookVerifier verifier(unusable);
      ADD_FAILURE() << "accepted the secret \"" << unusable << "\"";
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("whsec_"), std::string::npos) << message;
      if (unusable.size() > 6) {
        EXPECT_EQ(message.find(unusable.substr(6)), std::string::npos) << message;
      }
    }
  }
}

// The specification: "Random. At least 24 bytes (192 bits)", counted after decoding.
TEST(StandardWebhook, SecretShorterThanTwentyFourBytesIsRefusedAtConstruction) {
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{16}, std::size_t{23}}) {
    const std::string short_secret =
        "whsec_" + idemgate::detail::base64_encode(std::string(bytes, static_cast<char>(0xa5)));
    try {
      const StandardWebhookVerifier verifier(short_secret);
      ADD_FAILURE() << "accepted a secret of " << bytes << " bytes";
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("decodes to " + std::to_string(bytes) + " bytes"), std::string::npos)
          << message;
      EXPECT_NE(message.find("24 bytes"), std::string::npos) << message;
    }
    EXPECT_EQ(rejection_of(idemgate::verify_standard_webhook(short_secret, id, timestamp, signature,
                                                             body, clock_at(signed_at))),
              WebhookRejection::unusable_secret);
    EXPECT_THROW((void)idemgate::sign_standard_webhook(short_secret, id, signed_at, body),
                 std::invalid_argument);
  }
  // 24 bytes is the bound itself, and longer keys pass.
  for (const std::size_t bytes : {std::size_t{24}, std::size_t{32}, std::size_t{64}}) {
    const std::string key(bytes, static_cast<char>(0x5a));
    EXPECT_NO_THROW(StandardWebhookVerifier("whsec_" + idemgate::detail::base64_encode(key)))
        << bytes;
  }
}

TEST(StandardWebhook, SecretThatDoesNotDecodeExactlyIsRefusedAtConstruction) {
  const std::string whole =
      "whsec_" + idemgate::detail::base64_encode("a thirty-two byte endpoint key!!");
  ASSERT_EQ(whole.size(), 6u + 44u);
  ASSERT_EQ(whole.back(), '=');
  ASSERT_NO_THROW(StandardWebhookVerifier{whole});
  const std::string published(secret);
  const std::vector<std::string> inexact = {
      whole.substr(0, whole.size() - 1),          // the padding was cut off
      whole.substr(0, whole.size() - 2),          // and a digit with it
      published.substr(0, published.size() - 1),  // a character lost from an unpadded secret
      published + "A",                            // or one added
      whole.substr(0, whole.size() - 2) + "B=",   // unused bits set: not how it was encoded
  };
  for (const std::string& text : inexact) {
    try {
      const StandardWebhookVerifier verifier(text);
      ADD_FAILURE() << "accepted the secret \"" << text << "\"";
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("does not decode exactly"), std::string::npos) << message;
      EXPECT_EQ(message.find(text.substr(6)), std::string::npos) << message;
    }
    EXPECT_FALSE(idemgate::detail::decode_standard_secret(text).has_value()) << text;
    EXPECT_EQ(rejection_of(idemgate::verify_standard_webhook(text, id, timestamp, signature, body,
                                                             clock_at(signed_at))),
              WebhookRejection::unusable_secret);
  }
}

namespace {

/// The message a verifier gives for an unusable secret (empty when it was accepted).
std::string refusal_of(const std::string& unusable) {
  try {
    const StandardWebhookVerifier verifier(unusable);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return {};
}

}  // namespace

// Each problem is named as what it is, and a secret given without its "whsec_" prefix is never
// described as characters "after whsec_".
TEST(StandardWebhook, UnusableSecretMessageSaysWhatIsWrongAndWhetherThePrefixWasThere) {
  // Missing prefix, and seven characters that are base64 but not whole 4-character groups.
  std::string message = refusal_of("abcdefg");
  EXPECT_NE(message.find("does not decode exactly"), std::string::npos) << message;
  EXPECT_NE(message.find("no \"whsec_\" prefix"), std::string::npos) << message;
  EXPECT_EQ(message.find("after \"whsec_\""), std::string::npos) << message;
  EXPECT_NE(message.find("7 characters"), std::string::npos) << message;
  // The same with the prefix: counted after it.
  message = refusal_of("whsec_abcdefg");
  EXPECT_NE(message.find("7 base64 characters after \"whsec_\""), std::string::npos) << message;
  EXPECT_EQ(message.find("no \"whsec_\" prefix"), std::string::npos) << message;
  // Not base64 at all, with and without the prefix.
  message = refusal_of("sk_live_0123456789abcdef");
  EXPECT_NE(message.find("does not start with \"whsec_\" and is not standard base64"),
            std::string::npos)
      << message;
  message = refusal_of("whsec_not*base64!");
  EXPECT_NE(message.find("not standard base64 after \"whsec_\""), std::string::npos) << message;
  // Too short: how many bytes, where they were read from, and the bound.
  const std::string sixteen = idemgate::detail::base64_encode(std::string(16, 'k'));
  message = refusal_of(sixteen);
  EXPECT_NE(message.find("decodes to 16 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("no \"whsec_\" prefix"), std::string::npos) << message;
  EXPECT_NE(message.find("24 bytes"), std::string::npos) << message;
  message = refusal_of("whsec_" + sixteen);
  EXPECT_NE(message.find("decodes to 16 bytes (from its 24 base64 characters after \"whsec_\")"),
            std::string::npos)
      << message;
  // Empty, and nothing after the prefix.
  EXPECT_NE(refusal_of("").find("is empty"), std::string::npos);
  message = refusal_of("whsec_");
  EXPECT_NE(message.find("nothing after its \"whsec_\" prefix"), std::string::npos) << message;
  // An Ed25519 key given to the HMAC verifier says which verifier takes it.
  message = refusal_of("whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=");
  EXPECT_NE(message.find("Ed25519 key"), std::string::npos) << message;
  EXPECT_NE(message.find("StandardWebhookEd25519Verifier"), std::string::npos) << message;
  // None of them repeats the secret.
  for (const std::string text : {"sk_live_0123456789abcdef", "whsec_not*base64!"})
    EXPECT_EQ(refusal_of(text).find(text), std::string::npos);
}

TEST(StandardWebhook, OneShotVerifyReportsUnusableSecret) {
  const WebhookVerification result = idemgate::verify_standard_webhook(
      "whsec_***", id, timestamp, signature, body, clock_at(signed_at));
  EXPECT_EQ(rejection_of(result), WebhookRejection::unusable_secret);
  EXPECT_FALSE(result.message().empty());

  const std::map<std::string, std::string> headers{{"webhook-id", std::string(id)}};
  EXPECT_EQ(rejection_of(idemgate::verify_standard_webhook("", headers, body)),
            WebhookRejection::unusable_secret);
  EXPECT_THROW((void)idemgate::sign_standard_webhook("", id, signed_at, body),
               std::invalid_argument);
}

TEST(StandardWebhook, OneShotVerifyAcceptsTheSameDeliveries) {
  EXPECT_TRUE(
      idemgate::verify_standard_webhook(secret, id, timestamp, signature, body, clock_at(signed_at))
          .ok());
  const std::map<std::string, std::string> headers{{"Webhook-Id", std::string(id)},
                                                   {"Webhook-Timestamp", std::string(timestamp)},
                                                   {"Webhook-Signature", std::string(signature)}};
  EXPECT_TRUE(idemgate::verify_standard_webhook(secret, headers, body, clock_at(signed_at)).ok());
  EXPECT_EQ(rejection_of(idemgate::verify_standard_webhook(secret, headers, body,
                                                           clock_at(signed_at + 301))),
            WebhookRejection::stale);
}

TEST(StandardWebhook, SigningANegativeTimestampThrows) {
  EXPECT_THROW((void)verifier_at(signed_at).sign(id, -1, body), std::invalid_argument);
}

TEST(WebhookVerification, RejectedResultHasNoIdentityAndVerifiedHasNoRejection) {
  const WebhookVerification rejected =
      WebhookVerification::rejected(WebhookRejection::stale, "too old");
  EXPECT_FALSE(rejected);
  EXPECT_THROW((void)rejected.id(), std::logic_error);
  EXPECT_THROW((void)rejected.timestamp(), std::logic_error);
  EXPECT_EQ(rejected.message(), "too old");

  const WebhookVerification verified = WebhookVerification::verified("msg_1", 42);
  EXPECT_TRUE(verified);
  EXPECT_THROW((void)verified.rejection(), std::logic_error);
}

TEST(WebhookVerification, EveryRejectionHasItsOwnName) {
  EXPECT_EQ(idemgate::to_string(WebhookRejection::missing_header), "missing_header");
  EXPECT_EQ(idemgate::to_string(WebhookRejection::malformed_timestamp), "malformed_timestamp");
  EXPECT_EQ(idemgate::to_string(WebhookRejection::stale), "stale");
  EXPECT_EQ(idemgate::to_string(WebhookRejection::future), "future");
  EXPECT_EQ(idemgate::to_string(WebhookRejection::bad_signature), "bad_signature");
  EXPECT_EQ(idemgate::to_string(WebhookRejection::unusable_secret), "unusable_secret");
}

TEST(Base64, RoundTripsEveryLengthAndRejectsNonBase64) {
  std::string bytes;
  for (int i = 0; i < 40; ++i) {
    const std::string encoded = idemgate::detail::base64_encode(bytes);
    EXPECT_EQ(encoded.size() % 4, 0U);
    EXPECT_EQ(idemgate::detail::base64_decode(encoded), bytes);
    bytes += static_cast<char>(i * 37 + 200);
  }
  EXPECT_EQ(idemgate::detail::base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(idemgate::detail::base64_encode("fo"), "Zm8=");
  EXPECT_EQ(idemgate::detail::base64_decode("Zm8"), "fo");
  for (const std::string_view bad : {"Z", "Zm9vY", "Zm=8", "Zm8==", "Z===", "Zm-_", "Zm 8"})
    EXPECT_FALSE(idemgate::detail::base64_decode(bad).has_value()) << bad;
}

TEST(StandardWebhook, LargeBodyIsSignedToItsLastByte) {
  const StandardWebhookVerifier verifier = verifier_at(signed_at);
  std::string large(1 << 20, 'x');
  const std::string signed_large = verifier.sign(id, signed_at, large);
  EXPECT_TRUE(verifier.verify(id, timestamp, signed_large, large).ok());
  large.back() = 'y';
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, signed_large, large)),
            WebhookRejection::bad_signature);
}

// --- v1a: Ed25519 -----------------------------------------------------------------------------

namespace {

using idemgate::StandardWebhookEd25519Verifier;

// RFC 8032 section 7.1, test 1: the public key of the secret key
// 9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60, and its signature of the
// empty message.
constexpr std::string_view rfc8032_public_key = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
constexpr std::string_view rfc8032_empty_signature =
    "5VZDAMNgrHKQhuLMgG6CioSHfx645dl02HPgZSJJAVVfuIIVkKM7rMYeOXAc+bRr0lv18Flbvi"
    "RlUUFDjnoQCw==";
// The published delivery (id, timestamp, body above) signed under that secret key, computed
// with an implementation of RFC 8032 section 5.1 written apart from OpenSSL, which reproduces
// test 1 above.
constexpr std::string_view rfc8032_delivery_signature =
    "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==";

// An Ed25519 key pair generated by OpenSSL for one test, with a signer of Standard Webhooks
// deliveries (the library verifies only; senders sign).
class Ed25519Sender {
 public:
  Ed25519Sender() {
    EVP_PKEY_CTX* context = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
    EVP_PKEY* key = nullptr;
    if (context == nullptr || EVP_PKEY_keygen_init(context) != 1 ||
        EVP_PKEY_keygen(context, &key) != 1)
      throw std::runtime_error("test: OpenSSL could not generate an Ed25519 key");
    EVP_PKEY_CTX_free(context);
    key_.reset(key);
  }

  // `whpk_` + base64 of the raw public key.
  [[nodiscard]] std::string public_key() const {
    unsigned char raw[32];
    std::size_t size = sizeof raw;
    if (EVP_PKEY_get_raw_public_key(key_.get(), raw, &size) != 1 || size != 32)
      throw std::runtime_error("test: no raw Ed25519 public key");
    return "whpk_" + idemgate::detail::base64_encode(raw, size);
  }

  // The raw 64-byte signature of `message`.
  [[nodiscard]] std::string sign_raw(std::string_view message) const {
    const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                          EVP_MD_CTX_free);
    unsigned char raw[64];
    std::size_t size = sizeof raw;
    if (EVP_DigestSignInit(context.get(), nullptr, nullptr, nullptr, key_.get()) != 1 ||
        EVP_DigestSign(context.get(), raw, &size,
                       reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) != 1 ||
        size != 64)
      throw std::runtime_error("test: OpenSSL could not sign");
    return std::string(reinterpret_cast<const char*>(raw), size);
  }

  // `v1a,<base64>` for one delivery.
  [[nodiscard]] std::string sign(std::string_view message_id, std::int64_t at,
                                 std::string_view payload) const {
    const std::string content =
        std::string(message_id) + "." + std::to_string(at) + "." + std::string(payload);
    return "v1a," + idemgate::detail::base64_encode(sign_raw(content));
  }

 private:
  struct Free {
    void operator()(EVP_PKEY* key) const noexcept { EVP_PKEY_free(key); }
  };
  std::unique_ptr<EVP_PKEY, Free> key_;
};

StandardWebhookEd25519Verifier ed25519_verifier_at(const Ed25519Sender& sender, std::int64_t now) {
  return StandardWebhookEd25519Verifier(sender.public_key(), clock_at(now));
}

// The message of a public-key problem thrown at construction, or "" when the key was accepted.
std::string construction_error(std::string_view public_key) {
  try {
    const StandardWebhookEd25519Verifier verifier(public_key);
    return "";
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
}

}  // namespace

TEST(StandardWebhookEd25519, Rfc8032TestOneVerifiesThroughTheKeyWrapper) {
  const auto [raw, problem] =
      idemgate::detail::decode_standard_public_key_checked(rfc8032_public_key);
  ASSERT_EQ(problem, idemgate::detail::StandardPublicKeyProblem::none);
  const idemgate::detail::Ed25519PublicKey key(raw);
  idemgate::detail::Ed25519PublicKey::signature_type signature{};
  ASSERT_EQ(idemgate::detail::base64_decode_into(rfc8032_empty_signature, signature.data(),
                                                 signature.size()),
            signature.size());
  EXPECT_TRUE(key.verify(signature, ""));
  EXPECT_FALSE(key.verify(signature, "x"));
  signature[63] ^= 0x01;
  EXPECT_FALSE(key.verify(signature, ""));
}

TEST(StandardWebhookEd25519, FixedVectorOfThePublishedDeliveryVerifies) {
  const StandardWebhookEd25519Verifier verifier(rfc8032_public_key, clock_at(signed_at));
  const WebhookVerification result =
      verifier.verify(id, timestamp, rfc8032_delivery_signature, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.id(), id);
  EXPECT_EQ(result.timestamp(), signed_at);
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, rfc8032_delivery_signature,
                                         std::string(body) + " ")),
            WebhookRejection::bad_signature);
}

TEST(StandardWebhookEd25519, SignatureOfAFreshKeyVerifiesFromHeaders) {
  const Ed25519Sender sender;
  const std::string header = sender.sign(id, signed_at, body);
  const std::map<std::string, std::string> headers{{"Webhook-Id", std::string(id)},
                                                   {"Webhook-Timestamp", std::string(timestamp)},
                                                   {"Webhook-Signature", header}};
  const WebhookVerification result = ed25519_verifier_at(sender, signed_at).verify(headers, body);
  ASSERT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(result.id(), id);
  const std::map<std::string, std::string> svix{{"svix-id", std::string(id)},
                                                {"svix-timestamp", std::string(timestamp)},
                                                {"svix-signature", header}};
  EXPECT_TRUE(ed25519_verifier_at(sender, signed_at).verify(svix, body).ok());
  EXPECT_TRUE(idemgate::verify_standard_webhook_ed25519(sender.public_key(), headers, body,
                                                        clock_at(signed_at))
                  .ok());
}

TEST(StandardWebhookEd25519, TamperedPayloadIdOrTimestampIsBadSignature) {
  const Ed25519Sender sender;
  const StandardWebhookEd25519Verifier verifier = ed25519_verifier_at(sender, signed_at);
  const std::string header = sender.sign(id, signed_at, body);
  ASSERT_TRUE(verifier.verify(id, timestamp, header, body).ok());
  for (std::size_t i = 0; i < body.size(); ++i) {
    std::string changed(body);
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, header, changed)),
              WebhookRejection::bad_signature)
        << "byte " << i;
  }
  const WebhookVerification result = verifier.verify(id, timestamp, header, body.substr(1));
  EXPECT_EQ(rejection_of(result), WebhookRejection::bad_signature);
  EXPECT_NE(result.message().find("raw body"), std::string::npos) << result.message();
  EXPECT_EQ(rejection_of(verifier.verify("msg_other", timestamp, header, body)),
            WebhookRejection::bad_signature);
  EXPECT_EQ(rejection_of(verifier.verify(id, "01614265330", header, body)),
            WebhookRejection::bad_signature);
}

TEST(StandardWebhookEd25519, SignatureWithAnyOneByteChangedIsBadSignature) {
  const Ed25519Sender sender;
  const StandardWebhookEd25519Verifier verifier = ed25519_verifier_at(sender, signed_at);
  const std::string raw =
      sender.sign_raw(std::string(id) + "." + std::string(timestamp) + "." + std::string(body));
  for (std::size_t i = 0; i < raw.size(); ++i) {
    std::string changed = raw;
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    EXPECT_EQ(rejection_of(verifier.verify(
                  id, timestamp, "v1a," + idemgate::detail::base64_encode(changed), body)),
              WebhookRejection::bad_signature)
        << "byte " << i;
  }
}

TEST(StandardWebhookEd25519, SignatureOfAnotherKeyIsBadSignatureNamingThePublicKey) {
  const Ed25519Sender sender;
  const Ed25519Sender other;
  const WebhookVerification result =
      ed25519_verifier_at(other, signed_at)
          .verify(id, timestamp, sender.sign(id, signed_at, body), body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::bad_signature);
  EXPECT_NE(result.message().find("whpk_"), std::string::npos) << result.message();
}

TEST(StandardWebhookEd25519, ReplayWindowAppliesAsForV1) {
  const Ed25519Sender sender;
  const auto verify_at_offset = [&](std::int64_t offset) {
    const std::int64_t at = signed_at + offset;
    return ed25519_verifier_at(sender, signed_at)
        .verify(id, std::to_string(at), sender.sign(id, at, body), body);
  };
  EXPECT_TRUE(verify_at_offset(-300).ok());
  EXPECT_TRUE(verify_at_offset(300).ok());
  const WebhookVerification stale = verify_at_offset(-301);
  EXPECT_EQ(rejection_of(stale), WebhookRejection::stale);
  EXPECT_NE(stale.message().find("301 s old"), std::string::npos) << stale.message();
  EXPECT_EQ(rejection_of(verify_at_offset(301)), WebhookRejection::future);
  // A forgery far outside the window still reads as a forgery.
  EXPECT_EQ(
      rejection_of(
          ed25519_verifier_at(sender, signed_at + 3600).verify(id, timestamp, "v1a,AAAA", body)),
      WebhookRejection::bad_signature);
  EXPECT_EQ(rejection_of(ed25519_verifier_at(sender, signed_at).verify(id, "-1", "v1a,AAAA", body)),
            WebhookRejection::malformed_timestamp);
}

TEST(StandardWebhookEd25519, AnyOfSeveralSignaturesInAMixedHeaderVerifies) {
  const Ed25519Sender sender;
  const Ed25519Sender retired;
  const StandardWebhookEd25519Verifier verifier = ed25519_verifier_at(sender, signed_at);
  const std::string good = sender.sign(id, signed_at, body);
  const std::string old = retired.sign(id, signed_at, body);
  const std::string hmac(signature);
  EXPECT_TRUE(verifier.verify(id, timestamp, hmac + " " + old + " " + good, body).ok());
  EXPECT_TRUE(verifier.verify(id, timestamp, good + " " + hmac, body).ok());
  EXPECT_TRUE(verifier.verify(id, timestamp, "v2,AAAA v1a,!!!! v1a, " + good, body).ok());
  EXPECT_EQ(rejection_of(verifier.verify(id, timestamp, hmac + " " + old, body)),
            WebhookRejection::bad_signature);
  // The v1 verifier reads the v1 entry of the same header and ignores the v1a ones.
  EXPECT_TRUE(
      verifier_at(signed_at).verify(id, timestamp, old + " " + hmac + " " + good, body).ok());
}

TEST(StandardWebhookEd25519, NoAlgorithmConfusionBetweenV1AndV1a) {
  const Ed25519Sender sender;
  const StandardWebhookEd25519Verifier ed25519 = ed25519_verifier_at(sender, signed_at);
  // The classic confusion: an HMAC under the public key's own bytes, offered as v1 and as v1a.
  const std::optional<std::string> public_bytes =
      idemgate::detail::base64_decode(std::string_view(sender.public_key()).substr(5));
  ASSERT_TRUE(public_bytes.has_value());
  const auto mac = idemgate::detail::standard_mac(*public_bytes, id, timestamp, body);
  const std::string mac_base64 = idemgate::detail::base64_encode(mac.data(), mac.size());
  const WebhookVerification as_v1 = ed25519.verify(id, timestamp, "v1," + mac_base64, body);
  EXPECT_EQ(rejection_of(as_v1), WebhookRejection::bad_signature);
  EXPECT_NE(as_v1.message().find("never accepts v1"), std::string::npos) << as_v1.message();
  EXPECT_EQ(rejection_of(ed25519.verify(id, timestamp, "v1a," + mac_base64, body)),
            WebhookRejection::bad_signature);
  // A genuine HMAC delivery is refused by the Ed25519 verifier...
  EXPECT_EQ(rejection_of(ed25519.verify(id, timestamp, signature, body)),
            WebhookRejection::bad_signature);
  // ...and a genuine Ed25519 delivery by the HMAC verifier, which says where it belongs.
  const WebhookVerification as_hmac =
      verifier_at(signed_at).verify(id, timestamp, sender.sign(id, signed_at, body), body);
  EXPECT_EQ(rejection_of(as_hmac), WebhookRejection::bad_signature);
  EXPECT_NE(as_hmac.message().find("StandardWebhookEd25519Verifier"), std::string::npos)
      << as_hmac.message();
  // Valid Ed25519 bytes under a version name other than v1a count for nothing.
  const std::string good = sender.sign(id, signed_at, body);
  EXPECT_EQ(rejection_of(ed25519.verify(id, timestamp, "v1" + good.substr(3), body)),
            WebhookRejection::bad_signature);
  EXPECT_EQ(rejection_of(ed25519.verify(id, timestamp, "v2a" + good.substr(3), body)),
            WebhookRejection::bad_signature);
}

TEST(StandardWebhookEd25519, MalformedSignatureEntriesAreRejectedWithWhatIsWrong) {
  const Ed25519Sender sender;
  const StandardWebhookEd25519Verifier verifier = ed25519_verifier_at(sender, signed_at);
  const std::string good = sender.sign(id, signed_at, body);
  const std::string raw_base64 = good.substr(4);
  for (const std::string& bad :
       {std::string("v1a,!!!!"), std::string("v1a,"), "v1a," + raw_base64.substr(0, 84),
        "v1a," + raw_base64.substr(0, 40), "v1a," + raw_base64 + "AAAA",
        "v1a," + raw_base64.substr(0, 43) + "-" + raw_base64.substr(44), "v1a, " + raw_base64}) {
    const WebhookVerification result = verifier.verify(id, timestamp, bad, body);
    EXPECT_EQ(rejection_of(result), WebhookRejection::bad_signature) << bad;
    EXPECT_NE(result.message().find("64-byte Ed25519 signature"), std::string::npos)
        << bad << ": " << result.message();
  }
  const WebhookVerification none = verifier.verify(id, timestamp, "v0,abc v2a,def", body);
  EXPECT_EQ(rejection_of(none), WebhookRejection::bad_signature);
  EXPECT_NE(none.message().find("no v1a entry"), std::string::npos) << none.message();
  // Unpadded base64 is still the signature.
  ASSERT_EQ(good.substr(good.size() - 2), "==");
  EXPECT_TRUE(verifier.verify(id, timestamp, good.substr(0, good.size() - 2), body).ok());
}

TEST(StandardWebhookEd25519, HeaderStuffedWithEntriesIsRefusedBeforeAnyIsChecked) {
  const Ed25519Sender sender;
  const StandardWebhookEd25519Verifier verifier = ed25519_verifier_at(sender, signed_at);
  const std::string good = sender.sign(id, signed_at, body);
  std::string header;
  for (std::size_t i = 0; i < idemgate::detail::standard_max_v1a_entries; ++i) header += good + " ";
  EXPECT_TRUE(verifier.verify(id, timestamp, header, body).ok());
  const WebhookVerification result = verifier.verify(id, timestamp, header + good, body);
  EXPECT_EQ(rejection_of(result), WebhookRejection::bad_signature);
  EXPECT_NE(result.message().find("more than 8"), std::string::npos) << result.message();
}

TEST(StandardWebhookEd25519, PublicKeyOfTheWrongLengthIsRefusedSayingSo) {
  for (const std::size_t bytes :
       {std::size_t{16}, std::size_t{31}, std::size_t{33}, std::size_t{64}}) {
    const std::string key =
        "whpk_" + idemgate::detail::base64_encode(std::string(bytes, static_cast<char>(0x42)));
    const std::string message = construction_error(key);
    EXPECT_NE(message.find("decodes to " + std::to_string(bytes) + " bytes"), std::string::npos)
        << message;
    EXPECT_NE(message.find("exactly 32 bytes"), std::string::npos) << message;
    EXPECT_EQ(rejection_of(idemgate::verify_standard_webhook_ed25519(
                  key, id, timestamp, rfc8032_delivery_signature, body, clock_at(signed_at))),
              WebhookRejection::unusable_secret);
  }
}

TEST(StandardWebhookEd25519, UnusablePublicKeysAreRefusedWithWhatToDo) {
  const std::string public_base64(rfc8032_public_key.substr(5));
  const std::string hmac_secret(secret);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "is empty"},
      {"whpk_", "is empty"},
      {public_base64, "does not start with \"whpk_\""},
      {hmac_secret, "StandardWebhookVerifier"},
      {"whsk_" + public_base64, "must never reach a receiver"},
      {"whpk_" + public_base64.substr(0, 43), "does not decode exactly"},
      {"whpk_" + public_base64.substr(0, 42), "does not decode exactly"},
      {"whpk_" + public_base64 + "A", "standard base64"},
      {"whpk_" + public_base64.substr(0, 42) + "b=", "does not decode exactly"},
      {"whpk_11qY AYKx", "not \"whpk_\" followed by standard base64"},
      {"whpk_11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo=", "standard base64"},
  };
  for (const auto& [key, expected] : cases) {
    const std::string message = construction_error(key);
    EXPECT_NE(message.find(expected), std::string::npos) << key << ": " << message;
    if (key.size() > 10) {
      EXPECT_EQ(message.find(key.substr(5)), std::string::npos) << message;
    }
    EXPECT_EQ(rejection_of(idemgate::verify_standard_webhook_ed25519(
                  key, id, timestamp, rfc8032_delivery_signature, body, clock_at(signed_at))),
              WebhookRejection::unusable_secret)
        << key;
  }
  EXPECT_EQ(construction_error(rfc8032_public_key), "");
}
