// SPDX-License-Identifier: MIT
// The conformance suite's fixture: one fresh store per test, the helpers the tests share, and
// the suite's fake downstreams and events. The tests are in the role headers beside it.
#pragma once

#include "../../concepts.hpp"
#include "../../key.hpp"
#include "../../outcome.hpp"
#include "../../record.hpp"
#include "../slot_request.hpp"
#include "../store_traits.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace idemgate::testing {

// The suite's durations read as literals (`10s`, `11min`); the literal operators are all this
// brings into the namespace.
using namespace std::chrono_literals;

/// @cond
// The suite's fake downstream, its events and keys: not part of the API.
namespace detail {

/// A slot API that honours idempotency keys and counts what it was asked, in process: the same
/// key always gets the slot it got first, so a repeated claim never hands out a second slot.
class SlotTerminal {
 public:
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  /// Hands out a new slot for a new key, the key's first slot for a key seen before.
  ClaimResult<std::string> claim(const SlotRequest&, const Key& key) {
    calls_.fetch_add(1);
    std::lock_guard lock(mutex_);
    auto it = by_key_.find(key);
    if (it != by_key_.end()) return it->second;
    std::string slot = "slot-" + std::to_string(++issued_);
    by_key_.emplace(key, slot);
    return slot;
  }
  /// Claims made.
  int calls() const { return calls_.load(); }
  /// Distinct slots handed out.
  int slots_issued() const {
    std::lock_guard lock(mutex_);
    return issued_;
  }

 private:
  std::atomic<int> calls_{0};
  mutable std::mutex mutex_;
  int issued_ = 0;
  std::map<Key, std::string> by_key_;
};

/// A second downstream with another request and outcome type: credits an account (the
/// request is the account id, the outcome the cents credited). Counts what it was asked.
class CreditLedger {
 public:
  using request_type = std::string;
  using outcome_type = long;
  static constexpr bool honours_idempotency_key = true;

  /// Credits 100 cents to `account`.
  ClaimResult<long> claim(const std::string&, const Key&) {
    calls_.fetch_add(1);
    return 100L;
  }
  /// Looks a credit up by key (it always finds one).
  LookupResult<long> lookup(const Key&) {
    calls_.fetch_add(1);
    return 100L;
  }
  /// Claims and look-ups made.
  int calls() const { return calls_.load(); }

 private:
  std::atomic<int> calls_{0};
};

/// A storm of redeliveries: `events` events, the first ones delivered several times (6, 6, 5,
/// ... down to 2), the rest once, in an order shuffled by a fixed seed. Each delivery is the
/// index of its event.
inline std::vector<int> redelivery_storm(int events) {
  constexpr int copies[] = {6, 6, 5, 5, 5, 4, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2};
  std::vector<int> deliveries;
  for (int event = 0; event < events; ++event) {
    const int n = event < static_cast<int>(std::size(copies)) ? copies[event] : 1;
    deliveries.insert(deliveries.end(), static_cast<std::size_t>(n), event);
  }
  std::mt19937 rng(9);
  std::shuffle(deliveries.begin(), deliveries.end(), rng);
  return deliveries;
}

/// The request of the storm's event `event`: its container and window.
inline SlotRequest storm_request(int event) {
  return {"MSKU" + std::to_string(7000000 + event * 37),
          "T" + std::to_string(6 + event % 12) + ":00"};
}

/// The key of the suite's event `name`.
inline Key key_of(const std::string& name) {
  return derive_key("conformance", name);
}

/// The `i`-th key of a batch called `name`.
inline Key key_of(const std::string& name, int i) {
  return derive_key("conformance", name, std::to_string(i));
}

}  // namespace detail
/// @endcond

/**
 * The fixture of the conformance suite: one fresh store per test, made by `Traits`
 * (see `store_traits`), and the helpers the tests share.
 */
template <class Traits>
class StoreConformance : public ::testing::Test {
  static_assert(store_traits<Traits>,
                "the traits type does not meet idemgate::testing::store_traits: give it the "
                "members listed in <idemgate/testing/store_traits.hpp>");

 protected:
  /// The store under test.
  using Store = typename Traits::Store;

  /// The gate whose rows the tests work on, unless a test names another.
  static constexpr const char* gate_name = "conformance";

  /// Makes the test's fresh store (`Traits::set_up`).
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(traits_.set_up());
    scoped_.emplace(traits_.store->for_gate(gate_name));
  }
  /// Removes what `SetUp` made (`Traits::tear_down`).
  void TearDown() override {
    scoped_.reset();
    traits_.tear_down();
  }

  /// The store `set_up` made, scoped to the gate `gate_name`.
  Store& store() { return *scoped_; }
  /// The store `set_up` made, as it was made (scoped to no gate).
  Store& unscoped_store() { return *traits_.store; }

  /// Reserves `key` for `request` (its fingerprint is the request's SHA-256).
  Reservation reserve(const Key& key, const std::string& request = "request",
                      std::chrono::milliseconds lease = 1min) {
    return store().reserve(key, idemgate::detail::sha256(request), request, lease);
  }

  /// The business write for `key`, as the store's commit and resolve take it.
  auto writer(const Key& key) {
    return [this, key](auto& tx) { traits_.write_business(tx, key); };
  }

  /// The status of `key`'s row; throws when there is none.
  RecordStatus status_of(const Key& key) {
    const auto row = store().find(key);
    if (!row) throw std::logic_error("no row for " + key.hex());
    return row->status;
  }

  /// Reserves `distinct` new keys, then the first `repeated` of them once more (a redelivery
  /// while the first is still in flight).
  void traffic(const std::string& name, int distinct, int repeated) {
    for (int i = 0; i < distinct; ++i)
      ASSERT_EQ(reserve(detail::key_of(name, i)).kind, Reservation::Kind::acquired) << name << i;
    for (int i = 0; i < repeated; ++i)
      ASSERT_EQ(reserve(detail::key_of(name, i)).kind, Reservation::Kind::existing) << name << i;
  }

  /// Reserves `key` and settles it as `status` (in flight: left as reserved).
  void settled(const Key& key, RecordStatus status) {
    const Reservation r = reserve(key);
    ASSERT_EQ(r.kind, Reservation::Kind::acquired);
    switch (status) {
      case RecordStatus::in_flight:
        break;
      case RecordStatus::committed:
        ASSERT_EQ(store().commit(key, r.fence, "slot", writer(key)), CommitStatus::committed);
        break;
      case RecordStatus::failed:
        ASSERT_EQ(store().fail(key, r.fence, "422"), CommitStatus::committed);
        break;
      case RecordStatus::escalated:
        ASSERT_EQ(store().escalate(key, r.fence, "no key support"), CommitStatus::committed);
        break;
    }
  }

  /// Makes one row in each state a re-drive must leave alone, keyed `name` 0 to 3: committed, in
  /// flight under a live lease, in flight with its lease given back (a transient failure), and
  /// escalated; `rows` gets them as they are then, in that order.
  void rows_a_redrive_leaves_alone(const std::string& name, std::vector<Record>& rows) {
    const Key committed = detail::key_of(name, 0), flying = detail::key_of(name, 1),
              given_back = detail::key_of(name, 2), parked = detail::key_of(name, 3);
    ASSERT_NO_FATAL_FAILURE(settled(committed, RecordStatus::committed));
    ASSERT_NO_FATAL_FAILURE(settled(flying, RecordStatus::in_flight));
    ASSERT_NO_FATAL_FAILURE(settled(given_back, RecordStatus::in_flight));
    ASSERT_TRUE(store().release(given_back, 1));
    ASSERT_NO_FATAL_FAILURE(settled(parked, RecordStatus::escalated));
    rows.clear();
    for (const Key& key : {committed, flying, given_back, parked}) {
      const auto row = store().find(key);
      ASSERT_TRUE(row.has_value());
      rows.push_back(*row);
    }
  }

  /// Checks that the rows of `rows_a_redrive_leaves_alone` are as they were, and that their
  /// holders and redeliveries meet what they met before: the committed row's result, the live
  /// holder's fence (it commits; nobody takes it over), the given-back row taken over with the
  /// next fence, the escalated row resolved by hand.
  void expect_left_alone(const std::vector<Record>& rows) {
    static constexpr const char* what[] = {"the committed row", "the row in flight",
                                           "the row given back", "the escalated row"};
    ASSERT_EQ(rows.size(), std::size(what));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Record& was = rows[i];
      const auto row = store().find(was.key);
      ASSERT_TRUE(row.has_value()) << what[i];
      EXPECT_EQ(row->status, was.status) << what[i];
      EXPECT_EQ(row->fence, was.fence) << what[i];
      EXPECT_EQ(row->attempts, was.attempts) << what[i];
      EXPECT_EQ(row->lease_until, was.lease_until) << what[i];
      EXPECT_EQ(row->updated_at, was.updated_at) << what[i];
      EXPECT_EQ(row->result, was.result) << what[i];
      EXPECT_EQ(row->reason, was.reason) << what[i];
    }
    const Key& committed = rows[0].key;
    const Key& flying = rows[1].key;
    const Key& given_back = rows[2].key;
    const Key& parked = rows[3].key;
    const Reservation done = reserve(committed);
    EXPECT_EQ(done.status, RecordStatus::committed);
    EXPECT_EQ(done.result, "slot") << "its redelivery gets the stored result";
    const Reservation live = reserve(flying);
    EXPECT_EQ(live.kind, Reservation::Kind::existing) << "a live holder is never taken over";
    EXPECT_EQ(store().commit(flying, 1, "slot", writer(flying)), CommitStatus::committed)
        << "the holder still holds its fence";
    const Reservation next = reserve(given_back);
    EXPECT_EQ(next.kind, Reservation::Kind::taken_over);
    EXPECT_EQ(next.fence, 2) << "the next fence, not one a re-drive took";
    EXPECT_EQ(store().commit(given_back, next.fence, "slot", writer(given_back)),
              CommitStatus::committed);
    EXPECT_TRUE(store().resolve(parked, "slot", writer(parked))) << "still for a human";
    for (const Key& key : {committed, flying, given_back, parked})
      EXPECT_EQ(traits_.business_rows_for(key), 1);
  }

  /// The traits object of this test.
  Traits traits_;
  /// `store()`: the traits' store scoped to `gate_name`.
  std::optional<Store> scoped_;
};

/// @cond
// The suite itself; its tests are defined in the role headers, registered in
// store_conformance.hpp. Their names, as GoogleTest prints them, say what each one checks.
TYPED_TEST_SUITE_P(StoreConformance);
/// @endcond

}  // namespace idemgate::testing
