#include <idemgate/key.hpp>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <unordered_set>

using idemgate::derive_key;
using idemgate::derive_key_from;
using idemgate::Key;
using idemgate::KeyError;

namespace {

std::string hex(const idemgate::detail::Sha256::digest_type& digest) {
  return Key(digest).hex();
}

}  // namespace

TEST(Sha256, MatchesPublishedVectors) {
  EXPECT_EQ(hex(idemgate::detail::sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(idemgate::detail::sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      hex(idemgate::detail::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, ContextIsReusableAcrossDigests) {
  auto& hasher = idemgate::detail::thread_sha256();
  hasher.update("ab");
  hasher.update("c");
  EXPECT_EQ(hex(hasher.finish()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(idemgate::detail::sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(DeriveKey, IsSha256OfLengthPrefixedParts) {
  // Pinned: the encoding is part of the contract; changing it would re-key every stored event.
  EXPECT_EQ(derive_key("ect.claim_slot", "CIS-2025-06-09-1001", "MSKU7000037").hex(),
            "fcdf3be2f923908b2dc04f19ada8a7cf01909fd202b58ca9676f08591cf59d11");
}

TEST(DeriveKey, SeparatorInsidePartsCannotCollide) {
  const Key left = derive_key("s", "a:b", "c");
  const Key right = derive_key("s", "a", "b:c");
  EXPECT_NE(left, right);
  EXPECT_EQ(left.hex(), "02fd6c553807cbc44a4ce6b312c17bc0cac17cef0afc8054ea68dd5dcea4ef56");
  EXPECT_EQ(right.hex(), "7ced994c4e9dbe7bebaa7975e4b8dbb58ad7be8097cef54b9623d678af4fdf7f");
}

TEST(DeriveKey, ScopeSeparatesOperationsOnTheSameEvent) {
  EXPECT_NE(derive_key("ect.claim_slot", "n1"), derive_key("tms.write_booking", "n1"));
  EXPECT_NE(derive_key("ab", "c"), derive_key("a", "bc"));
}

TEST(DeriveKey, SameInputGivesSameKeyEveryTime) {
  const std::string id = "CIS-1";
  EXPECT_EQ(derive_key("s", id, "MSKU1"), derive_key("s", std::string_view("CIS-1"), "MSKU1"));
  EXPECT_EQ(derive_key("s", id, "MSKU1"), derive_key_from("s", {"CIS-1", "MSKU1"}));
}

TEST(DeriveKey, PartOrderMatters) {
  EXPECT_NE(derive_key("s", "a", "b"), derive_key("s", "b", "a"));
}

TEST(DeriveKey, EmptyPartIsAnErrorThatNamesThePart) {
  try {
    (void)derive_key("ect.claim_slot", "CIS-1", "");
    FAIL() << "an empty part must not give a key";
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("part 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ect.claim_slot"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)derive_key("", "CIS-1"), KeyError);
  EXPECT_THROW((void)derive_key_from("s", {"a", ""}), KeyError);
  EXPECT_THROW((void)derive_key_from("s", {}), KeyError);
}

TEST(Key, HexRoundTrips) {
  const Key key = derive_key("s", "round", "trip");
  const auto parsed = Key::from_hex(key.hex());
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, key);
  std::string upper = key.hex();
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(Key::from_hex(upper), key);
}

TEST(Key, FromHexRejectsWrongLengthAndNonHex) {
  EXPECT_FALSE(Key::from_hex("").has_value());
  EXPECT_FALSE(Key::from_hex(std::string(63, 'a')).has_value());
  EXPECT_FALSE(Key::from_hex(std::string(65, 'a')).has_value());
  EXPECT_FALSE(Key::from_hex(std::string(63, 'a') + "g").has_value());
}

TEST(Key, WorksInUnorderedContainers) {
  std::unordered_set<Key> keys;
  for (int i = 0; i < 1000; ++i) keys.insert(derive_key("s", std::to_string(i)));
  keys.insert(derive_key("s", "0"));
  EXPECT_EQ(keys.size(), 1000u);
}

TEST(Key, OrdersByItsBytesLexicographically) {
  Key::bytes_type low{}, high{};
  low[0] = 1;
  low[31] = 0xff;
  high[0] = 2;  // the first differing byte decides, whatever follows
  EXPECT_TRUE(Key(low) < Key(high));
  EXPECT_EQ(Key(high) <=> Key(low), std::strong_ordering::greater);
  EXPECT_EQ(Key(low) <=> Key(low), std::strong_ordering::equal);
  high[0] = 1;
  EXPECT_TRUE(Key(high) < Key(low));  // equal until the last byte
  std::set<Key> ordered{Key(low), Key(high), Key(low)};
  EXPECT_EQ(ordered.size(), 2U);
  EXPECT_EQ(*ordered.begin(), Key(high));
}
