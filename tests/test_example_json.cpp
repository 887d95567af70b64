// The examples' JSON (examples/common/json.hpp): nlohmann-json, with duplicate member names and
// deep nesting refused, because the examples parse bodies that arrive from outside.

#include <common/json.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace json = example::json;

TEST(ExampleJson, ReadsObjectsArraysStringsNumbersAndLiterals) {
  const auto document =
      json::parse(R"({"a":"x\u00e9\n","b":[1,-2,3.5,true,false,null],"c":{"d":7}})");
  ASSERT_TRUE(document.has_value());
  EXPECT_EQ(json::string_member(*document, "a"), "x\xc3\xa9\n");
  EXPECT_EQ(document->at("b").size(), 6u);
  EXPECT_EQ(json::integer_member(document->at("c"), "d"), 7);
}

TEST(ExampleJson, DuplicateMemberNameIsRefused) {
  EXPECT_FALSE(json::parse(R"({"account":"acc_1","account":"acc_2"})").has_value());
  EXPECT_FALSE(json::parse(R"({"a":1,"b":2,"a":1})").has_value()) << "even with equal values";
}

TEST(ExampleJson, DuplicateMemberNameInANestedObjectIsRefused) {
  EXPECT_FALSE(json::parse(R"({"data":{"cost_cents":5,"cost_cents":0}})").has_value());
  EXPECT_FALSE(json::parse(R"([{"x":1},{"y":2,"y":3}])").has_value());
  EXPECT_FALSE(json::parse(R"({"a":{"b":{"c":1,"c":1}}})").has_value());
}

TEST(ExampleJson, SameNameInDifferentObjectsIsAccepted) {
  const auto document = json::parse(R"({"id":1,"inner":{"id":2},"list":[{"id":3},{"id":4}]})");
  ASSERT_TRUE(document.has_value());
  EXPECT_EQ(json::integer_member(*document, "id"), 1);
  EXPECT_EQ(json::integer_member(document->at("inner"), "id"), 2);
  // A name reappearing after a nested object closes is still a repetition in the outer one.
  EXPECT_FALSE(json::parse(R"({"id":1,"inner":{"x":2},"id":3})").has_value());
}

TEST(ExampleJson, NestingDeeperThanTheLimitIsRefused) {
  const auto nested = [](int depth) {
    return std::string(static_cast<std::size_t>(depth), '[') + "1" +
           std::string(static_cast<std::size_t>(depth), ']');
  };
  EXPECT_TRUE(json::parse(nested(json::max_depth)).has_value());
  EXPECT_FALSE(json::parse(nested(json::max_depth + 1)).has_value());
  EXPECT_FALSE(json::parse(nested(100'000)).has_value());
}

TEST(ExampleJson, WhatIsNotJsonIsRefused) {
  for (const char* text : {"", "not json", "{", R"({"a":1,})", R"({"a":1} x)", R"({'a':1})",
                           R"({"a":01})", "\"\x01\"", R"("\ud800")", "{\"a\":\"\xff\"}"})
    EXPECT_FALSE(json::parse(text).has_value()) << text;
}

TEST(ExampleJson, MembersOfTheWrongTypeAreAbsent) {
  const auto document = json::parse(
      R"({"s":"5","i":5,"f":5.0,"e":5e2,"big":9223372036854775808,"max":9223372036854775807,)"
      R"("min":-9223372036854775808})");
  ASSERT_TRUE(document.has_value());
  EXPECT_EQ(json::string_member(*document, "i"), std::nullopt);
  EXPECT_EQ(json::string_member(*document, "missing"), std::nullopt);
  EXPECT_EQ(json::integer_member(*document, "s"), std::nullopt);
  EXPECT_EQ(json::integer_member(*document, "f"), std::nullopt);
  EXPECT_EQ(json::integer_member(*document, "e"), std::nullopt);
  EXPECT_EQ(json::integer_member(*document, "big"), std::nullopt);
  EXPECT_EQ(json::integer_member(*document, "max"), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(json::integer_member(*document, "min"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(json::string_member(json::Json::array(), "s"), std::nullopt);
}
