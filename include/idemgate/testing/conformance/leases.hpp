// SPDX-License-Identifier: MIT
// Conformance tests of renewals: `extend` renews only the leases whose fence still holds; a
// release with a hold keeps the key until the hold ends.
#pragma once

#include "../../concepts.hpp"
#include "../../record.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace idemgate::testing {

/// @cond
// A store without `extend` (lease_extending_store) skips this case: the gate renews no
// lease on it.

TYPED_TEST_P(StoreConformance, ARenewalExtendsOnlyTheLeasesWhoseFenceStillHolds) {
  if constexpr (!idemgate::lease_extending_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "this store has no extend(): the gate's heartbeat renews no lease on it";
  } else {
    const Key held = detail::key_of("renew-held"), moved = detail::key_of("renew-moved");
    const Key done = detail::key_of("renew-committed"), failed = detail::key_of("renew-failed");
    const Key parked = detail::key_of("renew-escalated"), unknown = detail::key_of("renew-none");
    const Reservation h = this->reserve(held, "request", 10s);
    const Reservation m = this->reserve(moved, "request", 10s);
    ASSERT_NO_FATAL_FAILURE(this->settled(done, RecordStatus::committed));
    ASSERT_NO_FATAL_FAILURE(this->settled(failed, RecordStatus::failed));
    ASSERT_NO_FATAL_FAILURE(this->settled(parked, RecordStatus::escalated));
    // Both leases run out; a redelivery takes one of them over, moving its fence.
    this->traits_.advance(11s);
    const Reservation taken = this->reserve(moved, "request", 10s);
    ASSERT_EQ(taken.kind, Reservation::Kind::taken_over);
    std::vector<Record> before;
    for (const Key& key : {held, moved, done, failed, parked})
      before.push_back(*this->store().find(key));

    const std::vector<HeldLease> asked{{held, h.fence}, {moved, m.fence}, {done, 1},
                                       {failed, 1},     {parked, 1},      {unknown, 1}};
    EXPECT_EQ(this->store().extend(asked, 1h), 1u) << "only the lease whose fence still holds";
    EXPECT_GT(this->store().find(held)->lease_until, before[0].lease_until + 50min)
        << "renewed from now, although it had run out: nobody took it over";
    static constexpr const char* untouched[] = {"the row taken over", "the committed row",
                                                "the failed row", "the escalated row"};
    for (std::size_t i = 1; i < before.size(); ++i) {
      const auto row = this->store().find(before[i].key);
      EXPECT_EQ(row->lease_until, before[i].lease_until) << untouched[i - 1];
      EXPECT_EQ(row->status, before[i].status) << untouched[i - 1];
      EXPECT_EQ(row->fence, before[i].fence) << untouched[i - 1];
    }
    EXPECT_EQ(this->store().extend(std::vector<HeldLease>{{moved, taken.fence + 1}}, 1h), 0u)
        << "a fence above the stored one (a takeover lost in a crash) holds no lease";
    EXPECT_EQ(this->store().extend(std::vector<HeldLease>{}, 1h), 0u);

    // What a renewal means to the holders: the renewed one is not taken over and commits; the
    // one whose fence moved cannot, and its renewals keep failing.
    const Reservation again = this->reserve(held, "request", 10s);
    EXPECT_EQ(again.kind, Reservation::Kind::existing) << "the renewed lease is live";
    EXPECT_EQ(again.fence, h.fence);
    EXPECT_EQ(this->store().commit(held, h.fence, "slot", this->writer(held)),
              CommitStatus::committed);
    EXPECT_EQ(this->store().commit(moved, m.fence, "slot", this->writer(moved)),
              CommitStatus::lost_lease);
    EXPECT_EQ(this->store().extend(std::vector<HeldLease>{{held, h.fence}, {moved, m.fence}}, 1h),
              0u)
        << "a lease that was committed or taken over is not renewed";
    EXPECT_EQ(this->store().extend(std::vector<HeldLease>{{moved, taken.fence}}, 1h), 1u)
        << "the new holder renews its own";
    EXPECT_EQ(this->traits_.business_rows(), 2) << "the committed row's and the renewed holder's";
  }
}

TYPED_TEST_P(StoreConformance, AReleaseWithAHoldKeepsTheKeyUntilTheHoldEnds) {
  if constexpr (!idemgate::backing_off_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::backing_off_store";
  } else {
    const Key held = detail::key_of("held for a back-off"), ran_out = detail::key_of("ran out");
    ASSERT_EQ(this->reserve(held).kind, Reservation::Kind::acquired);
    EXPECT_FALSE(this->store().release(held, 2, "503", 2s)) << "fenced, as every release";
    ASSERT_TRUE(this->store().release(held, 1, "503", 2s));
    const Reservation during = this->reserve(held);
    EXPECT_EQ(during.kind, Reservation::Kind::existing) << "held: no attempt may take it over";
    EXPECT_EQ(during.status, RecordStatus::in_flight);
    EXPECT_TRUE(during.held) << "nobody works under a hold: the gate must not answer in_flight";
    this->traits_.advance(2001ms);
    const Reservation after = this->reserve(held);
    ASSERT_EQ(after.kind, Reservation::Kind::taken_over);
    EXPECT_EQ(after.fence, 2);
    const Reservation live = this->reserve(held);
    EXPECT_EQ(live.kind, Reservation::Kind::existing);
    EXPECT_FALSE(live.held) << "a live worker's lease is no hold";
    // The history: the release, and no "lease expired" for a hold that ended.
    if constexpr (idemgate::operable_store<typename TypeParam::Store>) {
      const auto row = this->store().find(held);
      ASSERT_TRUE(row.has_value());
      ASSERT_FALSE(row->history.empty());
      EXPECT_EQ(row->history.back().outcome, "released");
      EXPECT_EQ(row->history.back().reason, "503");
      for (const auto& entry : row->history) EXPECT_NE(entry.outcome, "taken_over");
      // A lease that ran out after that takeover is one, and says so.
      this->traits_.advance(2min);
      ASSERT_EQ(this->reserve(held).kind, Reservation::Kind::taken_over);
      EXPECT_EQ(this->store().find(held)->history.back().outcome, "taken_over");
    }
    // A hold of 0 ends the lease now, as a release without one.
    ASSERT_EQ(this->reserve(ran_out).kind, Reservation::Kind::acquired);
    ASSERT_TRUE(this->store().release(ran_out, 1, "", 0ms));
    EXPECT_EQ(this->reserve(ran_out).kind, Reservation::Kind::taken_over);
  }
}

/// @endcond
}  // namespace idemgate::testing
