#pragma once

// Extreme option values and the check that a refused one says which option and which range.

#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::test {

/// A value under test and how to print it.
template <class T>
struct Sample {
  T value;
  std::string label;
};

/// 0, -1, min() and max() of a duration type.
template <class D>
std::vector<Sample<D>> extremes() {
  return {{D(0), "0"}, {D(-1), "-1"}, {D::min(), "min()"}, {D::max(), "max()"}};
}

/// 0 and max() of std::size_t (-1 converts to max()).
inline std::vector<Sample<std::size_t>> size_extremes() {
  return {{0, "0"}, {std::numeric_limits<std::size_t>::max(), "max()"}};
}

/// Runs `make`, which must throw `std::invalid_argument` whose message names `option` and says
/// the allowed `range`.
template <class Make>
void expect_refused(Make&& make, std::string_view option, std::string_view range,
                    const std::string& label) {
  try {
    make();
    ADD_FAILURE() << option << " = " << label << " was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(option), std::string::npos) << label << ": " << what;
    EXPECT_NE(what.find(range), std::string::npos) << label << ": " << what;
  }
}

}  // namespace idemgate::test
