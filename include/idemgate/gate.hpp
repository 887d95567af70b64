// SPDX-License-Identifier: MIT
// Gate<Store, Downstream>: reserve, call the downstream, commit, answer.
#pragma once

#include "batch.hpp"
#include "concepts.hpp"
#include "detail/answers.hpp"
#include "detail/attempts.hpp"
#include "detail/coalescer.hpp"
#include "detail/crypto/sha256.hpp"
#include "detail/durations.hpp"
#include "detail/lru_cache.hpp"
#include "errors.hpp"
#include "gate_name.hpp"
#include "leases.hpp"
#include "outcome.hpp"
#include "signals.hpp"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idemgate {

/// Group commit across concurrent deliveries (`GateOptions::coalesce`).
struct Coalescing {
  /// On: concurrent `process` calls on one gate share one reservation statement (the store's
  /// `reserve_batch`) and one commit transaction (its `commit_each`: every business write under
  /// its own savepoint, so one that throws costs only its own event). Worth it when many
  /// deliveries run at once on a disk whose flush is slow (docs/performance.md): one flush then
  /// serves a group instead of one event. The business write of an event may then run on another
  /// caller's thread, so it must not depend on thread-local state.
  bool enabled = false;
  /// How long a call that finds no group forming waits for others to join its group. 0 (the
  /// default) adds nothing to a lone delivery: it runs at once, and calls that arrive while a
  /// group runs form the next group.
  std::chrono::microseconds window{0};
  /// Most events in one group (1 to 64; PostgreSQL keeps up to 64 savepoints of a transaction
  /// in shared memory, more slow down every other session's snapshots).
  std::size_t max_events = 32;
  /// Groups of each kind (reservations, commits) running at once, each on its own connection.
  std::size_t concurrent_groups = 1;
};

/// What group commit did so far (`Gate::coalescing`): groups run, and events in them.
struct CoalescingStats {
  /// Reservation groups run.
  std::size_t reservation_groups = 0;
  /// Reservations run in those groups.
  std::size_t reservations = 0;
  /// Commit groups run.
  std::size_t commit_groups = 0;
  /// Commits run in those groups.
  std::size_t commits = 0;
  /// Calls that wait on another call's group right now: queued behind a running group, or in
  /// a group another call runs.
  std::size_t waiting = 0;
};

/// Tuning of a `Gate`.
struct GateOptions {
  /// How long a reservation stays exclusive without a renewal. While a call runs, the gate's
  /// heartbeat renews its lease every third of it (`heartbeat`), so a slow call is never taken
  /// over however long it takes; a worker that died stops renewing and its event is taken over by
  /// a redelivery or the reconciler one lease after its last renewal. Keep it short (the
  /// worst-case recovery after a crash is about lease + `ReconcilerOptions::interval`, see
  /// docs/design.md), but well above the longest stall of the whole process (a renewal late by
  /// more than two thirds of the lease loses the event to another attempt: the fenced commit then
  /// refuses this one). On a store without `extend` there is no heartbeat: set it above the
  /// longest plausible processing time.
  std::chrono::milliseconds lease = std::chrono::seconds(10);
  /// Renews the leases of the calls in progress (`process`, `process_batch` and the reconciler's
  /// passes) every third of the lease from one background thread per gate. Off, a lease is only
  /// renewed between the events of a batch or a pass: a call longer than the lease is taken over
  /// (tests that move the store's clock by hand turn it off to keep their schedule their own).
  bool heartbeat = true;
  /// Largest encoded request the gate accepts (it is stored with the reservation).
  std::size_t max_request_bytes = 1 << 20;
  /// Committed keys remembered in this process (a bounded LRU) to answer hot duplicates without
  /// a round trip; 0 turns it off. In-flight keys are never cached. Duplicates answered here do
  /// not reach the store's duplicate counter: with the cache on, watch the duplicate ratio
  /// through the observer's counts instead.
  std::size_t cache_capacity = 0;
  /// Group commit across concurrent `process` calls; off by default (see `Coalescing`).
  Coalescing coalesce{};
  /// Keeps the readable label of a `LabelledKey` (from `derive_labelled_key`) with a new row, so
  /// an operator recognises the event and finds it by the upstream's id. Off by default: a label
  /// holds the key's parts, which may be personal data (docs/operations.md). Needs a store that
  /// keeps labels (`labelling_store`); others keep none. `process_batch` keeps each message's
  /// `BatchMessage::label`.
  bool keep_labels = false;
  /// Attempts an event may take: its first reservation, the takeovers of redeliveries and the
  /// reconciler's passes together. The reservation that would start one more attempt calls no
  /// downstream: it escalates the event to the manual queue with the last attempt's error. From
  /// 1 to `max_max_attempts`; the reconciler counts against it too (unless
  /// `ReconcilerOptions::max_attempts` sets its own).
  std::size_t max_attempts = 10;
  /// How long a key is held after a transient failure before the next attempt may take it over,
  /// doubling with every attempt up to `max_retry_backoff`: a redelivery meanwhile is answered
  /// `retry` (do not ack) without a downstream call, so a sender that resends at once cannot
  /// hammer the downstream. Off (0) by default: the next delivery takes the event over at once.
  /// Turn it on where deliveries come back at once (a webhook sender retrying every 503, a
  /// hand-written retry loop); behind a broker, keep the broker's redelivery delay above
  /// `max_retry_backoff`, or each held redelivery spends one of the broker's deliveries
  /// (`PoisonPolicy::max_deliveries`) without an attempt. Needs a store that holds keys
  /// (`backing_off_store`); others end the lease at once.
  std::chrono::milliseconds retry_backoff = std::chrono::milliseconds(0);
  /// The longest hold between two attempts: from `retry_backoff` to a day.
  std::chrono::milliseconds max_retry_backoff = std::chrono::seconds(60);

  /// Largest `max_attempts`.
  static constexpr std::size_t max_max_attempts = 1'000'000;
};

/// What `Gate::stop` did.
struct StopReport {
  /// Calls (`process`, `process_batch`) in progress when the stop began.
  std::size_t running = 0;
  /// Of those, the ones still running when the grace period ended: their events are left to a
  /// redelivery (their leases were given back) unless their fenced commit still lands.
  std::size_t unfinished = 0;
  /// Leases given back (fenced release) so a redelivery takes their events over at once.
  std::size_t given_back = 0;
  /// Leases that could not be given back (the store failed): they run out after the lease.
  std::size_t not_given_back = 0;
  /// Background workers (`stop_gracefully`'s reconciler, retention) still in a pass when the
  /// grace period ended: each finishes its pass on its own thread; its destructor waits for it.
  std::size_t workers_unfinished = 0;
  /// True when every call and every background worker finished within the grace period.
  [[nodiscard]] bool clean() const noexcept { return unfinished == 0 && workers_unfinished == 0; }
};

/// The default business write's type: a callable taking the store's transaction, the request and
/// the downstream's outcome. Any callable that also takes the key after the transaction works.
template <class Store, class Downstream>
using BusinessWrite =
    std::function<void(typename Store::transaction&, const typename Downstream::request_type&,
                       const typename Downstream::outcome_type&)>;

/**
 * The exactly-once gate: reserve the key, call the downstream with it, commit the outcome and
 * the business write in one transaction.
 *
 * A `Gate` holds a handle on its store scoped to its name (`Store::for_gate`) and a reference
 * to its downstream; it is safe to share between threads when they are (every shipped store
 * is). Gates sharing one database each need their own name: a gate sees only its own rows.
 *
 * Example:
 *   idemgate::Gate gate{"ect.claim_slot", store, terminal,
 *                       [](pqxx::work& tx, const SlotRequest& r, const std::string& slot) {
 *                         book(tx, r, slot);
 *                       }};
 *   auto key = idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number);
 *   auto result = gate.process(key, SlotRequest{n.equipment_number, n.preferred_window});
 *   if (result.should_ack()) message.ack();
 */
template <store Store, downstream Downstream, class Apply = BusinessWrite<Store, Downstream>,
          observer Observer = NullObserver>
requires business_write<Apply, Store, Downstream>
class Gate {
 public:
  /// What the downstream is asked to do.
  using request_type = typename Downstream::request_type;
  /// What the downstream answers.
  using outcome_type = typename Downstream::outcome_type;
  /// What `process` returns.
  using result_type = Result<outcome_type>;
  /// What a bulk business write receives, one per event (`bulk_business_write`).
  using committed_event = CommittedEvent<request_type, outcome_type>;
  /// True when the business write is a `bulk_business_write`: `process_batch` then calls it once
  /// for the events it commits together, every other path with one event.
  static constexpr bool bulk_writes = bulk_business_write<Apply, Store, Downstream>;

  /// Gate `name` over `store` and `downstream`; `business_write` runs in the commit's
  /// transaction (also for the reconciler, so it must depend only on key, request and outcome).
  /// The gate works on its own rows of the store's log (`store.for_gate(name)`): give every gate
  /// on one database its own name (see `GateName`).
  Gate(GateName name, Store& store, Downstream& downstream, Apply business_write,
       GateOptions options = {}) requires std::same_as<Observer, NullObserver>
      : Gate(std::move(name), store, downstream, std::move(business_write), options,
             null_observer()) {}

  /// Gate `name` that also reports every result, reconciliation and mismatch to `observer` (for
  /// example a `Counters`); the observer must outlive the gate.
  Gate(GateName name, Store& store, Downstream& downstream, Apply business_write,
       GateOptions options, Observer& observer)
      : name_(std::move(name)),
        store_(store.for_gate(name_)),
        downstream_(downstream),
        apply_(std::move(business_write)),
        options_(options),
        observer_(observer),
        cache_(options.cache_capacity),
        heartbeat_(store_, options.lease, options.heartbeat) {
    detail::require_in_range("GateOptions::lease", options.lease, std::chrono::milliseconds(1),
                             std::chrono::days(365),
                             "The heartbeat renews it every third while a call runs (default "
                             "10 seconds); without a heartbeat, set it above the longest "
                             "plausible processing time.");
    detail::require_in_range("GateOptions::max_request_bytes", options.max_request_bytes,
                             std::size_t{1}, std::size_t{64} << 20,
                             "Every request is stored with its reservation (default 1 MiB); keep "
                             "larger payloads elsewhere and send a reference.");
    detail::require_in_range("GateOptions::cache_capacity", options.cache_capacity, std::size_t{0},
                             std::size_t{10'000'000},
                             "It is the committed keys remembered in this process; 0 turns the "
                             "cache off.");
    detail::require_in_range("GateOptions::max_attempts", options.max_attempts, std::size_t{1},
                             GateOptions::max_max_attempts,
                             "It is how many attempts an event gets before it is escalated "
                             "(default 10).");
    detail::require_in_range("GateOptions::max_retry_backoff", options.max_retry_backoff,
                             std::chrono::milliseconds(0), std::chrono::days(1),
                             "It is the longest hold between two attempts (default 60 s).");
    detail::require_in_range("GateOptions::retry_backoff", options.retry_backoff,
                             std::chrono::milliseconds(0), options.max_retry_backoff,
                             "It is the hold after a first transient failure, at most "
                             "max_retry_backoff; 0 (the default) turns it off.");
    if constexpr (requires { std::string_view(observer.gate()); }) {
      const std::string_view counted = observer.gate();
      if (!counted.empty() && counted != name_.view())
        throw std::invalid_argument("idemgate: gate \"" + name_.str() +
                                    "\" reports to an observer made for gate \"" +
                                    std::string(counted) +
                                    "\"; give each gate an observer of its own name, or its "
                                    "samples would be labelled as another gate's");
    }
    if (options.coalesce.enabled) start_coalescing();
    if constexpr (!Downstream::honours_idempotency_key &&
                  requires { store_.relaxed_reservations(); }) {
      if (store_.relaxed_reservations())
        throw std::invalid_argument(
            "idemgate: relaxed reservations need a downstream that honours Idempotency-Key (a "
            "reservation lost in a database crash is only safe when the repeated claim returns "
            "the original outcome); turn PostgresOptions::relaxed_reservations off");
    }
  }

  /**
   * Processes one delivery of an event: the four steps, in order.
   *
   * When it throws, there is no result: do not ack the message. The redelivery (or the
   * reconciler) finishes the event, or answers it from the log when its commit did land (a
   * commit whose confirmation was lost, an observer that threw afterwards). What can leave it:
   * - `RequestError`: the request does not encode, or its bytes are over
   *   `GateOptions::max_request_bytes`. Nothing was reserved; the same message fails the same
   *   way, so dead-letter it rather than retry it as is.
   * - `StoreError`: the store cannot do its work (the database unreachable or its connection
   *   lost, a commit whose fate could not be confirmed, the log's table missing). Its subclass
   *   `BusinessWriteError`: the business write broke the store's transaction.
   * - what the business write throws, unchanged: its own exceptions, its SQL errors (a
   *   `StoreError` on SQLite, a `pqxx::sql_error` on PostgreSQL). Its transaction was rolled
   *   back and the event's lease ended, so the redelivery takes the event over at once.
   * - what the outcome's codec throws (`CodecError`, by convention) while it encodes the
   *   downstream's outcome or decodes a stored one to answer a duplicate;
   * - what the observer throws, and `std::bad_alloc`.
   * The downstream's exceptions (those derived from `std::exception`) never leave: a `claim`
   * that throws is a transient failure, answered `retry`.
   *
   * While the downstream is called and the outcome committed, the gate's heartbeat keeps the
   * lease alive. When it lost the lease meanwhile (a renewal found the fence gone, or renewals
   * failed for longer than the lease) and the fenced commit was refused, the answer is `retry`
   * (do not ack), never `processed`: the redelivery is answered from the log. After `stop()`
   * began, `process` reserves nothing and answers `retry` at once (do not ack: another consumer
   * takes the message); `stopping()` tells it apart.
   */
  result_type process(const Key& key, const request_type& request) {
    return process_labelled(key, request, {});
  }

  /**
   * Like `process(key.key, request)`, and keeps `key.label` with the event's row when
   * `GateOptions::keep_labels` is on and the store keeps labels; otherwise the label is dropped.
   * The key is the same either way: turning labels on or off never changes a key.
   *
   * Example:
   *   idemgate::Gate gate{"ect.claim_slot", store, terminal,
   *                       [](pqxx::work& tx, const SlotRequest& r, const std::string& slot) {
   *                         book(tx, r, slot);
   *                       },
   *                       {.keep_labels = true}};
   *   auto key = idemgate::derive_labelled_key("ect.claim_slot", n.notification_id,
   *                                            n.equipment_number);  // "ect.claim_slot CIS-…
   * MSKU…" auto result = gate.process(key, SlotRequest{n.equipment_number, n.preferred_window});
   */
  result_type process(const LabelledKey& key, const request_type& request) {
    if constexpr (labelling_store<Store>) {
      if (options_.keep_labels) return process_labelled(key.key, request, key.label);
    }
    return process_labelled(key.key, request, {});
  }

  /// The observer results are reported to.
  [[nodiscard]] Observer& observer() noexcept { return observer_; }

  /// What group commit did so far; zeros when `GateOptions::coalesce` is off.
  [[nodiscard]] CoalescingStats coalescing() const {
    if (!reserve_group_) return {};
    return {reserve_group_->groups(), reserve_group_->items(), commit_group_->groups(),
            commit_group_->items(), reserve_group_->parked() + commit_group_->parked()};
  }

  /**
   * Processes a batch of messages (an SQS receive of up to 10, or more): every key reserved in
   * one statement when the store can (`reserve_batch`), the downstream called for each new
   * event, and the commits grouped in one transaction (`commit_batch`). With a bulk business
   * write (`bulk_business_write`) on a store that has `commit_bulk`, that transaction calls the
   * write once with every event to commit and marks them committed in one fenced statement.
   * Returns one result per message, in order; `retry_ids()` lists the messages not to ack.
   *
   * Messages with the same key in one batch are processed once; the others get its answer as
   * `duplicate`. A message whose request cannot be encoded gets `failed` (nothing written).
   * A business write that throws leaves its event in flight and its message to `retry`. When the
   * grouped commit cannot land whole (an event's lease was taken over meanwhile, a business
   * write threw or its SQL failed), nothing of it is written and the events are committed one
   * by one, each with its own business write (a bulk write gets one event): only the event at
   * fault answers `lost_lease` or `retry`.
   *
   * When it throws, there is no result for any message: ack none of them. Every lease the batch
   * held was given back; the redeliveries finish the events, or answer them from the log where
   * a commit did land.
   * What can leave it: `StoreError` when the store fails for the batch (its reservation,
   * storing a permanent failure or an escalation, a batch commit that failed on every attempt;
   * never one business write's error), what the outcome's codec throws, what the observer
   * throws, and `std::bad_alloc`. `RequestError` and the business write's exceptions do not
   * leave: they become `failed` and `retry` for their own message.
   */
  BatchResult<outcome_type> process_batch(std::span<const BatchMessage<request_type>> messages) {
    const auto started = std::chrono::steady_clock::now();
    const std::size_t n = messages.size();
    Call call(*this);
    if (!call.admitted()) {
      std::vector<BatchItem<outcome_type>> refused;
      for (const BatchMessage<request_type>& m : messages) {
        observer_.on_result(m.key, Status::retry, std::chrono::nanoseconds(0));
        refused.push_back({m.message_id, stopped_result()});
      }
      return BatchResult<outcome_type>(std::move(refused));
    }
    std::vector<BatchSlot> slots(n);
    std::unordered_map<Key, std::size_t, KeyHash> seen;
    std::vector<std::size_t> pending;  // first occurrences that need the store
    for (std::size_t i = 0; i < n; ++i) {
      BatchSlot& slot = slots[i];
      slot.first = i;
      try {
        slot.bytes = encode_request(messages[i].request);
      } catch (const RequestError& e) {
        slot.result = result_type::because(Status::failed, e.what());
        continue;
      }
      slot.fingerprint = detail::sha256(slot.bytes);
      // The first usable message of a key speaks for the batch's later copies of it.
      slot.first = seen.try_emplace(messages[i].key, i).first->second;
      if (slot.first != i) {
        if (slot.fingerprint != slots[slot.first].fingerprint) {
          slot.result = result_type::because(
              Status::conflict,
              "this key came twice in one batch with different requests; the key derivation "
              "is not stable or two events share a key");
          slot.first = i;
        }
        continue;
      }
      if (auto hit = cache_.get(messages[i].key))
        slot.result = answer_cached(*hit, slot.fingerprint);
      else
        pending.push_back(i);
    }

    const std::vector<Reservation> reservations = reserve_all(messages, pending, slots);
    // Every lease this batch holds: kept alive while the downstream is called one event after
    // another, and given back if the batch cannot finish (a store failure must not leave them
    // live, or the redeliveries would be answered "in flight" and acked while nobody works).
    std::vector<HeldLease> held;
    for (std::size_t p = 0; p < pending.size(); ++p)
      if (reservations[p].kind != Reservation::Kind::existing)
        held.push_back({messages[pending[p]].key, reservations[p].fence});
    detail::LeaseKeeper<Store> keeper(store_, options_.lease);
    keeper.hold(held);
    std::unordered_map<Key, LeaseTicket, KeyHash> tickets;
    for (const HeldLease& h : held) tickets.try_emplace(h.key, heartbeat_, h.key, h.fence);
    try {
      std::vector<BatchCommit> commits;
      for (std::size_t p = 0; p < pending.size(); ++p) {
        const std::size_t i = pending[p];
        const Reservation& r = reservations[p];
        const Key& key = messages[i].key;
        BatchSlot& slot = slots[i];
        if (r.kind == Reservation::Kind::existing) {
          remember(key, slot.fingerprint, r);
          slot.result = answer_existing(r);
          continue;
        }
        keeper.keep_alive();
        if (r.kind == Reservation::Kind::taken_over &&
            r.fence > static_cast<std::int64_t>(options_.max_attempts)) {
          if (auto given_up = give_up_at_the_door(key, r.fence)) {
            slot.result = std::move(*given_up);
            keeper.drop(key);
            continue;
          }
        }
        if constexpr (!Downstream::honours_idempotency_key) {
          slot.result = start(key, messages[i].request, slot.fingerprint, r);
          keeper.drop(key);
        } else {
          const ClaimResult<outcome_type> answer = claim(key, messages[i].request);
          if (answer.ok()) {
            commits.push_back(
                {i, r.fence, r.kind == Reservation::Kind::taken_over, answer.outcome(), {}});
          } else {
            slot.result = finish(key, r.fence, messages[i].request, answer);
            keeper.drop(key);
          }
        }
      }
      keeper.keep_alive();
      commit_all(messages, slots, commits, keeper);
      for (auto& [key, ticket] : tickets) {
        std::optional<result_type>& result = slots[seen.at(key)].result;
        const std::string trouble = ticket.drop();
        if (result) result = vouch(std::move(*result), trouble);
      }
    } catch (...) {
      give_back(held);
      throw;
    }

    std::vector<BatchItem<outcome_type>> items;
    items.reserve(n);
    const auto took = std::chrono::steady_clock::now() - started;
    for (std::size_t i = 0; i < n; ++i) {
      result_type result = *slots[slots[i].first].result;
      if (slots[i].first != i && result.has_outcome())
        result = result_type::with(Status::duplicate, result.outcome());
      observer_.on_result(messages[i].key, result.status(), took / static_cast<long>(n));
      items.push_back({messages[i].message_id, std::move(result)});
    }
    return BatchResult<outcome_type>(std::move(items));
  }

  // --- The last steps of `process`, public for the reconciler (which finishes a stranded event
  // under the fence its pass took) and for tests that play a worker resuming late. An
  // application calls `process`, `process_batch` or `resolve` instead. ---

  /// Stores the downstream's answer under a fence this caller holds: commits an outcome with the
  /// business write, stores a permanent failure, or releases the key after a transient one.
  /// `process` and the reconciler both end here. For the reconciler; applications call `process`.
  result_type finish(const Key& key, std::int64_t fence, const request_type& request,
                     const ClaimResult<outcome_type>& answer) {
    if (answer.ok()) return commit(key, fence, request, answer.outcome());
    if (answer.permanent()) {
      std::string reason(answer.reason());
      if (store_.fail(key, fence, reason) == CommitStatus::lost_lease) return lost_lease_result();
      return result_type::because(Status::failed, std::move(reason));
    }
    heartbeat_.give_up(key, fence);
    detail::release_with_reason(store_, key, fence, answer.reason(), backoff(fence));
    return result_type::because(Status::retry, std::string(answer.reason()));
  }

  /// How long the key is held after attempt `attempt` failed for now: `retry_backoff` doubled
  /// per attempt before it, at most `max_retry_backoff`.
  [[nodiscard]] std::chrono::milliseconds backoff(std::int64_t attempt) const {
    std::chrono::milliseconds hold = options_.retry_backoff;
    for (std::int64_t i = 1; i < attempt && hold < options_.max_retry_backoff; ++i) hold *= 2;
    return std::min(hold, options_.max_retry_backoff);
  }

  /// Commits `outcome` and the business write under `fence` in one transaction. When the business
  /// write throws, nothing is committed, the lease is ended at once (the redelivery takes the
  /// event over) and the exception is rethrown. For the reconciler; applications call `process`.
  result_type commit(const Key& key, std::int64_t fence, const request_type& request,
                     const outcome_type& outcome) {
    std::string outcome_bytes;
    codec<outcome_type>::encode(outcome, outcome_bytes);
    const CommitStatus status = commit_or_release(key, fence, request, outcome, outcome_bytes);
    if (status == CommitStatus::lost_lease) {
      note_mismatch(key, outcome_bytes, "lost_lease");
      return lost_lease_result();
    }
    return result_type::with(Status::processed, outcome);
  }

  /// Runs the business write inside `tx` (the store's commit or resolve transaction). For the
  /// stores' commit callbacks; applications call `process`.
  void apply(typename Store::transaction& tx, const Key& key, const request_type& request,
             const outcome_type& outcome) {
    if constexpr (bulk_writes) {
      const committed_event event{key, request, outcome};
      std::invoke(apply_, tx, std::span<const committed_event>(&event, 1));
    } else if constexpr (std::invocable<Apply&, typename Store::transaction&, const Key&,
                                        const request_type&, const outcome_type&>)
      std::invoke(apply_, tx, key, request, outcome);
    else
      std::invoke(apply_, tx, request, outcome);
  }

  // --- The manual queue. ---

  /// Up to `limit` escalated events, oldest first: the manual queue.
  std::vector<Record> escalated(std::size_t limit = 100) { return store_.escalated(limit); }

  /// Resolves an escalated event by hand with `outcome`: commits it with the business write in
  /// one transaction. False when the event is not escalated (unknown, or resolved already).
  bool resolve(const Key& key, const outcome_type& outcome) {
    const std::optional<Record> row = store_.find(key);
    if (!row || row->status != RecordStatus::escalated) return false;
    std::optional<request_type> request;
    try {
      request.emplace(decode_request(row->request));
    } catch (const std::exception& e) {
      throw CodecError(std::string("idemgate: the stored request of escalated key ") + key.hex() +
                       " no longer decodes (" + e.what() +
                       "); resolve it with Gate::resolve_stored, whose business write gets the "
                       "stored bytes as they are");
    }
    std::string outcome_bytes;
    codec<outcome_type>::encode(outcome, outcome_bytes);
    return store_.resolve(key, outcome_bytes, [&](typename Store::transaction& tx) {
      apply(tx, key, *request, outcome);
    });
  }

  /// Resolves an escalated event by hand when its stored request no longer decodes (the codec
  /// changed since it was stored): commits `outcome` with `write(tx, key, stored_request_bytes,
  /// outcome)` in one transaction. False when the event is not escalated.
  template <class StoredWrite>
  requires std::invocable<StoredWrite&, typename Store::transaction&, const Key&, std::string_view,
                          const outcome_type&>
  bool resolve_stored(const Key& key, const outcome_type& outcome, StoredWrite&& write) {
    const std::optional<Record> row = store_.find(key);
    if (!row || row->status != RecordStatus::escalated) return false;
    std::string outcome_bytes;
    codec<outcome_type>::encode(outcome, outcome_bytes);
    return store_.resolve(key, outcome_bytes, [&](typename Store::transaction& tx) {
      std::invoke(write, tx, key, std::string_view(row->request), outcome);
    });
  }

  /// Encodes a request as the store keeps it; throws `RequestError` when it cannot.
  [[nodiscard]] std::string encode_request(const request_type& request) const {
    return detail::encode_request(request, options_.max_request_bytes,
                                  "GateOptions::max_request_bytes");
  }

  /// Decodes a stored request; throws `CodecError` when the bytes do not decode.
  [[nodiscard]] request_type decode_request(std::string_view bytes) const {
    return codec<request_type>::decode(bytes);
  }

  // --- Stopping. ---

  /**
   * Stops the gate for a graceful shutdown: from now on `process` and `process_batch` reserve
   * nothing and answer `retry` (do not ack); the calls in progress get up to `grace` to finish;
   * then the heartbeat stops and the leases of the calls still running are given back (fenced
   * release), so a redelivery takes their events over at once instead of after the lease. A call
   * still running keeps going: its fenced commit lands if nobody took the event over yet, and
   * otherwise it answers `retry`. Safe to call from any thread, more than once; never from a
   * signal handler: `StopSignal` and `stop_gracefully` in <idemgate/shutdown.hpp> hook SIGTERM
   * and stop the gate with its background workers (an example is there).
   */
  StopReport stop(std::chrono::milliseconds grace) {
    begin_stop();
    StopReport report;
    {
      std::unique_lock lock(calls_mutex_);
      report.running = running_at_stop_;
      calls_idle_.wait_until(lock, detail::saturating_add(std::chrono::steady_clock::now(), grace),
                             [this] { return active_calls_ == 0; });
      report.unfinished = active_calls_;
    }
    for (const HeldLease& h : heartbeat_.stop()) {
      try {
        if (detail::release_with_reason(store_, h.key, h.fence,
                                        "the consumer stopped before this attempt finished; the "
                                        "redelivery takes the event over"))
          ++report.given_back;
      } catch (...) {
        ++report.not_given_back;
      }
    }
    return report;
  }

  /// The first half of `stop`: from now on `process` and `process_batch` reserve nothing and
  /// answer `retry`; the calls in progress go on. Returns at once.
  void begin_stop() {
    std::lock_guard lock(calls_mutex_);
    if (!stopping_) running_at_stop_ = active_calls_;
    stopping_ = true;
  }

  /// True once `stop()` began: `process` answers `retry` without reserving anything.
  [[nodiscard]] bool stopping() const {
    std::lock_guard lock(calls_mutex_);
    return stopping_;
  }

  /// Gives back a lease this caller holds (fenced), after making sure the heartbeat no longer
  /// renews it. For the reconciler; applications call `process`.
  bool release_lease(const Key& key, std::int64_t fence, std::string_view reason) {
    heartbeat_.give_up(key, fence);
    return detail::release_with_reason(store_, key, fence, reason);
  }

  /// The heartbeat that keeps this gate's leases alive. For the reconciler, which keeps the rows
  /// of its pass alive with it; applications call `process`.
  [[nodiscard]] detail::Heartbeat<Store>& heartbeat() noexcept { return heartbeat_; }

  /// The gate's name.
  [[nodiscard]] const GateName& name() const noexcept { return name_; }
  /// The gate's handle on its store: it sees only this gate's rows.
  [[nodiscard]] Store& store() noexcept { return store_; }
  /// The downstream.
  [[nodiscard]] Downstream& downstream() noexcept { return downstream_; }
  /// The options.
  [[nodiscard]] const GateOptions& options() const noexcept { return options_; }

 private:
  result_type process_labelled(const Key& key, const request_type& request,
                               std::string_view label) {
    const auto started = std::chrono::steady_clock::now();
    Call call(*this);
    result_type result = call.admitted() ? process_once(key, request, label) : stopped_result();
    observer_.on_result(key, result.status(), std::chrono::steady_clock::now() - started);
    return result;
  }

  result_type process_once(const Key& key, const request_type& request, std::string_view label) {
    const std::string bytes = encode_request(request);
    const Fingerprint fingerprint = detail::sha256(bytes);
    if (auto hit = cache_.get(key)) return answer_cached(*hit, fingerprint);
    const Reservation reservation = reserve(key, fingerprint, bytes, label);
    if (reservation.kind == Reservation::Kind::existing) {
      remember(key, fingerprint, reservation);
      return answer_existing(reservation);
    }
    return start(key, request, fingerprint, reservation);
  }

  // Acquired or taken over: call the downstream (or escalate), then store its answer.
  result_type start(const Key& key, const request_type& request, const Fingerprint& fingerprint,
                    const Reservation& reservation) {
    const bool took_over = reservation.kind == Reservation::Kind::taken_over;
    // A takeover past the last attempt allowed calls nothing: the event goes to a human. The
    // fence counts attempts (it starts at 1 and every takeover moves it on); the row's own
    // count decides and is what the reason says.
    if (took_over && reservation.fence > static_cast<std::int64_t>(options_.max_attempts)) {
      if (auto given_up = give_up_at_the_door(key, reservation.fence)) return *given_up;
    }
    if constexpr (!Downstream::honours_idempotency_key) {
      const CommitStatus parked = store_.escalate(key, reservation.fence, no_key_support_reason());
      if (parked == CommitStatus::lost_lease) return lost_lease_result();
      return result_type::because(Status::escalated, no_key_support_reason())
          .set_took_over(took_over);
    } else {
      LeaseTicket ticket(heartbeat_, key, reservation.fence);
      if (!ticket) {
        // The gate stopped between the admission and the reservation: hand the event on at once.
        give_back_one(key, reservation.fence, "the consumer stopped before calling the downstream");
        return stopped_result().set_took_over(took_over);
      }
      result_type result = finish(key, reservation.fence, request, claim(key, request));
      result = vouch(std::move(result), ticket.drop());
      if (result.status() == Status::processed) remember(key, fingerprint, result.outcome());
      return result.set_took_over(took_over);
    }
  }

  // Escalates an event whose attempts are used up, with the last one's error; none when the
  // row's own count allows one more attempt (a row whose fence ran ahead of its attempts).
  std::optional<result_type> give_up_at_the_door(const Key& key, std::int64_t fence) {
    const std::optional<Record> row = store_.find(key);
    if (!row || row->attempts <= static_cast<std::int64_t>(options_.max_attempts))
      return std::nullopt;
    std::string reason = detail::gave_up_reason(row->attempts - 1, options_.max_attempts,
                                                "GateOptions::max_attempts", row->reason);
    if (store_.escalate(key, fence, reason) == CommitStatus::lost_lease)
      return lost_lease_result().set_took_over(true);
    return result_type::because(Status::escalated, std::move(reason)).set_took_over(true);
  }

  // One call in progress, counted so `stop` can wait for it; refused once the gate stops.
  class Call {
   public:
    explicit Call(Gate& gate) : gate_(gate) {
      std::lock_guard lock(gate_.calls_mutex_);
      admitted_ = !gate_.stopping_;
      if (admitted_) ++gate_.active_calls_;
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    ~Call() {
      if (!admitted_) return;
      std::lock_guard lock(gate_.calls_mutex_);
      --gate_.active_calls_;
      gate_.calls_idle_.notify_all();
    }
    [[nodiscard]] bool admitted() const noexcept { return admitted_; }

   private:
    Gate& gate_;
    bool admitted_ = false;
  };

  // A lease the heartbeat keeps alive until dropped (at the latest when this goes away).
  class LeaseTicket {
   public:
    LeaseTicket(detail::Heartbeat<Store>& heartbeat, const Key& key, std::int64_t fence)
        : heartbeat_(heartbeat), ticket_(heartbeat.hold(key, fence)) {}
    LeaseTicket(const LeaseTicket&) = delete;
    LeaseTicket& operator=(const LeaseTicket&) = delete;
    ~LeaseTicket() { (void)drop(); }
    // False when the heartbeat refused it: the gate is stopping.
    explicit operator bool() const noexcept { return ticket_ != 0; }
    // Stops renewing; why the lease may have been lost meanwhile, or empty.
    std::string drop() {
      return ticket_ == 0 ? std::string() : heartbeat_.drop(std::exchange(ticket_, 0));
    }

   private:
    detail::Heartbeat<Store>& heartbeat_;
    std::uint64_t ticket_;
  };

  // A worker whose heartbeat lost its lease does not ack an event its commit could not settle:
  // `lost_lease` becomes `retry`, and the redelivery is answered from the log.
  static result_type vouch(result_type result, const std::string& trouble) {
    if (trouble.empty() || result.status() != Status::lost_lease) return result;
    return result_type::because(
               Status::retry,
               "this worker lost its lease while it worked (" + trouble +
                   "); its commit was refused. Do not ack: the redelivery is answered from the "
                   "log, where another attempt holds or finished the event")
        .set_took_over(result.took_over());
  }

  static result_type stopped_result() {
    return result_type::because(
        Status::retry,
        "the gate is stopping: nothing was reserved. Do not ack: another consumer takes the "
        "message");
  }

  struct CachedOutcome {
    Fingerprint fingerprint;
    std::string result;
  };

  result_type answer_cached(const CachedOutcome& hit, const Fingerprint& fingerprint) const {
    Reservation found = Reservation::existing(0, RecordStatus::committed,
                                              hit.fingerprint == fingerprint, hit.result);
    return answer_existing(found);
  }

  void remember(const Key& key, const Fingerprint& fingerprint, const Reservation& found) {
    if (options_.cache_capacity > 0 && found.status == RecordStatus::committed &&
        found.same_request)
      cache_.put(key, {fingerprint, found.result});
  }

  void remember(const Key& key, const Fingerprint& fingerprint, const outcome_type& outcome) {
    if (options_.cache_capacity == 0) return;
    std::string bytes;
    codec<outcome_type>::encode(outcome, bytes);
    cache_.put(key, {fingerprint, std::move(bytes)});
  }

  // One message of a batch as `process_batch` works through it.
  struct BatchSlot {
    // The request's canonical bytes and their SHA-256.
    std::string bytes;
    Fingerprint fingerprint{};
    // The message that answers for this one: itself, or the batch's first message of its key.
    std::size_t first = 0;
    // Its answer, once known.
    std::optional<result_type> result;
  };

  // One event of a batch whose downstream gave an outcome to commit under the fence it holds.
  struct BatchCommit {
    // The event's message, by position in the batch.
    std::size_t index = 0;
    std::int64_t fence = 0;
    bool took_over = false;
    outcome_type outcome;
    // The outcome's bytes, encoded by `commit_all`.
    std::string outcome_bytes;
  };

  // Whether the store reserves many keys in one statement (`reserve_batch`).
  static constexpr bool reserves_in_batches =
      requires(Store & store, std::span<const ReserveItem> items, std::chrono::milliseconds lease) {
    store.reserve_batch(items, lease);
  };

  std::vector<Reservation> reserve_all(std::span<const BatchMessage<request_type>> messages,
                                       const std::vector<std::size_t>& pending,
                                       const std::vector<BatchSlot>& slots) {
    if constexpr (reserves_in_batches) {
      std::vector<ReserveItem> items;
      items.reserve(pending.size());
      for (std::size_t i : pending)
        items.push_back(
            {messages[i].key, slots[i].fingerprint, slots[i].bytes, label_of(messages[i])});
      if (!items.empty()) return store_.reserve_batch(items, options_.lease);
      return {};
    } else {
      std::vector<Reservation> reservations;
      for (std::size_t i : pending)
        reservations.push_back(reserve_one(messages[i].key, slots[i].fingerprint, slots[i].bytes,
                                           label_of(messages[i])));
      return reservations;
    }
  }

  // The label a batch message's new row keeps: its own when the gate keeps labels, else none.
  std::string_view label_of(const BatchMessage<request_type>& message) const noexcept {
    if constexpr (labelling_store<Store>) {
      if (options_.keep_labels) return message.label;
    }
    return {};
  }

  void commit_all(std::span<const BatchMessage<request_type>> messages,
                  std::vector<BatchSlot>& slots, std::vector<BatchCommit>& commits,
                  detail::LeaseKeeper<Store>& keeper) {
    if (commits.empty()) return;
    auto settle_one = [&](const BatchCommit& c, CommitStatus status) {
      std::optional<result_type>& result = slots[c.index].result;
      if (status == CommitStatus::committed) {
        remember(messages[c.index].key, slots[c.index].fingerprint, c.outcome);
        result = result_type::with(Status::processed, c.outcome);
      } else {
        note_mismatch(messages[c.index].key, c.outcome_bytes, "lost_lease");
        result = lost_lease_result();
      }
      if (c.took_over) result->set_took_over();
    };
    for (BatchCommit& c : commits) codec<outcome_type>::encode(c.outcome, c.outcome_bytes);
    // Gives every lease back and answers `retry` for each: a business write broke the store's
    // transaction, so nothing may run again item by item (its statements after the break may have
    // run outside the transaction). The redeliveries take the events over at once.
    auto give_all_back = [&](const BusinessWriteError& e) {
      for (const BatchCommit& c : commits) {
        give_back_one(messages[c.index].key, c.fence, e.what());
        slots[c.index].result = result_type::because(Status::retry, e.what());
      }
    };
    if constexpr (bulk_writes && requires(std::span<const CommitItem> items) {
                    store_.commit_bulk(items, [](typename Store::transaction&) {});
                  }) {
      if (commits.size() > 1) {
        std::vector<CommitItem> items;
        std::vector<committed_event> events;
        items.reserve(commits.size());
        events.reserve(commits.size());
        for (const BatchCommit& c : commits) {
          items.push_back({messages[c.index].key, c.fence, c.outcome_bytes});
          events.push_back({messages[c.index].key, messages[c.index].request, c.outcome});
        }
        std::optional<std::vector<CommitStatus>> statuses;
        try {
          // One call of the bulk write and one fenced update for the whole batch; when a fence
          // moved or the write threw, nothing was written and the items go one by one below.
          statuses = store_.commit_bulk(items, [&](typename Store::transaction& tx) {
            std::invoke(apply_, tx, std::span<const committed_event>(events));
          });
        } catch (const BusinessWriteError& e) {
          give_all_back(e);
          return;
        }
        if (statuses) {
          for (std::size_t k = 0; k < commits.size(); ++k) settle_one(commits[k], (*statuses)[k]);
          return;
        }
      }
    } else if constexpr (requires(std::span<const CommitItem> items) {
                           store_.commit_batch(items,
                                               [](typename Store::transaction&, std::size_t) {});
                         }) {
      std::vector<CommitItem> items;
      items.reserve(commits.size());
      for (const BatchCommit& c : commits)
        items.push_back({messages[c.index].key, c.fence, c.outcome_bytes});
      std::optional<std::vector<CommitStatus>> statuses;
      try {
        statuses = store_.commit_batch(items, [&](typename Store::transaction& tx, std::size_t k) {
          const BatchCommit& c = commits[k];
          apply(tx, messages[c.index].key, messages[c.index].request, c.outcome);
        });
      } catch (const BusinessWriteError& e) {
        give_all_back(e);
        return;
      }
      if (statuses) {
        for (std::size_t k = 0; k < commits.size(); ++k) settle_one(commits[k], (*statuses)[k]);
        return;
      }
    }
    // One by one: a refused business write costs only its own message.
    for (const BatchCommit& c : commits) {
      const Key& key = messages[c.index].key;
      keeper.keep_alive();
      keeper.drop(key);  // from here on, its commit decides (and may give it back)
      try {
        settle_one(c, commit_or_release(key, c.fence, messages[c.index].request, c.outcome,
                                        c.outcome_bytes));
      } catch (const std::exception& e) {
        slots[c.index].result = result_type::because(
            Status::retry, std::string("the commit failed: ") + e.what() +
                               "; the event's lease was ended for the redelivery");
      }
    }
  }

  // Commits with the business write; when that throws, ends the lease at once (so the
  // redelivery, which the caller's exception or `retry` asks for, takes the event over instead
  // of meeting a live lease) and rethrows.
  CommitStatus commit_or_release(const Key& key, std::int64_t fence, const request_type& request,
                                 const outcome_type& outcome, const std::string& outcome_bytes) {
    try {
      if (commit_group_)
        return commit_group_->submit({key, fence, outcome_bytes, &request, &outcome});
      return store_.commit(key, fence, outcome_bytes, [&](typename Store::transaction& tx) {
        apply(tx, key, request, outcome);
      });
    } catch (const std::exception& e) {
      give_back_one(key, fence, std::string("the commit failed: ") + e.what());
      throw;
    } catch (...) {
      give_back_one(key, fence, "the commit failed with an unknown exception");
      throw;
    }
  }

  // Ends a lease this caller holds, keeping `reason` where the store can; best effort: when the
  // store is down, the lease runs out by itself and the reconciler takes over.
  void give_back_one(const Key& key, std::int64_t fence, const std::string& reason) noexcept {
    try {
      release_lease(key, fence, reason);
    } catch (...) {
    }
  }

  void give_back(const std::vector<HeldLease>& held) noexcept {
    for (const HeldLease& h : held)
      give_back_one(h.key, h.fence, "the batch could not finish: the store failed");
  }

  // --- Group commit (GateOptions::coalesce). ---

  // One reservation waiting for its group.
  struct ReserveJob {
    Key key;
    const Fingerprint* fingerprint = nullptr;
    std::string_view request;
    std::string_view label;
  };

  // One commit waiting for its group; the pointers are its caller's, which waits meanwhile.
  struct CommitJob {
    Key key;
    std::int64_t fence = 0;
    std::string_view outcome_bytes;
    const request_type* request = nullptr;
    const outcome_type* outcome = nullptr;
  };

  using ReserveGroup = detail::Coalescer<ReserveJob, Reservation>;
  using CommitGroup = detail::Coalescer<CommitJob, CommitStatus>;

  void start_coalescing() {
    const Coalescing& c = options_.coalesce;
    detail::require_in_range("GateOptions::coalesce.window", c.window, std::chrono::microseconds(0),
                             std::chrono::microseconds(std::chrono::seconds(1)),
                             "It is added to a lone delivery's latency; 0 (the default) groups "
                             "only the calls that arrive while a group runs.");
    detail::require_in_range("GateOptions::coalesce.max_events", c.max_events, std::size_t{1},
                             std::size_t{64},
                             "Each event of a commit group is a savepoint; PostgreSQL keeps 64 "
                             "per transaction in shared memory (default 32).");
    detail::require_in_range("GateOptions::coalesce.concurrent_groups", c.concurrent_groups,
                             std::size_t{1}, std::size_t{64},
                             "Each running group holds one connection of the store's pool "
                             "(default 1).");
    const detail::CoalescerLimits limits{c.window, c.max_events, c.concurrent_groups};
    reserve_group_ = std::make_unique<ReserveGroup>(
        limits, [this](std::span<typename ReserveGroup::Slot* const> g) { run_reservations(g); });
    commit_group_ = std::make_unique<CommitGroup>(
        limits, [this](std::span<typename CommitGroup::Slot* const> g) { run_commits(g); });
  }

  // `label` is empty unless the gate keeps labels on a store that keeps them.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view bytes,
                      std::string_view label) {
    if (reserve_group_) return reserve_group_->submit({key, &fingerprint, bytes, label});
    return reserve_one(key, fingerprint, bytes, label);
  }

  Reservation reserve_one(const Key& key, const Fingerprint& fingerprint, std::string_view bytes,
                          std::string_view label) {
    if constexpr (labelling_store<Store>) {
      if (!label.empty()) return store_.reserve(key, fingerprint, bytes, options_.lease, label);
    }
    return store_.reserve(key, fingerprint, bytes, options_.lease);
  }

  // A group of reservations in one statement where the store can; alone, or on a store without
  // `reserve_batch`, one by one, each answered or failed on its own.
  void run_reservations(std::span<typename ReserveGroup::Slot* const> group) {
    if constexpr (reserves_in_batches) {
      if (group.size() > 1) {
        std::vector<ReserveItem> items;
        items.reserve(group.size());
        for (const auto* slot : group)
          items.push_back(
              {slot->item.key, *slot->item.fingerprint, slot->item.request, slot->item.label});
        std::vector<Reservation> reservations = store_.reserve_batch(items, options_.lease);
        for (std::size_t i = 0; i < group.size(); ++i)
          group[i]->answer = std::move(reservations.at(i));
        return;
      }
    }
    for (auto* slot : group) {
      const ReserveJob& job = slot->item;
      try {
        slot->answer = reserve_one(job.key, *job.fingerprint, job.request, job.label);
      } catch (...) {
        slot->error = std::current_exception();
      }
    }
  }

  // A group of commits in one transaction, each under its own savepoint, where the store can;
  // alone, or on a store without `commit_each`, one by one.
  void run_commits(std::span<typename CommitGroup::Slot* const> group) {
    if constexpr (requires(std::span<const CommitItem> items) {
                    store_.commit_each(items, [](typename Store::transaction&, std::size_t) {});
                  }) {
      if (group.size() > 1) {
        std::vector<CommitItem> items;
        items.reserve(group.size());
        for (const auto* slot : group)
          items.push_back({slot->item.key, slot->item.fence, slot->item.outcome_bytes});
        const std::vector<ItemCommit> answers =
            store_.commit_each(items, [&](typename Store::transaction& tx, std::size_t i) {
              const CommitJob& job = group[i]->item;
              apply(tx, job.key, *job.request, *job.outcome);
            });
        for (std::size_t i = 0; i < group.size(); ++i) {
          if (answers.at(i).error)
            group[i]->error = answers[i].error;
          else
            group[i]->answer = answers[i].status;
        }
        return;
      }
    }
    for (auto* slot : group) {
      const CommitJob& job = slot->item;
      try {
        slot->answer = store_.commit(job.key, job.fence, job.outcome_bytes,
                                     [&](typename Store::transaction& tx) {
                                       apply(tx, job.key, *job.request, *job.outcome);
                                     });
      } catch (...) {
        slot->error = std::current_exception();
      }
    }
  }

  static NullObserver& null_observer() noexcept {
    static NullObserver none;
    return none;
  }

  // A worker that lost its lease holds an answer from the downstream: if the new holder
  // committed a different one, the downstream gave two results for one key.
  void note_mismatch(const Key& key, const std::string& observed, std::string_view source) {
    const std::optional<Record> row = store_.find(key);
    if (!row || row->status != RecordStatus::committed || !row->result || *row->result == observed)
      return;
    if constexpr (monitored_store<Store>)
      store_.record_mismatch(key, *row->result, observed, source);
    observer_.on_mismatch(key, *row->result, observed);
  }

  ClaimResult<outcome_type> claim(const Key& key, const request_type& request) {
    try {
      return downstream_.claim(request, key);
    } catch (const std::exception& e) {
      // The downstream honours the key, so a later claim under it cannot double the effect.
      return TransientFailure{std::string("the downstream threw: ") + e.what()};
    }
  }

  result_type answer_existing(const Reservation& found) const {
    return detail::answer_existing<outcome_type>(found);
  }

  static result_type lost_lease_result() {
    return result_type::because(
        Status::lost_lease,
        "this worker's lease was taken over; its commit was rolled back and the "
        "new holder finishes the event");
  }

  static std::string no_key_support_reason() {
    return "the downstream does not honour Idempotency-Key, so a retry could double the side "
           "effect; a human must finish this event";
  }

  GateName name_;
  Store store_;  // scoped to name_
  Downstream& downstream_;
  Apply apply_;
  GateOptions options_;
  Observer& observer_;
  detail::LruCache<Key, CachedOutcome, KeyHash> cache_;
  mutable std::mutex calls_mutex_;  // guards stopping_ and active_calls_
  std::condition_variable calls_idle_;
  bool stopping_ = false;
  std::size_t active_calls_ = 0;
  std::size_t running_at_stop_ = 0;
  // Group commit, when on.
  std::unique_ptr<ReserveGroup> reserve_group_;
  std::unique_ptr<CommitGroup> commit_group_;
  // Last: its thread stops first when the gate goes away.
  detail::Heartbeat<Store> heartbeat_;
};

/// Deduces a gate without an observer.
template <class Store, class Downstream, class Apply>
Gate(GateName, Store&, Downstream&, Apply, GateOptions = {}) -> Gate<Store, Downstream, Apply>;

/// Deduces a gate with an observer.
template <class Store, class Downstream, class Apply, class Observer>
Gate(GateName, Store&, Downstream&, Apply, GateOptions, Observer&)
    -> Gate<Store, Downstream, Apply, Observer>;

}  // namespace idemgate
