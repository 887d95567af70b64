// SPDX-License-Identifier: MIT
// Conformance tests of re-driving failed rows, by key and by time.
#pragma once

#include "../../concepts.hpp"
#include "../../record.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace idemgate::testing {

/// @cond
// A store without `redrive_failed` yet fails these cases (instead of not compiling).

TYPED_TEST_P(StoreConformance, ARedrivenFailedRowIsTakenOverByTheNextReservation) {
  if constexpr (!idemgate::redrivable_store<typename TypeParam::Store>) {
    FAIL() << "this store has no redrive_failed(key) and redrive_failed(from, to, limit) yet";
  } else {
    const Key key = detail::key_of("redrive-next");
    const Reservation r = this->reserve(key);
    ASSERT_EQ(this->store().fail(key, r.fence, "422 unknown container"), CommitStatus::committed);
    EXPECT_EQ(this->store().redrive_failed(detail::key_of("redrive-unknown")), 0u);
    EXPECT_EQ(this->store().redrive_failed(key), 1u);
    EXPECT_EQ(this->store().redrive_failed(key), 0u) << "only failed rows are re-driven";
    const auto row = this->store().find(key);
    ASSERT_TRUE(row.has_value());
    EXPECT_EQ(row->status, RecordStatus::in_flight);
    EXPECT_EQ(row->fence, 2);
    EXPECT_EQ(row->attempts, 2);
    EXPECT_EQ(row->reason, "");
    const Reservation again = this->reserve(key);
    EXPECT_EQ(again.kind, Reservation::Kind::taken_over) << "the lease of a re-driven row ended";
    EXPECT_EQ(again.fence, 3);
    EXPECT_EQ(this->store().find(key)->attempts, 3);
    EXPECT_EQ(this->store().fail(key, r.fence, "late"), CommitStatus::lost_lease)
        << "the fence of the failed attempt no longer holds";
    EXPECT_EQ(this->store().commit(key, again.fence, "slot", this->writer(key)),
              CommitStatus::committed);
    EXPECT_EQ(this->traits_.business_rows_for(key), 1);
  }
}

TYPED_TEST_P(StoreConformance, ARedrivenFailedRowIsTakenByTheReconciler) {
  if constexpr (!idemgate::redrivable_store<typename TypeParam::Store>) {
    FAIL() << "this store has no redrive_failed(key) and redrive_failed(from, to, limit) yet";
  } else {
    const Key key = detail::key_of("redrive-reconciler");
    const Reservation r = this->reserve(key);
    ASSERT_EQ(this->store().fail(key, r.fence, "422"), CommitStatus::committed);
    EXPECT_TRUE(this->store().take_stale(10, 0s, 1min).empty()) << "a failed row is not stale";
    ASSERT_EQ(this->store().redrive_failed(key), 1u);
    const std::vector<Stranded> taken = this->store().take_stale(10, 0s, 1min);
    ASSERT_EQ(taken.size(), 1u);
    EXPECT_EQ(taken[0].key, key);
    EXPECT_EQ(taken[0].fence, 3);
    EXPECT_EQ(taken[0].attempts, 3);
    EXPECT_EQ(taken[0].request, "request");
  }
}

TYPED_TEST_P(StoreConformance, RedrivingByTimeTakesFailedRowsInTheRangeUpToTheLimit) {
  if constexpr (!idemgate::redrivable_store<typename TypeParam::Store>) {
    FAIL() << "this store has no redrive_failed(key) and redrive_failed(from, to, limit) yet";
  } else {
    for (int i = 0; i < 3; ++i)
      this->settled(detail::key_of("redrive-range", i), RecordStatus::failed);
    this->settled(detail::key_of("redrive-range", 3), RecordStatus::committed);
    this->settled(detail::key_of("redrive-range", 4), RecordStatus::escalated);
    const auto now = std::chrono::system_clock::now();
    EXPECT_EQ(this->store().redrive_failed(now + 1h, now + 2h, 10), 0u) << "[from, to) excludes";
    EXPECT_EQ(this->store().redrive_failed(now - 1h, now + 1h, 2), 2u) << "at most limit rows";
    EXPECT_EQ(this->store().redrive_failed(now - 1h, now + 1h, 10), 1u);
    EXPECT_EQ(this->store().redrive_failed(now - 1h, now + 1h, 10), 0u);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(this->status_of(detail::key_of("redrive-range", i)), RecordStatus::in_flight) << i;
    EXPECT_EQ(this->status_of(detail::key_of("redrive-range", 3)), RecordStatus::committed);
    EXPECT_EQ(this->status_of(detail::key_of("redrive-range", 4)), RecordStatus::escalated);
    EXPECT_EQ(this->store().signals(1h).retrying, 3);
  }
}

TYPED_TEST_P(StoreConformance, RedrivingByKeyLeavesCommittedInFlightAndEscalatedRowsAlone) {
  if constexpr (!idemgate::redrivable_store<typename TypeParam::Store>) {
    FAIL() << "this store has no redrive_failed(key) and redrive_failed(from, to, limit) yet";
  } else {
    std::vector<Record> rows;
    ASSERT_NO_FATAL_FAILURE(this->rows_a_redrive_leaves_alone("redrive-key-guard", rows));
    for (const Record& row : rows)
      EXPECT_EQ(this->store().redrive_failed(row.key), 0u)
          << "a re-drive took a " << to_string(row.status) << " row";
    ASSERT_NO_FATAL_FAILURE(this->expect_left_alone(rows));
  }
}

TYPED_TEST_P(StoreConformance, RedrivingByTimeLeavesCommittedInFlightAndEscalatedRowsAlone) {
  if constexpr (!idemgate::redrivable_store<typename TypeParam::Store>) {
    FAIL() << "this store has no redrive_failed(key) and redrive_failed(from, to, limit) yet";
  } else {
    std::vector<Record> rows;
    ASSERT_NO_FATAL_FAILURE(this->rows_a_redrive_leaves_alone("redrive-range-guard", rows));
    const Key failed = detail::key_of("redrive-range-guard", 4);
    ASSERT_NO_FATAL_FAILURE(this->settled(failed, RecordStatus::failed));
    // Every row was written within the range: only its status may set one apart.
    const auto now = std::chrono::system_clock::now();
    EXPECT_EQ(this->store().redrive_failed(now - 1h, now + 1h, 100), 1u) << "the failed row only";
    EXPECT_EQ(this->status_of(failed), RecordStatus::in_flight);
    ASSERT_NO_FATAL_FAILURE(this->expect_left_alone(rows));
  }
}

/// @endcond
}  // namespace idemgate::testing
