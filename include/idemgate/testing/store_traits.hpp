// SPDX-License-Identifier: MIT
// What a user writes to run the store conformance suite over a store: the traits contract, as a
// concept, and two helpers that make most traits types a few lines long (the clocks are in
// clocks.hpp).
#pragma once

#include "../concepts.hpp"
#include "../key.hpp"
#include "clocks.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

namespace idemgate::testing {

/**
 * Concept: how the conformance suite makes a fresh store, writes and counts business rows, and
 * lets time pass. Each test default-constructs one traits object and calls `set_up()` first and
 * `tear_down()` last.
 *
 * - `Store`: the store type under test. It must satisfy `idemgate::store` and
 *   `idemgate::monitored_store`; the re-drive tests fail (they still compile) unless it also
 *   satisfies `idemgate::redrivable_store`.
 * - `store`: a pointer-like member (`std::unique_ptr<Store>`) that `set_up()` fills with a fresh,
 *   empty store; the suite uses it from several threads at once.
 * - `set_up()`: creates the store and whatever the business write needs (a table, a file). A
 *   GoogleTest assertion that fails in it fails the test before its body runs.
 * - `tear_down()`: removes what `set_up()` created (the store's tables, its mismatches table too).
 * - `write_business(tx, key)`: the business write, one row tagged with `key`, through the store's
 *   transaction `Store::transaction`. Called from several threads at once.
 * - `business_rows()`, `business_rows_for(key)`, `distinct_business_events()`: count the business
 *   rows that committed (all, those tagged with `key`, distinct keys among them), as something
 *   that converts to `std::int64_t`.
 * - `advance(by)`: lets `by` pass for every lease and timestamp in the store, the recorded
 *   mismatches' too: move an injected clock forward (`ShiftableClock`), or move the stored
 *   timestamps back by `by`.
 */
template <class T>
concept store_traits = std::default_initializable<T> && requires {
  typename T::Store;
} && idemgate::store<typename T::Store> && idemgate::monitored_store<typename T::Store> &&
    requires(T& traits, typename T::Store::transaction& tx, const Key& key,
             std::chrono::milliseconds by) {
  { *traits.store } -> std::same_as<typename T::Store&>;
  traits.set_up();
  traits.tear_down();
  traits.write_business(tx, key);
  { traits.business_rows() } -> std::convertible_to<std::int64_t>;
  { traits.business_rows_for(key) } -> std::convertible_to<std::int64_t>;
  { traits.distinct_business_events() } -> std::convertible_to<std::int64_t>;
  traits.advance(by);
};

/**
 * Concept: traits of a store whose business write runs statements in the store's own
 * transaction (an SQL store), for `SqlStoreConformance`.
 *
 * - `break_transaction(tx)`: runs what ends the whole transaction early (a statement that fails,
 *   or a trigger that rolls everything back) and swallows the error, as a careless business write
 *   would. The suite checks that the store then commits nothing of the log.
 */
template <class T>
concept transaction_breaking_store_traits = store_traits<T> &&
    requires(T& traits, typename T::Store::transaction& tx) {
  traits.break_transaction(tx);
};

/**
 * The business-write half of a traits type for a store whose transaction stages effects with
 * `on_commit(std::function<void()>)`, as `idemgate::MemoryStore::transaction` does: the business
 * row is a key kept in memory once the transaction commits. Derive the traits type from it.
 */
class OnCommitBusinessRows {
 public:
  /// Stages one business row tagged with `key`; it exists once `tx` commits.
  template <class Transaction>
  void write_business(Transaction& tx, const Key& key) {
    tx.on_commit([this, key] {
      std::lock_guard lock(mutex_);
      rows_.push_back(key);
    });
  }
  /// Every business row that committed.
  std::int64_t business_rows() {
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(rows_.size());
  }
  /// The business rows tagged with `key`.
  std::int64_t business_rows_for(const Key& key) {
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(std::count(rows_.begin(), rows_.end(), key));
  }
  /// Distinct keys among the business rows.
  std::int64_t distinct_business_events() {
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(std::set<Key>(rows_.begin(), rows_.end()).size());
  }

 private:
  std::mutex mutex_;
  std::vector<Key> rows_;
};

}  // namespace idemgate::testing
