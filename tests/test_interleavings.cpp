// Seeded randomized interleavings of several workers and reconcilers running at once against one
// store (MemoryStore, SqliteStore, PostgresStore).
//
// Every actor is a real thread running the real gate or reconciler; the store and the downstream
// are wrapped (tests/support/pausing_store.hpp) so that each actor is held at every step: the
// reservation, the downstream call and its answer, the commit and the inside of its business
// write, a release, a lease extension, a reconciler pass's take-over. A turnstile
// (tests/support/turnstile.hpp) lets exactly one held actor go on at a time, chosen by the seeded
// generator, so a seed replays the same interleaving. Between steps the schedule also expires
// every lease through the store's own clock (a manual clock for MemoryStore and SqliteStore; for
// PostgreSQL, whose leases are measured by the server's now(), an UPDATE that moves lease_until
// into the past: its form of clock control), and the queue redelivers what held workers carry.
// So a held worker resumes after its lease was taken over, by a redelivery on another worker or
// by a reconciler, and tries to commit.
//
// Faults: crashes at any held step (the actor writes nothing more until its next delivery),
// events delivered at least once and out of order, batches, 503s and lost answers from the
// downstream, poison events whose business write always throws, and on MemoryStore and
// PostgreSQL lost store replies and writes lost in a database crash.
//
// The same schedules run again with group commit on (GateOptions::coalesce, with and without a
// window): a call may then wait on the group another actor leads, at no hold of its own, and its
// reservation, commit and business write run on that actor's thread, held, crashed or answered
// with a lost reply there. The turnstile counts such calls as settled (Gate::coalescing().waiting)
// and the oldest waiting call leads the next group, so a seed still replays exactly.
//
// Each schedule ends with final reconciler passes and the invariants, among them that no stale
// worker's commit ever lands: an event's business row was written under the fence its committed
// row holds. A failure prints its seed; IDEMGATE_SCHEDULE_SEED=<seed> replays that schedule
// (IDEMGATE_SCHEDULE_TRACE=1 prints its every decision), and IDEMGATE_SCHEDULE_KEEP_GOING=1 runs
// every seed and counts the broken ones; IDEMGATE_SCHEDULE_COUNT=<n> runs n seeds per store.

#include "support/fake_terminal.hpp"
#include "support/pausing_store.hpp"
#include "support/pg_fault_proxy.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"
#include "support/turnstile.hpp"
#if IDEMGATE_TEST_SQLITE
#include "support/sqlite_files.hpp"
#endif

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/testing/clocks.hpp>

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using idemgate::Key;
using idemgate::Record;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::PausePoint;
using idemgate::test::PausingDownstream;
using idemgate::test::PausingStore;
using idemgate::test::SimulatedCrash;
using idemgate::test::SlotRequest;
using idemgate::test::Step;
using idemgate::test::Turnstile;
using namespace std::chrono_literals;

namespace {

// The decorator takes the same code paths in the gate and the reconciler as the bare stores.
template <class S>
constexpr bool same_paths =
    idemgate::explaining_store<PausingStore<S>> ==
    idemgate::explaining_store<S>&& idemgate::lease_extending_store<PausingStore<S>> ==
    idemgate::lease_extending_store<S>&& idemgate::redrivable_store<PausingStore<S>> ==
    idemgate::redrivable_store<S>&& idemgate::monitored_store<PausingStore<S>> ==
    idemgate::monitored_store<S>&& requires(PausingStore<S>& s,
                                            std::span<const idemgate::ReserveItem> r,
                                            std::span<const idemgate::CommitItem> c) {
  s.reserve_batch(r, 1ms);
  s.commit_batch(c, [](typename S::transaction&, std::size_t) {});
}
== requires(S& s, std::span<const idemgate::ReserveItem> r,
            std::span<const idemgate::CommitItem> c) {
  s.reserve_batch(r, 1ms);
  s.commit_batch(c, [](typename S::transaction&, std::size_t) {});
};
static_assert(idemgate::store<PausingStore<idemgate::MemoryStore>> &&
              same_paths<idemgate::MemoryStore> &&
              idemgate::lease_extending_store<PausingStore<idemgate::MemoryStore>>);
static_assert(idemgate::store<PausingStore<idemgate::PostgresStore>> &&
              same_paths<idemgate::PostgresStore>);
#if IDEMGATE_TEST_SQLITE
static_assert(idemgate::store<PausingStore<idemgate::SqliteStore>> &&
              same_paths<idemgate::SqliteStore>);
#endif

// Group commit takes the same path through the decorator: it forwards `commit_each` exactly where
// the store has it.
template <class S>
constexpr bool same_group_commit = requires(PausingStore<S>& s,
                                            std::span<const idemgate::CommitItem> c) {
  s.commit_each(c, [](typename S::transaction&, std::size_t) {});
}
== requires(S& s, std::span<const idemgate::CommitItem> c) {
  s.commit_each(c, [](typename S::transaction&, std::size_t) {});
};
static_assert(same_group_commit<idemgate::MemoryStore> &&
              same_group_commit<idemgate::PostgresStore>);
#if IDEMGATE_TEST_SQLITE
static_assert(same_group_commit<idemgate::SqliteStore>);
#endif

/// A business row: the slot booked and the fence of the commit that wrote it.
struct Booking {
  std::string slot;
  std::int64_t fence = 0;
};

/// What the schedules of one store reached, summed: proof that they exercised what they claim.
struct Tally {
  int schedules = 0;
  long steps = 0;
  /// Commits let go under a fence that had been taken over meanwhile.
  int stale_commits = 0;
  /// Business writes held while their fence was taken over.
  int stale_business_writes = 0;
  /// Of those, taken over by a redelivery on another worker, and by a reconciler pass.
  int taken_by_redelivery = 0;
  int taken_by_reconciler = 0;
  /// Events other than the poison one that used up their attempts.
  int given_up = 0;
  int lost_leases = 0;
  int extends = 0;
  int crashes = 0;
  int expiries = 0;
  int batches = 0;
  /// With group commit: groups run, and calls that ran in another call's group (a group of n
  /// carries n - 1 of them), of reservations and of commits.
  std::size_t groups = 0;
  std::size_t grouped_reservations = 0;
  std::size_t grouped_commits = 0;
  int bulk_commits = 0;
  /// Every decision of every schedule, hashed: equal across runs when the seeds replay exactly.
  std::uint64_t trace = 14695981039346656037ull;
  void note(const std::string& decision) {
    for (char c : decision) trace = (trace ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
};

// The gate of every schedule: its workers and reconcilers are replicas of one service.
constexpr const char* gate_name = "ect.claim_slot";

/// Sizes and odds of a schedule.
constexpr int step_budget = 6000;
constexpr int crash_percent = 3;
constexpr int expire_percent = 4;

/// One schedule over the environment `Env` (a store with its clock control and business table).
/// With `Bulk`, the gate's business write is a bulk one: a batch's commit calls it once with
/// every event it commits, every other commit with one.
template <class Env, bool Bulk = false>
class Schedule {
 public:
  using Inner = typename Env::Store;
  using Store = PausingStore<Inner>;
  using Downstream = PausingDownstream<FakeTerminal<>>;
  using Events = std::span<const idemgate::CommittedEvent<SlotRequest, std::string>>;
  using Write = std::conditional_t<Bulk, std::function<void(typename Inner::transaction&, Events)>,
                                   std::function<void(typename Inner::transaction&, const Key&,
                                                      const SlotRequest&, const std::string&)>>;
  using GateType = idemgate::Gate<Store, Downstream, Write>;
  using ReconcilerType = idemgate::Reconciler<Store, Downstream, Write>;

  Schedule(Env& env, unsigned seed, Tally& tally, idemgate::Coalescing coalesce = {})
      : env_(env),
        seed_(seed),
        rng_(seed),
        tally_(tally),
        store_(
            env.store().for_gate(gate_name), [this](const PausePoint& at) { step(at); },
            Env::pauses_inside_business_write,
            [this](const Key& key, std::int64_t fence) { leased(key, fence); }),
        downstream_(terminal_, [this](const PausePoint& at) { step(at); }),
        gate_(gate_name, store_, downstream_, make_write(),
              // No heartbeat: it would renew leases on a thread of its own, outside the
              // schedule, and a seed would no longer replay its interleaving. The lease keeper
              // of batches and passes still renews on the actors' threads, held at each step.
              {.lease = env.lease(),
               .heartbeat = false,
               .coalesce = coalesce,
               .max_attempts = options().max_attempts}),
        coalescing_(coalesce.enabled) {
    events_ = 2 + static_cast<int>(rng_() % 5);
    poison_ = chance(33) ? static_cast<int>(rng_() % static_cast<unsigned>(events_)) : -1;
    for (int e = 0; e < events_; ++e) {
      const SlotRequest r{"C" + std::to_string(seed) + "-" + std::to_string(e), "w"};
      all_.emplace_back(idemgate::derive_key("schedule", r.container), r);
      const int copies = 1 + static_cast<int>(rng_() % 3);
      for (int c = 0; c < copies; ++c) queue_.push_back(e);
    }
    std::shuffle(queue_.begin(), queue_.end(), rng_);
    terminal_.before = [this](const SlotRequest&, const Key& key) { return before_claim(key); };
    terminal_.after = [this](const Key& key, const std::string&) { return after_claim(key); };
  }

  /// Runs the schedule; returns the first broken invariant, or nothing.
  std::optional<std::string> run() {
    ++tally_.schedules;
    // With group commit, one more worker: more calls to group.
    const int workers = 2 + static_cast<int>(rng_() % 2) + (coalescing_ ? 1 : 0);
    const int reconcilers = 1 + static_cast<int>(rng_() % 2);
    std::deque<ReconcilerType> passes;
    actors_.resize(static_cast<std::size_t>(workers + reconcilers));
    pausing_ = true;
    for (int w = 0; w < workers; ++w) {
      actors_[static_cast<std::size_t>(w)].worker = true;
      turnstile_.spawn([this, w] { work(actors_[static_cast<std::size_t>(w)]); });
    }
    for (int r = 0; r < reconcilers; ++r) {
      auto& reconciler = passes.emplace_back(gate_, options());
      auto& actor = actors_[static_cast<std::size_t>(workers + r)];
      turnstile_.spawn([this, &reconciler, &actor] { reconcile(reconciler, actor); });
    }
    schedule();
    turnstile_.stop();
    pausing_ = false;
    const idemgate::CoalescingStats groups = gate_.coalescing();
    tally_.groups += groups.reservation_groups + groups.commit_groups;
    tally_.grouped_reservations += groups.reservations - groups.reservation_groups;
    tally_.grouped_commits += groups.commits - groups.commit_groups;
    tally_.bulk_commits += store_.bulk_commits();
    // The final passes run even after a broken invariant, so that a store shared with the next
    // schedule holds nothing of this one in flight.
    const auto broken = finish();
    if (violation_) return violation_;
    return broken;
  }

 private:
  /// Where an actor is and what it carries, as the schedule sees it.
  struct Actor {
    bool worker = false;
    /// The events of the delivery in hand.
    std::vector<int> carrying;
    /// Its business write crashes the worker (after writing its row).
    bool crash_in_business_write = false;
    /// A database crash loses this delivery's reservation before the downstream is called.
    bool lose_write = false;
    /// The row as this delivery's reservation found it.
    std::optional<Record> before;
    bool captured = false;
  };

  /// Whether a database crash can lose the store's latest write (MemoryStore, PostgreSQL).
  static constexpr bool can_restore =
      requires(Env & e, const Key& key, const std::optional<Record>& row) {
    e.restore(key, row);
  };

  /// Whether the store reserves a group in one statement (`reserve_batch`).
  static constexpr bool reserves_at_once =
      requires(Inner & s, std::span<const idemgate::ReserveItem> items) {
    s.reserve_batch(items, 1ms);
  };

  static idemgate::ReconcilerOptions options() {
    return {.interval = 1min, .stale_after = 0ms, .batch = 50, .max_attempts = 12};
  }

  bool chance(int percent) { return static_cast<int>(rng_() % 100) < percent; }

  void violate(std::string what) {
    if (!violation_) violation_ = std::move(what);
  }

  std::string blamed() const {
    return "the store blamed the business write " + std::to_string(store_.business_write_errors()) +
           " time(s), which never breaks its transaction: " + store_.first_blame();
  }

  // The scheduling thread: lets one held actor go on at a time until the deliveries drain.
  void schedule() {
    for (int steps = 0;; ++steps) {
      // With group commit, a call may wait on the group another actor leads, at no hold.
      const auto held = coalescing_
                            ? turnstile_.settle(std::chrono::seconds(120),
                                                [this] { return gate_.coalescing().waiting; })
                            : turnstile_.settle();
      if (violation_ || store_.business_write_errors() > 0) return;
      bool busy = false;
      std::vector<const Turnstile::Held*> eligible;
      for (const Turnstile::Held& h : held) {
        if (h.at == "take") {
          if (!queue_.empty()) eligible.push_back(&h);
        } else if (h.at == "pass") {
          if (chance(30)) eligible.push_back(&h);
        } else if (h.at == "done") {
          busy = true;  // it still carries its messages
          eligible.push_back(&h);
        } else {
          busy = true;
          eligible.push_back(&h);
        }
      }
      if (!busy && queue_.empty()) return;
      ++tally_.steps;
      if (steps >= step_budget) {
        violate("deliveries did not drain in " + std::to_string(step_budget) + " steps");
        return;
      }
      if (chance(expire_percent)) {
        decided(steps, "every lease expires");
        expire(held);
        continue;
      }
      if (eligible.empty()) continue;
      if (coalescing_ && chance(50)) {
        // With group commit, an actor held before its reservation or commit (a group's leader)
        // often waits while others go on: calls that arrive meanwhile join the next group.
        std::vector<const Turnstile::Held*> others;
        for (const Turnstile::Held* h : eligible)
          if (h->at != to_string(Step::reserve) && h->at != to_string(Step::commit))
            others.push_back(h);
        if (!others.empty()) eligible = std::move(others);
      }
      const Turnstile::Held& pick = *eligible[rng_() % eligible.size()];
      const bool crash =
          pick.at != "take" && pick.at != "pass" && pick.at != "done" && chance(crash_percent);
      if (crash) ++tally_.crashes;
      decided(steps, (crash ? "crash actor " : "let go actor ") + std::to_string(pick.actor) +
                         " at " + pick.at);
      turnstile_.let_go(pick.actor, crash);
    }
  }

  // Keeps a decision in the tally's trace; prints it when IDEMGATE_SCHEDULE_TRACE is set.
  void decided(int step, const std::string& decision) {
    tally_.note(decision);
    if (trace_)
      std::cerr << "seed " << seed_ << " step " << step << ": " << decision << " (queue "
                << queue_.size() << ")\n";
  }

  // Every lease runs out, and the queue's visibility timeout with it: a message a held worker
  // carries may come back to another worker.
  void expire(const std::vector<Turnstile::Held>& held) {
    env_.expire_leases();
    ++tally_.expiries;
    for (const Turnstile::Held& h : held) {
      const Actor& actor = actors_[static_cast<std::size_t>(h.actor)];
      if (!actor.worker || h.at == "take" || h.at == "done") continue;
      for (int e : actor.carrying)
        if (chance(50)) queue_.push_back(e);
    }
  }

  // Every step of the gate and the reconciler: held until the schedule lets it go on.
  void step(const PausePoint& at) {
    if (!pausing_ || me_ == nullptr) {
      if (at.step == Step::take_stale) order_stale();
      return;
    }
    turnstile_.hold(to_string(at.step));
    switch (at.step) {
      case Step::take_stale:
        order_stale();
        break;
      case Step::reserve:
        // Only a reservation of this actor's own event (with group commit, a leader reserves the
        // events of its group one by one on a store without batch statements).
        if (me_->lose_write && at.key != nullptr && me_->carrying.size() == 1 &&
            *at.key == all_[static_cast<std::size_t>(me_->carrying[0])].first) {
          me_->before = store_.find(*at.key);
          me_->captured = true;
        }
        break;
      case Step::commit:
      case Step::business_write:
        if (at.key != nullptr) {
          const auto row = store_.find(*at.key);
          if (row && row->fence > at.fence) {
            // Held while its lease was taken over: by whom?
            ++(at.step == Step::commit ? tally_.stale_commits : tally_.stale_business_writes);
            const auto taker = takers_.find({*at.key, row->fence});
            if (taker != takers_.end())
              ++(taker->second ? tally_.taken_by_redelivery : tally_.taken_by_reconciler);
          }
        }
        break;
      case Step::extend:
        ++tally_.extends;
        break;
      default:
        break;
    }
  }

  // Who was granted `fence` of `key`: a worker (true) or a reconciler.
  void leased(const Key& key, std::int64_t fence) {
    if (pausing_ && me_ != nullptr) takers_[{key, fence}] = me_->worker;
  }

  std::optional<idemgate::ClaimResult<std::string>> before_claim(const Key& key) {
    if constexpr (can_restore) {
      if (me_ != nullptr && std::exchange(me_->lose_write, false) && me_->captured) {
        // Only while this delivery's reservation is still the row's latest write.
        const auto row = store_.find(key);
        const std::int64_t mine = me_->before ? me_->before->fence + 1 : 1;
        if (row && row->status == RecordStatus::in_flight && row->fence == mine)
          env_.restore(key, me_->before);
      }
    }
    if (chance(10)) return idemgate::TransientFailure{"503"};
    return std::nullopt;
  }

  std::optional<idemgate::ClaimResult<std::string>> after_claim(const Key& key) {
    step({Step::claimed, &key});
    if (chance(10)) return idemgate::TransientFailure{"answer lost"};
    return std::nullopt;
  }

  Write make_write() {
    if constexpr (Bulk) {
      // Each event's row is written under the fence its commit presents (the ledger's
      // `committing`, set for every item of the store's commit).
      return [this](typename Inner::transaction& tx, Events events) {
        for (const auto& event : events)
          business_write(tx, event.key, event.request, event.outcome,
                         idemgate::test::thread_ledger().committing.at(event.key));
      };
    } else {
      return [this](typename Inner::transaction& tx, const Key& key, const SlotRequest& r,
                    const std::string& slot) {
        business_write(tx, key, r, slot, idemgate::test::thread_ledger().business_fence);
      };
    }
  }

  void business_write(typename Inner::transaction& tx, const Key& key, const SlotRequest& r,
                      const std::string& slot, std::int64_t fence) {
    env_.book(tx, key, slot, fence);
    if (me_ != nullptr && std::exchange(me_->crash_in_business_write, false)) {
      turnstile_.kill();
      throw SimulatedCrash{};
    }
    if (poison_ >= 0 && r == all_[static_cast<std::size_t>(poison_)].second)
      throw std::runtime_error("poison: the business write always fails");
  }

  void order_stale() {
    if constexpr (requires(Env & e) { e.order_stale(); }) env_.order_stale();
  }

  void lose_reply_of_write(int n) {
    if constexpr (requires(Env & e) { e.lose_reply_of_write(store_, 1); })
      env_.lose_reply_of_write(store_, n);
  }

  // A worker: takes a message (or a batch of them) from the queue, processes it, acks it or
  // leaves it to come back.
  void work(Actor& actor) {
    me_ = &actor;
    for (;;) {
      turnstile_.revive();
      actor.carrying.clear();
      turnstile_.hold("take");
      if (queue_.empty()) continue;
      std::size_t n = 1;
      if (queue_.size() > 1 && chance(20)) n = std::min<std::size_t>(queue_.size(), 2 + rng_() % 2);
      for (std::size_t i = 0; i < n; ++i) {
        actor.carrying.push_back(queue_.front());
        queue_.pop_front();
      }
      actor.crash_in_business_write = chance(5);
      if (chance(10)) lose_reply_of_write(1 + static_cast<int>(rng_() % 6));
      if (n == 1)
        deliver(actor, actor.carrying[0]);
      else
        deliver_batch(actor);
      actor.crash_in_business_write = false;
      actor.lose_write = false;
      actor.captured = false;
      if (chance(10)) queue_.push_back(static_cast<int>(rng_() % static_cast<unsigned>(events_)));
    }
  }

  void deliver(Actor& actor, int e) {
    const auto& [key, request] = all_[static_cast<std::size_t>(e)];
    if constexpr (can_restore) actor.lose_write = chance(6);
    bool acked = false;
    bool failed = false;
    bool poisoned = false;
    try {
      const auto result = gate_.process(key, request);
      // With group commit on a store without batch reservations, the leader reserves its group
      // one by one, held at each: the answer of an earlier one waits for the later ones.
      check(key, request, result, !coalescing_ || reserves_at_once);
      turnstile_.hold("ack");
      acked = result.should_ack();
    } catch (const SimulatedCrash&) {
      failed = true;
    } catch (const idemgate::StoreError&) {
      // A lost reply, a lost write or a blamed business write (checked by the scheduler).
      failed = true;
    } catch (const std::runtime_error&) {
      // The poison business write: after three deliveries the queue dead-letters the message.
      failed = true;
      poisoned = e == poison_;
    }
    if (failed) wait_turn_after_failure();
    if (poisoned && ++poison_deliveries_ >= 3) acked = true;
    if (!acked) requeue(e);
  }

  void deliver_batch(Actor& actor) {
    ++tally_.batches;
    std::vector<idemgate::BatchMessage<SlotRequest>> messages;
    for (std::size_t i = 0; i < actor.carrying.size(); ++i) {
      const auto& [key, request] = all_[static_cast<std::size_t>(actor.carrying[i])];
      messages.push_back({"m" + std::to_string(i), key, request});
    }
    std::vector<bool> acked(messages.size(), false);
    try {
      const auto result = gate_.process_batch(messages);
      const auto& items = result.items();
      for (std::size_t i = 0; i < items.size(); ++i)
        check(messages[i].key, messages[i].request, items[i].result, false);
      turnstile_.hold("ack");
      for (std::size_t i = 0; i < items.size(); ++i) {
        acked[i] = items[i].result.should_ack();
        if (!acked[i] && actor.carrying[i] == poison_ &&
            items[i].result.reason().find("poison") != std::string::npos &&
            ++poison_deliveries_ >= 3)
          acked[i] = true;
      }
    } catch (const SimulatedCrash&) {
      wait_turn_after_failure();
    } catch (const idemgate::StoreError&) {
      wait_turn_after_failure();
    }
    for (std::size_t i = 0; i < messages.size(); ++i)
      if (!acked[i]) requeue(actor.carrying[i]);
  }

  // With group commit, what a group threw reaches every call in it at once, and they all run on
  // until their next hold: a failed call waits for its turn before it touches the queue (as a
  // crashed one: a restarted process). Without group commit, only one actor ever runs.
  void wait_turn_after_failure() {
    if (!coalescing_) return;
    turnstile_.revive();
    turnstile_.hold("done");
  }

  void requeue(int e) {
    queue_.insert(queue_.begin() + static_cast<long>(rng_() % (queue_.size() + 1)), e);
  }

  // What a delivery's answer says must hold at once, before anything else runs. `fresh`: nothing
  // ran since the reservation that answered it (a single delivery; a batch works on after it).
  // With group commit, the other calls of this call's group run on meanwhile, up to their next
  // hold; they write nothing before it.
  void check(const Key& key, const SlotRequest& request,
             const idemgate::Result<std::string>& result, bool fresh) {
    const std::lock_guard lock(checking_);
    const auto row = store_.find(key);
    const std::string event = request.container;
    switch (result.status()) {
      case Status::conflict:
        violate("conflict for an unchanged request of " + event);
        break;
      case Status::processed: {
        // With group commit, the commit ran on the thread of its group's leader: the fence the
        // store answered `committed` under.
        const std::int64_t fence = coalescing_ ? store_.committed_fence(key)
                                               : idemgate::test::thread_ledger().committing[key];
        if (!row || row->status != RecordStatus::committed)
          violate("processed " + event + " whose row is not committed");
        else if (row->fence != fence)
          violate("a stale commit landed: " + event + " was committed by a worker under fence " +
                  std::to_string(fence) + " while the row's fence is " +
                  std::to_string(row->fence));
        break;
      }
      case Status::duplicate:
        if (!row || row->status != RecordStatus::committed)
          violate("duplicate answered for " + event + " whose row is not committed");
        break;
      case Status::in_flight:
        if (fresh &&
            (!row || row->status != RecordStatus::in_flight || row->lease_until < env_.now()))
          violate("in_flight acked for " + event + " that nobody holds");
        break;
      case Status::lost_lease:
        ++tally_.lost_leases;
        break;
      default:
        break;
    }
  }

  // A reconciler: one pass whenever the schedule lets it.
  void reconcile(ReconcilerType& reconciler, Actor& actor) {
    me_ = &actor;
    for (;;) {
      turnstile_.revive();
      turnstile_.hold("pass");
      try {
        (void)reconciler.run_once();
      } catch (const SimulatedCrash&) {
      } catch (const idemgate::StoreError&) {
        // A lost reply of the pass's take-over: its rows come back once their leases expire.
      }
    }
  }

  // The final passes, then every invariant.
  std::optional<std::string> finish() {
    lose_reply_of_write(0);
    ReconcilerType reconciler{gate_, options()};
    for (int pass = 0; pass < 40; ++pass) {
      env_.expire_leases();
      if (reconciler.run_once().taken == 0) break;
    }
    if (store_.business_write_errors() > 0) return blamed();
    terminal_.lookup_down = false;
    std::map<std::string, Key> key_of_container;
    for (const auto& [key, request] : all_) key_of_container.emplace(request.container, key);
    for (const auto& claim : terminal_.received())
      if (key_of_container.at(claim.container) != claim.key)
        return "a claim for " + claim.container + " went out under another event's key";
    for (int e = 0; e < events_; ++e) {
      const auto& [key, request] = all_[static_cast<std::size_t>(e)];
      const auto row = store_.find(key);
      const std::string event = request.container;
      if (!row) return "event " + event + " has no row";
      const auto booked = env_.bookings_for(key);
      if (row->status == RecordStatus::escalated &&
          row->reason.find("gave up after") != std::string::npos) {
        // Attempts used up (the poison event, or one that crashed too often): for a human, and
        // nothing of it was booked.
        if (!booked.empty()) return "escalated event " + event + " was booked";
        if (row->attempts <= static_cast<std::int64_t>(options().max_attempts))
          return "event " + event + " was given up after only " + std::to_string(row->attempts) +
                 " attempts";
        if (e != poison_) ++tally_.given_up;
        continue;
      }
      if (e == poison_) return "the poison event ended " + std::string(to_string(row->status));
      if (row->status != RecordStatus::committed)
        return "event " + event + " ended " + std::string(to_string(row->status)) + " (" +
               row->reason + ")";
      if (booked.size() != 1)
        return "event " + event + " has " + std::to_string(booked.size()) + " business rows";
      if (booked[0].slot != *row->result) return "event " + event + " booked another slot";
      const auto held = terminal_.lookup(key);
      if (!held.found() || held.outcome() != booked[0].slot)
        return "event " + event + " booked a slot the terminal does not hold under its key";
      if (booked[0].fence != row->fence)
        return "a stale commit landed: the business row of " + event + " was written under fence " +
               std::to_string(booked[0].fence) + ", the committed row holds fence " +
               std::to_string(row->fence);
      if (terminal_.slots_for(event) > 1)
        return "event " + event + " got " + std::to_string(terminal_.slots_for(event)) +
               " slots from a downstream that honours keys";
    }
    // Every event is accounted for: committed and booked once, or (the poison event, or one that
    // crashed more often than max_attempts allows) escalated for a human with nothing booked.
    return std::nullopt;
  }

  static inline thread_local Actor* me_ = nullptr;

  Env& env_;
  unsigned seed_;
  std::mt19937 rng_;
  Tally& tally_;
  FakeTerminal<> terminal_;
  Store store_;
  Downstream downstream_;
  GateType gate_;
  Turnstile turnstile_;
  std::deque<Actor> actors_;
  bool pausing_ = false;
  int events_ = 0;
  int poison_ = -1;
  int poison_deliveries_ = 0;
  std::vector<std::pair<Key, SlotRequest>> all_;
  std::deque<int> queue_;
  std::optional<std::string> violation_;
  std::map<std::pair<Key, std::int64_t>, bool> takers_;
  bool coalescing_ = false;
  std::mutex checking_;  // the checks of the calls of one group, which return at once
  bool trace_ = std::getenv("IDEMGATE_SCHEDULE_TRACE") != nullptr;
};

/// MemoryStore on a manual clock. Its commit runs the business write before it takes its lock,
/// so a worker can be held inside it while its lease is taken over.
class MemoryEnv {
 public:
  using Store = idemgate::MemoryStore;
  static constexpr bool pauses_inside_business_write = true;
  Store& store() { return store_; }
  /// Two milliseconds of the manual clock: the lease keeper renews at every step it reaches.
  std::chrono::milliseconds lease() const { return 2ms; }
  void expire_leases() { clock_.advance(3ms); }
  std::chrono::system_clock::time_point now() const { return clock_.now(); }
  void lose_reply_of_write(PausingStore<Store>& store, int n) { store.lose_reply_of_write(n); }
  /// A database crash loses this delivery's reservation or takeover: the row is back as it was.
  void restore(const Key& key, const std::optional<Record>& row) {
    store_.for_gate(gate_name).restore(key, row);
  }
  void book(Store::transaction& tx, const Key& key, const std::string& slot, std::int64_t fence) {
    tx.on_commit([this, key, slot, fence] { bookings_[key].push_back({slot, fence}); });
  }
  std::vector<Booking> bookings_for(const Key& key) { return bookings_[key]; }

 private:
  idemgate::testing::ManualClock clock_;
  Store store_{clock_.fn()};
  std::map<Key, std::vector<Booking>> bookings_;
};

#if IDEMGATE_TEST_SQLITE
/// SqliteStore on a file, on a manual clock. Its commit holds the write lock from the fenced
/// update through the business write, so nothing can interleave inside it: workers are held
/// before their commits instead.
class SqliteEnv {
 public:
  using Store = idemgate::SqliteStore;
  static constexpr bool pauses_inside_business_write = false;
  SqliteEnv() {
    store_.migrate();
    auto raw = idemgate::test::sqlite::open_raw(path_);
    idemgate::detail::sqlite::exec(raw.get(),
                                   "CREATE TABLE bookings (id INTEGER PRIMARY KEY, source_event "
                                   "BLOB NOT NULL, slot TEXT NOT NULL, fence INTEGER NOT NULL)");
  }
  Store& store() { return store_; }
  /// Two milliseconds of the manual clock: the lease keeper renews at every step it reaches.
  std::chrono::milliseconds lease() const { return 2ms; }
  void expire_leases() { clock_.advance(3ms); }
  std::chrono::system_clock::time_point now() const { return clock_.now(); }
  void book(Store::transaction& tx, const Key& key, const std::string& slot, std::int64_t fence) {
    tx.exec("INSERT INTO bookings (source_event, slot, fence) VALUES (?, ?, ?)", key, slot, fence);
  }
  std::vector<Booking> bookings_for(const Key& key) {
    auto raw = idemgate::test::sqlite::open_raw(path_);
    idemgate::detail::sqlite::Statement read(
        raw.get(), "SELECT slot, fence FROM bookings WHERE source_event = ?", "reading bookings");
    read.bind("reading bookings", key);
    std::vector<Booking> rows;
    while (read.step("reading bookings")) rows.push_back({read.bytes(0), read.int64(1)});
    return rows;
  }

 private:
  idemgate::test::sqlite::TempDir dir_{idemgate::test::sqlite::TempDir::Where::memory};
  std::string path_ = dir_.file("interleavings.db");
  idemgate::testing::ManualClock clock_;
  Store store_{path_, {.busy_timeout = 20s, .clock = clock_.fn()}};
};
#endif

/// PostgresStore on the test server, through a wire-level fault proxy that can lose the reply
/// to a chosen statement. Its leases are measured by the server's now(), so the test controls
/// that clock the PostgreSQL way: an UPDATE moves every live lease_until into the past. The
/// leases are long; nothing here waits for one to run out. Its commit runs the business write
/// first and the fenced update last, so a worker can be held inside the business write.
class PostgresEnv {
 public:
  using Store = idemgate::PostgresStore;
  static constexpr bool pauses_inside_business_write = true;
  PostgresEnv(const std::string& uri, const std::string& log, std::string bookings)
      : log_(log),
        bookings_(std::move(bookings)),
        admin_(uri),
        proxy_(uri),
        store_(proxy_.uri(), {.table = log, .pool_size = 8}) {}
  Store& store() { return store_; }
  /// Ten minutes of server time: leases end only when the test moves them (the lease keeper
  /// renews after a third of it, so never within a schedule).
  std::chrono::milliseconds lease() const { return 10min; }
  void expire_leases() {
    exec("UPDATE " + log_ +
         " SET lease_until = now() - interval '1 millisecond'"
         " WHERE status = 'in_flight' AND lease_until >= now() - interval '1 millisecond'");
  }
  std::chrono::system_clock::time_point now() const { return std::chrono::system_clock::now(); }
  /// Renumbers the expired leases in (lease_until, key) order before a reconciler pass takes
  /// them: PostgreSQL breaks ties in the pass's ORDER BY lease_until by where the rows lie in the
  /// table, which vacuum changes, so without it a seed would not replay the same pass.
  void order_stale() {
    exec("UPDATE " + log_ +
         " AS log SET lease_until = 'epoch'::timestamptz + n * interval '1 "
         "microsecond' FROM (SELECT key, row_number() OVER (ORDER BY lease_until, key) AS n FROM " +
         log_ +
         " WHERE status = 'in_flight' AND lease_until < now()) AS expired"
         " WHERE log.key = expired.key");
  }
  /// Loses the reply to the next statement of one kind (0: cancels what did not fire).
  void lose_reply_of_write(PausingStore<Store>&, int n) {
    static constexpr std::array<const char*, 6> statements = {
        "idemgate_reserve", "idemgate_take_over", "COMMIT",
        "idemgate_release", "idemgate_fail",      "idemgate_take_stale"};
    proxy_.disarm();
    if (n <= 0) return;
    const std::size_t which = static_cast<std::size_t>(n - 1) % statements.size();
    proxy_.arm(idemgate::test::Fault::lose_reply, statements[which]);
    // With group commit, a group of reservations is one statement of its own.
    if (lose_group_reservations && which == 0)
      proxy_.arm(idemgate::test::Fault::lose_reply, "idemgate_reserve_batch");
  }
  /// Whether a lost reservation reply is also armed on a group's reservation statement.
  bool lose_group_reservations = false;
  /// A database crash loses this delivery's reservation or takeover: the row is back as it was.
  void restore(const Key& key, const std::optional<Record>& row) {
    const std::string where = " WHERE key = '\\x" + key.hex() + "'::bytea";
    if (!row) {
      exec("DELETE FROM " + log_ + where);
      return;
    }
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(row->lease_until.time_since_epoch())
            .count();
    exec("UPDATE " + log_ + " SET status = 'in_flight', holder = 0, fence = " +
         std::to_string(row->fence) + ", attempts = " + std::to_string(row->attempts) +
         ", lease_until = 'epoch'::timestamptz + " + std::to_string(micros) +
         " * interval '1 microsecond'" + where);
  }
  void book(pqxx::work& tx, const Key& key, const std::string& slot, std::int64_t fence) {
    idemgate::detail::pq::exec_params(
        tx,
        "INSERT INTO " + bookings_ +
            " (source_event, slot_id, fence) VALUES ($1::bytea, $2, $3::bigint)",
        idemgate::detail::pq::bytea_param(key.view()), slot, fence);
  }
  std::vector<Booking> bookings_for(const Key& key) {
    pqxx::nontransaction tx(admin_);
    std::vector<Booking> rows;
    for (const auto& row : idemgate::detail::pq::exec_params(
             tx, "SELECT slot_id, fence FROM " + bookings_ + " WHERE source_event = $1::bytea",
             idemgate::detail::pq::bytea_param(key.view())))
      rows.push_back({row[0].c_str(), idemgate::detail::pq::int_field(row[1])});
    return rows;
  }

 private:
  void exec(const std::string& sql) {
    pqxx::nontransaction tx(admin_);
    idemgate::detail::pq::exec(tx, sql);
  }

  std::string log_;
  std::string bookings_;
  pqxx::connection admin_;  // straight to the server: the clock control and the checks
  idemgate::test::PgFaultProxy proxy_;
  Store store_;
};

/// The seeds to run: a base and a count (IDEMGATE_SCHEDULE_COUNT=<n> for another count), or the
/// one seed named in the environment.
std::vector<unsigned> seeds(unsigned base, unsigned count) {
  if (const char* one = std::getenv("IDEMGATE_SCHEDULE_SEED"))
    return {static_cast<unsigned>(std::strtoul(one, nullptr, 10))};
  if (const char* n = std::getenv("IDEMGATE_SCHEDULE_COUNT"))
    count = static_cast<unsigned>(std::strtoul(n, nullptr, 10));
  std::vector<unsigned> all;
  for (unsigned i = 0; i < count; ++i) all.push_back(base + i);
  return all;
}

/// Runs the schedules of `seeds` on fresh environments from `make` (or all on the one environment
/// `make` is), stopping at the first broken
/// invariant; then checks that they reached what they are for. With `coalesce` on, the gate
/// groups concurrent calls; odd seeds also wait `coalesce.window` for a group to fill (even
/// seeds use none).
template <bool Bulk = false, class Make>
void run_schedules(const std::vector<unsigned>& seeds, Make&& make, const std::string& filter,
                   bool extends, idemgate::Coalescing coalesce = {}) {
  Tally tally;
  // Set, every seed runs even after one broke, and the count of broken ones is reported.
  const char* keep_going = std::getenv("IDEMGATE_SCHEDULE_KEEP_GOING");
  int broken_schedules = 0;
  for (unsigned seed : seeds) {
    idemgate::Coalescing grouping = coalesce;
    if (seed % 2 == 0) grouping.window = 0us;
    const auto broken = [&] {
      if constexpr (std::is_invocable_v<Make&>) {
        auto env = make();
        return Schedule<typename decltype(env)::element_type, Bulk>(*env, seed, tally, grouping)
            .run();
      } else {
        return Schedule<std::remove_cvref_t<Make>, Bulk>(make, seed, tally, grouping).run();
      }
    }();
    if (!broken) continue;
    ++broken_schedules;
    if (broken_schedules == 1 || keep_going == nullptr)
      ADD_FAILURE() << *broken << "\nreplay: IDEMGATE_SCHEDULE_SEED=" << seed
                    << " ./test_interleavings --gtest_filter='" << filter << "'";
    if (keep_going == nullptr) return;
  }
  if (broken_schedules > 0)
    ADD_FAILURE() << broken_schedules << " of " << seeds.size() << " schedules broke an invariant";
  std::cout << "[ schedules ] " << tally.schedules << " schedules, " << tally.steps
            << " steps, stale commits " << tally.stale_commits << ", stale business writes "
            << tally.stale_business_writes << " (taken over by a redelivery "
            << tally.taken_by_redelivery << ", by a reconciler " << tally.taken_by_reconciler
            << "), lost leases " << tally.lost_leases << ", extensions " << tally.extends
            << ", crashes " << tally.crashes << ", expiries " << tally.expiries << ", batches "
            << tally.batches << ", given up " << tally.given_up << ", groups " << tally.groups
            << " (calls run in another's: reservations " << tally.grouped_reservations
            << ", commits " << tally.grouped_commits << "), bulk commits " << tally.bulk_commits
            << ", trace " << std::hex << tally.trace << std::dec << "\n";
  if (seeds.size() == 1) return;  // a replay
  // Without these the schedules would prove nothing about fences and leases.
  EXPECT_GT(tally.stale_commits, 0) << "no held worker ever resumed to commit a taken-over event";
  EXPECT_GT(tally.taken_by_redelivery, 0) << "no stale worker's lease went to a redelivery";
  EXPECT_GT(tally.taken_by_reconciler, 0) << "no stale worker's lease went to a reconciler";
  EXPECT_GT(tally.lost_leases, 0) << "no stale worker was ever answered lost_lease";
  EXPECT_GT(tally.crashes, 0);
  if (extends) {
    EXPECT_GT(tally.extends, 0) << "no lease was ever extended";
  }
  if (coalesce.enabled) {
    // Without these the schedules would prove nothing about group commit.
    EXPECT_GT(tally.grouped_reservations, 0u) << "no reservation ever ran in another call's group";
    EXPECT_GT(tally.grouped_commits, 0u) << "no commit ever ran in another call's group";
  }
  if (Bulk) {
    EXPECT_GT(tally.bulk_commits, 0) << "no batch ever committed with one bulk write";
  }
}

/// Group commit on, for the schedules that run with it.
constexpr idemgate::Coalescing grouped{.enabled = true, .window = 200us};

/// Fewer schedules under a sanitizer, which runs the same code many times slower.
unsigned scaled(unsigned count) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return std::max(1u, count / 4);
#else
  return count;
#endif
}

}  // namespace

TEST(Interleavings, WorkersAndReconcilersOnMemoryStoreKeepEveryInvariant) {
  run_schedules(
      seeds(1, scaled(600)), [] { return std::make_unique<MemoryEnv>(); }, "*MemoryStore*", true);
}

#if IDEMGATE_TEST_SQLITE
TEST(Interleavings, WorkersAndReconcilersOnSqliteStoreKeepEveryInvariant) {
  run_schedules(
      seeds(50001, scaled(200)), [] { return std::make_unique<SqliteEnv>(); }, "*SqliteStore*",
      true);
}
#endif

TEST(Interleavings, WorkersAndReconcilersOnPostgresKeepEveryInvariant) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  const std::string log = idemgate::test::unique_table("log");
  const std::string bookings = idemgate::test::unique_table("book");
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
  idemgate::test::pg_exec(
      "CREATE TABLE " + bookings +
      " (id bigserial PRIMARY KEY, source_event bytea NOT NULL, slot_id text, fence bigint)");
  idemgate::PostgresStore(uri, {.table = log}).migrate();
  {
    // One store for every schedule (their keys differ): connecting is much of a schedule's time.
    PostgresEnv env(uri, log, bookings);
    run_schedules(seeds(100001, scaled(100)), env, "*Postgres*", false);
  }
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
}

// The same schedules with group commit on (GateOptions::coalesce): concurrent calls share one
// reservation and one commit run by one of them, so a worker's reservation or commit, with its
// business write, may run on another worker's or a reconciler's thread, be held there, crash
// there, or meet a lost reply there, with the group's other events.
TEST(Interleavings, WorkersAndReconcilersWithCoalescingOnMemoryStoreKeepEveryInvariant) {
  run_schedules(
      seeds(700001, scaled(200)), [] { return std::make_unique<MemoryEnv>(); },
      "*WithCoalescingOnMemoryStore*", true, grouped);
}

#if IDEMGATE_TEST_SQLITE
TEST(Interleavings, WorkersAndReconcilersWithCoalescingOnSqliteStoreKeepEveryInvariant) {
  run_schedules(
      seeds(750001, scaled(80)), [] { return std::make_unique<SqliteEnv>(); },
      "*WithCoalescingOnSqliteStore*", true, grouped);
}
#endif

TEST(Interleavings, WorkersAndReconcilersWithCoalescingOnPostgresKeepEveryInvariant) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  const std::string log = idemgate::test::unique_table("log");
  const std::string bookings = idemgate::test::unique_table("book");
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
  idemgate::test::pg_exec(
      "CREATE TABLE " + bookings +
      " (id bigserial PRIMARY KEY, source_event bytea NOT NULL, slot_id text, fence bigint)");
  idemgate::PostgresStore(uri, {.table = log}).migrate();
  {
    PostgresEnv env(uri, log, bookings);
    env.lose_group_reservations = true;
    run_schedules(seeds(800001, scaled(60)), env, "*WithCoalescingOnPostgres*", false, grouped);
  }
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
}

// The same schedules with a bulk business write: a batch's commit runs one write for all its
// events and one fenced update (PostgreSQL) or its fenced updates in one transaction (SQLite,
// MemoryStore); when a fence moved or the write threw (poison, a crash inside it), nothing of the
// batch lands and its events are committed one by one.
TEST(Interleavings, WorkersAndReconcilersWithBulkWritesOnMemoryStoreKeepEveryInvariant) {
  run_schedules<true>(
      seeds(900001, scaled(300)), [] { return std::make_unique<MemoryEnv>(); },
      "*WithBulkWritesOnMemoryStore*", true);
}

#if IDEMGATE_TEST_SQLITE
TEST(Interleavings, WorkersAndReconcilersWithBulkWritesOnSqliteStoreKeepEveryInvariant) {
  run_schedules<true>(
      seeds(950001, scaled(100)), [] { return std::make_unique<SqliteEnv>(); },
      "*WithBulkWritesOnSqliteStore*", true);
}
#endif

TEST(Interleavings, WorkersAndReconcilersWithBulkWritesOnPostgresKeepEveryInvariant) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  const std::string log = idemgate::test::unique_table("log");
  const std::string bookings = idemgate::test::unique_table("book");
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
  idemgate::test::pg_exec(
      "CREATE TABLE " + bookings +
      " (id bigserial PRIMARY KEY, source_event bytea NOT NULL, slot_id text, fence bigint)");
  idemgate::PostgresStore(uri, {.table = log}).migrate();
  {
    PostgresEnv env(uri, log, bookings);
    run_schedules<true>(seeds(1000001, scaled(60)), env, "*WithBulkWritesOnPostgres*", false);
  }
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
}
