// SPDX-License-Identifier: MIT
// Conformance tests of what an operator works with: rows, causes, gates, labels, history.
#pragma once

#include "../../concepts.hpp"
#include "../../record.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

namespace idemgate::testing {

/// @cond

TYPED_TEST_P(StoreConformance, RowsAndCountFilterByStatusReasonLabelAndTimeNewestFirst) {
  if constexpr (!idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::operable_store";
  } else {
    auto& store = this->store();
    const Key old_failure = detail::key_of("rows", 0);
    ASSERT_NO_FATAL_FAILURE(this->settled(old_failure, RecordStatus::failed));  // "422"
    this->traits_.advance(1h);
    const Key committed = detail::key_of("rows", 1), failed = detail::key_of("rows", 2),
              parked = detail::key_of("rows", 3), flying = detail::key_of("rows", 4);
    ASSERT_NO_FATAL_FAILURE(this->settled(committed, RecordStatus::committed));
    const Reservation r = this->reserve(failed);
    ASSERT_EQ(store.fail(failed, r.fence, "401 token expired"), CommitStatus::committed);
    ASSERT_NO_FATAL_FAILURE(this->settled(parked, RecordStatus::escalated));
    ASSERT_NO_FATAL_FAILURE(this->settled(flying, RecordStatus::in_flight));
    auto elsewhere = this->unscoped_store().for_gate("ect.cancel_slot");
    const Reservation e = elsewhere.reserve(failed, idemgate::detail::sha256("r"), "r", 1min);
    ASSERT_EQ(elsewhere.fail(failed, e.fence, "422"), CommitStatus::committed);

    const auto keys = [](const std::vector<Record>& rows) {
      std::vector<Key> out;
      for (const Record& row : rows) out.push_back(row.key);
      return out;
    };
    EXPECT_EQ(store.rows({}).size(), 5u) << "every row of the gate, and only of the gate";
    EXPECT_EQ(store.count({}), 5);
    EXPECT_EQ(keys(store.rows({.status = RecordStatus::failed})),
              (std::vector<Key>{failed, old_failure}))
        << "newest change first";
    EXPECT_EQ(store.count({.status = RecordStatus::failed}), 2);
    EXPECT_EQ(keys(store.rows({.status = RecordStatus::failed, .limit = 1})),
              std::vector<Key>{failed});
    EXPECT_EQ(store.count({.status = RecordStatus::failed, .limit = 1}), 2) << "no limit";
    EXPECT_EQ(keys(store.rows({.reason = "422"})), std::vector<Key>{old_failure})
        << "the other gate's 422 is not listed";
    EXPECT_EQ(store.count({.reason = "42"}), 0) << "a reason matches exactly";
    EXPECT_EQ(store.count({.reason = ""}), 2) << "no reason: the committed and in-flight rows";
    EXPECT_EQ(keys(store.rows({.status = RecordStatus::escalated})), std::vector<Key>{parked});
    EXPECT_EQ(store.count({.status = RecordStatus::in_flight}), 1);
    const auto old_at = store.find(old_failure)->updated_at;
    const auto new_at = store.find(committed)->updated_at;
    ASSERT_LT(old_at, new_at);
    EXPECT_EQ(keys(store.rows({.changed_to = new_at})), std::vector<Key>{old_failure})
        << "changed_to excludes its instant";
    EXPECT_EQ(store.count({.changed_from = new_at}), 4) << "changed_from includes its instant";
    EXPECT_EQ(store.count({.status = RecordStatus::failed, .changed_from = new_at}), 1);
    EXPECT_EQ(store.count({.label_contains = "MSKU"}), 0) << "no row keeps a label";
    const auto listed = store.rows({.status = RecordStatus::failed, .limit = 1});
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].reason, "401 token expired");
    EXPECT_EQ(listed[0].gate, std::string(TestFixture::gate_name));
    EXPECT_EQ(listed[0].request, "request");
  }
}

TYPED_TEST_P(StoreConformance, CausesGroupTheGatesFailedAndEscalatedRowsByReason) {
  if constexpr (!idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::operable_store";
  } else {
    auto& store = this->store();
    const auto settle = [&](auto& on, const Key& key, RecordStatus status, const char* reason) {
      const Reservation r = on.reserve(key, idemgate::detail::sha256("r"), "r", 1min);
      ASSERT_EQ(r.kind, Reservation::Kind::acquired);
      ASSERT_EQ(status == RecordStatus::failed ? on.fail(key, r.fence, reason)
                                               : on.escalate(key, r.fence, reason),
                CommitStatus::committed);
    };
    EXPECT_TRUE(store.causes(10).empty());
    for (int i = 0; i < 3; ++i)
      settle(store, detail::key_of("expired", i), RecordStatus::failed, "401 token expired");
    this->traits_.advance(1min);
    settle(store, detail::key_of("unknown", 0), RecordStatus::failed, "422 unknown container");
    settle(store, detail::key_of("parked", 0), RecordStatus::escalated, "401 token expired");
    settle(store, detail::key_of("parked", 1), RecordStatus::escalated, "401 token expired");
    settle(store, detail::key_of("expired", 3), RecordStatus::failed, "401 token expired");
    ASSERT_NO_FATAL_FAILURE(this->settled(detail::key_of("done", 0), RecordStatus::committed));
    ASSERT_NO_FATAL_FAILURE(this->settled(detail::key_of("flying", 0), RecordStatus::in_flight));
    auto other = this->unscoped_store().for_gate("ect.cancel_slot");
    for (int i = 0; i < 6; ++i)
      settle(other, detail::key_of("other", i), RecordStatus::failed, "503 unavailable");

    const std::vector<Cause> causes = store.causes(10);
    ASSERT_EQ(causes.size(), 3u) << "failed and escalated rows of this gate only";
    EXPECT_EQ(causes[0].status, RecordStatus::failed);
    EXPECT_EQ(causes[0].reason, "401 token expired");
    EXPECT_EQ(causes[0].rows, 4) << "most rows first";
    EXPECT_EQ(causes[1].status, RecordStatus::escalated) << "a status and a reason make a cause";
    EXPECT_EQ(causes[1].reason, "401 token expired");
    EXPECT_EQ(causes[1].rows, 2);
    EXPECT_EQ(causes[2].reason, "422 unknown container");
    EXPECT_EQ(causes[2].rows, 1);
    const auto at = [&](const Key& key) { return store.find(key)->updated_at; };
    EXPECT_EQ(causes[0].first_seen, at(detail::key_of("expired", 0)));
    EXPECT_EQ(causes[0].last_seen, at(detail::key_of("expired", 3)));
    EXPECT_LT(causes[0].first_seen, causes[0].last_seen);
    EXPECT_EQ(causes[2].first_seen, causes[2].last_seen);
    EXPECT_EQ(store.causes(1).size(), 1u) << "at most limit causes";
    ASSERT_EQ(other.causes(10).size(), 1u);
    EXPECT_EQ(other.causes(10)[0].rows, 6);
  }
}

TYPED_TEST_P(StoreConformance, RedrivingACauseTakesOnlyItsFailedRowsInTheGateAndKeepsTheReason) {
  if constexpr (!idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::operable_store";
  } else {
    auto& store = this->store();
    const auto settle = [&](auto& on, const Key& key, RecordStatus status, const char* reason) {
      const Reservation r = on.reserve(key, idemgate::detail::sha256("r"), "r", 1min);
      ASSERT_EQ(r.kind, Reservation::Kind::acquired);
      ASSERT_EQ(status == RecordStatus::failed ? on.fail(key, r.fence, reason)
                                               : on.escalate(key, r.fence, reason),
                CommitStatus::committed);
    };
    for (int i = 0; i < 3; ++i)
      settle(store, detail::key_of("cause", i), RecordStatus::failed, "401 token expired");
    settle(store, detail::key_of("near", 0), RecordStatus::failed, "401 token expired again");
    settle(store, detail::key_of("near", 1), RecordStatus::failed, "401");
    settle(store, detail::key_of("parked", 0), RecordStatus::escalated, "401 token expired");
    auto other = this->unscoped_store().for_gate("ect.cancel_slot");
    settle(other, detail::key_of("cause", 0), RecordStatus::failed, "401 token expired");

    EXPECT_EQ(store.redrive_cause("401 token expired", 2), 2u) << "at most limit rows";
    EXPECT_EQ(store.redrive_cause("401 token expired", 10), 1u);
    EXPECT_EQ(store.redrive_cause("401 token expired", 10), 0u);
    for (int i = 0; i < 3; ++i) {
      const auto row = store.find(detail::key_of("cause", i));
      ASSERT_TRUE(row.has_value());
      EXPECT_EQ(row->status, RecordStatus::in_flight) << i;
      EXPECT_EQ(row->fence, 2) << i;
      EXPECT_EQ(row->attempts, 2) << i;
      EXPECT_EQ(row->reason, "") << i;
      ASSERT_EQ(row->history.size(), 2u) << i;
      EXPECT_EQ(row->history[0].outcome, "failed");
      EXPECT_EQ(row->history[0].reason, "401 token expired") << "why it failed survives";
      EXPECT_EQ(row->history[0].attempt, 1);
      EXPECT_EQ(row->history[1].outcome, "redriven");
      EXPECT_EQ(row->history[1].reason, "401 token expired");
      EXPECT_EQ(row->history[1].attempt, 1);
    }
    EXPECT_EQ(this->status_of(detail::key_of("near", 0)), RecordStatus::failed)
        << "a reason matches exactly";
    EXPECT_EQ(this->status_of(detail::key_of("near", 1)), RecordStatus::failed);
    EXPECT_EQ(this->status_of(detail::key_of("parked", 0)), RecordStatus::escalated)
        << "escalated rows wait for a human";
    EXPECT_EQ(other.find(detail::key_of("cause", 0))->status, RecordStatus::failed)
        << "another gate's rows are left alone";
    const Reservation again = this->reserve(detail::key_of("cause", 0), "r");
    EXPECT_EQ(again.kind, Reservation::Kind::taken_over) << "the next delivery claims again";
    EXPECT_EQ(again.fence, 3);
  }
}

TYPED_TEST_P(StoreConformance, ACauseIsTheFirstLineOfAReasonAndFindsEveryRowOfIt) {
  if constexpr (!idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::operable_store";
  } else {
    auto& store = this->store();
    const auto fail = [&](const Key& key, const std::string& reason) {
      const Reservation r = store.reserve(key, idemgate::detail::sha256("r"), "r", 1min);
      ASSERT_EQ(r.kind, Reservation::Kind::acquired);
      ASSERT_EQ(store.fail(key, r.fence, reason), CommitStatus::committed);
    };
    const std::string refused = "POST https://t.example/slots answered 422 (not-announced)";
    for (int i = 0; i < 3; ++i)
      fail(detail::key_of("refused", i),
           refused + "\n{\"detail\": \"BADU000000" + std::to_string(i) + "\"}\nmore");
    fail(detail::key_of("one-line", 0), refused);
    fail(detail::key_of("other", 0), "POST https://t.example/slots answered 410\nBADU0000009");
    fail(detail::key_of("bare", 0), "\nonly details");

    const std::vector<Cause> causes = store.causes(10);
    ASSERT_EQ(causes.size(), 3u) << "grouped by first line, whatever the lines after it";
    EXPECT_EQ(causes[0].reason, refused);
    EXPECT_EQ(causes[0].rows, 4) << "a one-line reason is its own cause";
    EXPECT_EQ(store.find(detail::key_of("refused", 1))->reason,
              refused + "\n{\"detail\": \"BADU0000001\"}\nmore")
        << "the row keeps every line";
    bool bare = false;
    for (const Cause& c : causes) bare = bare || (c.reason.empty() && c.rows == 1);
    EXPECT_TRUE(bare) << "a reason whose first line is empty has the empty cause";
    const auto id_of = [&](RecordStatus status) {
      Cause named;
      named.status = status;
      named.reason = refused;
      return named.id();
    };
    EXPECT_EQ(causes[0].id(), id_of(RecordStatus::failed)) << "the id stays while rows come and go";
    EXPECT_NE(causes[0].id(), id_of(RecordStatus::escalated)) << "a status and a cause make an id";

    EXPECT_EQ(store.count({.reason = refused}), 4) << "a cause finds every row of it";
    EXPECT_EQ(store.count({.reason = refused + "\n{\"detail\": \"BADU0000002\"}\nmore"}), 1)
        << "a whole reason finds its rows";
    EXPECT_EQ(store.count({.reason = "POST https://t.example/slots"}), 0)
        << "a cause matches whole, never as a prefix";
    EXPECT_EQ(store.redrive_cause(refused, 10), 4u);
    EXPECT_EQ(this->status_of(detail::key_of("other", 0)), RecordStatus::failed);
    EXPECT_EQ(store.redrive_cause("POST https://t.example/slots answered 410\nBADU0000009", 10), 1u)
        << "a whole reason re-drives its rows";
  }
}

TYPED_TEST_P(StoreConformance, GatesListsEveryGateWithRowsFromAnyHandle) {
  if constexpr (!idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::operable_store";
  } else {
    EXPECT_TRUE(this->store().gates().empty());
    auto credit = this->unscoped_store().for_gate("payments.credit");
    auto claim = this->unscoped_store().for_gate("ect.claim_slot");
    const Key key = detail::key_of("gates");
    for (auto* on : {&credit, &claim, &credit})
      (void)on->reserve(key, idemgate::detail::sha256("r"), "r", 1min);
    (void)this->unscoped_store().reserve(key, idemgate::detail::sha256("r"), "r", 1min);
    const std::vector<std::string> gates{"ect.claim_slot", "payments.credit"};
    EXPECT_EQ(this->store().gates(), gates) << "sorted; rows of no gate are no gate";
    EXPECT_EQ(credit.gates(), gates);
    EXPECT_EQ(this->unscoped_store().gates(), gates);
    (void)this->reserve(key);
    EXPECT_EQ(this->store().gates().size(), 3u);
  }
}

TYPED_TEST_P(StoreConformance, ALabelIsKeptOnlyWhenGivenAndFindsItsRow) {
  if constexpr (!idemgate::labelling_store<typename TypeParam::Store> ||
                !idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::labelling_store and idemgate::operable_store";
  } else {
    auto& store = this->store();
    const Key plain = detail::key_of("plain"), labelled = detail::key_of("labelled"),
              other_event = detail::key_of("other event");
    const std::string label = "ect.claim_slot CIS-2025-06-09-1001 MSKU7000037";
    const auto fingerprint = idemgate::detail::sha256("request");
    ASSERT_EQ(this->reserve(plain).kind, Reservation::Kind::acquired);
    ASSERT_EQ(store.reserve(labelled, fingerprint, "request", 1min, label).kind,
              Reservation::Kind::acquired);
    ASSERT_EQ(store
                  .reserve(other_event, fingerprint, "request", 1min,
                           "ect.claim_slot CIS-2025-06-09-1002 MSKU7000044")
                  .kind,
              Reservation::Kind::acquired);
    EXPECT_EQ(store.find(plain)->label, "") << "no label unless one is given";
    EXPECT_EQ(store.find(labelled)->label, label);
    EXPECT_EQ(store.reserve(labelled, fingerprint, "request", 1min, "another label").kind,
              Reservation::Kind::existing);
    EXPECT_EQ(store.find(labelled)->label, label) << "a stored row keeps its label";
    auto elsewhere = this->unscoped_store().for_gate("ect.cancel_slot");
    (void)elsewhere.reserve(labelled, fingerprint, "request", 1min, label);

    const auto found = store.rows({.label_contains = "CIS-2025-06-09-1001"});
    ASSERT_EQ(found.size(), 1u) << "by the upstream's id, in this gate only";
    EXPECT_EQ(found[0].key, labelled);
    EXPECT_EQ(found[0].label, label);
    EXPECT_EQ(store.count({.label_contains = "ect.claim_slot"}), 2);
    EXPECT_EQ(store.count({.label_contains = "MSKU7000044"}), 1);
    EXPECT_EQ(store.count({.label_contains = "msku7000044"}), 0) << "case-sensitive";
    EXPECT_EQ(store.count({.label_contains = "CIS-2025-06-09-1003"}), 0);
    const Reservation r = store.reserve(labelled, fingerprint, "request", 1min);
    EXPECT_EQ(store.commit(labelled, r.fence, "slot", this->writer(labelled)),
              CommitStatus::committed);
    EXPECT_EQ(store.find(labelled)->label, label) << "the label outlives the attempt";
  }
}

TYPED_TEST_P(StoreConformance, HistoryKeepsWhyEveryAttemptEndedThroughRedriveAndResolve) {
  if constexpr (!idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::operable_store";
  } else {
    auto& store = this->store();
    const Key key = detail::key_of("history");
    Reservation r = this->reserve(key);
    ASSERT_EQ(r.kind, Reservation::Kind::acquired);
    EXPECT_TRUE(store.find(key)->history.empty()) << "a reservation writes no entry";
    ASSERT_TRUE(store.release(key, r.fence, "503 unavailable"));
    r = this->reserve(key, "request", 1ms);  // attempt 2 takes the given-back lease over
    ASSERT_EQ(r.kind, Reservation::Kind::taken_over);
    this->traits_.advance(1min);
    r = this->reserve(key);  // attempt 3: attempt 2's lease ran out
    ASSERT_EQ(r.kind, Reservation::Kind::taken_over);
    ASSERT_EQ(store.fail(key, r.fence, "422 unknown container"), CommitStatus::committed);
    ASSERT_EQ(store.fail(key, r.fence, "422 unknown container"), CommitStatus::committed)
        << "repeated under its fence";
    ASSERT_EQ(store.redrive_failed(key), 1u);
    r = this->reserve(key);  // attempt 5: the re-drive was attempt 4
    ASSERT_EQ(r.kind, Reservation::Kind::taken_over);
    ASSERT_EQ(store.escalate(key, r.fence, "no key support"), CommitStatus::committed);
    ASSERT_TRUE(store.resolve(key, "slot", this->writer(key)));

    const auto row = store.find(key);
    ASSERT_TRUE(row.has_value());
    EXPECT_EQ(row->status, RecordStatus::committed);
    struct Want {
      std::int64_t attempt;
      const char* outcome;
      const char* reason;
    };
    const Want want[] = {
        {1, "released", "503 unavailable"},     {2, "taken_over", "lease expired"},
        {3, "failed", "422 unknown container"}, {3, "redriven", "422 unknown container"},
        {5, "escalated", "no key support"},     {5, "resolved", "no key support"}};
    ASSERT_EQ(row->history.size(), std::size(want));
    for (std::size_t i = 0; i < std::size(want); ++i) {
      EXPECT_EQ(row->history[i].attempt, want[i].attempt) << i;
      EXPECT_EQ(row->history[i].outcome, want[i].outcome) << i;
      EXPECT_EQ(row->history[i].reason, want[i].reason) << i;
      EXPECT_GT(row->history[i].at, std::chrono::system_clock::time_point{}) << i;
    }

    const Key stranded = detail::key_of("history stranded");
    ASSERT_EQ(this->reserve(stranded, "request", 1ms).kind, Reservation::Kind::acquired);
    this->traits_.advance(1min);
    const std::vector<Stranded> taken = store.take_stale(10, 0s, 1min);
    ASSERT_EQ(taken.size(), 1u);
    ASSERT_EQ(store.commit(stranded, taken[0].fence, "slot", this->writer(stranded)),
              CommitStatus::committed);
    const auto finished = store.find(stranded);
    ASSERT_EQ(finished->history.size(), 1u) << "a commit writes no entry";
    EXPECT_EQ(finished->history[0].outcome, "taken_over");
    EXPECT_EQ(finished->history[0].attempt, 1);
    ASSERT_EQ(store.rows({.label_contains = ""}).size(), 2u);
  }
}

TYPED_TEST_P(StoreConformance, HistoryKeepsTheNewestSixteenEntries) {
  if constexpr (!idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::operable_store";
  } else {
    auto& store = this->store();
    const Key key = detail::key_of("long history");
    std::int64_t fence = this->reserve(key).fence;
    for (int i = 0; i < 20; ++i) {
      const std::string reason = "500 attempt \"" + std::to_string(i) + "\"\n\\ é";
      ASSERT_EQ(store.fail(key, fence, reason), CommitStatus::committed) << i;
      ASSERT_EQ(store.redrive_failed(key), 1u) << i;
      ++fence;
    }
    const auto row = store.find(key);
    ASSERT_TRUE(row.has_value());
    ASSERT_EQ(row->history.size(), idemgate::history_limit);
    static_assert(idemgate::history_limit == 16);
    // 40 entries: the newest 16 are the failures and re-drives of attempts 13 to 20.
    EXPECT_EQ(row->history.front().outcome, "failed");
    EXPECT_EQ(row->history.front().attempt, 13);
    EXPECT_EQ(row->history.front().reason, "500 attempt \"12\"\n\\ é")
        << "any text survives the store's encoding";
    EXPECT_EQ(row->history.back().outcome, "redriven");
    EXPECT_EQ(row->history.back().attempt, 20);
    EXPECT_EQ(row->history.back().reason, "500 attempt \"19\"\n\\ é");
  }
}

/// @endcond
}  // namespace idemgate::testing
