#pragma once

// The Monday, replayed twice: the naive handler of the story (claim, then write, no key) and
// the same consumer behind the gate. Both run against the fake ECT Delta API over real HTTP,
// with the same deliveries, the same four workers and the same two crashes between the slot
// claim and the TMS write.

#include <ect_delta/portbase.hpp>
#include <ect_delta/slot_api.hpp>
#include <ect_delta/terminal_server.hpp>

#include <idemgate/downstream/http.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace replay {

/// What one run did, as the table and `--json` report it.
struct Counts {
  /// Deliveries handled, redeliveries of crashed or unacked messages included.
  std::size_t deliveries = 0;
  /// Containers in the notifications.
  std::size_t containers = 0;
  /// Distinct slots the terminal handed out.
  std::size_t slots_claimed = 0;
  /// Rows in the TMS.
  std::size_t bookings = 0;
  /// Slots beyond one per container: each must be cancelled (or paid).
  std::size_t ghost_slots = 0;
  /// Deliveries the gate stopped before the terminal (duplicate or in flight).
  std::size_t duplicates_blocked = 0;
  /// Events a crash left in flight and the reconciler finished.
  std::size_t reconciled = 0;
  /// Events parked for a human (the terminal cannot take keys).
  std::size_t escalated = 0;
  /// Messages given up on after too many failed deliveries.
  std::size_t dead_lettered = 0;
};

/// The story's cancellation fee per slot: that Monday the team cancelled 71 of the 87
/// appointments and paid the terminal EUR 4,250 in fees for them (about EUR 60 each). The
/// rest of the day's EUR 6,800 was the 16 appointments it could not cancel in time and three
/// missed reefer pick-ups, which no per-slot price captures.
inline constexpr double euro_per_cancelled_slot = 4250.0 / 71.0;

/// What cancelling `ghost_slots` costs at the story's fee, rounded to whole euros.
inline long cancellation_cost_eur(std::size_t ghost_slots) {
  return std::lround(static_cast<double>(ghost_slots) * euro_per_cancelled_slot);
}

/// How a run is set up.
struct Setup {
  /// The deliveries, in order.
  std::vector<ect_delta::Notification> deliveries;
  /// Delivery positions whose worker dies after the slot claim, before the TMS write.
  std::set<std::size_t> crash_at;
  /// Concurrent consumers.
  int workers = 4;
  /// A message delivered this often without an ack is dead-lettered.
  int max_attempts = 6;
};

/// A worker dying: not a `std::exception`, so nothing mistakes it for a handled failure.
struct Crash {};

/// An at-least-once queue: a message comes back until a worker acks it.
class Queue {
 public:
  /// A queue holding `deliveries` (positions into the setup's list).
  explicit Queue(std::size_t deliveries) {
    for (std::size_t i = 0; i < deliveries; ++i) pending_.push_back({i, 0});
  }

  /// Runs `handle(position, attempt)` on `workers` threads until every message is acked or
  /// dead-lettered. `handle` returns true to ack; a `Crash` leaves the message unacked. Any
  /// other exception stops the run and is rethrown here once every worker has stopped.
  void drain(int workers, int max_attempts, const std::function<bool(std::size_t, int)>& handle) {
    std::vector<std::thread> threads;
    std::exception_ptr failure;
    for (int w = 0; w < workers; ++w)
      threads.emplace_back([&] {
        for (;;) {
          Message m;
          {
            std::lock_guard lock(mutex_);
            if (pending_.empty() || failure) return;
            m = pending_.front();
            pending_.pop_front();
          }
          bool acked = false;
          try {
            acked = handle(m.position, m.attempt);
          } catch (const Crash&) {
          } catch (...) {
            std::lock_guard lock(mutex_);
            if (!failure) failure = std::current_exception();
            return;
          }
          deliveries_.fetch_add(1);
          if (acked) continue;
          std::lock_guard lock(mutex_);
          if (++m.attempt >= max_attempts)
            ++dead_;
          else
            // A short visibility timeout: it comes back next, while the lease of a crashed
            // worker still runs (so only the reconciler finishes what the crash left behind).
            pending_.push_front(m);
        }
      });
    for (auto& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);
  }

  /// Deliveries handed to workers.
  [[nodiscard]] std::size_t deliveries() const { return deliveries_.load(); }
  /// Messages given up on.
  [[nodiscard]] std::size_t dead_lettered() const { return dead_; }

 private:
  struct Message {
    std::size_t position = 0;
    int attempt = 0;
  };
  std::mutex mutex_;
  std::deque<Message> pending_;
  std::atomic<std::size_t> deliveries_{0};
  std::size_t dead_ = 0;
};

/// Slots as the consumer saw them come back, per container.
class SlotsSeen {
 public:
  /// Records a slot the terminal answered with.
  void add(const std::string& container, const std::string& slot) {
    std::lock_guard lock(mutex_);
    by_container_[container].insert(slot);
  }
  /// Distinct slots seen.
  [[nodiscard]] std::size_t slots() const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [container, slots] : by_container_) n += slots.size();
    return n;
  }
  /// Slots beyond the first for each container.
  [[nodiscard]] std::size_t ghosts() const {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [container, slots] : by_container_) n += slots.size() - 1;
    return n;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::set<std::string>> by_container_;
};

inline std::size_t containers_in(const std::vector<ect_delta::Notification>& deliveries) {
  std::set<std::string> containers;
  for (const auto& n : deliveries) containers.insert(n.equipment_number);
  return containers.size();
}

/**
 * The story's handler: claim a slot, then write the booking, then ack. No key: the terminal
 * answers every call with a new slot, and a crash before the write makes the redelivery claim
 * again.
 */
inline Counts run_naive(const Setup& setup, const std::string& terminal_url) {
  httplib::Client terminal(terminal_url);
  terminal.set_connection_timeout(std::chrono::seconds(3));
  terminal.set_read_timeout(std::chrono::seconds(10));
  std::mutex client_mutex, tms_mutex;
  std::vector<std::pair<std::string, std::string>> tms;  // (container, slot)
  SlotsSeen seen;
  Queue queue(setup.deliveries.size());
  queue.drain(setup.workers, setup.max_attempts, [&](std::size_t position, int attempt) {
    const auto& n = setup.deliveries[position];
    const ect_delta::SlotRequest request{n.equipment_number, n.preferred_window};
    httplib::Result answer = [&] {
      std::lock_guard lock(client_mutex);
      return terminal.Post("/slots", ect_delta::SlotApi{}.claim_call(request).body,
                           "application/json");
    }();
    if (!answer || answer->status / 100 != 2) return false;
    const auto slot = ect_delta::SlotApi{}.parse_outcome(answer->body);
    if (!slot) return false;
    seen.add(n.equipment_number, *slot);
    if (attempt == 0 && setup.crash_at.count(position)) throw Crash{};
    std::lock_guard lock(tms_mutex);
    tms.emplace_back(n.equipment_number, *slot);
    return true;
  });
  Counts counts;
  counts.deliveries = queue.deliveries();
  counts.containers = containers_in(setup.deliveries);
  counts.slots_claimed = seen.slots();
  counts.bookings = tms.size();
  counts.ghost_slots = seen.ghosts();
  counts.dead_lettered = queue.dead_lettered();
  return counts;
}

/// The terminal behind the gate, with the replay's crash point after the claim.
template <bool HonoursKeys>
class CrashingTerminal {
 public:
  using request_type = ect_delta::SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = HonoursKeys;

  CrashingTerminal(const std::string& url, SlotsSeen& seen) : http_(url), seen_(seen) {}

  /// Makes this thread's next claim die after the terminal answered.
  static void crash_next_claim(bool crash) { crash_next() = crash; }

  idemgate::ClaimResult<std::string> claim(const request_type& r, const idemgate::Key& key) {
    auto answer = http_.claim(r, key);
    if (answer.ok()) seen_.add(r.container, answer.outcome());
    if (std::exchange(crash_next(), false) && answer.ok()) throw Crash{};
    return answer;
  }

  idemgate::LookupResult<std::string> lookup(const idemgate::Key& key) { return http_.lookup(key); }

 private:
  static bool& crash_next() {
    thread_local bool crash = false;
    return crash;
  }

  idemgate::HttpDownstream<ect_delta::SlotApi, HonoursKeys> http_;
  SlotsSeen& seen_;
};

/**
 * The same consumer behind the gate: key from the notification, reservation before the claim,
 * the key sent to the terminal, slot and TMS booking committed together, and a reconciler for
 * what the crashes left in flight.
 *
 * `Store` is the gate's store; `book` is the business write (it must insert one row into
 * `tms_bookings` inside the store's transaction); `count_bookings` reads the TMS afterwards.
 */
template <bool HonoursKeys, class Store, class Book>
Counts run_gated(const Setup& setup, const std::string& terminal_url, Store& store, Book book,
                 const std::function<std::size_t()>& count_bookings) {
  SlotsSeen seen;
  CrashingTerminal<HonoursKeys> terminal(terminal_url, seen);
  const auto lease = std::chrono::milliseconds(500);
  idemgate::Gate gate{"ect.claim_slot", store, terminal, book, {.lease = lease}};
  std::atomic<std::size_t> blocked{0};
  Queue queue(setup.deliveries.size());
  queue.drain(setup.workers, setup.max_attempts, [&](std::size_t position, int attempt) {
    const auto& n = setup.deliveries[position];
    const auto key = idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number);
    CrashingTerminal<HonoursKeys>::crash_next_claim(attempt == 0 && setup.crash_at.count(position));
    const auto result = gate.process(key, {n.equipment_number, n.preferred_window});
    CrashingTerminal<HonoursKeys>::crash_next_claim(false);
    if (result.status() == idemgate::Status::duplicate ||
        result.status() == idemgate::Status::in_flight)
      ++blocked;
    return result.should_ack();
  });

  // What the crashes left in flight: the reconciler looks the slot up under the original key.
  std::this_thread::sleep_for(lease + std::chrono::milliseconds(50));
  idemgate::Reconciler reconciler{gate,
                                  {.interval = std::chrono::seconds(1),
                                   .stale_after = std::chrono::milliseconds(0),
                                   .batch = 100}};
  std::size_t reconciled = 0;
  for (int pass = 0; pass < 20; ++pass) {
    const auto report = reconciler.run_once();
    reconciled += report.found + report.reclaimed;
    if (!report.first_error.empty())
      throw std::runtime_error("the reconciler failed: " + report.first_error);
    if (report.taken == 0) break;
    if (report.deferred > 0) std::this_thread::sleep_for(lease);
  }

  Counts counts;
  counts.deliveries = queue.deliveries();
  counts.containers = containers_in(setup.deliveries);
  counts.slots_claimed = seen.slots();
  counts.bookings = count_bookings();
  counts.ghost_slots = seen.ghosts();
  counts.duplicates_blocked = blocked.load();
  counts.reconciled = reconciled;
  counts.escalated = gate.escalated(setup.deliveries.size()).size();
  counts.dead_lettered = queue.dead_lettered();
  return counts;
}

/// The story's setup: the Monday's 87 deliveries shuffled by `seed`, two of them redeliveries
/// after a crash between claim and write. The two notifications the queue delivers exactly twice
/// crash on their first delivery; the crash is what brings each back, so their second copy is
/// not in the list: the queue redelivers it. 85 listed deliveries plus 2 redeliveries make the
/// Monday's 87, and the naive handler claims 87 slots for 39 containers, as it did that day.
inline Setup monday(unsigned seed) {
  Setup setup;
  setup.deliveries = ect_delta::monday_deliveries(seed);
  std::map<std::string, int> copies;
  for (const auto& n : setup.deliveries) ++copies[n.notification_id];
  std::set<std::string> crashed;
  for (std::size_t i = 0; i < setup.deliveries.size() && crashed.size() < 2; ++i) {
    const auto& id = setup.deliveries[i].notification_id;
    if (copies[id] == 2 && crashed.insert(id).second) setup.crash_at.insert(i);
  }
  // Remove the second copy of each crashed notification (always after the crash position).
  std::set<std::string> seen;
  std::vector<ect_delta::Notification> kept;
  std::set<std::size_t> crash_at;
  for (std::size_t i = 0; i < setup.deliveries.size(); ++i) {
    const auto& n = setup.deliveries[i];
    if (crashed.count(n.notification_id) && !seen.insert(n.notification_id).second) continue;
    if (setup.crash_at.count(i)) crash_at.insert(kept.size());
    kept.push_back(n);
  }
  setup.deliveries = std::move(kept);
  setup.crash_at = std::move(crash_at);
  return setup;
}

}  // namespace replay
