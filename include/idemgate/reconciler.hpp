// SPDX-License-Identifier: MIT
// Reconciler: finishes in-flight work that a crashed or stalled worker left behind.
#pragma once

#include "concepts.hpp"
#include "detail/durations.hpp"
#include "detail/periodic.hpp"
#include "gate.hpp"
#include "outcome.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idemgate {

/// Tuning of a `Reconciler`. Its constructor refuses values outside the ranges below with
/// `std::invalid_argument`.
struct ReconcilerOptions {
  /// Time between passes of the background loop: from 1 ms to a day. With the defaults, a crashed
  /// worker's event is finished at worst about `max(GateOptions::lease, stale_after) + interval`
  /// after its last lease renewal (docs/design.md, "Timing").
  std::chrono::milliseconds interval = std::chrono::seconds(2);
  /// An in-flight row is stranded when its lease has expired and it has not changed for this
  /// long: from 0 (as soon as its lease expired) to a year. Only an expired lease makes a row
  /// stranded, and a live worker's heartbeat never lets its lease expire, so no value takes over
  /// a live worker; what it decides is how long a lease given back after a transient failure (or
  /// by a stopping consumer) is left to the redelivery before the reconciler steps in. The
  /// default equals `GateOptions::lease`'s: never above the lease, it adds nothing to the
  /// recovery of a crashed worker.
  std::chrono::milliseconds stale_after = std::chrono::seconds(10);
  /// Most rows taken over in one pass: from 1 to `max_batch`.
  std::size_t batch = 100;
  /// Attempts an event may take (its first reservation, redeliveries after an expired lease and
  /// reconciler passes together) before the reconciler stops retrying it and escalates it with
  /// the last error: a poison row whose business write always throws, or whose downstream keeps
  /// failing, ends in the manual queue instead of being retaken forever. 0 (the default): the
  /// gate's `GateOptions::max_attempts`, which bounds redeliveries too; otherwise from 1 to
  /// `max_max_attempts`, for this reconciler's passes only.
  std::size_t max_attempts = 0;

  /// Longest `interval`.
  static constexpr std::chrono::days max_interval{1};
  /// Longest `stale_after`.
  static constexpr std::chrono::days max_stale_after{365};
  /// Largest `batch`.
  static constexpr std::size_t max_batch = 10'000;
  /// Largest `max_attempts`.
  static constexpr std::size_t max_max_attempts = 1'000'000;
};

/// What one reconciler pass did.
struct ReconcileReport {
  /// Stranded rows taken over in this pass.
  std::size_t taken = 0;
  /// Finished with the outcome the downstream already held under the original key.
  std::size_t found = 0;
  /// Finished by claiming again under the same key (the downstream had nothing yet).
  std::size_t reclaimed = 0;
  /// Finished with a permanent downstream failure.
  std::size_t failed = 0;
  /// Moved to the manual queue.
  std::size_t escalated = 0;
  /// Left in flight for a later pass (the downstream failed for now).
  std::size_t deferred = 0;
  /// Lost to another worker that took the row over meanwhile.
  std::size_t lost = 0;
  /// Rows whose finishing threw (store down, business write refused); left in flight.
  std::size_t errors = 0;
  /// Rows escalated because they used up `ReconcilerOptions::max_attempts` (poison rows).
  std::size_t given_up = 0;
  /// The first error's message, if any.
  std::string first_error;
};

/**
 * Finishes stranded in-flight work: rows whose worker died between the reservation and the
 * commit.
 *
 * For each stranded row it takes the row over (fence bump), then asks the downstream what it
 * already holds under the original key and commits that with the business write. It claims
 * again, under the same key, only when the downstream holds nothing and honours keys; it never
 * claims anew for a key the downstream already has. A downstream that can neither look up nor
 * honour keys gets the row escalated. Several reconcilers on one store never take the same row.
 *
 * Example:
 *   idemgate::Reconciler reconciler{gate};
 *   reconciler.start();  // a pass every 2 seconds until stop() or destruction
 */
template <store Store, downstream Downstream, class Apply, class Observer = NullObserver>
class Reconciler {
 public:
  /// The gate whose stranded rows this reconciler finishes.
  using gate_type = Gate<Store, Downstream, Apply, Observer>;

  /// A reconciler for `gate`'s store and downstream; throws `std::invalid_argument` when an
  /// option is out of its range.
  explicit Reconciler(gate_type& gate, ReconcilerOptions options = {})
      : gate_(gate), options_(options) {
    using std::chrono::milliseconds;
    detail::require_in_range("ReconcilerOptions::interval", options_.interval, milliseconds(1),
                             ReconcilerOptions::max_interval,
                             "It is the pause between passes (default 2 seconds).");
    detail::require_in_range("ReconcilerOptions::stale_after", options_.stale_after,
                             milliseconds(0), ReconcilerOptions::max_stale_after,
                             "0 takes a row over as soon as its lease expired (default 10 "
                             "seconds, the default lease).");
    detail::require_in_range("ReconcilerOptions::batch", options_.batch, std::size_t{1},
                             ReconcilerOptions::max_batch,
                             "It is the most rows taken over per pass (default 100).");
    detail::require_in_range("ReconcilerOptions::max_attempts", options_.max_attempts,
                             std::size_t{0}, ReconcilerOptions::max_max_attempts,
                             "It is how many attempts an event gets before it is escalated; 0 "
                             "(the default) takes GateOptions::max_attempts.");
  }

  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;
  ~Reconciler() { stop(); }

  /// One pass: takes over at most `batch` stranded rows and finishes each. Its report is added
  /// to `total_report()`.
  ReconcileReport run_once() {
    ReconcileReport report = pass();
    std::lock_guard lock(report_mutex_);
    add(total_, report);
    return report;
  }

  /// Starts the background loop: a pass now, then one every `interval`, until `stop()`.
  void start() {
    stopping_.store(false);
    worker_.start(options_.interval, [this] {
      ReconcileReport report;
      try {
        report = pass();
      } catch (const std::exception& e) {
        // The store is unreachable: try again next interval.
        ++report.errors;
        report.first_error = e.what();
      }
      std::lock_guard lock(report_mutex_);
      last_ = report;
      add(total_, report);
    });
  }

  /// Stops the background loop: the current pass finishes the row in progress, gives the rows it
  /// has not reached back (their leases end at once) and ends; waits for it.
  void stop() {
    stopping_.store(true);
    worker_.stop();
    stopping_.store(false);  // a `run_once` called afterwards is a whole pass again
  }

  /// Asks the background loop to stop as `stop()` does, and returns at once.
  void request_stop() {
    stopping_.store(true);
    worker_.request_stop();
  }

  /// Stops the background loop as `stop()` does, waiting for the row in progress only up to
  /// `deadline`: true when the loop ended, false when that row still runs then (its downstream
  /// is slow). The row then finishes on its own, fenced: once its lease was given back (the
  /// gate's `stop` does that), its commit cannot land over a takeover. `stop()` or the
  /// destructor waits for it.
  bool stop_until(std::chrono::steady_clock::time_point deadline) {
    stopping_.store(true);
    if (!worker_.stop_until(deadline)) return false;
    stopping_.store(false);
    return true;
  }

  /// The report of the background loop's latest pass (zeros after a pass that found nothing).
  [[nodiscard]] ReconcileReport last_report() const {
    std::lock_guard lock(report_mutex_);
    return last_;
  }

  /// Every pass since construction added up, the background loop's and `run_once()`'s alike;
  /// `first_error` is the first error of them all. An idle pass leaves it as it was.
  [[nodiscard]] ReconcileReport total_report() const {
    std::lock_guard lock(report_mutex_);
    return total_;
  }

 private:
  static void add(ReconcileReport& total, const ReconcileReport& pass) {
    total.taken += pass.taken;
    total.found += pass.found;
    total.reclaimed += pass.reclaimed;
    total.failed += pass.failed;
    total.escalated += pass.escalated;
    total.deferred += pass.deferred;
    total.lost += pass.lost;
    total.errors += pass.errors;
    total.given_up += pass.given_up;
    if (total.first_error.empty()) total.first_error = pass.first_error;
  }

  ReconcileReport pass() {
    ReconcileReport report;
    const auto stranded =
        gate_.store().take_stale(options_.batch, options_.stale_after, gate_.options().lease);
    report.taken = stranded.size();
    // The rows are finished one after another: their leases are kept alive meanwhile, so a long
    // pass does not lose the rows it has not reached yet.
    std::vector<HeldLease> held;
    held.reserve(stranded.size());
    for (const Stranded& row : stranded) held.push_back({row.key, row.fence});
    detail::LeaseKeeper<Store> keeper(gate_.store(), gate_.options().lease);
    keeper.hold(held);
    // The gate's heartbeat also keeps each row alive while its downstream is asked, however long
    // that takes.
    std::vector<std::uint64_t> tickets;
    tickets.reserve(held.size());
    for (const HeldLease& h : held) tickets.push_back(gate_.heartbeat().hold(h.key, h.fence));
    struct Untickets {
      detail::Heartbeat<Store>& heartbeat;
      std::vector<std::uint64_t>& tickets;
      ~Untickets() {
        for (std::uint64_t t : tickets)
          if (t != 0) (void)heartbeat.drop(t);
      }
    } untickets{gate_.heartbeat(), tickets};
    for (std::size_t i = 0; i < stranded.size(); ++i) {
      const Stranded& row = stranded[i];
      try {
        if (stopping_.load()) {
          // Stopping: the rows not reached yet go back at once, for the next pass elsewhere.
          gate_.release_lease(row.key, row.fence,
                              "the reconciler stopped before finishing this row");
          ++report.deferred;
          continue;
        }
        keeper.keep_alive();
        keeper.drop(row.key);  // from here on, finishing it decides (and may give it back)
        finish(row, report);
      } catch (const std::exception& e) {
        // The row stays in flight under this pass's fence; a later pass takes it again.
        ++report.errors;
        if (report.first_error.empty()) report.first_error = e.what();
      }
      if (tickets[i] != 0) (void)gate_.heartbeat().drop(std::exchange(tickets[i], 0));
    }
    return report;
  }

  void finish(const Stranded& row, ReconcileReport& report) {
    const bool own = options_.max_attempts > 0;
    const std::size_t allowed = own ? options_.max_attempts : gate_.options().max_attempts;
    if (row.attempts > static_cast<std::int64_t>(allowed)) {
      const std::string reason = detail::gave_up_reason(
          row.attempts - 1, allowed,
          own ? "ReconcilerOptions::max_attempts" : "GateOptions::max_attempts", row.last_error);
      if (park(row, reason, report)) ++report.given_up;
      return;
    }
    std::optional<typename gate_type::request_type> decoded;
    try {
      decoded.emplace(gate_.decode_request(row.request));
    } catch (const std::exception& e) {
      park(row, std::string("the stored request does not decode: ") + e.what(), report);
      return;
    }
    const auto& request = *decoded;
    if constexpr (lookup_downstream<Downstream>) {
      const LookupResult<typename gate_type::outcome_type> held = look_up(row.key);
      if (held.found()) {
        count(row.key, gate_.commit(row.key, row.fence, request, held.outcome()).status(), report,
              report.found);
        return;
      }
      if (held.transient()) {
        if constexpr (!Downstream::honours_idempotency_key) {
          defer(row, "the lookup failed: " + std::string(held.reason()), report);
          return;
        }
        // The lookup keeps failing (a wrong lookup URL, a credential it refuses): a claim under
        // the same key is just as safe, since the downstream returns its original outcome for a
        // key it has seen.
      }
    }
    if constexpr (Downstream::honours_idempotency_key) {
      const auto answer = claim(row.key, request);
      if (answer.transient()) {
        // No message carries this event any more: keep the row in flight for a later pass.
        defer(row, std::string(answer.reason()), report);
        return;
      }
      count(row.key, gate_.finish(row.key, row.fence, request, answer).status(), report,
            report.reclaimed);
    } else {
      park(row,
           "stranded in flight and the downstream neither honours Idempotency-Key nor can look "
           "up by key; check the downstream by hand before resolving",
           report);
    }
  }

  LookupResult<typename gate_type::outcome_type> look_up(const Key& key) {
    try {
      return gate_.downstream().lookup(key);
    } catch (const std::exception& e) {
      return TransientFailure{std::string("the lookup threw: ") + e.what()};
    }
  }

  ClaimResult<typename gate_type::outcome_type> claim(const Key& key,
                                                      const typename gate_type::request_type& r) {
    try {
      return gate_.downstream().claim(r, key);
    } catch (const std::exception& e) {
      return TransientFailure{std::string("the downstream threw: ") + e.what()};
    }
  }

  // Ends this pass's lease at once, keeping why: a later pass takes the row again (counting an
  // attempt) after `stale_after`, and shows the reason if it gives up.
  void defer(const Stranded& row, const std::string& reason, ReconcileReport& report) {
    gate_.release_lease(row.key, row.fence, reason);
    ++report.deferred;
  }

  bool park(const Stranded& row, const std::string& reason, ReconcileReport& report) {
    if (gate_.store().escalate(row.key, row.fence, reason) == CommitStatus::lost_lease) {
      ++report.lost;
      return false;
    }
    ++report.escalated;
    gate_.observer().on_reconciled(row.key, Status::escalated);
    return true;
  }

  void count(const Key& key, Status status, ReconcileReport& report, std::size_t& finished) {
    if (status == Status::processed || status == Status::failed)
      gate_.observer().on_reconciled(key, status);
    switch (status) {
      case Status::processed:
        ++finished;
        break;
      case Status::failed:
        ++report.failed;
        break;
      case Status::lost_lease:
        ++report.lost;
        break;
      default:
        ++report.deferred;
        break;
    }
  }

  gate_type& gate_;
  ReconcilerOptions options_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex report_mutex_;
  ReconcileReport last_;
  ReconcileReport total_;
  detail::PeriodicWorker worker_;
};

/// Deduces the reconciler's policies from its gate.
template <class Store, class Downstream, class Apply, class Observer>
Reconciler(Gate<Store, Downstream, Apply, Observer>&, ReconcilerOptions = {})
    -> Reconciler<Store, Downstream, Apply, Observer>;

}  // namespace idemgate
