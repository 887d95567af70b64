// The one JSON string reader behind the console's requests, the server's canonical form and a
// row's history: what it reads, where it stops, and what it refuses.

#include <idemgate/detail/json_string.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace {

using idemgate::detail::json::RawBytes;
using idemgate::detail::json::read_string;

struct Read {
  std::string value;
  std::string_view wrong;
  std::size_t at = 0;
};

Read read(std::string_view text, RawBytes raw = RawBytes::utf8) {
  Read r;
  r.wrong = read_string(text, r.at, r.value, raw);
  return r;
}

TEST(JsonString, ResolvesEveryEscapeAndStopsAfterTheClosingQuote) {
  const auto r = read(R"("a\"b\\c\/d\be\ff\ng\rh\ti\u0041\u00e9" tail)");
  EXPECT_TRUE(r.wrong.empty()) << r.wrong;
  EXPECT_EQ(r.value, "a\"b\\c/d\be\ff\ng\rh\tiA\xC3\xA9");
  EXPECT_EQ(r.at, std::string_view(R"("a\"b\\c\/d\be\ff\ng\rh\ti\u0041\u00e9")").size());
}

TEST(JsonString, JoinsASurrogatePairIntoOneCodePoint) {
  const auto r = read(R"("\ud83d\ude00")");
  EXPECT_TRUE(r.wrong.empty()) << r.wrong;
  EXPECT_EQ(r.value, "\xF0\x9F\x98\x80");  // U+1F600
}

TEST(JsonString, RefusesHalfASurrogatePairPointingAtItsEscape) {
  for (const std::string_view bad :
       {R"("x\ud83d")", R"("x\ud83dy")", R"("x\ud83d\u0041")", R"("x\ude00")"}) {
    const auto r = read(bad);
    EXPECT_NE(r.wrong.find("surrogate"), std::string_view::npos) << bad << ": " << r.wrong;
    EXPECT_EQ(r.at, 2u) << bad;
  }
}

TEST(JsonString, RefusesWhatIsNotAStringToken) {
  EXPECT_EQ(read("abc").wrong, "a string is expected");
  EXPECT_EQ(read(R"("abc)").wrong, "a string is not closed");
  EXPECT_EQ(read("\"a\nb\"").wrong, "a control character inside a string must be escaped");
  EXPECT_EQ(read(R"("a\)").wrong, "an escape is cut short");
  EXPECT_EQ(read(R"("a\u00g1")").wrong, "a \\u escape needs four hex digits");
  EXPECT_EQ(read(R"("a\u00")").wrong, "a \\u escape needs four hex digits");
  const auto unknown = read(R"("ab\x")");
  EXPECT_EQ(unknown.wrong, "a string holds an unknown escape");
  EXPECT_EQ(unknown.at, 3u);
}

TEST(JsonString, BytesThatAreNotUtf8AreRefusedOrKeptAsAsked) {
  const std::string overlong = "\"a\xC0\xAF\"";  // an overlong '/'
  const auto strict = read(overlong);
  EXPECT_EQ(strict.wrong, "a string is not UTF-8");
  EXPECT_EQ(strict.at, 2u);
  const auto kept = read(overlong, RawBytes::any);
  EXPECT_TRUE(kept.wrong.empty()) << kept.wrong;
  EXPECT_EQ(kept.value, "a\xC0\xAF");
  EXPECT_EQ(read("\"\xE2\x82\xAC\"").value, "\xE2\x82\xAC");  // a valid euro sign either way
}

}  // namespace
