#pragma once

#include "concepts.hpp"
#include "detail/durations.hpp"
#include "detail/periodic.hpp"
#include "gate.hpp"
#include "outcome.hpp"

#include <chrono>
#include <cstddef>
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
  /// Time between passes of the background loop: from 1 ms to a day.
  std::chrono::milliseconds interval = std::chrono::minutes(1);
  /// An in-flight row is stranded when its lease has expired and it has not changed for this
  /// long: from 0 (as soon as its lease expired) to a year.
  std::chrono::milliseconds stale_after = std::chrono::minutes(2);
  /// Most rows taken over in one pass: from 1 to `max_batch`.
  std::size_t batch = 100;

  /// Longest `interval`.
  static constexpr std::chrono::days max_interval{1};
  /// Longest `stale_after`.
  static constexpr std::chrono::days max_stale_after{365};
  /// Largest `batch`.
  static constexpr std::size_t max_batch = 10'000;
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
 *   reconciler.start();  // a pass every minute until stop() or destruction
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
                             "It is the pause between passes (default 1 minute).");
    detail::require_in_range("ReconcilerOptions::stale_after", options_.stale_after,
                             milliseconds(0), ReconcilerOptions::max_stale_after,
                             "0 takes a row over as soon as its lease expired (default 2 "
                             "minutes).");
    detail::require_in_range("ReconcilerOptions::batch", options_.batch, std::size_t{1},
                             ReconcilerOptions::max_batch,
                             "It is the most rows taken over per pass (default 100).");
  }

  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;
  ~Reconciler() { stop(); }

  /// One pass: takes over at most `batch` stranded rows and finishes each.
  ReconcileReport run_once() {
    ReconcileReport report;
    const auto stranded =
        gate_.store().take_stale(options_.batch, options_.stale_after, gate_.options().lease);
    report.taken = stranded.size();
    for (const Stranded& row : stranded) {
      try {
        finish(row, report);
      } catch (const std::exception& e) {
        // The row stays in flight under this pass's fence; a later pass takes it again.
        ++report.errors;
        if (report.first_error.empty()) report.first_error = e.what();
      }
    }
    return report;
  }

  /// Starts the background loop: a pass now, then one every `interval`, until `stop()`.
  void start() {
    worker_.start(options_.interval, [this] {
      ReconcileReport report;
      try {
        report = run_once();
      } catch (const std::exception& e) {
        // The store is unreachable: try again next interval.
        ++report.errors;
        report.first_error = e.what();
      }
      std::lock_guard lock(report_mutex_);
      last_ = report;
    });
  }

  /// Stops the background loop and waits for the current pass to end.
  void stop() { worker_.stop(); }

  /// The report of the background loop's latest pass.
  [[nodiscard]] ReconcileReport last_report() const {
    std::lock_guard lock(report_mutex_);
    return last_;
  }

 private:
  void finish(const Stranded& row, ReconcileReport& report) {
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
        ++report.deferred;
        return;
      }
    }
    if constexpr (Downstream::honours_idempotency_key) {
      const auto answer = claim(row.key, request);
      if (answer.transient()) {
        // No message carries this event any more: keep the row in flight for a later pass.
        ++report.deferred;
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

  void park(const Stranded& row, const std::string& reason, ReconcileReport& report) {
    if (gate_.store().escalate(row.key, row.fence, reason) == CommitStatus::lost_lease) {
      ++report.lost;
    } else {
      ++report.escalated;
      gate_.observer().on_reconciled(row.key, Status::escalated);
    }
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
  mutable std::mutex report_mutex_;
  ReconcileReport last_;
  detail::PeriodicWorker worker_;
};

/// Deduces the reconciler's policies from its gate.
template <class Store, class Downstream, class Apply, class Observer>
Reconciler(Gate<Store, Downstream, Apply, Observer>&, ReconcilerOptions = {})
    -> Reconciler<Store, Downstream, Apply, Observer>;

}  // namespace idemgate
