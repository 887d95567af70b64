// Includes every public header; test_all_headers_b.cpp does the same in a second translation
// unit, so a non-inline definition in a header fails to link.
#include "all_headers.hpp"

#include <gtest/gtest.h>

int all_headers_b_marker();

TEST(AllHeaders, CompileAndLinkInTwoTranslationUnits) {
  EXPECT_EQ(all_headers_b_marker(), 32);
  EXPECT_EQ(idemgate::derive_key("a", "b"), idemgate::derive_key("a", "b"));
}
