#pragma once

// A store and a downstream that forward every call to the ones they wrap and let a schedule hold
// the calling thread at each step of the gate and the reconciler: before a reservation, a
// commit, a release, a lease extension, a take-over pass, a claim, a lookup, and inside the
// commit's business write (a group commit's as one step of the thread that runs it). They satisfy
// the same concepts as what they wrap, so the gate and the reconciler take the same code paths as
// over the bare store.

#include "fake_terminal.hpp"

#include <idemgate/batch.hpp>
#include <idemgate/concepts.hpp>
#include <idemgate/errors.hpp>
#include <idemgate/record.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::test {

/// A step where a schedule may hold the thread that reaches it.
enum class Step {
  reserve,         ///< before a reservation (or a batch's reservations)
  commit,          ///< before a commit (or a batch's commit)
  business_write,  ///< inside the commit, before the business write runs
  fail,            ///< before storing a permanent failure
  escalate,        ///< before parking an event for a human
  release,         ///< before giving a lease back
  extend,          ///< before extending leases
  take_stale,      ///< before a reconciler pass takes stranded rows over
  claim,           ///< before the downstream is called
  claimed,         ///< after the downstream's side effect, before its answer leaves
  lookup,          ///< before the downstream is asked what it holds under a key
};

/// The step's name, for messages.
constexpr const char* to_string(Step step) noexcept {
  switch (step) {
    case Step::reserve:
      return "reserve";
    case Step::commit:
      return "commit";
    case Step::business_write:
      return "business write";
    case Step::fail:
      return "fail";
    case Step::escalate:
      return "escalate";
    case Step::release:
      return "release";
    case Step::extend:
      return "extend";
    case Step::take_stale:
      return "take stale";
    case Step::claim:
      return "claim";
    case Step::claimed:
      return "claimed";
    case Step::lookup:
      return "lookup";
  }
  return "?";
}

/// Where a thread is about to go on: the step, its key (null for calls over many keys) and the
/// fence the call is made under (0 when it has none).
struct PausePoint {
  Step step;
  const Key* key = nullptr;
  std::int64_t fence = 0;
};

/// Called at every step; returns when the thread may go on, or throws to end it (a crash).
using PauseHook = std::function<void(const PausePoint&)>;

/// Called on the calling thread when a call granted it a lease: the key and its new fence.
using LeaseHook = std::function<void(const Key&, std::int64_t)>;

/// What the calling thread did through a `PausingStore`, for a schedule's checks: the fence each
/// key's latest commit was made under, and the fence of the commit whose business write runs on
/// this thread right now (0 outside one).
struct ThreadLedger {
  /// Latest commit's fence per key.
  std::map<Key, std::int64_t> committing;
  /// The fence of the commit whose business write runs now.
  std::int64_t business_fence = 0;
};

/// The calling thread's ledger.
inline ThreadLedger& thread_ledger() {
  thread_local ThreadLedger ledger;
  return ledger;
}

/**
 * A store decorator: every call goes to `Inner`, after `pause` let the thread go on. It also
 * loses the reply of a chosen write when asked (the write lands, the caller gets a
 * `StoreError`), records in the calling thread's ledger which fence each commit runs under, and
 * counts the commits that blamed the business write (`BusinessWriteError`). A copy, and
 * `for_gate`, is a handle on the inner store's handle of the same scope that shares the pause
 * hooks, the lost replies, the counts and the ledger.
 *
 * Example:
 *   PausingStore<MemoryStore> store{memory, [&](const PausePoint& at) { schedule.hold(at); }};
 *   Gate gate{"ect.claim_slot", store, terminal, book};
 */
template <store Inner>
class PausingStore {
 public:
  /// The inner store's transaction.
  using transaction = typename Inner::transaction;

  /// Wraps `inner` (a handle on its log); `pause` runs before every call, and inside the commit's
  /// business write when `pause_inside_business_write` (not on a store whose commit holds its lock
  /// across the business write: nothing else could go on meanwhile). `leased`, if given, hears of
  /// every lease a reservation, a takeover or a reconciler pass granted.
  PausingStore(Inner inner, PauseHook pause, bool pause_inside_business_write,
               LeaseHook leased = {})
      : inner_(std::move(inner)),
        shared_(std::make_shared<Shared>(std::move(pause), std::move(leased),
                                         pause_inside_business_write)) {}

  /// A handle on the inner store's handle for gate `name`, sharing this one's hooks and counts.
  [[nodiscard]] PausingStore for_gate(const GateName& name) const {
    return PausingStore(inner_.for_gate(name), shared_);
  }
  /// The gate whose rows this handle sees.
  [[nodiscard]] decltype(auto) gate() const { return inner_.gate(); }

  /// The wrapped store (this handle's).
  Inner& inner() noexcept { return inner_; }

  /// How many commits threw `BusinessWriteError` (the store blamed the business write).
  [[nodiscard]] int business_write_errors() const noexcept { return shared_->blamed.load(); }
  /// Bulk commits of more than one event that committed (`commit_bulk`).
  [[nodiscard]] int bulk_commits() const noexcept { return shared_->bulk_commits.load(); }
  /// The first `BusinessWriteError`'s message (read it once the callers are done).
  [[nodiscard]] const std::string& first_blame() const noexcept { return shared_->first_blame; }

  /// Loses the reply of the `n`-th write from now (0: none).
  void lose_reply_of_write(int n) { shared_->lose_at.store(n); }

  /// Forwards `reserve`.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    hold({Step::reserve, &key});
    Reservation reservation = inner_.reserve(key, fingerprint, request, lease);
    if (reservation.kind != Reservation::Kind::existing) heard(key, reservation.fence);
    return lost(std::move(reservation));
  }

  /// Forwards `reserve_batch` where the inner store has it.
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) requires
      requires(Inner& s) {
    s.reserve_batch(items, lease);
  }
  {
    hold({Step::reserve});
    std::vector<Reservation> reservations = inner_.reserve_batch(items, lease);
    for (std::size_t i = 0; i < items.size() && i < reservations.size(); ++i)
      if (reservations[i].kind != Reservation::Kind::existing)
        heard(items[i].key, reservations[i].fence);
    return lost(std::move(reservations));
  }

  /// Forwards `commit`; the business write runs with this call's fence in the thread's ledger.
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    hold({Step::commit, &key, fence});
    thread_ledger().committing[key] = fence;
    const CommitStatus status = counted([&] {
      return inner_.commit(key, fence, result, [&](transaction& tx) {
        if (shared_->inside) hold({Step::business_write, &key, fence});
        const FenceScope scope(fence);
        business(tx);
      });
    });
    if (status == CommitStatus::committed) committed_under(key, fence);
    return lost(status);
  }

  /// Forwards `commit_batch` where the inner store has it. Only the first item's business write
  /// is paused: later ones run after earlier items' fenced updates, which hold row locks.
  template <class BusinessWrite>
  requires requires(Inner& s, std::span<const CommitItem> items) {
    s.commit_batch(items, [](transaction&, std::size_t) {});
  }
  std::optional<std::vector<CommitStatus>> commit_batch(std::span<const CommitItem> items,
                                                        BusinessWrite&& business) {
    hold({Step::commit});
    for (const CommitItem& item : items) thread_ledger().committing[item.key] = item.fence;
    auto statuses = counted([&] {
      return inner_.commit_batch(items, [&](transaction& tx, std::size_t i) {
        if (shared_->inside && i == 0) hold({Step::business_write, &items[i].key, items[i].fence});
        const FenceScope scope(items[i].fence);
        business(tx, i);
      });
    });
    if (statuses)
      for (std::size_t i = 0; i < items.size() && i < statuses->size(); ++i)
        if ((*statuses)[i] == CommitStatus::committed)
          committed_under(items[i].key, items[i].fence);
    return lost(std::move(statuses));
  }

  /// Forwards `commit_bulk` where the inner store has it (a bulk business write, called once for
  /// the batch). Held before it starts and, where the store runs it before its fenced updates,
  /// inside the write; every item's fence goes to the thread's ledger (`committing`), where the
  /// bulk write finds each event's fence.
  template <class BusinessWrite>
  requires requires(Inner& s, std::span<const CommitItem> items) {
    s.commit_bulk(items, [](transaction&) {});
  }
  std::optional<std::vector<CommitStatus>> commit_bulk(std::span<const CommitItem> items,
                                                       BusinessWrite&& business) {
    hold({Step::commit});
    for (const CommitItem& item : items) thread_ledger().committing[item.key] = item.fence;
    auto statuses = counted([&] {
      return inner_.commit_bulk(items, [&](transaction& tx) {
        if (shared_->inside && !items.empty())
          hold({Step::business_write, &items[0].key, items[0].fence});
        business(tx);
      });
    });
    if (statuses) {
      for (std::size_t i = 0; i < items.size() && i < statuses->size(); ++i)
        if ((*statuses)[i] == CommitStatus::committed)
          committed_under(items[i].key, items[i].fence);
      if (items.size() > 1) ++shared_->bulk_commits;
    }
    return lost(std::move(statuses));
  }

  /// Forwards `commit_each` where the inner store has it (group commit). The group is held once,
  /// before it starts, as one step of the thread that runs it (the group's leader, whose step it
  /// is); never inside: every business write of a group runs after its own item's fenced update
  /// (and the earlier items'), whose row locks last until the group commits. Held there, the
  /// group would keep those rows locked while the schedule runs others, and a lease expiry or a
  /// takeover of one of them would wait on the database for the held thread: a deadlock of the
  /// schedule, never of the gate. Every item's fence goes to the ledgers; each business write
  /// runs with its own item's fence in the thread's ledger.
  template <class BusinessWrite>
  requires requires(Inner& s, std::span<const CommitItem> items) {
    s.commit_each(items, [](transaction&, std::size_t) {});
  }
  std::vector<ItemCommit> commit_each(std::span<const CommitItem> items, BusinessWrite&& business) {
    hold({Step::commit});
    for (const CommitItem& item : items) thread_ledger().committing[item.key] = item.fence;
    std::vector<ItemCommit> answers = counted([&] {
      return inner_.commit_each(items, [&](transaction& tx, std::size_t i) {
        const FenceScope scope(items[i].fence);
        business(tx, i);
      });
    });
    // An item the store blamed on its business write is answered with the error, not thrown.
    for (std::size_t i = 0; i < answers.size() && i < items.size(); ++i) {
      const ItemCommit& answer = answers[i];
      if (!answer.error && answer.status == CommitStatus::committed)
        committed_under(items[i].key, items[i].fence);
      if (!answer.error) continue;
      try {
        std::rethrow_exception(answer.error);
      } catch (const BusinessWriteError& e) {
        blame(e);
      } catch (...) {
      }
    }
    return lost(std::move(answers));
  }

  /// The fence under which the store last answered `committed` for `key` (a commit of any kind,
  /// on any thread), or 0. With group commit, an event's commit runs on whichever thread leads
  /// its group, so a caller finds its commit's fence here rather than in its thread's ledger.
  [[nodiscard]] std::int64_t committed_fence(const Key& key) const {
    std::lock_guard lock(shared_->ledger_mutex);
    const auto it = shared_->latest.find(key);
    return it == shared_->latest.end() ? 0 : it->second;
  }

  /// Forwards `fail`.
  CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    hold({Step::fail, &key, fence});
    return lost(inner_.fail(key, fence, reason));
  }

  /// Forwards `escalate`.
  CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    hold({Step::escalate, &key, fence});
    return lost(inner_.escalate(key, fence, reason));
  }

  /// Forwards `release`.
  bool release(const Key& key, std::int64_t fence) {
    hold({Step::release, &key, fence});
    return lost(inner_.release(key, fence));
  }

  /// Forwards `release` with a reason (`explaining_store`).
  bool release(const Key& key, std::int64_t fence,
               std::string_view reason) requires explaining_store<Inner> {
    hold({Step::release, &key, fence});
    return lost(inner_.release(key, fence, reason));
  }

  /// Forwards `extend` (`lease_extending_store`).
  std::size_t extend(std::span<const HeldLease> held,
                     std::chrono::milliseconds lease) requires lease_extending_store<Inner> {
    hold({Step::extend});
    return inner_.extend(held, lease);
  }

  /// Forwards `renew` (`lease_renewing_store`), held at the same step as `extend`.
  std::vector<LeaseRenewal> renew(std::span<const HeldLease> held,
                                  std::chrono::milliseconds lease) requires
      lease_renewing_store<Inner> {
    hold({Step::extend});
    return inner_.renew(held, lease);
  }

  /// Forwards `find` (never held: the schedule's own checks read through it too).
  std::optional<Record> find(const Key& key) { return inner_.find(key); }

  /// Forwards `take_stale`.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    hold({Step::take_stale});
    std::vector<Stranded> taken = inner_.take_stale(limit, stale_after, lease);
    for (const Stranded& row : taken) heard(row.key, row.fence);
    return lost(std::move(taken));
  }

  /// Forwards `escalated`.
  std::vector<Record> escalated(std::size_t limit) { return inner_.escalated(limit); }

  /// Forwards `resolve`.
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    return inner_.resolve(key, result, std::forward<BusinessWrite>(business));
  }

  /// Forwards `redrive_failed` of one key (`redrivable_store`).
  std::size_t redrive_failed(const Key& key) requires redrivable_store<Inner> {
    return inner_.redrive_failed(key);
  }

  /// Forwards `redrive_failed` of a range (`redrivable_store`).
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to,
                             std::size_t limit) requires redrivable_store<Inner> {
    return inner_.redrive_failed(from, to, limit);
  }

  /// Forwards `signals` (`monitored_store`).
  StoreSignals signals(std::chrono::seconds window) requires monitored_store<Inner> {
    return inner_.signals(window);
  }

  /// Forwards `record_mismatch` (`monitored_store`).
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) requires monitored_store<Inner> {
    inner_.record_mismatch(key, stored, observed, source);
  }

  /// Forwards `mismatches` (`monitored_store`).
  std::vector<Mismatch> mismatches(std::size_t limit) requires monitored_store<Inner> {
    return inner_.mismatches(limit);
  }

  /// Forwards `purge` (`monitored_store`).
  std::size_t purge(std::chrono::seconds older_than,
                    std::size_t batch) requires monitored_store<Inner> {
    return inner_.purge(older_than, batch);
  }

  /// Forwards `relaxed_reservations` where the inner store has it (the gate checks it).
  [[nodiscard]] bool relaxed_reservations() const requires requires(const Inner& s) {
    s.relaxed_reservations();
  }
  { return inner_.relaxed_reservations(); }

 private:
  // What every handle of one wrapper shares.
  struct Shared {
    Shared(PauseHook p, LeaseHook l, bool i)
        : pause(std::move(p)), leased(std::move(l)), inside(i) {}
    PauseHook pause;
    LeaseHook leased;
    bool inside;
    std::atomic<int> lose_at{0};
    std::atomic<int> blamed{0};
    std::atomic<int> bulk_commits{0};
    std::string first_blame;
    std::mutex ledger_mutex;
    std::map<Key, std::int64_t> latest;
  };

  PausingStore(Inner inner, std::shared_ptr<Shared> shared)
      : inner_(std::move(inner)), shared_(std::move(shared)) {}

  // Runs the pause hook: returns when the thread may go on.
  void hold(const PausePoint& at) const { shared_->pause(at); }

  // Puts a commit's fence in the thread's ledger while its business write runs.
  class FenceScope {
   public:
    explicit FenceScope(std::int64_t fence) : before_(thread_ledger().business_fence) {
      thread_ledger().business_fence = fence;
    }
    FenceScope(const FenceScope&) = delete;
    FenceScope& operator=(const FenceScope&) = delete;
    ~FenceScope() { thread_ledger().business_fence = before_; }

   private:
    std::int64_t before_;
  };

  void heard(const Key& key, std::int64_t fence) {
    if (shared_->leased) shared_->leased(key, fence);
  }

  template <class Commit>
  auto counted(Commit&& commit) {
    try {
      return commit();
    } catch (const BusinessWriteError& e) {
      blame(e);
      throw;
    }
  }

  void blame(const BusinessWriteError& e) {
    if (shared_->blamed.fetch_add(1) == 0) shared_->first_blame = e.what();
  }

  void committed_under(const Key& key, std::int64_t fence) {
    std::lock_guard lock(shared_->ledger_mutex);
    shared_->latest[key] = fence;
  }

  template <class T>
  T lost(T answer) {
    int at = shared_->lose_at.load();
    while (at > 0 && !shared_->lose_at.compare_exchange_weak(at, at - 1)) {
    }
    if (at == 1) throw StoreError("the reply was lost");
    return answer;
  }

  Inner inner_;
  std::shared_ptr<Shared> shared_;
};

/// A downstream decorator: `claim` and `lookup` go to `Inner` after `pause` let the thread go on.
template <downstream Inner>
class PausingDownstream {
 public:
  /// The inner downstream's request.
  using request_type = typename Inner::request_type;
  /// The inner downstream's outcome.
  using outcome_type = typename Inner::outcome_type;
  /// As the inner downstream.
  static constexpr bool honours_idempotency_key = Inner::honours_idempotency_key;

  /// Wraps `inner`.
  PausingDownstream(Inner& inner, PauseHook pause) : inner_(inner), pause_(std::move(pause)) {}

  /// Forwards `claim`.
  ClaimResult<outcome_type> claim(const request_type& request, const Key& key) {
    pause_({Step::claim, &key});
    return inner_.claim(request, key);
  }

  /// Forwards `lookup` where the inner downstream has it.
  LookupResult<outcome_type> lookup(const Key& key) requires lookup_downstream<Inner> {
    pause_({Step::lookup, &key});
    return inner_.lookup(key);
  }

 private:
  Inner& inner_;
  PauseHook pause_;
};

}  // namespace idemgate::test
