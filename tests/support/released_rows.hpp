#pragma once

// What an upgraded log must still hold of the rows `released_logs.hpp` wrote into a released
// shape: each row as the old version wrote it, belonging to no gate.

#include "released_logs.hpp"

#include <idemgate/record.hpp>

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace idemgate::test {

/// Checks the row of event `i` written into a log of released shape `shape`, as the upgraded
/// store reads it back with `find`.
inline void expect_released_row(const std::optional<Record>& row, int i, int shape) {
  ASSERT_TRUE(row.has_value()) << "row " << i;
  const RecordStatus by_remainder[] = {RecordStatus::in_flight, RecordStatus::committed,
                                       RecordStatus::failed, RecordStatus::escalated};
  EXPECT_EQ(row->status, by_remainder[i % 4]) << "row " << i;
  EXPECT_EQ(row->request, "{\"order\":" + std::to_string(i) + "}") << "row " << i;
  if (row->status == RecordStatus::committed) {
    EXPECT_EQ(row->result, "{\"booking\":" + std::to_string(i) + "}") << "row " << i;
  }
  if (row->status == RecordStatus::failed) {
    EXPECT_EQ(row->reason, "downstream answered 422") << "row " << i;
  }
  if (row->status == RecordStatus::escalated) {
    EXPECT_EQ(row->reason, "poison: gave up after 5 attempts") << "row " << i;
  }
  EXPECT_EQ(row->duplicates, shape >= 2 ? i % 3 : 0) << "row " << i;
  EXPECT_EQ(row->label, shape >= 5 && i % 3 == 0 ? "order " + std::to_string(i) : "")
      << "row " << i;
  EXPECT_EQ(row->gate, "") << "row " << i;
}

}  // namespace idemgate::test
