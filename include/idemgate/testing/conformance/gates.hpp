// SPDX-License-Identifier: MIT
// Conformance tests of gates sharing one log: each handle sees only its own gate's rows.
#pragma once

#include "../../concepts.hpp"
#include "../../errors.hpp"
#include "../../gate.hpp"
#include "../../reconciler.hpp"
#include "../../record.hpp"
#include "../slot_request.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::testing {

/// @cond

TYPED_TEST_P(StoreConformance, TwoGatesReservingOneKeyEachHoldTheirOwnRow) {
  auto credit = this->unscoped_store().for_gate("payments.credit");
  auto receipt = this->unscoped_store().for_gate("payments.receipt");
  EXPECT_EQ(credit.gate(), std::string_view("payments.credit"));
  EXPECT_EQ(this->unscoped_store().gate(), std::string_view(""));
  const Key key = detail::key_of("fan-out");  // one upstream event, both gates derive this key
  const Reservation c = credit.reserve(key, idemgate::detail::sha256("credit"), "credit", 1min);
  const Reservation r = receipt.reserve(key, idemgate::detail::sha256("receipt"), "receipt", 1min);
  EXPECT_EQ(c.kind, Reservation::Kind::acquired);
  EXPECT_EQ(r.kind, Reservation::Kind::acquired) << "another gate's row is no duplicate";
  EXPECT_EQ(credit.commit(key, c.fence, "credited", this->writer(key)), CommitStatus::committed);
  EXPECT_EQ(receipt.commit(key, r.fence, "sent", this->writer(key)), CommitStatus::committed);
  EXPECT_EQ(credit.find(key)->result, "credited");
  EXPECT_EQ(credit.find(key)->gate, "payments.credit");
  EXPECT_EQ(receipt.find(key)->result, "sent");
  EXPECT_EQ(receipt.find(key)->request, "receipt");
  EXPECT_FALSE(this->unscoped_store().find(key).has_value());
  EXPECT_FALSE(this->store().find(key).has_value());
  const Reservation again = credit.reserve(key, idemgate::detail::sha256("credit"), "credit", 1min);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.result, "credited");
  EXPECT_EQ(credit.find(key)->duplicates, 1);
  EXPECT_EQ(receipt.find(key)->duplicates, 0) << "a duplicate counts on its own gate's row only";
  EXPECT_EQ(this->traits_.business_rows_for(key), 2);
}

TYPED_TEST_P(StoreConformance, AGateNeverTakesOverFinishesOrEscalatesAnotherGatesRow) {
  auto mine = this->unscoped_store().for_gate("ect.claim_slot");
  auto other = this->unscoped_store().for_gate("payments.credit");
  const Key key = detail::key_of("stranded elsewhere");
  const Reservation r = mine.reserve(key, idemgate::detail::sha256("MSKU1"), "MSKU1", 1ms);
  ASSERT_EQ(r.kind, Reservation::Kind::acquired);
  this->traits_.advance(1min);
  EXPECT_TRUE(other.take_stale(100, 0s, 1min).empty()) << "the scan sees only its own gate";
  EXPECT_THROW((void)other.commit(key, r.fence, "slot", this->writer(key)), StoreError)
      << "no row of its own under this key: nothing to commit";
  EXPECT_THROW((void)other.fail(key, r.fence, "no"), StoreError);
  EXPECT_THROW((void)other.escalate(key, r.fence, "no"), StoreError);
  EXPECT_FALSE(other.release(key, r.fence));
  const HeldLease held{key, r.fence};
  if constexpr (idemgate::lease_extending_store<typename TypeParam::Store>) {
    EXPECT_EQ(other.extend(std::span<const HeldLease>(&held, 1), 1h), 0u);
  }
  EXPECT_EQ(this->traits_.business_rows(), 0);
  const auto row = mine.find(key);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->status, RecordStatus::in_flight);
  EXPECT_EQ(row->fence, r.fence);
  const std::vector<Stranded> taken = mine.take_stale(100, 0s, 1min);
  ASSERT_EQ(taken.size(), 1u) << "its own gate's reconciler finishes it";
  EXPECT_EQ(taken[0].request, "MSKU1");
}

TYPED_TEST_P(StoreConformance, QueuesSignalsMismatchesRedrivesAndPurgesSeeOnlyTheirGate) {
  auto mine = this->unscoped_store().for_gate("ect.claim_slot");
  auto other = this->unscoped_store().for_gate("ect.cancel_slot");
  const auto settle = [&](auto& store, const Key& key, RecordStatus status) {
    const Reservation r = store.reserve(key, idemgate::detail::sha256("r"), "r", 1min);
    ASSERT_EQ(r.kind, Reservation::Kind::acquired);
    if (status == RecordStatus::committed) {
      ASSERT_EQ(store.commit(key, r.fence, "slot", this->writer(key)), CommitStatus::committed);
    } else if (status == RecordStatus::failed) {
      ASSERT_EQ(store.fail(key, r.fence, "422"), CommitStatus::committed);
    } else if (status == RecordStatus::escalated) {
      ASSERT_EQ(store.escalate(key, r.fence, "no keys"), CommitStatus::committed);
    }
  };
  settle(mine, detail::key_of("mine", 0), RecordStatus::committed);
  settle(mine, detail::key_of("mine", 1), RecordStatus::failed);
  settle(mine, detail::key_of("mine", 2), RecordStatus::escalated);
  settle(mine, detail::key_of("mine", 3), RecordStatus::in_flight);
  (void)mine.reserve(detail::key_of("mine", 0), idemgate::detail::sha256("r"), "r", 1min);
  mine.record_mismatch(detail::key_of("mine", 0), "slot", "slot-2", "reconciler");

  EXPECT_TRUE(other.escalated(100).empty());
  EXPECT_TRUE(other.mismatches(100).empty());
  const StoreSignals quiet = other.signals(1h);
  EXPECT_EQ(quiet.events, 0);
  EXPECT_EQ(quiet.duplicates, 0);
  EXPECT_EQ(quiet.in_flight, 0);
  EXPECT_EQ(quiet.escalated, 0);
  EXPECT_EQ(quiet.mismatched_keys, 0);
  EXPECT_EQ(quiet.mismatches_total, 0);
  const StoreSignals busy = mine.signals(1h);
  EXPECT_EQ(busy.events, 5);
  EXPECT_EQ(busy.duplicates, 1);
  EXPECT_EQ(busy.in_flight, 1);
  EXPECT_EQ(busy.escalated, 1);
  EXPECT_EQ(busy.mismatches_total, 1);
  EXPECT_EQ(mine.escalated(100).size(), 1u);
  if constexpr (idemgate::redrivable_store<typename TypeParam::Store>) {
    const auto now = std::chrono::system_clock::now();
    EXPECT_EQ(other.redrive_failed(detail::key_of("mine", 1)), 0u);
    EXPECT_EQ(other.redrive_failed(now - 1h, now + 1h, 100), 0u);
  }
  this->traits_.advance(2h);
  EXPECT_EQ(other.purge(1h, 100), 0u) << "retention purges only its own gate's rows";
  EXPECT_EQ(mine.find(detail::key_of("mine", 0))->status, RecordStatus::committed);
  EXPECT_EQ(mine.find(detail::key_of("mine", 1))->status, RecordStatus::failed);
  EXPECT_EQ(mine.purge(1h, 100), 2u);
}

TYPED_TEST_P(StoreConformance, AnotherGatesReconcilerNeverFinishesAStrandedRow) {
  // Gate A reserves a key and dies; gate B (another downstream, another request type) runs
  // its reconciler over the same log: it must neither look A's row up nor claim, write or
  // commit anything for it. A's own reconciler then finishes it.
  using detail::SlotRequest;
  detail::SlotTerminal slots;
  auto a = idemgate::Gate{"ect.claim_slot",
                          this->unscoped_store(),
                          slots,
                          [this](auto& tx, const Key& key, const SlotRequest&, const std::string&) {
                            this->traits_.write_business(tx, key);
                          },
                          {.lease = 1ms, .heartbeat = false}};
  detail::CreditLedger ledger;
  auto b = idemgate::Gate{"payments.credit",
                          this->unscoped_store(),
                          ledger,
                          [this](auto& tx, const Key& key, const std::string&, long) {
                            this->traits_.write_business(tx, key);
                          },
                          {.lease = 1ms, .heartbeat = false}};
  const Key key = detail::key_of("stranded slot claim");
  const std::string bytes = a.encode_request(SlotRequest{"MSKU7000037", "07:00"});
  ASSERT_EQ(a.store().reserve(key, idemgate::detail::sha256(bytes), bytes, 1ms).kind,
            Reservation::Kind::acquired);  // ... and the worker dies
  this->traits_.advance(1min);
  idemgate::Reconciler b_reconciler{b, {.stale_after = 0ms}};
  const ReconcileReport b_pass = b_reconciler.run_once();
  EXPECT_EQ(b_pass.taken, 0u);
  EXPECT_EQ(ledger.calls(), 0);
  EXPECT_EQ(this->traits_.business_rows(), 0);
  EXPECT_EQ(a.store().find(key)->status, RecordStatus::in_flight);
  EXPECT_EQ(b.store().signals(1h).in_flight, 0);

  idemgate::Reconciler a_reconciler{a, {.stale_after = 0ms}};
  const ReconcileReport a_pass = a_reconciler.run_once();
  EXPECT_EQ(a_pass.taken, 1u);
  EXPECT_EQ(a.store().find(key)->status, RecordStatus::committed);
  EXPECT_EQ(slots.calls(), 1) << "looked up and claimed once, under the original key";
  EXPECT_EQ(this->traits_.business_rows_for(key), 1);
}

TYPED_TEST_P(StoreConformance, AdoptingGivesRowsOfNoGateToOneGateExceptKeysItHolds) {
  auto& unowned = this->unscoped_store();
  if constexpr (!requires { unowned.adopt_unowned_rows(std::size_t{1}); }) {
    GTEST_SKIP() << "this store has no adopt_unowned_rows (optional: only stores whose logs "
                    "predate gates need it)";
  } else {
    const auto fp = idemgate::detail::sha256("old");
    const Key first = detail::key_of("unowned", 0), second = detail::key_of("unowned", 1),
              third = detail::key_of("unowned", 2);
    auto claims = unowned.for_gate("ect.claim_slot");
    // The gate holds `third` already, and then a row of no gate appears under it too (as an
    // earlier version's reservation, before its gate took rows of no gate over, left it).
    ASSERT_EQ(claims.reserve(third, fp, "new", 1min).kind, Reservation::Kind::acquired);
    for (const Key& key : {first, second, third})
      ASSERT_EQ(unowned.reserve(key, fp, "old", 1min).kind, Reservation::Kind::acquired);
    unowned.record_mismatch(first, "stored", "observed", "reconciler");
    unowned.record_mismatch(third, "stored", "observed", "reconciler");
    EXPECT_THROW((void)unowned.adopt_unowned_rows(10), std::logic_error);
    EXPECT_EQ(claims.adopt_unowned_rows(1), 1u);
    EXPECT_EQ(claims.adopt_unowned_rows(10), 1u) << "the key it holds stays unowned";
    EXPECT_EQ(claims.adopt_unowned_rows(10), 0u);
    EXPECT_EQ(claims.find(first)->gate, "ect.claim_slot");
    EXPECT_EQ(claims.find(first)->request, "old");
    EXPECT_TRUE(claims.find(second).has_value());
    EXPECT_EQ(claims.find(third)->request, "new");
    EXPECT_FALSE(unowned.find(first).has_value());
    EXPECT_EQ(unowned.find(third)->request, "old");
    EXPECT_FALSE(this->store().find(first).has_value()) << "another gate got nothing";
    // The adopted key's mismatch went with its row; the one of the key left unowned stayed.
    const auto carried = claims.mismatches(10);
    ASSERT_EQ(carried.size(), 1u);
    EXPECT_EQ(carried[0].key, first);
    const auto left = unowned.mismatches(10);
    ASSERT_EQ(left.size(), 1u);
    EXPECT_EQ(left[0].key, third);
  }
}

TYPED_TEST_P(StoreConformance, AReservationMeetingARowOfNoGateAnswersFromItAndTakesItOver) {
  // Rows an earlier version wrote before logs knew their gates, not adopted yet: a finished
  // event, one finished with another request, and one whose worker died.
  auto& unowned = this->unscoped_store();
  const auto fp = idemgate::detail::sha256("MSKU1");
  const Key done = detail::key_of("before gates", 0), other = detail::key_of("before gates", 1),
            stranded = detail::key_of("before gates", 2);
  for (const Key& key : {done, other, stranded})
    ASSERT_EQ(unowned.reserve(key, fp, "MSKU1", 1ms).kind, Reservation::Kind::acquired);
  ASSERT_EQ(unowned.commit(done, 1, "slot 17", this->writer(done)), CommitStatus::committed);
  ASSERT_EQ(unowned.commit(other, 1, "slot 18", this->writer(other)), CommitStatus::committed);
  this->traits_.advance(1min);

  auto claims = unowned.for_gate("ect.claim_slot");
  const Reservation again = claims.reserve(done, fp, "MSKU1", 1min);
  EXPECT_EQ(again.kind, Reservation::Kind::existing) << "an event finished before the upgrade "
                                                        "was reserved as new";
  EXPECT_EQ(again.status, RecordStatus::committed);
  EXPECT_TRUE(again.same_request);
  EXPECT_EQ(again.result, "slot 17");
  EXPECT_EQ(claims.find(done)->gate, "ect.claim_slot") << "the row became the gate's";
  EXPECT_EQ(claims.find(done)->duplicates, 1);
  EXPECT_FALSE(unowned.find(done).has_value());
  EXPECT_FALSE(this->store().find(done).has_value()) << "one gate took it, not every gate";

  const Reservation changed =
      claims.reserve(other, idemgate::detail::sha256("MSKU2"), "MSKU2", 1min);
  EXPECT_EQ(changed.kind, Reservation::Kind::existing);
  EXPECT_FALSE(changed.same_request) << "another request under the key is a conflict";

  const Reservation taken = claims.reserve(stranded, fp, "MSKU1", 1min);
  EXPECT_EQ(taken.kind, Reservation::Kind::taken_over) << "the dead worker's event is finished";
  EXPECT_EQ(taken.fence, 2);
  EXPECT_EQ(this->traits_.business_rows_for(done), 1) << "written once, by the earlier version";
}

TYPED_TEST_P(StoreConformance, ABatchReservationMeetingRowsOfNoGateAnswersFromThem) {
  auto& unowned = this->unscoped_store();
  auto claims = unowned.for_gate("ect.claim_slot");
  if constexpr (!requires { claims.reserve_batch(std::span<const ReserveItem>{}, 1min); }) {
    GTEST_SKIP() << "this store reserves no batches of its own";
  } else {
    const auto fp = idemgate::detail::sha256("MSKU1");
    const Key done = detail::key_of("batch before gates", 0),
              fresh = detail::key_of("batch before gates", 1);
    ASSERT_EQ(unowned.reserve(done, fp, "MSKU1", 1min).kind, Reservation::Kind::acquired);
    ASSERT_EQ(unowned.commit(done, 1, "slot 17", this->writer(done)), CommitStatus::committed);
    const std::vector<ReserveItem> items{{done, fp, "MSKU1"}, {fresh, fp, "MSKU1"}};
    const std::vector<Reservation> got = claims.reserve_batch(items, 1min);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].kind, Reservation::Kind::existing);
    EXPECT_EQ(got[0].status, RecordStatus::committed);
    EXPECT_EQ(got[0].result, "slot 17");
    EXPECT_EQ(got[1].kind, Reservation::Kind::acquired);
    EXPECT_EQ(claims.find(done)->gate, "ect.claim_slot");
    EXPECT_FALSE(unowned.find(done).has_value());
  }
}

/// @endcond
}  // namespace idemgate::testing
