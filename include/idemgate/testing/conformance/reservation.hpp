// SPDX-License-Identifier: MIT
// Conformance tests of one key: reserve, commit, fail, escalate, release, takeover, resolve.
#pragma once

#include "../../errors.hpp"
#include "../../record.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::testing {

/// @cond

TYPED_TEST_P(StoreConformance, FirstReservationAcquiresWithFenceOne) {
  const Key key = detail::key_of("first");
  EXPECT_FALSE(this->store().find(key).has_value());
  const Reservation r = this->reserve(key, "MSKU1\n07:00");
  EXPECT_EQ(r.kind, Reservation::Kind::acquired);
  EXPECT_EQ(r.fence, 1);
  const auto row = this->store().find(key);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->key, key);
  EXPECT_EQ(row->status, RecordStatus::in_flight);
  EXPECT_EQ(row->fence, 1);
  EXPECT_EQ(row->request, "MSKU1\n07:00");
  EXPECT_EQ(row->fingerprint, idemgate::detail::sha256("MSKU1\n07:00"));
  EXPECT_FALSE(row->result.has_value());
  EXPECT_GT(row->lease_until, row->created_at);
}

TYPED_TEST_P(StoreConformance, SecondReservationFindsTheKeyInFlightAsTheSameRequest) {
  const Key key = detail::key_of("second");
  ASSERT_EQ(this->reserve(key).kind, Reservation::Kind::acquired);
  const Reservation again = this->reserve(key);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.status, RecordStatus::in_flight);
  EXPECT_TRUE(again.same_request);
  EXPECT_EQ(again.fence, 1);
  EXPECT_EQ(this->store().find(key)->fence, 1) << "a live lease is never taken over";
}

TYPED_TEST_P(StoreConformance, ReservationWithADifferentRequestIsNotTheSameRequest) {
  const Key key = detail::key_of("different");
  ASSERT_EQ(this->reserve(key, "first request", 10s).kind, Reservation::Kind::acquired);
  const Reservation clash = this->reserve(key, "second request", 10s);
  EXPECT_EQ(clash.kind, Reservation::Kind::existing);
  EXPECT_FALSE(clash.same_request);
  this->traits_.advance(11s);
  const Reservation late = this->reserve(key, "second request", 10s);
  EXPECT_EQ(late.kind, Reservation::Kind::existing)
      << "a different request never takes an expired lease over";
  EXPECT_FALSE(late.same_request);
  EXPECT_EQ(this->store().find(key)->fence, 1);
  EXPECT_EQ(this->store().find(key)->request, "first request");
}

TYPED_TEST_P(StoreConformance, CommitWritesStatusResultAndBusinessRowTogether) {
  const Key key = detail::key_of("commit");
  const Reservation r = this->reserve(key);
  EXPECT_EQ(this->traits_.business_rows(), 0);
  EXPECT_EQ(this->store().commit(key, r.fence, "slot-1", this->writer(key)),
            CommitStatus::committed);
  const auto row = this->store().find(key);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->status, RecordStatus::committed);
  EXPECT_EQ(row->result, "slot-1");
  EXPECT_EQ(row->fence, r.fence);
  EXPECT_EQ(this->traits_.business_rows_for(key), 1);
  const Reservation duplicate = this->reserve(key);
  EXPECT_EQ(duplicate.kind, Reservation::Kind::existing);
  EXPECT_EQ(duplicate.status, RecordStatus::committed);
  EXPECT_TRUE(duplicate.same_request);
  EXPECT_EQ(duplicate.result, "slot-1");
}

TYPED_TEST_P(StoreConformance, CommitUnderAStaleFenceLosesTheLeaseAndWritesNothing) {
  const Key key = detail::key_of("stale");
  const Reservation first = this->reserve(key, "request", 10s);
  this->traits_.advance(11s);
  const Reservation second = this->reserve(key, "request", 10s);
  ASSERT_EQ(second.kind, Reservation::Kind::taken_over);
  EXPECT_EQ(this->store().commit(key, first.fence, "slot-old", this->writer(key)),
            CommitStatus::lost_lease);
  EXPECT_THROW((void)this->store().commit(key, second.fence + 5, "slot-future", this->writer(key)),
               idemgate::StoreError)
      << "a fence above the stored one: the caller's own takeover was lost; never acked";
  EXPECT_EQ(this->traits_.business_rows(), 0);
  const auto row = this->store().find(key);
  EXPECT_EQ(row->status, RecordStatus::in_flight);
  EXPECT_EQ(row->fence, second.fence);
  EXPECT_FALSE(row->result.has_value());
  EXPECT_EQ(this->store().commit(key, second.fence, "slot-new", this->writer(key)),
            CommitStatus::committed);
  EXPECT_EQ(this->traits_.business_rows_for(key), 1);
  EXPECT_EQ(this->store().find(key)->result, "slot-new");
  EXPECT_THROW(
      (void)this->store().commit(detail::key_of("never reserved"), 1, "slot", this->writer(key)),
      idemgate::StoreError)
      << "no row: the caller's reservation was lost; never acked";
  EXPECT_EQ(this->traits_.business_rows(), 1);
}

TYPED_TEST_P(StoreConformance, BusinessWriteThatThrowsCommitsNothingAndLeavesTheRowInFlight) {
  const Key key = detail::key_of("throws");
  const Reservation r = this->reserve(key);
  auto failing = [&](auto& tx) {
    this->traits_.write_business(tx, key);
    throw std::runtime_error("the business system refused");
  };
  EXPECT_THROW(this->store().commit(key, r.fence, "slot-1", failing), std::runtime_error);
  const auto row = this->store().find(key);
  EXPECT_EQ(row->status, RecordStatus::in_flight);
  EXPECT_FALSE(row->result.has_value());
  EXPECT_EQ(this->traits_.business_rows(), 0);
  // The store is still usable and the holder may commit once the business write succeeds.
  EXPECT_EQ(this->store().commit(key, r.fence, "slot-1", this->writer(key)),
            CommitStatus::committed);
  EXPECT_EQ(this->traits_.business_rows(), 1);
}

TYPED_TEST_P(StoreConformance, RepeatedCommitUnderTheSameFenceIsCommittedWithoutRepeatingTheWrite) {
  const Key key = detail::key_of("repeat");
  const Reservation r = this->reserve(key);
  ASSERT_EQ(this->store().commit(key, r.fence, "slot-1", this->writer(key)),
            CommitStatus::committed);
  EXPECT_EQ(this->store().commit(key, r.fence, "slot-1", this->writer(key)),
            CommitStatus::committed);
  EXPECT_EQ(this->store().commit(key, r.fence, "slot-2", this->writer(key)),
            CommitStatus::committed);
  EXPECT_EQ(this->traits_.business_rows_for(key), 1);
  EXPECT_EQ(this->store().find(key)->result, "slot-1") << "the first commit's result stays";
  EXPECT_EQ(this->store().commit(key, r.fence + 1, "slot-3", this->writer(key)),
            CommitStatus::lost_lease);
  EXPECT_EQ(this->traits_.business_rows(), 1);
}

TYPED_TEST_P(StoreConformance, FailIsFencedAndTheNextReservationSeesTheReason) {
  const Key key = detail::key_of("fail");
  const Reservation r = this->reserve(key);
  EXPECT_THROW((void)this->store().fail(key, r.fence + 1, "a takeover lost in a crash"),
               idemgate::StoreError)
      << "a fence above the stored one means the caller's own takeover is gone: not acked";
  EXPECT_EQ(this->status_of(key), RecordStatus::in_flight);
  EXPECT_EQ(this->store().fail(key, r.fence, "422 unknown container"), CommitStatus::committed);
  const Reservation again = this->reserve(key);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.status, RecordStatus::failed);
  EXPECT_EQ(again.reason, "422 unknown container");
  EXPECT_EQ(this->store().find(key)->reason, "422 unknown container");
  EXPECT_EQ(this->store().commit(key, r.fence, "slot", this->writer(key)),
            CommitStatus::lost_lease);
  EXPECT_EQ(this->store().escalate(key, r.fence, "late"), CommitStatus::lost_lease);
  EXPECT_EQ(this->status_of(key), RecordStatus::failed);
  EXPECT_EQ(this->traits_.business_rows(), 0);
  EXPECT_THROW((void)this->store().fail(detail::key_of("never reserved"), 1, "x"),
               idemgate::StoreError)
      << "no row: nobody holds the event, so the answer must not be acked";
}

TYPED_TEST_P(StoreConformance, EscalateIsFencedAndTheNextReservationSeesTheReason) {
  const Key key = detail::key_of("escalate");
  const Reservation first = this->reserve(key, "request", 10s);
  this->traits_.advance(11s);
  const Reservation second = this->reserve(key, "request", 10s);
  ASSERT_EQ(second.kind, Reservation::Kind::taken_over);
  EXPECT_EQ(this->store().escalate(key, first.fence, "stale worker"), CommitStatus::lost_lease);
  EXPECT_EQ(this->status_of(key), RecordStatus::in_flight);
  EXPECT_EQ(this->store().escalate(key, second.fence, "needs a human"), CommitStatus::committed);
  const Reservation again = this->reserve(key);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.status, RecordStatus::escalated);
  EXPECT_EQ(again.reason, "needs a human");
  this->traits_.advance(1h);
  EXPECT_EQ(this->reserve(key).kind, Reservation::Kind::existing)
      << "an escalated row is never taken over, however old";
  EXPECT_EQ(this->store().commit(key, second.fence, "slot", this->writer(key)),
            CommitStatus::lost_lease);
  EXPECT_EQ(this->traits_.business_rows(), 0);
}

TYPED_TEST_P(StoreConformance, ReleaseNeedsTheCurrentFenceAndKeepsTheRowInFlight) {
  const Key key = detail::key_of("release");
  const Reservation r = this->reserve(key);
  EXPECT_FALSE(this->store().release(key, r.fence + 1));
  EXPECT_EQ(this->reserve(key).kind, Reservation::Kind::existing)
      << "a wrong fence leaves the lease live";
  EXPECT_TRUE(this->store().release(key, r.fence));
  const auto row = this->store().find(key);
  ASSERT_TRUE(row.has_value()) << "a released row stays";
  EXPECT_EQ(row->status, RecordStatus::in_flight);
  EXPECT_EQ(row->fence, r.fence);
  EXPECT_LT(row->lease_until, row->updated_at) << "its lease ended when it was released";
  EXPECT_LT(row->lease_until, row->created_at);
  EXPECT_TRUE(this->store().release(key, r.fence)) << "releasing again under the fence is harmless";
  EXPECT_FALSE(this->store().release(detail::key_of("never reserved"), 1));
}

TYPED_TEST_P(StoreConformance, ReleasedKeyIsTakenOverAtOnceWithTheNextFence) {
  const Key key = detail::key_of("release-takeover");
  const Reservation r = this->reserve(key, "request", 1h);
  ASSERT_TRUE(this->store().release(key, r.fence));
  const Reservation next = this->reserve(key, "request", 1h);
  EXPECT_EQ(next.kind, Reservation::Kind::taken_over) << "no wait for the old lease";
  EXPECT_EQ(next.fence, r.fence + 1) << "fences stay monotonic per key";
  EXPECT_EQ(this->reserve(key, "request", 1h).kind, Reservation::Kind::existing)
      << "the new holder's lease is live";
  EXPECT_FALSE(this->store().release(key, r.fence)) << "the old fence releases nothing";
  EXPECT_EQ(this->store().commit(key, r.fence, "slot-old", this->writer(key)),
            CommitStatus::lost_lease)
      << "the worker that released can never commit";
  EXPECT_EQ(this->store().fail(key, r.fence, "old"), CommitStatus::lost_lease);
  EXPECT_EQ(this->traits_.business_rows(), 0);
  ASSERT_EQ(this->store().commit(key, next.fence, "slot", this->writer(key)),
            CommitStatus::committed);
  EXPECT_FALSE(this->store().release(key, next.fence)) << "a committed row is never released";
  EXPECT_EQ(this->status_of(key), RecordStatus::committed);
  EXPECT_EQ(this->traits_.business_rows_for(key), 1);
}

TYPED_TEST_P(StoreConformance, ReleasedRowThatNoDeliveryReclaimsIsLeftToTheReconciler) {
  const Key key = detail::key_of("release-stale");
  const Reservation r = this->reserve(key, "request", 1h);
  ASSERT_TRUE(this->store().release(key, r.fence));
  EXPECT_TRUE(this->store().take_stale(10, 1min, 1min).empty())
      << "a release is a change: not stale yet";
  this->traits_.advance(2min);
  const std::vector<Stranded> taken = this->store().take_stale(10, 1min, 1min);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].key, key);
  EXPECT_EQ(taken[0].fence, r.fence + 1);
  EXPECT_EQ(taken[0].request, "request");
  EXPECT_EQ(this->store().commit(key, r.fence, "slot-old", this->writer(key)),
            CommitStatus::lost_lease);
  EXPECT_EQ(this->store().commit(key, taken[0].fence, "slot", this->writer(key)),
            CommitStatus::committed);
  EXPECT_EQ(this->traits_.business_rows_for(key), 1);
}

TYPED_TEST_P(StoreConformance, RepeatedFailOrEscalateUnderTheSameFenceIsCommitted) {
  const Key failed = detail::key_of("repeat-fail"), parked = detail::key_of("repeat-escalate");
  const Reservation f = this->reserve(failed);
  const Reservation p = this->reserve(parked);
  ASSERT_EQ(this->store().fail(failed, f.fence, "422"), CommitStatus::committed);
  EXPECT_EQ(this->store().fail(failed, f.fence, "422"), CommitStatus::committed);
  EXPECT_EQ(this->store().fail(failed, f.fence + 1, "422"), CommitStatus::lost_lease);
  EXPECT_EQ(this->store().escalate(failed, f.fence, "x"), CommitStatus::lost_lease)
      << "the same fence, but another status";
  ASSERT_EQ(this->store().escalate(parked, p.fence, "no key"), CommitStatus::committed);
  EXPECT_EQ(this->store().escalate(parked, p.fence, "no key"), CommitStatus::committed);
  EXPECT_EQ(this->store().fail(parked, p.fence, "x"), CommitStatus::lost_lease);
  EXPECT_EQ(this->store().find(failed)->reason, "422");
  EXPECT_EQ(this->status_of(parked), RecordStatus::escalated);
}

TYPED_TEST_P(StoreConformance, ExpiredLeaseIsTakenOverWithTheNextFenceLiveLeaseIsNot) {
  const Key key = detail::key_of("takeover");
  ASSERT_EQ(this->reserve(key, "request", 10s).fence, 1);
  this->traits_.advance(5s);
  const Reservation live = this->reserve(key, "request", 10s);
  EXPECT_EQ(live.kind, Reservation::Kind::existing);
  EXPECT_EQ(live.status, RecordStatus::in_flight);
  this->traits_.advance(6s);
  const Reservation taken = this->reserve(key, "request", 10s);
  EXPECT_EQ(taken.kind, Reservation::Kind::taken_over);
  EXPECT_EQ(taken.fence, 2);
  const Reservation after = this->reserve(key, "request", 10s);
  EXPECT_EQ(after.kind, Reservation::Kind::existing) << "the new lease is live";
  EXPECT_EQ(after.fence, 2);
  this->traits_.advance(11s);
  EXPECT_EQ(this->reserve(key, "request", 10s).fence, 3);
  EXPECT_EQ(this->store().find(key)->fence, 3);
}

TYPED_TEST_P(StoreConformance, TakeStaleRespectsLeaseStalenessAndLimitAndBumpsFences) {
  const Key k1 = detail::key_of("stale-1"), k2 = detail::key_of("stale-2"),
            k3 = detail::key_of("stale-3");
  const Key live = detail::key_of("stale-live"), done = detail::key_of("stale-done");
  // Lease order (k2, k3, k1) differs from insertion order, so "oldest lease first" shows.
  this->reserve(k1, "r1", 30s);
  this->reserve(k2, "r2", 10s);
  this->reserve(k3, "r3", 20s);
  this->reserve(live, "live", 1h);
  const Reservation d = this->reserve(done, "done", 10s);
  ASSERT_EQ(this->store().commit(done, d.fence, "slot", this->writer(done)),
            CommitStatus::committed);
  EXPECT_TRUE(this->store().take_stale(10, 0s, 1min).empty()) << "every lease is still live";
  this->traits_.advance(31s);
  EXPECT_TRUE(this->store().take_stale(10, 1min, 1min).empty())
      << "nothing has been unchanged for a minute yet";

  const std::vector<Stranded> oldest = this->store().take_stale(2, 0s, 1min);
  ASSERT_EQ(oldest.size(), 2u) << "the limit holds";
  std::set<Key> taken;
  for (const Stranded& s : oldest) {
    taken.insert(s.key);
    EXPECT_EQ(s.fence, 2);
    EXPECT_EQ(s.request, s.key == k2 ? "r2" : "r3");
  }
  EXPECT_EQ(taken, (std::set<Key>{k2, k3})) << "oldest lease first";
  const std::vector<Stranded> rest = this->store().take_stale(10, 0s, 1min);
  ASSERT_EQ(rest.size(), 1u) << "taken rows hold a new live lease";
  EXPECT_EQ(rest[0].key, k1);
  EXPECT_EQ(rest[0].fence, 2);
  EXPECT_EQ(rest[0].request, "r1");
  EXPECT_TRUE(this->store().take_stale(10, 0s, 1min).empty());

  EXPECT_EQ(this->store().find(live)->fence, 1);
  EXPECT_EQ(this->store().find(done)->status, RecordStatus::committed);
  EXPECT_EQ(this->store().commit(k1, 1, "slot", this->writer(k1)), CommitStatus::lost_lease);
  EXPECT_EQ(this->store().commit(k1, 2, "slot", this->writer(k1)), CommitStatus::committed);
  EXPECT_EQ(this->traits_.business_rows(), 2);
}

TYPED_TEST_P(StoreConformance, EscalatedListsOldestFirst) {
  const Key a = detail::key_of("esc-a"), b = detail::key_of("esc-b"), c = detail::key_of("esc-c");
  const Key flying = detail::key_of("esc-flying");
  const auto ra = this->reserve(a), rb = this->reserve(b), rc = this->reserve(c);
  this->reserve(flying);
  ASSERT_EQ(this->store().escalate(b, rb.fence, "reason b"), CommitStatus::committed);
  this->traits_.advance(1s);
  ASSERT_EQ(this->store().escalate(a, ra.fence, "reason a"), CommitStatus::committed);
  this->traits_.advance(1s);
  ASSERT_EQ(this->store().escalate(c, rc.fence, "reason c"), CommitStatus::committed);

  const std::vector<Record> all = this->store().escalated(10);
  ASSERT_EQ(all.size(), 3u) << "in-flight rows are not listed";
  EXPECT_EQ(all[0].key, b);
  EXPECT_EQ(all[1].key, a);
  EXPECT_EQ(all[2].key, c);
  EXPECT_EQ(all[0].reason, "reason b");
  EXPECT_EQ(all[0].status, RecordStatus::escalated);
  EXPECT_EQ(all[0].request, "request");
  const std::vector<Record> two = this->store().escalated(2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].key, b);
  EXPECT_EQ(two[1].key, a);
}

TYPED_TEST_P(StoreConformance, ResolveCommitsAnEscalatedRowWithItsBusinessWriteOnly) {
  const Key parked = detail::key_of("resolve-parked"), flying = detail::key_of("resolve-flying");
  const Reservation r = this->reserve(parked);
  const Reservation f = this->reserve(flying);
  ASSERT_EQ(this->store().escalate(parked, r.fence, "no key support"), CommitStatus::committed);

  EXPECT_FALSE(this->store().resolve(flying, "slot", this->writer(flying)))
      << "an in-flight row is not resolved";
  EXPECT_FALSE(this->store().resolve(detail::key_of("unknown"), "slot", this->writer(flying)));
  EXPECT_EQ(this->status_of(flying), RecordStatus::in_flight);
  EXPECT_EQ(this->traits_.business_rows(), 0);

  auto failing = [&](auto& tx) {
    this->traits_.write_business(tx, parked);
    throw std::runtime_error("the business system refused");
  };
  EXPECT_THROW(this->store().resolve(parked, "slot-9", failing), std::runtime_error);
  EXPECT_EQ(this->status_of(parked), RecordStatus::escalated);
  EXPECT_EQ(this->traits_.business_rows(), 0);

  EXPECT_TRUE(this->store().resolve(parked, "slot-9", this->writer(parked)));
  const auto row = this->store().find(parked);
  EXPECT_EQ(row->status, RecordStatus::committed);
  EXPECT_EQ(row->result, "slot-9");
  EXPECT_EQ(this->traits_.business_rows_for(parked), 1);
  EXPECT_FALSE(this->store().resolve(parked, "slot-9", this->writer(parked)))
      << "a resolved row is not resolved twice";
  EXPECT_EQ(this->traits_.business_rows(), 1);
  EXPECT_TRUE(this->store().escalated(10).empty());
  const Reservation duplicate = this->reserve(parked);
  EXPECT_EQ(duplicate.status, RecordStatus::committed);
  EXPECT_EQ(duplicate.result, "slot-9");
  EXPECT_EQ(f.fence, this->store().find(flying)->fence);
}

TYPED_TEST_P(StoreConformance, EightThreadsReservingOneKeyHaveExactlyOneWinner) {
  for (int round = 0; round < 10; ++round) {
    const Key key = detail::key_of("race-" + std::to_string(round));
    std::barrier start(8);
    std::atomic<int> acquired{0}, existing{0}, errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&] {
        start.arrive_and_wait();
        try {
          const Reservation r = this->reserve(key);
          if (r.kind == Reservation::Kind::acquired) ++acquired;
          if (r.kind == Reservation::Kind::existing && r.same_request &&
              r.status == RecordStatus::in_flight && r.fence == 1)
            ++existing;
        } catch (...) {
          ++errors;
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors.load(), 0) << "round " << round;
    EXPECT_EQ(acquired.load(), 1) << "round " << round;
    EXPECT_EQ(existing.load(), 7) << "round " << round;
    EXPECT_EQ(this->store().find(key)->fence, 1);
  }
}

/// @endcond
}  // namespace idemgate::testing
