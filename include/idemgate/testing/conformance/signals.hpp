// SPDX-License-Identifier: MIT
// Conformance tests of a store's signals and of the mismatches it records.
#pragma once

#include "../../gate.hpp"
#include "../../outcome.hpp"
#include "../../record.hpp"
#include "../../signals.hpp"
#include "../slot_request.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace idemgate::testing {

/// @cond

TYPED_TEST_P(StoreConformance, SignalsOfAnEmptyStoreAreZeroAndHealthy) {
  const StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.window, 1h);
  EXPECT_EQ(s.events, 0);
  EXPECT_EQ(s.duplicates, 0);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_FALSE(s.oldest_in_flight.has_value());
  EXPECT_EQ(s.escalated, 0);
  EXPECT_EQ(s.mismatched_keys, 0);
  EXPECT_EQ(s.mismatches_total, 0);
  EXPECT_TRUE(idemgate::evaluate(s).healthy());
  EXPECT_TRUE(this->store().mismatches(10).empty());
}

TYPED_TEST_P(StoreConformance, EveryReservationThatMeetsAnExistingKeyIsCountedOnItsRow) {
  const Key key = detail::key_of("counted");
  ASSERT_EQ(this->reserve(key, "request", 10s).kind, Reservation::Kind::acquired);
  EXPECT_EQ(this->store().find(key)->duplicates, 0);
  EXPECT_EQ(this->reserve(key, "request", 10s).kind, Reservation::Kind::existing);
  EXPECT_EQ(this->store().find(key)->duplicates, 1) << "in flight under a live lease";
  EXPECT_FALSE(this->reserve(key, "another request", 10s).same_request);
  EXPECT_EQ(this->store().find(key)->duplicates, 2) << "a conflicting request";
  this->traits_.advance(11s);
  const Reservation taken = this->reserve(key, "request", 10s);
  ASSERT_EQ(taken.kind, Reservation::Kind::taken_over);
  EXPECT_EQ(this->store().find(key)->duplicates, 3) << "a takeover";
  ASSERT_EQ(this->store().commit(key, taken.fence, "slot", this->writer(key)),
            CommitStatus::committed);
  EXPECT_EQ(this->reserve(key, "request", 10s).status, RecordStatus::committed);
  EXPECT_EQ(this->store().find(key)->duplicates, 4) << "a duplicate of a committed event";
  EXPECT_EQ(this->store().find(key)->fence, taken.fence) << "counting never moves the fence";
  const StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.events, 5);
  EXPECT_EQ(s.duplicates, 4);
}

TYPED_TEST_P(StoreConformance, SignalsWithoutOneDuplicateInAHundredEventsSuspectTheKeyDerivation) {
  ASSERT_NO_FATAL_FAILURE(this->traffic("zero", 100, 0));
  const StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.events, 100);
  EXPECT_EQ(s.duplicates, 0);
  EXPECT_EQ(s.duplicate_ratio(), 0.0);
  EXPECT_EQ(s.in_flight, 100);
  const idemgate::Health h = idemgate::evaluate(s);
  EXPECT_TRUE(h.key_derivation_suspect);
  EXPECT_FALSE(h.upstream_misbehaving);
  EXPECT_FALSE(h.stranded_work);
}

TYPED_TEST_P(StoreConformance, SignalsWithTwoPercentDuplicatesAreHealthy) {
  ASSERT_NO_FATAL_FAILURE(this->traffic("normal", 98, 2));
  const StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.events, 100);
  EXPECT_EQ(s.duplicates, 2);
  EXPECT_DOUBLE_EQ(s.duplicate_ratio(), 0.02);
  EXPECT_EQ(s.in_flight, 98);
  EXPECT_TRUE(idemgate::evaluate(s).healthy());
}

TYPED_TEST_P(StoreConformance, SignalsWithAQuarterDuplicatesSayTheUpstreamMisbehaves) {
  ASSERT_NO_FATAL_FAILURE(this->traffic("storm", 75, 25));
  const StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.events, 100);
  EXPECT_EQ(s.duplicates, 25);
  EXPECT_DOUBLE_EQ(s.duplicate_ratio(), 0.25);
  const idemgate::Health h = idemgate::evaluate(s);
  EXPECT_TRUE(h.upstream_misbehaving);
  EXPECT_FALSE(h.key_derivation_suspect);
}

TYPED_TEST_P(StoreConformance, SignalsShowARowInFlightForElevenMinutesAsStranded) {
  const Key old = detail::key_of("stranded-old"), young = detail::key_of("stranded-young");
  ASSERT_EQ(this->reserve(old, "request", 1min).kind, Reservation::Kind::acquired);
  this->traits_.advance(11min);
  ASSERT_EQ(this->reserve(young, "request", 1min).kind, Reservation::Kind::acquired);
  StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.in_flight, 2);
  ASSERT_TRUE(s.oldest_in_flight.has_value());
  EXPECT_GE(*s.oldest_in_flight, 11min);
  EXPECT_LT(*s.oldest_in_flight, 12min);
  EXPECT_TRUE(idemgate::evaluate(s).stranded_work);

  // Age counts from the first reservation: a takeover does not make the event young again.
  const Reservation taken = this->reserve(old, "request", 1min);
  ASSERT_EQ(taken.kind, Reservation::Kind::taken_over);
  s = this->store().signals(1h);
  ASSERT_TRUE(s.oldest_in_flight.has_value());
  EXPECT_GE(*s.oldest_in_flight, 11min);

  ASSERT_EQ(this->store().commit(old, taken.fence, "slot", this->writer(old)),
            CommitStatus::committed);
  s = this->store().signals(1h);
  EXPECT_EQ(s.in_flight, 1);
  ASSERT_TRUE(s.oldest_in_flight.has_value());
  EXPECT_LT(*s.oldest_in_flight, 1min);
  EXPECT_FALSE(idemgate::evaluate(s).stranded_work);

  ASSERT_EQ(this->store().escalate(young, 1, "needs a human"), CommitStatus::committed);
  s = this->store().signals(1h);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_FALSE(s.oldest_in_flight.has_value());
  EXPECT_EQ(s.escalated, 1);
}

TYPED_TEST_P(StoreConformance, SignalsCountAKeyWithTwoResultsAndMismatchesKeepBoth) {
  const Key key = detail::key_of("two results"), other = detail::key_of("another two results");
  const std::string stored("slot\0-1", 7), observed("slot\0-2", 7);
  this->store().record_mismatch(key, stored, observed, "lost_lease");
  StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.mismatched_keys, 1);
  EXPECT_EQ(s.mismatches_total, 1);
  EXPECT_TRUE(idemgate::evaluate(s).result_mismatch);

  this->traits_.advance(1s);
  this->store().record_mismatch(key, stored, "slot-3", "reconciler");
  s = this->store().signals(1h);
  EXPECT_EQ(s.mismatched_keys, 1) << "keys, not mismatches";
  EXPECT_EQ(s.mismatches_total, 2);
  this->traits_.advance(1s);
  this->store().record_mismatch(other, "a", "b", "lost_lease");
  s = this->store().signals(1h);
  EXPECT_EQ(s.mismatched_keys, 2);
  EXPECT_EQ(s.mismatches_total, 3);

  const std::vector<Mismatch> all = this->store().mismatches(10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].key, other) << "newest first";
  EXPECT_EQ(all[1].key, key);
  EXPECT_EQ(all[1].stored, stored);
  EXPECT_EQ(all[1].observed, "slot-3");
  EXPECT_EQ(all[1].source, "reconciler");
  EXPECT_EQ(all[2].key, key);
  EXPECT_EQ(all[2].stored, stored) << "results are bytes, not C strings";
  EXPECT_EQ(all[2].observed, observed);
  EXPECT_EQ(all[2].source, "lost_lease");
  EXPECT_GT(all[0].at, all[1].at);
  EXPECT_GT(all[1].at, all[2].at);
  const std::vector<Mismatch> newest = this->store().mismatches(1);
  ASSERT_EQ(newest.size(), 1u);
  EXPECT_EQ(newest[0].key, other);
  EXPECT_TRUE(this->store().mismatches(0).empty());
}

TYPED_TEST_P(StoreConformance, GateRecordsAMismatchWhenALateWorkerHoldsAnotherResult) {
  using detail::SlotRequest;
  detail::SlotTerminal terminal;
  idemgate::Gate gate{this->gate_name,
                      this->store(),
                      terminal,
                      [this](auto& tx, const Key& key, const SlotRequest&, const std::string&) {
                        this->traits_.write_business(tx, key);
                      },
                      {.lease = 10s}};
  const SlotRequest request{"MSKU1", "07:00"};
  const Key key = detail::key_of("late worker");
  const std::string bytes = gate.encode_request(request);
  // A worker reserves and stalls past its lease; a redelivery takes the event over and commits.
  const Reservation stalled =
      this->store().reserve(key, idemgate::detail::sha256(bytes), bytes, 10s);
  this->traits_.advance(11s);
  const auto fresh = gate.process(key, request);
  ASSERT_EQ(fresh.status(), idemgate::Status::processed);
  ASSERT_TRUE(fresh.took_over());

  EXPECT_EQ(gate.commit(key, stalled.fence, request, fresh.outcome()).status(),
            idemgate::Status::lost_lease);
  EXPECT_EQ(this->store().signals(1h).mismatches_total, 0) << "the same answer is no mismatch";
  EXPECT_EQ(gate.commit(key, stalled.fence, request, std::string("slot-elsewhere")).status(),
            idemgate::Status::lost_lease);
  const StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.mismatched_keys, 1);
  const std::vector<Mismatch> found = this->store().mismatches(10);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].key, key);
  EXPECT_EQ(found[0].stored, fresh.outcome());
  EXPECT_EQ(found[0].observed, "slot-elsewhere");
  EXPECT_EQ(found[0].source, "lost_lease");
  EXPECT_EQ(this->traits_.business_rows(), 1);
}

TYPED_TEST_P(StoreConformance, SignalsCountOnlyEventsAndMismatchesInsideTheWindow) {
  ASSERT_NO_FATAL_FAILURE(this->traffic("last week", 10, 2));
  this->store().record_mismatch(detail::key_of("last week", 0), "a", "b", "lost_lease");
  this->traits_.advance(2h);
  ASSERT_NO_FATAL_FAILURE(this->traffic("today", 5, 1));
  // A late redelivery counts toward its event's reservation time, outside the window.
  EXPECT_NE(this->reserve(detail::key_of("last week", 9)).kind, Reservation::Kind::acquired);

  const StoreSignals recent = this->store().signals(1h);
  EXPECT_EQ(recent.window, 1h);
  EXPECT_EQ(recent.events, 6);
  EXPECT_EQ(recent.duplicates, 1);
  EXPECT_EQ(recent.mismatched_keys, 0);
  EXPECT_EQ(recent.mismatches_total, 1) << "the total is not windowed";
  EXPECT_EQ(recent.in_flight, 15) << "rows in flight now, whenever reserved";
  ASSERT_TRUE(recent.oldest_in_flight.has_value());
  EXPECT_GE(*recent.oldest_in_flight, 2h);

  const StoreSignals wide = this->store().signals(3h);
  EXPECT_EQ(wide.events, 19);
  EXPECT_EQ(wide.duplicates, 4);
  EXPECT_EQ(wide.mismatched_keys, 1);
}

/// @endcond
}  // namespace idemgate::testing
