// SPDX-License-Identifier: MIT
// The store conformance suite: the same behaviours over every store, as a type-parameterised
// GoogleTest suite. A store that passes it is a correct store.
#pragma once

/**
 * @file
 * Run it over a store by writing a traits type (see `store_traits.hpp`) and instantiating the
 * suite with it, in the namespace the suite is defined in. Example:
 *
 *     struct MyStoreTraits : idemgate::testing::OnCommitBusinessRows { ... };
 *     namespace idemgate::testing {
 *     INSTANTIATE_TYPED_TEST_SUITE_P(MyStore, StoreConformance, MyStoreTraits);
 *     }
 *
 * and linking the CMake target `idemgate::testing` (with `GTest::gtest_main`, or a main of your
 * own). Tests are named `MyStore/StoreConformance/0.<Behaviour>`. Stores whose business write
 * runs SQL in the store's transaction also run `SqlStoreConformance`
 * (`sql_store_conformance.hpp`).
 */

#include "../codec.hpp"
#include "../concepts.hpp"
#include "../errors.hpp"
#include "../gate.hpp"
#include "../key.hpp"
#include "../outcome.hpp"
#include "../reconciler.hpp"
#include "../record.hpp"
#include "../signals.hpp"
#include "slot_request.hpp"
#include "store_traits.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
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
// The tests. Their names, as GoogleTest prints them, say what each one checks.
TYPED_TEST_SUITE_P(StoreConformance);

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

// --- signals ---------------------------------------------------------------------------------

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

// --- purge -----------------------------------------------------------------------------------

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

// --- the gate over the store ----------------------------------------------------------------

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

// =============================================================================================
// Attempts, retrying rows and re-driving failed rows: the calls every store shares.
// A store without `redrive_failed` yet fails the re-drive cases (instead of not compiling).
// =============================================================================================

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

// =============================================================================================
// Gates sharing one log: each handle (`for_gate`) sees and changes only its own gate's rows.
// =============================================================================================

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
    for (const Key& key : {first, second, third})
      ASSERT_EQ(unowned.reserve(key, fp, "old", 1min).kind, Reservation::Kind::acquired);
    auto claims = unowned.for_gate("ect.claim_slot");
    ASSERT_EQ(claims.reserve(third, fp, "new", 1min).kind, Reservation::Kind::acquired);
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

// =============================================================================================
// Renewals: `extend` (lease_extending_store) renews only the leases whose fence still holds.
// A store without `extend` skips this case: the gate renews no lease on it.
// =============================================================================================

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

// =============================================================================================
// What an operator works with: rows listed and counted, causes, re-driving a cause, the gates,
// labels, and the history that survives re-drives and resolutions.
// =============================================================================================

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

REGISTER_TYPED_TEST_SUITE_P(
    StoreConformance, FirstReservationAcquiresWithFenceOne,
    SecondReservationFindsTheKeyInFlightAsTheSameRequest,
    ReservationWithADifferentRequestIsNotTheSameRequest,
    CommitWritesStatusResultAndBusinessRowTogether,
    CommitUnderAStaleFenceLosesTheLeaseAndWritesNothing,
    BusinessWriteThatThrowsCommitsNothingAndLeavesTheRowInFlight,
    RepeatedCommitUnderTheSameFenceIsCommittedWithoutRepeatingTheWrite,
    FailIsFencedAndTheNextReservationSeesTheReason,
    EscalateIsFencedAndTheNextReservationSeesTheReason,
    ReleaseNeedsTheCurrentFenceAndKeepsTheRowInFlight, ReleasedKeyIsTakenOverAtOnceWithTheNextFence,
    ReleasedRowThatNoDeliveryReclaimsIsLeftToTheReconciler,
    RepeatedFailOrEscalateUnderTheSameFenceIsCommitted,
    ExpiredLeaseIsTakenOverWithTheNextFenceLiveLeaseIsNot,
    TakeStaleRespectsLeaseStalenessAndLimitAndBumpsFences, EscalatedListsOldestFirst,
    ResolveCommitsAnEscalatedRowWithItsBusinessWriteOnly,
    EightThreadsReservingOneKeyHaveExactlyOneWinner, SignalsOfAnEmptyStoreAreZeroAndHealthy,
    EveryReservationThatMeetsAnExistingKeyIsCountedOnItsRow,
    SignalsWithoutOneDuplicateInAHundredEventsSuspectTheKeyDerivation,
    SignalsWithTwoPercentDuplicatesAreHealthy,
    SignalsWithAQuarterDuplicatesSayTheUpstreamMisbehaves,
    SignalsShowARowInFlightForElevenMinutesAsStranded,
    SignalsCountAKeyWithTwoResultsAndMismatchesKeepBoth,
    GateRecordsAMismatchWhenALateWorkerHoldsAnotherResult,
    SignalsCountOnlyEventsAndMismatchesInsideTheWindow,
    PurgeRemovesFinishedRowsPastTheWindowAndKeepsTheRest, PurgeDeletesInBatchesAndReturnsTheTotal,
    PurgeNeverRemovesAnInFlightRowUnderConcurrentTraffic,
    GateOverTheStoreTurnsARedeliveryStormIntoOneClaimPerEvent,
    AttemptsStartAtOneAndGrowWithEveryTakeover, RetryingCountsInFlightRowsHeldMoreThanOnce,
    ARedrivenFailedRowIsTakenOverByTheNextReservation, ARedrivenFailedRowIsTakenByTheReconciler,
    RedrivingByTimeTakesFailedRowsInTheRangeUpToTheLimit,
    TwoGatesReservingOneKeyEachHoldTheirOwnRow,
    AGateNeverTakesOverFinishesOrEscalatesAnotherGatesRow,
    QueuesSignalsMismatchesRedrivesAndPurgesSeeOnlyTheirGate,
    AnotherGatesReconcilerNeverFinishesAStrandedRow,
    AdoptingGivesRowsOfNoGateToOneGateExceptKeysItHolds,
    RedrivingByKeyLeavesCommittedInFlightAndEscalatedRowsAlone,
    RedrivingByTimeLeavesCommittedInFlightAndEscalatedRowsAlone,
    ARenewalExtendsOnlyTheLeasesWhoseFenceStillHolds,
    RowsAndCountFilterByStatusReasonLabelAndTimeNewestFirst,
    CausesGroupTheGatesFailedAndEscalatedRowsByReason,
    RedrivingACauseTakesOnlyItsFailedRowsInTheGateAndKeepsTheReason,
    GatesListsEveryGateWithRowsFromAnyHandle, ALabelIsKeptOnlyWhenGivenAndFindsItsRow,
    HistoryKeepsWhyEveryAttemptEndedThroughRedriveAndResolve, HistoryKeepsTheNewestSixteenEntries);

/// @endcond
}  // namespace idemgate::testing
