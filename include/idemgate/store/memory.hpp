// SPDX-License-Identifier: MIT
// MemoryStore: an in-process store for tests; not durable.
#pragma once

#include "../concepts.hpp"
#include "../detail/durations.hpp"
#include "../record.hpp"
#include "../signals.hpp"
#include "log/protocol.hpp"
#include "log/text.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idemgate {

/**
 * An in-memory store: a test double, **not durable**.
 *
 * Everything is lost when the process exits, and two processes never see each other's keys, so a
 * restart or a second consumer processes every event again. Use it in unit tests and examples;
 * use `SqliteStore` or `PostgresStore` for anything that must survive a restart. Thread-safe.
 * A copy, and `for_gate`, is a handle on the same rows.
 *
 * Every duration parameter is added to or subtracted from the clock with saturating arithmetic:
 * `duration::max()` means forever (a lease never expires, a row is never stale or purged), and
 * negative or `duration::min()` values never wrap around (a negative lease has already expired).
 */
class MemoryStore {
 public:
  /// The clock leases are measured with; injectable so tests can expire leases at once.
  using Clock = WallClock;

  /// The business write's transaction: stage effects with `on_commit`; they run only when the
  /// fenced status change succeeds, under the store's lock.
  class transaction {
   public:
    /// Runs `effect` if and when the transaction commits.
    void on_commit(std::function<void()> effect) { effects_.push_back(std::move(effect)); }

   private:
    friend class MemoryStore;
    std::vector<std::function<void()>> effects_;
  };

  /// A store on the system clock.
  MemoryStore() : MemoryStore([] { return std::chrono::system_clock::now(); }) {}
  /// A store on an injected clock.
  explicit MemoryStore(Clock clock) : MemoryStore(std::make_shared<Shared>(std::move(clock)), "") {}

  /// A handle on the same rows that sees only those of gate `name`.
  [[nodiscard]] MemoryStore for_gate(const GateName& name) const {
    return MemoryStore(shared_, name.str());
  }
  /// The gate whose rows this handle sees ("" for rows that belong to no gate).
  [[nodiscard]] const std::string& gate() const noexcept { return gate_; }

  /// Inserts the key as in flight, takes over an expired lease, or reports what is stored.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    return reserve(key, fingerprint, request, lease, {});
  }

  /// Like `reserve`, and keeps `label` with a new row (a stored row keeps its own).
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease, std::string_view label) {
    std::lock_guard lock(mutex_);
    const auto now = clock_();
    adopt_key(key);
    auto [it, inserted] = rows_.try_emplace(key);
    Record& row = it->second;
    if (inserted) {
      row.gate = gate_;
      row.key = key;
      row.status = RecordStatus::in_flight;
      row.fence = 1;
      row.request.assign(request);
      row.fingerprint = fingerprint;
      row.created_at = row.updated_at = now;
      row.lease_until = detail::saturating_add(now, lease);
      row.attempts = 1;
      row.label = detail::stored_text(label);
      return Reservation::acquired(row.fence);
    }
    ++row.duplicates;
    const bool same = row.fingerprint == fingerprint;
    // One locked step reserves: it never meets a row of its own.
    if (detail::met(row.status, same, row.lease_until >= now, false) == detail::Met::expired) {
      taken_over(row, now);
      ++row.fence;
      ++row.attempts;
      row.lease_until = detail::saturating_add(now, lease);
      row.updated_at = now;
      return Reservation::taken_over(row.fence);
    }
    Reservation found = Reservation::existing(row.fence, row.status, same,
                                              row.result.value_or(std::string()), row.reason);
    found.held = detail::held(row.status, row.lease_until >= now, released_by_this_attempt(row));
    return found;
  }

  /// Runs `business` and marks the key committed with `result`, only if `fence` still holds.
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    transaction tx;
    std::forward<BusinessWrite>(business)(tx);
    std::lock_guard lock(mutex_);
    Record* row = holder(key, fence);
    if (row == nullptr) return missed(key, fence, RecordStatus::committed);
    row->status = RecordStatus::committed;
    row->result = std::string(result);
    row->updated_at = clock_();
    for (auto& effect : tx.effects_) effect();
    return CommitStatus::committed;
  }

  /// Commits many outcomes at once with one business write for all of them: runs `business` once
  /// and, only if every item's fence still holds, marks them all committed and applies what the
  /// write recorded. All or nothing: nullopt when a fence moved or `business` threw (nothing
  /// applied; commit the items one by one instead, as `Gate::process_batch` does).
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_bulk(std::span<const CommitItem> items,
                                                       BusinessWrite&& business) {
    transaction tx;
    try {
      std::forward<BusinessWrite>(business)(tx);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    std::lock_guard lock(mutex_);
    for (const CommitItem& item : items)
      if (holder(item.key, item.fence) == nullptr) return std::nullopt;
    const auto now = clock_();
    for (const CommitItem& item : items) {
      Record& row = rows_.at(item.key);
      row.status = RecordStatus::committed;
      row.result = std::string(item.result);
      row.updated_at = now;
    }
    for (auto& effect : tx.effects_) effect();
    return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
  }

  /// Like `commit`, with the result returned by `produce(transaction&)`.
  template <class Produce>
  CommitStatus commit_computed(const Key& key, std::int64_t fence, Produce&& produce) {
    transaction tx;
    std::string result = std::forward<Produce>(produce)(tx);
    return commit(key, fence, result,
                  [&](transaction& outer) { outer.effects_ = std::move(tx.effects_); });
  }

  /**
   * One event in one transaction (see `PostgresStore::commit_once`): reserves the key, runs
   * `produce(transaction&)` and commits the row with the string it returns and the effects it
   * staged; when `produce` throws, nothing is kept. A concurrent call of the same key waits for
   * the first up to `wait`, then is answered `busy`. Unlike a database, the row shows in flight
   * to readers for the moment between `produce` and its commit.
   */
  template <class Produce>
  OnceResult commit_once(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                         std::string_view label, std::chrono::milliseconds wait,
                         Produce&& produce) {
    const std::pair<std::string, std::string> slot{gate_, std::string(key.view())};
    {
      std::unique_lock lock(mutex_);
      // Another call holds the key in its open transaction: wait for it to end.
      if (!shared_->open_changed.wait_for(lock, std::max(wait, std::chrono::milliseconds(0)),
                                          [&] { return !shared_->open.contains(slot); }))
        return OnceResult::busy();
      adopt_key(key);
      if (auto it = rows_.find(key); it != rows_.end()) {
        Record& row = it->second;
        const bool same_request = row.fingerprint == fingerprint;
        if (detail::met(row.status, same_request, row.lease_until >= clock_(), false) !=
            detail::Met::expired) {
          ++row.duplicates;
          Reservation found = Reservation::existing(row.fence, row.status, same_request,
                                                    row.result.value_or(std::string()), row.reason);
          found.held =
              detail::held(row.status, row.lease_until >= clock_(), released_by_this_attempt(row));
          return OnceResult::existing(std::move(found));
        }
      }
      shared_->open.insert(slot);
    }
    struct Close {
      MemoryStore& store;
      const std::pair<std::string, std::string>& slot;
      ~Close() {
        std::lock_guard lock(store.mutex_);
        store.shared_->open.erase(slot);
        store.shared_->open_changed.notify_all();
      }
    } close{*this, slot};
    transaction tx;
    std::string result = std::forward<Produce>(produce)(tx);
    const Reservation held = reserve(key, fingerprint, request, std::chrono::hours(24), label);
    if (held.kind == Reservation::Kind::existing) return OnceResult::existing(held);
    if (commit(key, held.fence, result, [&](transaction& outer) {
          outer.effects_ = std::move(tx.effects_);
        }) != CommitStatus::committed)
      throw StoreError("idemgate: the memory store's row of key " + key.hex() +
                       " was taken over between its reservation and its commit");
    return OnceResult::committed(std::move(result), held.kind == Reservation::Kind::taken_over);
  }

  /// Stores a permanent failure, only if `fence` still holds.
  CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle(key, fence, RecordStatus::failed, reason);
  }

  /// Parks the key for a human, only if `fence` still holds.
  CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle(key, fence, RecordStatus::escalated, reason);
  }

  /// Gives back an in-flight reservation this caller holds after a transient failure: its lease
  /// ends now, so the next delivery takes the key over at once (with a higher fence). False when
  /// the fence no longer holds.
  bool release(const Key& key, std::int64_t fence) { return release(key, fence, {}); }

  /// Like `release`, and keeps `reason` (when not empty) as why this attempt gave the event back.
  bool release(const Key& key, std::int64_t fence, std::string_view given) {
    return release(key, fence, given, std::chrono::milliseconds(0));
  }

  /// Like `release(key, fence, reason)`, and holds the key for `hold` before the next attempt
  /// may take it over (`GateOptions::retry_backoff`). A hold of 0 ends the lease now.
  bool release(const Key& key, std::int64_t fence, std::string_view given,
               std::chrono::milliseconds hold) {
    const std::string reason = detail::held_reason(given, hold);
    std::lock_guard lock(mutex_);
    Record* row = holder(key, fence);
    if (row == nullptr) return false;
    row->updated_at = clock_();
    row->lease_until = hold.count() > 0 ? detail::saturating_add(row->updated_at, hold)
                                        : std::chrono::system_clock::time_point{};  // the epoch
    if (!reason.empty()) {
      row->reason.assign(reason);
      add_history(*row, detail::history::released, reason, row->updated_at);
    }
    return true;
  }

  /// Extends the leases the caller still holds to `lease` from now; returns how many it extended.
  std::size_t extend(std::span<const HeldLease> held, std::chrono::milliseconds lease) {
    std::lock_guard lock(mutex_);
    const auto now = clock_();
    std::size_t extended = 0;
    for (const HeldLease& h : held) {
      Record* row = holder(h.key, h.fence);
      if (row == nullptr) continue;
      row->lease_until = detail::saturating_add(now, lease);
      ++extended;
    }
    return extended;
  }

  /// Puts a failed event back in flight under a new fence with its lease ended, so the next
  /// delivery or the reconciler claims again under the same key. Returns 1, or 0 when the key is
  /// not failed.
  std::size_t redrive_failed(const Key& key) {
    std::lock_guard lock(mutex_);
    auto it = rows_.find(key);
    if (it == rows_.end() || it->second.status != RecordStatus::failed) return 0;
    redrive(it->second);
    return 1;
  }

  /// Re-drives up to `limit` failed events whose failure was stored in [`from`, `to`).
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    std::lock_guard lock(mutex_);
    std::size_t done = 0;
    for (auto& [key, row] : rows_) {
      if (done >= limit) break;
      if (row.status != RecordStatus::failed || row.updated_at < from || row.updated_at >= to)
        continue;
      redrive(row);
      ++done;
    }
    return done;
  }

  /// The stored row, if any.
  std::optional<Record> find(const Key& key) const {
    std::lock_guard lock(mutex_);
    auto it = rows_.find(key);
    if (it == rows_.end()) return std::nullopt;
    return it->second;
  }

  /// Takes over up to `limit` in-flight rows whose lease expired and that have not changed for
  /// `stale_after`, bumping their fence and granting a new `lease`.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    std::lock_guard lock(mutex_);
    const auto now = clock_();
    std::vector<Record*> candidates;
    for (auto& [key, row] : rows_)
      if (row.status == RecordStatus::in_flight && row.lease_until < now &&
          detail::saturating_add(row.updated_at, stale_after) <= now)
        candidates.push_back(&row);
    std::sort(candidates.begin(), candidates.end(),
              [](const Record* a, const Record* b) { return a->lease_until < b->lease_until; });
    if (candidates.size() > limit) candidates.resize(limit);
    std::vector<Stranded> taken;
    taken.reserve(candidates.size());
    for (Record* row : candidates) {
      taken_over(*row, now);
      ++row->fence;
      ++row->attempts;
      row->lease_until = detail::saturating_add(now, lease);
      row->updated_at = now;
      taken.push_back({row->key, row->fence, row->request, row->attempts, row->reason});
    }
    return taken;
  }

  /// Up to `limit` escalated rows, oldest first.
  std::vector<Record> escalated(std::size_t limit) const {
    std::lock_guard lock(mutex_);
    std::vector<Record> parked;
    for (const auto& [key, row] : rows_)
      if (row.status == RecordStatus::escalated) parked.push_back(row);
    std::sort(parked.begin(), parked.end(),
              [](const Record& a, const Record& b) { return a.updated_at < b.updated_at; });
    if (parked.size() > limit) parked.resize(limit);
    return parked;
  }

  /// Commits an escalated row with `result` and the business write; false if it is not escalated.
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    transaction tx;
    std::forward<BusinessWrite>(business)(tx);
    std::lock_guard lock(mutex_);
    auto it = rows_.find(key);
    if (it == rows_.end() || it->second.status != RecordStatus::escalated) return false;
    it->second.status = RecordStatus::committed;
    it->second.result = std::string(result);
    it->second.updated_at = clock_();
    add_history(it->second, detail::history::resolved, it->second.reason, it->second.updated_at);
    for (auto& effect : tx.effects_) effect();
    return true;
  }

  /// The three signals over the events reserved in the last `window`.
  StoreSignals signals(std::chrono::seconds window) const {
    std::lock_guard lock(mutex_);
    const auto now = clock_();
    const auto since = detail::saturating_sub(now, window);
    StoreSignals s;
    s.window = window;
    for (const auto& [key, row] : rows_) {
      if (row.created_at >= since) {
        s.events += 1 + row.duplicates;
        s.duplicates += row.duplicates;
      }
      if (row.status == RecordStatus::in_flight) {
        ++s.in_flight;
        if (row.attempts > 1) ++s.retrying;
        const auto age = std::chrono::duration_cast<std::chrono::seconds>(now - row.created_at);
        if (!s.oldest_in_flight || age > *s.oldest_in_flight) s.oldest_in_flight = age;
      }
      if (row.status == RecordStatus::escalated) ++s.escalated;
    }
    std::vector<Key> keys;
    for (const Mismatch& m : mismatches_)
      if (m.at >= since && std::find(keys.begin(), keys.end(), m.key) == keys.end())
        keys.push_back(m.key);
    s.mismatched_keys = static_cast<std::int64_t>(keys.size());
    s.mismatches_total = static_cast<std::int64_t>(mismatches_.size());
    return s;
  }

  /// Keeps a downstream answer that differed from the stored one.
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    std::lock_guard lock(mutex_);
    mismatches_.push_back(
        {key, std::string(stored), std::string(observed), detail::stored_text(source), clock_()});
  }

  /// Up to `limit` recorded mismatches, newest first.
  std::vector<Mismatch> mismatches(std::size_t limit) const {
    std::lock_guard lock(mutex_);
    std::vector<Mismatch> newest(mismatches_.rbegin(), mismatches_.rend());
    if (newest.size() > limit) newest.resize(limit);
    return newest;
  }

  /// Deletes committed and failed rows that finished more than `older_than` ago, `batch` per lock;
  /// never in-flight or escalated rows. Returns how many it deleted.
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    return erase_in_batches(older_than, batch, [](const Record& row, auto, auto cutoff) {
      return (row.status == RecordStatus::committed || row.status == RecordStatus::failed) &&
             row.created_at < cutoff && row.updated_at < cutoff;
    });
  }

  /// Deletes abandoned attempts: rows in flight whose lease ended and that nothing touched (no
  /// retry, no takeover, no reconciler pass) for `older_than`, `batch` rows per statement; never a
  /// live lease, a finished or an escalated row. For gates no reconciler finishes (an endpoint's),
  /// or whose reconciler's passes would have touched the row long since: `Retention` calls it
  /// with `RetentionOptions::abandoned_after`. Returns how many it deleted.
  std::size_t purge_abandoned(std::chrono::seconds older_than, std::size_t batch) {
    return erase_in_batches(older_than, batch, abandoned);
  }

  /// Deletes the row of `key` when its life is over: committed or failed more than `lifetime`
  /// ago, or in flight with its lease ended and untouched as long (an attempt that never
  /// committed). Never an escalated row or a live lease. True when it deleted the row; the key is
  /// then new to the gate.
  bool expire(const Key& key, std::chrono::seconds lifetime) {
    std::lock_guard lock(mutex_);
    const auto it = rows_.find(key);
    if (it == rows_.end()) return false;
    const Record& row = it->second;
    const auto now = clock_();
    const auto cutoff = detail::saturating_sub(now, lifetime);
    const bool finished =
        (row.status == RecordStatus::committed || row.status == RecordStatus::failed) &&
        row.updated_at < cutoff;
    if (!finished && !abandoned(row, now, cutoff)) return false;
    rows_.erase(it);
    return true;
  }

  /// Gives this handle's gate the rows that belong to no gate (written before logs knew their
  /// gates), up to `limit` of them, except keys this gate already holds; returns how many it
  /// moved. Throws `std::logic_error` on a handle scoped to no gate.
  std::size_t adopt_unowned_rows(std::size_t limit) {
    detail::require_named_scope(gate_, "adopt_unowned_rows");
    std::lock_guard lock(mutex_);
    auto& unowned = shared_->rows[""];
    std::size_t moved = 0;
    for (auto it = unowned.begin(); it != unowned.end() && moved < limit;) {
      if (rows_.contains(it->first)) {
        ++it;
        continue;
      }
      Record row = std::move(it->second);
      row.gate = gate_;
      rows_.emplace(it->first, std::move(row));
      it = unowned.erase(it);
      ++moved;
    }
    adopt_mismatches();
    return moved;
  }

  /// Up to `query.limit` rows of this gate that match `query`, the newest change first.
  std::vector<Record> rows(const RowQuery& asked) const {
    const RowQuery query = detail::stored_query(asked);
    std::lock_guard lock(mutex_);
    std::vector<Record> found;
    for (const auto& [key, row] : rows_)
      if (matches(row, query)) found.push_back(row);
    std::sort(found.begin(), found.end(), [](const Record& a, const Record& b) {
      return a.updated_at != b.updated_at ? a.updated_at > b.updated_at : a.key < b.key;
    });
    if (found.size() > query.limit) found.resize(query.limit);
    return found;
  }

  /// How many rows of this gate match `query` (its limit aside).
  std::int64_t count(const RowQuery& asked) const {
    const RowQuery query = detail::stored_query(asked);
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(
        std::count_if(rows_.begin(), rows_.end(),
                      [&](const auto& entry) { return matches(entry.second, query); }));
  }

  /// This gate's failed and escalated rows grouped by status and cause (`cause_of` their
  /// reasons), most rows first (then the most recent), at most `limit` groups.
  std::vector<Cause> causes(std::size_t limit) const {
    std::lock_guard lock(mutex_);
    std::map<std::pair<RecordStatus, std::string>, Cause> groups;
    for (const auto& [key, row] : rows_) {
      if (row.status != RecordStatus::failed && row.status != RecordStatus::escalated) continue;
      const std::string_view shared = cause_of(row.reason);
      auto [it, added] = groups.try_emplace({row.status, std::string(shared)});
      Cause& cause = it->second;
      if (added) {
        cause.status = row.status;
        cause.reason = shared;
        cause.first_seen = cause.last_seen = row.updated_at;
      }
      ++cause.rows;
      cause.first_seen = std::min(cause.first_seen, row.updated_at);
      cause.last_seen = std::max(cause.last_seen, row.updated_at);
    }
    std::vector<Cause> found;
    for (auto& [group, cause] : groups) found.push_back(std::move(cause));
    std::stable_sort(found.begin(), found.end(), [](const Cause& a, const Cause& b) {
      return a.rows != b.rows ? a.rows > b.rows : a.last_seen > b.last_seen;
    });
    if (found.size() > limit) found.resize(limit);
    return found;
  }

  /// Re-drives up to `limit` failed rows of this gate whose reason or cause is exactly `given`,
  /// as `redrive_failed(key)` does; returns how many.
  std::size_t redrive_cause(std::string_view given, std::size_t limit) {
    const std::string reason = detail::stored_text(given);
    std::lock_guard lock(mutex_);
    std::size_t done = 0;
    for (auto& [key, row] : rows_) {
      if (done >= limit) break;
      if (row.status != RecordStatus::failed || !reason_or_cause_is(row, reason)) continue;
      redrive(row);
      ++done;
    }
    return done;
  }

  /// The gates that have rows in this log, sorted (from any handle; rows of no gate are not
  /// listed).
  std::vector<std::string> gates() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> names;
    for (const auto& [name, rows] : shared_->rows)
      if (!name.empty() && !rows.empty()) names.push_back(name);
    return names;
  }

  /// Replaces the stored row of `row.key` with `row`, or removes it when `row` is nullopt: for
  /// tests that emulate a database crash losing its latest writes.
  void restore(const Key& key, std::optional<Record> row) {
    std::lock_guard lock(mutex_);
    if (row)
      rows_[key] = std::move(*row);
    else
      rows_.erase(key);
  }

  /// Every stored row (test inspection).
  std::vector<Record> records() const {
    std::lock_guard lock(mutex_);
    std::vector<Record> all;
    all.reserve(rows_.size());
    for (const auto& [key, row] : rows_) all.push_back(row);
    return all;
  }

 private:
  // Everything the handles on one log share; each gate's rows in a map of their own.
  struct Shared {
    explicit Shared(Clock c) : clock(std::move(c)) {}
    Clock clock;
    std::mutex mutex;
    std::map<std::string, std::unordered_map<Key, Record, KeyHash>, std::less<>> rows;
    // The (gate, key) of every `commit_once` whose transaction is open, and its end.
    std::set<std::pair<std::string, std::string>> open;
    std::condition_variable open_changed;
    std::map<std::string, std::vector<Mismatch>, std::less<>> mismatches;
  };

  MemoryStore(std::shared_ptr<Shared> shared, std::string gate)
      : shared_(std::move(shared)),
        gate_(std::move(gate)),
        clock_(shared_->clock),
        mutex_(shared_->mutex),
        rows_(gate_rows(*shared_, gate_)),
        mismatches_(gate_mismatches(*shared_, gate_)) {}

  // Erases the rows for which `doomed(row, now, cutoff)` holds, `cutoff` being `older_than`
  // before now, `batch` per lock; returns how many.
  template <class Doomed>
  std::size_t erase_in_batches(std::chrono::seconds older_than, std::size_t batch, Doomed doomed) {
    std::size_t deleted = 0;
    for (;;) {
      std::lock_guard lock(mutex_);
      const auto now = clock_();
      const auto cutoff = detail::saturating_sub(now, older_than);
      std::size_t this_batch = 0;
      for (auto it = rows_.begin(); it != rows_.end() && this_batch < batch;) {
        if (doomed(it->second, now, cutoff)) {
          it = rows_.erase(it);
          ++this_batch;
        } else {
          ++it;
        }
      }
      deleted += this_batch;
      if (this_batch < batch || batch == 0) return deleted;
    }
  }

  // An attempt nobody finishes: in flight, its lease ended, untouched since `cutoff`.
  static bool abandoned(const Record& row, std::chrono::system_clock::time_point now,
                        std::chrono::system_clock::time_point cutoff) {
    return row.status == RecordStatus::in_flight && row.lease_until < now &&
           row.updated_at < cutoff;
  }

  // std::map keeps references to its values valid while other entries come and go.
  static std::unordered_map<Key, Record, KeyHash>& gate_rows(Shared& shared,
                                                             const std::string& gate) {
    std::lock_guard lock(shared.mutex);
    return shared.rows[gate];
  }
  static std::vector<Mismatch>& gate_mismatches(Shared& shared, const std::string& gate) {
    std::lock_guard lock(shared.mutex);
    return shared.mismatches[gate];
  }

  // A key whose only row belongs to no gate becomes this gate's before a reservation looks at it
  // (the stores' reservations do the same): the event an earlier version finished is answered
  // from it, never processed again. The caller holds the lock.
  void adopt_key(const Key& key) {
    if (gate_.empty() || rows_.contains(key)) return;
    auto& unowned = shared_->rows[""];
    auto it = unowned.find(key);
    if (it == unowned.end()) return;
    Record row = std::move(it->second);
    row.gate = gate_;
    rows_.emplace(key, std::move(row));
    unowned.erase(it);
  }

  // Gives this gate the mismatches of no gate whose key it now holds and no unowned row holds.
  // The caller holds the lock.
  void adopt_mismatches() {
    auto& unowned = shared_->mismatches[""];
    const auto& unowned_rows = shared_->rows[""];
    std::erase_if(unowned, [&](Mismatch& m) {
      if (!rows_.contains(m.key) || unowned_rows.contains(m.key)) return false;
      mismatches_.push_back(std::move(m));
      return true;
    });
  }

  void redrive(Record& row) {
    add_history(row, detail::history::redriven, row.reason, clock_());
    row.status = RecordStatus::in_flight;
    ++row.fence;
    ++row.attempts;
    row.reason.clear();
    row.lease_until = std::chrono::system_clock::time_point{};
    row.updated_at = clock_();
  }

  Record* holder(const Key& key, std::int64_t fence) {
    auto it = rows_.find(key);
    if (it == rows_.end()) return nullptr;
    Record& row = it->second;
    if (row.status != RecordStatus::in_flight || row.fence != fence) return nullptr;
    return &row;
  }

  // A fenced write that found no row in flight under its fence (see `after_missed_write`): a
  // repeat of this fence's own write that landed gets the same answer with nothing written
  // again; another worker took over or settled the event (lost lease); or the caller's own
  // reservation or takeover is gone (no row, or the row back in flight under a lower fence): a
  // crash lost it, and nobody holds the event.
  CommitStatus missed(const Key& key, std::int64_t fence, RecordStatus target) const {
    std::optional<detail::StoredFence> stored;
    if (auto it = rows_.find(key); it != rows_.end())
      stored = detail::StoredFence{it->second.status, it->second.fence};
    return detail::after_missed_write(stored, fence, target, "the memory store")
        .value_or(CommitStatus::lost_lease);
  }

  CommitStatus settle(const Key& key, std::int64_t fence, RecordStatus status,
                      std::string_view given) {
    const std::string reason = detail::stored_text(given);
    std::lock_guard lock(mutex_);
    Record* row = holder(key, fence);
    if (row == nullptr) return missed(key, fence, status);
    row->status = status;
    row->reason = reason;
    row->updated_at = clock_();
    add_history(*row, to_string(status), reason, row->updated_at);
    return CommitStatus::committed;
  }

  // Keeps the newest `history_limit` entries.
  static void add_history(Record& row, std::string_view outcome, std::string_view reason,
                          std::chrono::system_clock::time_point at) {
    if (row.history.size() >= history_limit)
      row.history.erase(row.history.begin(),
                        row.history.end() - static_cast<std::ptrdiff_t>(history_limit - 1));
    row.history.push_back({row.attempts, std::string(outcome), std::string(reason), at});
  }

  // A takeover after the holder's lease ran out; a lease given back (released, re-driven) has
  // its entry already.
  // Whether the newest history entry is the current attempt's release: a lease still live is
  // then a back-off hold nobody works under.
  static bool released_by_this_attempt(const Record& row) {
    return !row.history.empty() && row.history.back().outcome == detail::history::released &&
           row.history.back().attempt == row.attempts;
  }

  static void taken_over(Record& row, std::chrono::system_clock::time_point now) {
    if (row.lease_until != std::chrono::system_clock::time_point{} &&
        !released_by_this_attempt(row))
      add_history(row, detail::history::taken_over, detail::history::lease_expired, now);
  }

  static bool reason_or_cause_is(const Record& row, std::string_view text) {
    return row.reason == text || cause_of(row.reason) == text;
  }

  // `query` as the log keeps its texts (`detail::stored_query`).
  static bool matches(const Record& row, const RowQuery& query) {
    return (!query.status || row.status == *query.status) &&
           (!query.reason || reason_or_cause_is(row, *query.reason)) &&
           (query.label_contains.empty() ||
            row.label.find(query.label_contains) != std::string::npos) &&
           (!query.changed_from || row.updated_at >= *query.changed_from) &&
           (!query.changed_to || row.updated_at < *query.changed_to);
  }

  std::shared_ptr<Shared> shared_;
  std::string gate_;
  // This handle's view of the shared state: the clock and lock of the log, its gate's rows.
  Clock& clock_;
  std::mutex& mutex_;
  std::unordered_map<Key, Record, KeyHash>& rows_;
  std::vector<Mismatch>& mismatches_;
};

static_assert(store<MemoryStore>);
static_assert(monitored_store<MemoryStore>);
static_assert(explaining_store<MemoryStore>);
static_assert(lease_extending_store<MemoryStore>);
static_assert(redrivable_store<MemoryStore>);
static_assert(labelling_store<MemoryStore>);
static_assert(operable_store<MemoryStore>);

}  // namespace idemgate
