// SPDX-License-Identifier: MIT
// Conformance tests of a gate over the store, of attempts and of rows retrying.
#pragma once

#include "../../gate.hpp"
#include "../../record.hpp"
#include "../slot_request.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::testing {

/// @cond

TYPED_TEST_P(StoreConformance, GateOverTheStoreTurnsARedeliveryStormIntoOneClaimPerEvent) {
  using detail::SlotRequest;
  detail::SlotTerminal terminal;
  idemgate::Gate gate{this->gate_name, this->store(), terminal,
                      [this](auto& tx, const Key& key, const SlotRequest&, const std::string&) {
                        this->traits_.write_business(tx, key);
                      }};
  constexpr int events = 39;
  const auto deliveries = detail::redelivery_storm(events);
  ASSERT_EQ(deliveries.size(), 87u);
  std::atomic<std::size_t> next{0};
  std::atomic<int> not_acked{0}, errors{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < deliveries.size();) {
        try {
          const int event = deliveries[i];
          if (!gate.process(detail::key_of("storm", event), detail::storm_request(event))
                   .should_ack())
            ++not_acked;
        } catch (...) {
          ++errors;
        }
      }
    });
  for (auto& w : workers) w.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(not_acked.load(), 0);
  EXPECT_EQ(terminal.calls(), events);
  EXPECT_EQ(terminal.slots_issued(), events);
  EXPECT_EQ(this->traits_.business_rows(), events);
  EXPECT_EQ(this->traits_.distinct_business_events(), events);
  for (int event = 0; event < events; ++event) {
    const Key key = detail::key_of("storm", event);
    const auto row = this->store().find(key);
    ASSERT_TRUE(row.has_value()) << "event " << event;
    EXPECT_EQ(row->status, RecordStatus::committed) << "event " << event;
    EXPECT_EQ(this->traits_.business_rows_for(key), 1) << "event " << event;
  }
}

TYPED_TEST_P(StoreConformance, AttemptsStartAtOneAndGrowWithEveryTakeover) {
  const Key key = detail::key_of("attempts");
  const Reservation r = this->reserve(key);
  ASSERT_EQ(r.kind, Reservation::Kind::acquired);
  EXPECT_EQ(this->store().find(key)->attempts, 1);
  EXPECT_EQ(this->reserve(key).kind, Reservation::Kind::existing);
  EXPECT_EQ(this->store().find(key)->attempts, 1) << "a duplicate is not an attempt";
  ASSERT_TRUE(this->store().release(key, r.fence));
  const Reservation second = this->reserve(key);
  ASSERT_EQ(second.kind, Reservation::Kind::taken_over);
  EXPECT_EQ(this->store().find(key)->attempts, 2);
  this->traits_.advance(2min);
  const std::vector<Stranded> taken = this->store().take_stale(10, 0s, 1min);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].attempts, 3);
  EXPECT_EQ(this->store().find(key)->attempts, 3);
}

TYPED_TEST_P(StoreConformance, RetryingCountsInFlightRowsHeldMoreThanOnce) {
  const Key fresh = detail::key_of("retrying", 0), retried = detail::key_of("retrying", 1),
            finished = detail::key_of("retrying", 2);
  ASSERT_EQ(this->reserve(fresh).kind, Reservation::Kind::acquired);
  for (const Key& key : {retried, finished}) {
    const Reservation r = this->reserve(key);
    ASSERT_TRUE(this->store().release(key, r.fence));
    ASSERT_EQ(this->reserve(key).kind, Reservation::Kind::taken_over);
  }
  ASSERT_EQ(this->store().commit(finished, 2, "slot", this->writer(finished)),
            CommitStatus::committed);
  const StoreSignals s = this->store().signals(1h);
  EXPECT_EQ(s.in_flight, 2);
  EXPECT_EQ(s.retrying, 1) << "in flight and held more than once: only the retried row";
}

/// @endcond
}  // namespace idemgate::testing
