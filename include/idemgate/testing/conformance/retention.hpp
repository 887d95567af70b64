// SPDX-License-Identifier: MIT
// Conformance tests of retention: purge finished rows past the window, never in-flight ones;
// expire one key's row and purge abandoned attempts once their life is over.
#pragma once

#include "../../concepts.hpp"
#include "../../record.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::testing {

/// @cond

TYPED_TEST_P(StoreConformance, PurgeRemovesFinishedRowsPastTheWindowAndKeepsTheRest) {
  const Key c1 = detail::key_of("old committed 1"), c2 = detail::key_of("old committed 2");
  const Key f1 = detail::key_of("old failed"), i1 = detail::key_of("old in flight");
  const Key e1 = detail::key_of("old escalated"), r1 = detail::key_of("old released");
  ASSERT_NO_FATAL_FAILURE(this->settled(c1, RecordStatus::committed));
  ASSERT_NO_FATAL_FAILURE(this->settled(c2, RecordStatus::committed));
  ASSERT_NO_FATAL_FAILURE(this->settled(f1, RecordStatus::failed));
  ASSERT_NO_FATAL_FAILURE(this->settled(i1, RecordStatus::in_flight));
  ASSERT_NO_FATAL_FAILURE(this->settled(e1, RecordStatus::escalated));
  ASSERT_NO_FATAL_FAILURE(this->settled(r1, RecordStatus::in_flight));
  ASSERT_TRUE(this->store().release(r1, 1));
  this->traits_.advance(2h);
  const Key c3 = detail::key_of("new committed"), f2 = detail::key_of("new failed");
  ASSERT_NO_FATAL_FAILURE(this->settled(c3, RecordStatus::committed));
  ASSERT_NO_FATAL_FAILURE(this->settled(f2, RecordStatus::failed));

  EXPECT_EQ(this->store().purge(1h, 100), 3u);
  for (const Key& gone : {c1, c2, f1}) EXPECT_FALSE(this->store().find(gone).has_value());
  EXPECT_EQ(this->status_of(i1), RecordStatus::in_flight);
  EXPECT_EQ(this->status_of(r1), RecordStatus::in_flight);
  EXPECT_EQ(this->status_of(e1), RecordStatus::escalated);
  EXPECT_EQ(this->status_of(c3), RecordStatus::committed);
  EXPECT_EQ(this->status_of(f2), RecordStatus::failed);
  EXPECT_EQ(this->store().purge(1h, 100), 0u) << "nothing left past the window";
  EXPECT_EQ(this->traits_.business_rows(), 3) << "business rows are the caller's";
  EXPECT_EQ(this->store().escalated(10).size(), 1u);
  // Past the dedup window an event is new again: why the window must outlast redeliveries.
  EXPECT_EQ(this->reserve(c1).kind, Reservation::Kind::acquired);
}

TYPED_TEST_P(StoreConformance, ExpireDeletesAKeysRowOnlyWhenItsLifeIsOver) {
  if constexpr (!idemgate::expiring_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::expiring_store";
  } else {
    const Key committed = detail::key_of("expire: committed"),
              failed = detail::key_of("expire: failed"),
              released = detail::key_of("expire: released"),
              dead = detail::key_of("expire: dead worker"),
              parked = detail::key_of("expire: escalated"),
              running = detail::key_of("expire: live lease");
    ASSERT_NO_FATAL_FAILURE(this->settled(committed, RecordStatus::committed));
    ASSERT_NO_FATAL_FAILURE(this->settled(failed, RecordStatus::failed));
    ASSERT_NO_FATAL_FAILURE(this->settled(released, RecordStatus::in_flight));
    ASSERT_TRUE(this->store().release(released, 1));
    ASSERT_NO_FATAL_FAILURE(this->settled(dead, RecordStatus::in_flight));
    ASSERT_NO_FATAL_FAILURE(this->settled(parked, RecordStatus::escalated));
    ASSERT_EQ(this->reserve(running, "request", 10h).kind, Reservation::Kind::acquired);
    for (const Key& key : {committed, failed, released})
      EXPECT_FALSE(this->store().expire(key, 1h)) << "within its lifetime";
    EXPECT_FALSE(this->store().expire(detail::key_of("expire: never seen"), 0s));

    this->traits_.advance(2h);
    for (const Key& key : {committed, failed, released, dead})
      EXPECT_TRUE(this->store().expire(key, 1h)) << "past its lifetime";
    for (const Key& key : {committed, failed, released, dead})
      EXPECT_FALSE(this->store().find(key).has_value());
    EXPECT_FALSE(this->store().expire(parked, 1h)) << "an escalated row waits for its human";
    EXPECT_FALSE(this->store().expire(running, 1h)) << "a live lease is never cut";
    EXPECT_EQ(this->status_of(parked), RecordStatus::escalated);
    EXPECT_EQ(this->status_of(running), RecordStatus::in_flight);
    // The key is new again, for any request.
    EXPECT_EQ(this->reserve(released, "another request").kind, Reservation::Kind::acquired);
    EXPECT_FALSE(this->store().expire(released, 1h)) << "the new row's life has just begun";
  }
}

TYPED_TEST_P(StoreConformance, PurgeAbandonedDeletesOnlyAttemptsNobodyTouched) {
  if constexpr (!idemgate::expiring_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::expiring_store";
  } else {
    const Key released = detail::key_of("abandoned: released"),
              dead = detail::key_of("abandoned: dead worker"),
              retried = detail::key_of("abandoned: retried lately"),
              committed = detail::key_of("abandoned: committed"),
              parked = detail::key_of("abandoned: escalated"),
              running = detail::key_of("abandoned: live lease");
    ASSERT_NO_FATAL_FAILURE(this->settled(released, RecordStatus::in_flight));
    ASSERT_TRUE(this->store().release(released, 1));
    ASSERT_NO_FATAL_FAILURE(this->settled(dead, RecordStatus::in_flight));
    ASSERT_NO_FATAL_FAILURE(this->settled(retried, RecordStatus::in_flight));
    ASSERT_NO_FATAL_FAILURE(this->settled(committed, RecordStatus::committed));
    ASSERT_NO_FATAL_FAILURE(this->settled(parked, RecordStatus::escalated));
    ASSERT_EQ(this->reserve(running, "request", 10h).kind, Reservation::Kind::acquired);
    this->traits_.advance(2h);
    // A retry took `retried` over and gave it back just now: touched within the window.
    const Reservation retry = this->reserve(retried);
    ASSERT_EQ(retry.kind, Reservation::Kind::taken_over);
    ASSERT_TRUE(this->store().release(retried, retry.fence));

    EXPECT_EQ(this->store().purge_abandoned(1h, 0), 0u) << "a batch of 0 deletes nothing";
    EXPECT_EQ(this->store().purge_abandoned(1h, 1), 2u) << "one by one: released and dead";
    EXPECT_FALSE(this->store().find(released).has_value());
    EXPECT_FALSE(this->store().find(dead).has_value());
    EXPECT_EQ(this->status_of(retried), RecordStatus::in_flight);
    EXPECT_EQ(this->status_of(committed), RecordStatus::committed) << "purge's, not this one's";
    EXPECT_EQ(this->status_of(parked), RecordStatus::escalated);
    EXPECT_EQ(this->status_of(running), RecordStatus::in_flight);
    EXPECT_EQ(this->store().purge_abandoned(1h, 100), 0u);
    EXPECT_EQ(this->store().purge_abandoned(0s, 100), 1u) << "retried, with a window of 0";
  }
}

TYPED_TEST_P(StoreConformance, PurgeDeletesInBatchesAndReturnsTheTotal) {
  for (int i = 0; i < 23; ++i)
    ASSERT_NO_FATAL_FAILURE(this->settled(
        detail::key_of("batch", i), i % 5 == 0 ? RecordStatus::failed : RecordStatus::committed));
  this->traits_.advance(2h);
  EXPECT_EQ(this->store().purge(1h, 0), 0u) << "a batch of 0 deletes nothing";
  EXPECT_TRUE(this->store().find(detail::key_of("batch", 0)).has_value());
  EXPECT_EQ(this->store().purge(1h, 10), 23u) << "10 + 10 + 3";
  for (int i = 0; i < 23; ++i)
    EXPECT_FALSE(this->store().find(detail::key_of("batch", i)).has_value()) << i;
  for (int i = 0; i < 4; ++i)
    ASSERT_NO_FATAL_FAILURE(
        this->settled(detail::key_of("one by one", i), RecordStatus::committed));
  EXPECT_EQ(this->store().purge(0s, 1), 4u);
  EXPECT_EQ(this->store().purge(0s, 2), 0u);
}

TYPED_TEST_P(StoreConformance, PurgeNeverRemovesAnInFlightRowUnderConcurrentTraffic) {
  constexpr int workers = 4, per_worker = 40;
  std::vector<std::vector<Key>> flying(workers), finished(workers);
  std::atomic<bool> traffic_done{false};
  std::atomic<std::size_t> purged{0};
  std::atomic<int> errors{0}, lost{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      try {
        for (int i = 0; i < per_worker; ++i) {
          const Key key = detail::key_of("traffic-" + std::to_string(w), i);
          const Reservation r = this->reserve(key);
          if (r.kind != Reservation::Kind::acquired) ++errors;
          switch (i % 4) {
            case 0:
              if (this->store().commit(key, r.fence, "slot", this->writer(key)) !=
                  CommitStatus::committed)
                ++lost;
              finished[w].push_back(key);
              break;
            case 1:
              if (this->store().fail(key, r.fence, "422") != CommitStatus::committed) ++lost;
              finished[w].push_back(key);
              break;
            case 2:
              flying[w].push_back(key);
              break;
            default:
              if (!this->store().release(key, r.fence)) ++lost;
              flying[w].push_back(key);
              break;
          }
        }
      } catch (...) {
        ++errors;
      }
    });
  std::thread purger([&] {
    try {
      while (!traffic_done.load()) purged += this->store().purge(0s, 3);
    } catch (...) {
      ++errors;
    }
  });
  for (auto& t : threads) t.join();
  traffic_done = true;
  purger.join();
  purged += this->store().purge(0s, 1000);

  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(lost.load(), 0) << "a purge took a row from under its holder";
  std::size_t finished_count = 0;
  for (int w = 0; w < workers; ++w) {
    for (const Key& key : flying[w]) {
      const auto row = this->store().find(key);
      ASSERT_TRUE(row.has_value()) << "an in-flight row was purged";
      EXPECT_EQ(row->status, RecordStatus::in_flight);
    }
    for (const Key& key : finished[w])
      EXPECT_FALSE(this->store().find(key).has_value()) << "a finished row outlived the purge";
    finished_count += finished[w].size();
  }
  EXPECT_EQ(purged.load(), finished_count) << "exactly the finished rows were purged";
  EXPECT_EQ(this->traits_.business_rows(), workers * per_worker / 4);
}

/// @endcond
}  // namespace idemgate::testing
