// SPDX-License-Identifier: MIT
// Conformance tests of one event run as one transaction (`commit_once`, `TransactionGate`).
#pragma once

#include "../../record.hpp"
#include "../../transaction_gate.hpp"
#include "../slot_request.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::testing {

/// @cond
namespace detail {

/// A `TransactionGate` of the suite over `Store`: the request is a container, the outcome the
/// slot the write books (one business row tagged with the key), `before` runs first in the write.
template <class Store, class Before>
auto transaction_gate(const char* name, Store& store, Before before,
                      TransactionGateOptions options = {}) {
  using Write =
      std::function<std::string(typename Store::transaction&, const Key&, const std::string&)>;
  return std::make_unique<TransactionGate<Store, std::string, std::string, Write>>(
      name, store, Write(std::move(before)), options);
}

}  // namespace detail

TYPED_TEST_P(StoreConformance, OneTransactionCommitsTheRowItsOutcomeAndTheBusinessWriteTogether) {
  if constexpr (!one_transaction_store<typename TestFixture::Store>) {
    GTEST_SKIP() << "this store does not run an event in one transaction (commit_once)";
  } else {
    std::atomic<int> writes{0};
    auto gate = detail::transaction_gate(this->gate_name, this->store(),
                                         [&](auto& tx, const Key& key, const std::string& box) {
                                           ++writes;
                                           this->traits_.write_business(tx, key);
                                           return "slot for " + box;
                                         });
    const Key key = detail::key_of("one-transaction");
    const auto first = gate->process(key, "MSKU7000001");
    ASSERT_EQ(first.status(), Status::processed) << first.reason();
    EXPECT_EQ(first.outcome(), "slot for MSKU7000001");
    EXPECT_FALSE(first.took_over()) << "a new key is no takeover";
    const auto row = this->store().find(key);
    ASSERT_TRUE(row.has_value());
    EXPECT_EQ(row->status, RecordStatus::committed);
    EXPECT_EQ(row->result.value_or(""), "slot for MSKU7000001");
    EXPECT_EQ(row->attempts, 1);
    EXPECT_EQ(this->traits_.business_rows_for(key), 1);

    const auto again = gate->process(key, "MSKU7000001");
    EXPECT_EQ(again.status(), Status::duplicate);
    EXPECT_EQ(again.outcome(), "slot for MSKU7000001");
    EXPECT_EQ(gate->process(key, "MSKU7000002").status(), Status::conflict);
    EXPECT_EQ(writes.load(), 1);
    EXPECT_EQ(this->traits_.business_rows(), 1);
    EXPECT_EQ(this->store().find(key)->duplicates, 2);
  }
}

TYPED_TEST_P(StoreConformance, OneTransactionWhoseWriteThrowsLeavesNeitherRowNorBusinessRow) {
  if constexpr (!one_transaction_store<typename TestFixture::Store>) {
    GTEST_SKIP() << "this store does not run an event in one transaction (commit_once)";
  } else {
    bool fail = true;
    auto gate = detail::transaction_gate(this->gate_name, this->store(),
                                         [&](auto& tx, const Key& key, const std::string&) {
                                           this->traits_.write_business(tx, key);
                                           if (fail) throw std::runtime_error("the ledger refused");
                                           return std::string("booked");
                                         });
    const Key key = detail::key_of("one-transaction-throws");
    EXPECT_THROW((void)gate->process(key, "MSKU7000001"), std::runtime_error);
    EXPECT_FALSE(this->store().find(key).has_value()) << "the reservation outlived its rollback";
    EXPECT_EQ(this->traits_.business_rows(), 0);
    fail = false;
    EXPECT_EQ(gate->process(key, "MSKU7000001").status(), Status::processed);
    EXPECT_EQ(this->traits_.business_rows_for(key), 1);
  }
}

TYPED_TEST_P(StoreConformance, OneTransactionTakesOverAStrandedRowAndAnswersEveryOtherStoredRow) {
  if constexpr (!one_transaction_store<typename TestFixture::Store>) {
    GTEST_SKIP() << "this store does not run an event in one transaction (commit_once)";
  } else {
    auto gate = detail::transaction_gate(this->gate_name, this->store(),
                                         [&](auto& tx, const Key& key, const std::string& box) {
                                           this->traits_.write_business(tx, key);
                                           return "slot for " + box;
                                         });
    // In flight under a lease that ran out (a gate that calls a downstream crashed): taken over.
    const Key stranded = detail::key_of("one-transaction-stranded");
    ASSERT_EQ(this->reserve(stranded, "MSKU7000003", 1s).kind, Reservation::Kind::acquired);
    this->traits_.advance(2s);
    const auto taken = gate->process(stranded, "MSKU7000003");
    EXPECT_EQ(taken.status(), Status::processed);
    EXPECT_TRUE(taken.took_over()) << "the answer says the stranded work was taken over";
    EXPECT_EQ(this->store().find(stranded)->fence, 2);
    EXPECT_EQ(this->store().find(stranded)->attempts, 2);
    // In flight under a live lease: answered in flight, nothing written.
    const Key live = detail::key_of("one-transaction-live");
    ASSERT_EQ(this->reserve(live, "MSKU7000004").kind, Reservation::Kind::acquired);
    EXPECT_EQ(gate->process(live, "MSKU7000004").status(), Status::in_flight);
    // Failed: answered with the stored reason.
    const Key failed = detail::key_of("one-transaction-failed");
    const Reservation f = this->reserve(failed, "MSKU7000005");
    ASSERT_EQ(this->store().fail(failed, f.fence, "container not announced"),
              CommitStatus::committed);
    const auto answer = gate->process(failed, "MSKU7000005");
    EXPECT_EQ(answer.status(), Status::failed);
    EXPECT_EQ(answer.reason(), "container not announced");
    EXPECT_EQ(this->traits_.business_rows(), 1);
    EXPECT_EQ(this->traits_.business_rows_for(stranded), 1);
  }
}

TYPED_TEST_P(StoreConformance, SixteenThreadsRunningOneKeyInOneTransactionWriteOnce) {
  if constexpr (!one_transaction_store<typename TestFixture::Store>) {
    GTEST_SKIP() << "this store does not run an event in one transaction (commit_once)";
  } else {
    std::atomic<int> writes{0};
    auto gate = detail::transaction_gate(this->gate_name, this->store(),
                                         [&](auto& tx, const Key& key, const std::string& box) {
                                           ++writes;
                                           this->traits_.write_business(tx, key);
                                           // Long enough that the others arrive while this
                                           // transaction is open.
                                           std::this_thread::sleep_for(20ms);
                                           return "slot for " + box;
                                         });
    for (int round = 0; round < 5; ++round) {
      const Key key = detail::key_of("one-transaction-race", round);
      std::atomic<int> processed{0}, duplicates{0}, other{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < 16; ++t)
        threads.emplace_back([&] {
          try {
            const auto r = gate->process(key, "MSKU7000006");
            if (r.status() == Status::processed)
              ++processed;
            else if (r.status() == Status::duplicate && r.outcome() == "slot for MSKU7000006")
              ++duplicates;
            else
              ++other;
          } catch (...) {
            ++other;
          }
        });
      for (auto& t : threads) t.join();
      EXPECT_EQ(processed.load(), 1) << "round " << round;
      EXPECT_EQ(duplicates.load(), 15) << "round " << round;
      EXPECT_EQ(other.load(), 0) << "round " << round;
      EXPECT_EQ(this->traits_.business_rows_for(key), 1) << "round " << round;
    }
    EXPECT_EQ(writes.load(), 5);
  }
}

TYPED_TEST_P(StoreConformance, ADuplicateWaitsForAnOpenTransactionOnlyUpToTheLockTimeout) {
  if constexpr (!one_transaction_store<typename TestFixture::Store>) {
    GTEST_SKIP() << "this store does not run an event in one transaction (commit_once)";
  } else {
    std::mutex m;
    std::condition_variable cv;
    bool entered = false, go_on = false;
    const auto holding = [&](auto& tx, const Key& key, const std::string& box) {
      this->traits_.write_business(tx, key);
      std::unique_lock lock(m);
      entered = true;
      cv.notify_all();
      cv.wait(lock, [&] { return go_on; });
      return "slot for " + box;
    };
    // The first delivery waits as long as it likes; the duplicate gives up after 1 ms (which
    // would also bound the first one's own waits, a table's extension lock among them).
    auto gate = detail::transaction_gate(this->gate_name, this->store(), holding);
    auto impatient =
        detail::transaction_gate(this->gate_name, this->store(), holding, {.lock_timeout = 1ms});
    const Key key = detail::key_of("one-transaction-open");
    std::thread first(
        [&] { EXPECT_EQ(gate->process(key, "MSKU7000007").status(), Status::processed); });
    {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return entered; });
    }
    // The first delivery's transaction is open: the duplicate gives up at the bound (a store
    // whose wait is its own busy timeout throws StoreError instead), having written nothing.
    const auto started = std::chrono::steady_clock::now();
    try {
      const auto r = impatient->process(key, "MSKU7000007");
      EXPECT_EQ(r.status(), Status::retry) << r.reason();
      EXPECT_FALSE(r.should_ack());
    } catch (const StoreError&) {
    }
    EXPECT_LT(std::chrono::steady_clock::now() - started, 30s);
    {
      std::lock_guard lock(m);
      go_on = true;
    }
    cv.notify_all();
    first.join();
    const auto after = gate->process(key, "MSKU7000007");
    EXPECT_EQ(after.status(), Status::duplicate);
    EXPECT_EQ(this->traits_.business_rows_for(key), 1);

    // With a bound longer than the transaction, the duplicate waits and is answered from it.
    std::atomic<bool> writing{false};
    auto patient = detail::transaction_gate(this->gate_name, this->store(),
                                            [&](auto& tx, const Key& k, const std::string& box) {
                                              this->traits_.write_business(tx, k);
                                              writing = true;
                                              std::this_thread::sleep_for(50ms);
                                              return "slot for " + box;
                                            },
                                            {.lock_timeout = std::chrono::hours(1)});
    const Key second = detail::key_of("one-transaction-patient");
    std::thread a(
        [&] { EXPECT_EQ(patient->process(second, "MSKU7000008").status(), Status::processed); });
    // The duplicate comes once the first delivery is inside its transaction (a fixed pause let
    // a busy machine start the duplicate first).
    for (const auto until = std::chrono::steady_clock::now() + 10s;
         !writing && std::chrono::steady_clock::now() < until;)
      std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(writing) << "the first delivery never reached its write";
    const auto waited = patient->process(second, "MSKU7000008");
    a.join();
    EXPECT_TRUE(waited.status() == Status::duplicate || waited.status() == Status::processed)
        << waited.reason();
    EXPECT_EQ(this->traits_.business_rows_for(second), 1);
  }
}

TYPED_TEST_P(StoreConformance, ABatchInOneTransactionEachAnswersEveryMessage) {
  if constexpr (!one_transaction_store<typename TestFixture::Store>) {
    GTEST_SKIP() << "this store does not run an event in one transaction (commit_once)";
  } else {
    auto gate = detail::transaction_gate(this->gate_name, this->store(),
                                         [&](auto& tx, const Key& key, const std::string& box) {
                                           if (box == "BAD") throw std::runtime_error("refused");
                                           this->traits_.write_business(tx, key);
                                           return "slot for " + box;
                                         });
    const Key done = detail::key_of("one-transaction-batch", 0);
    ASSERT_EQ(gate->process(done, "A").status(), Status::processed);
    const std::vector<BatchMessage<std::string>> batch{
        {"m0", done, "A"},
        {"m1", detail::key_of("one-transaction-batch", 1), "B"},
        {"m2", detail::key_of("one-transaction-batch", 1), "B"},
        {"m3", detail::key_of("one-transaction-batch", 1), "C"},
        {"m4", detail::key_of("one-transaction-batch", 2), "BAD"},
        {"m5", detail::key_of("one-transaction-batch", 3), "D"}};
    const auto result = gate->process_batch(batch);
    const auto& items = result.items();
    ASSERT_EQ(items.size(), 6u);
    EXPECT_EQ(items[0].result.status(), Status::duplicate);
    EXPECT_EQ(items[1].result.status(), Status::processed);
    EXPECT_EQ(items[2].result.status(), Status::duplicate);
    EXPECT_EQ(items[2].result.outcome(), "slot for B");
    EXPECT_EQ(items[3].result.status(), Status::conflict);
    EXPECT_EQ(items[4].result.status(), Status::retry);
    EXPECT_EQ(items[5].result.status(), Status::processed);
    EXPECT_EQ(result.retry_ids(), std::vector<std::string>{"m4"});
    EXPECT_FALSE(this->store().find(detail::key_of("one-transaction-batch", 2)).has_value());
    EXPECT_EQ(this->traits_.business_rows(), 3);
  }
}

/// @endcond
}  // namespace idemgate::testing
