// SPDX-License-Identifier: MIT
// What stores, downstreams, business writes and observers must provide, as concepts.
#pragma once

#include "batch.hpp"
#include "codec.hpp"
#include "gate_name.hpp"
#include "key.hpp"
#include "outcome.hpp"
#include "record.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate {

namespace detail {
/// Stands in for a business write when checking a store's commit signature.
template <class Transaction>
struct BusinessWriteProbe {
  void operator()(Transaction&) const {}
};
}  // namespace detail

/**
 * Concept: a durable idempotency log with one atomic reservation and fenced commits.
 *
 * A store object is a handle on a log scoped to one gate: `for_gate(name)` returns a handle on
 * the same log (sharing its connections) that sees only the rows of gate `name`, and `gate()`
 * names the scope ("" for rows that belong to no gate: the scope of a handle never scoped, and
 * of rows written before logs knew their gates). Every operation of a handle reads and writes
 * only its own gate's rows, so two gates may hold the same key.
 *
 * `reserve` inserts the key as in flight in one atomic statement, or reports what the store
 * already holds; an in-flight row whose lease has expired is taken over with a fence bump.
 * `commit` runs the caller's business write and the fenced status change in one transaction:
 * when the fence no longer matches, nothing is written. See `docs/stores.md` to write your own;
 * the conformance suite in `testing/store_conformance.hpp` is what a correct store passes.
 */
template <class S>
concept store = std::copy_constructible<S> &&
    requires(S& s, const S& cs, const GateName& name, const Key& key,
             const Fingerprint& fingerprint, std::string_view bytes,
             std::chrono::milliseconds duration, std::int64_t fence, std::size_t limit,
             detail::BusinessWriteProbe<typename S::transaction> write) {
  typename S::transaction;
  { s.for_gate(name) } -> std::same_as<S>;
  { cs.gate() } -> std::convertible_to<std::string_view>;
  { s.reserve(key, fingerprint, bytes, duration) } -> std::same_as<Reservation>;
  { s.commit(key, fence, bytes, write) } -> std::same_as<CommitStatus>;
  { s.fail(key, fence, bytes) } -> std::same_as<CommitStatus>;
  { s.release(key, fence) } -> std::same_as<bool>;
  { s.escalate(key, fence, bytes) } -> std::same_as<CommitStatus>;
  { s.find(key) } -> std::same_as<std::optional<Record>>;
  { s.take_stale(limit, duration, duration) } -> std::same_as<std::vector<Stranded>>;
  { s.escalated(limit) } -> std::same_as<std::vector<Record>>;
  { s.resolve(key, bytes, write) } -> std::same_as<bool>;
};

/// Concept: a store that runs one event as one transaction (`commit_once`): the reservation, the
/// business write and the committed row together, for `TransactionGate`.
template <class S>
concept one_transaction_store = store<S> &&
    requires(S& s, const Key& key, const Fingerprint& fingerprint, std::string_view bytes,
             std::chrono::milliseconds wait, std::string (*produce)(typename S::transaction&)) {
  { s.commit_once(key, fingerprint, bytes, bytes, wait, produce) } -> std::same_as<OnceResult>;
};

/// Concept: a store that keeps why an attempt gave its event back (`release` with a reason); the
/// reconciler shows that reason when it gives up on the event.
template <class S>
concept explaining_store = store<S> &&
    requires(S& s, const Key& key, std::int64_t fence, std::string_view reason) {
  { s.release(key, fence, reason) } -> std::same_as<bool>;
};

/// Concept: a store that can hold a released key for a back-off (`release` with a reason and a
/// hold): the next attempt may take the key over only once the hold ends, and a redelivery
/// meanwhile finds it held (`Reservation::held`; `GateOptions::retry_backoff`).
template <class S>
concept backing_off_store = explaining_store<S> &&
    requires(S& s, const Key& key, std::int64_t fence, std::string_view reason,
             std::chrono::milliseconds hold) {
  { s.release(key, fence, reason, hold) } -> std::same_as<bool>;
};

/// Concept: a store that extends leases a caller still holds, in one call (long batches and
/// reconciler passes keep their leases with it). Returns how many leases were extended.
template <class S>
concept lease_extending_store = store<S> &&
    requires(S& s, std::span<const HeldLease> held, std::chrono::milliseconds lease) {
  { s.extend(held, lease) } -> std::same_as<std::size_t>;
};

/// Concept: a store that renews held leases in one call and says, per lease, whether it was
/// extended, its fence is gone, or its row was busy (locked by another transaction: a renewal
/// never waits behind a commit's row locks). The gate's heartbeat uses it where a store has it;
/// otherwise it uses `extend`, and one `extend` per lease when fewer were extended than asked.
template <class S>
concept lease_renewing_store = lease_extending_store<S> &&
    requires(S& s, std::span<const HeldLease> held, std::chrono::milliseconds lease) {
  { s.renew(held, lease) } -> std::same_as<std::vector<LeaseRenewal>>;
};

/// Concept: a store whose failed events an operator can re-drive: the row goes back in flight
/// under a new fence with its lease ended, so the next delivery or the reconciler claims again
/// under the same key.
template <class S>
concept redrivable_store = store<S> &&
    requires(S& s, const Key& key, std::chrono::system_clock::time_point at, std::size_t limit) {
  { s.redrive_failed(key) } -> std::same_as<std::size_t>;
  { s.redrive_failed(at, at, limit) } -> std::same_as<std::size_t>;
};

/// Concept: a store that keeps a readable label with a row (`Record::label`): `reserve` with a
/// `label` writes it with a new row (a key already stored keeps its own). The gate passes one
/// only when asked (`GateOptions::keep_labels`, `Gate::process_labelled`).
template <class S>
concept labelling_store = store<S> &&
    requires(S& s, const Key& key, const Fingerprint& fingerprint, std::string_view bytes,
             std::chrono::milliseconds lease) {
  { s.reserve(key, fingerprint, bytes, lease, bytes) } -> std::same_as<Reservation>;
};

/**
 * Concept: a store an operator works with (the `idemgate` command, a console): rows listed and
 * counted by status, reason, label and time (`rows`, newest change first, at most
 * `RowQuery::limit`; `count`, the same filter without a limit), failed and escalated rows
 * grouped by cause (`causes`: the first line of their reasons, `cause_of`; most rows first), the
 * failed rows of one cause re-driven at once (`redrive_cause`: rows whose reason or cause is
 * exactly the text given, up to `limit`, as `redrive_failed` does), and the gates
 * that have rows in the log (`gates`, any handle, sorted; rows of no gate are not a gate). Every
 * call but `gates` sees only the handle's gate.
 */
template <class S>
concept operable_store = redrivable_store<S> &&
    requires(S& s, const RowQuery& query, std::string_view reason, std::size_t limit) {
  { s.rows(query) } -> std::same_as<std::vector<Record>>;
  { s.count(query) } -> std::same_as<std::int64_t>;
  { s.causes(limit) } -> std::same_as<std::vector<Cause>>;
  { s.redrive_cause(reason, limit) } -> std::same_as<std::size_t>;
  { s.gates() } -> std::same_as<std::vector<std::string>>;
};

/**
 * Concept: the side effect the gate protects (claim a slot, debit an account).
 *
 * `claim(request, key)` must send `key` along (as an `Idempotency-Key` header for HTTP).
 * `honours_idempotency_key` says whether the far side returns the original outcome for a key it
 * has seen: when false, the gate escalates instead of calling.
 */
template <class D>
concept downstream = codable<typename D::request_type> && codable<typename D::outcome_type> &&
    requires(D& d, const typename D::request_type& request, const Key& key) {
  { D::honours_idempotency_key } -> std::convertible_to<bool>;
  { d.claim(request, key) } -> std::same_as<ClaimResult<typename D::outcome_type>>;
};

/// Concept: a downstream that can say what it already holds under a key.
template <class D>
concept lookup_downstream = downstream<D> && requires(D& d, const Key& key) {
  { d.lookup(key) } -> std::same_as<LookupResult<typename D::outcome_type>>;
};

/// Concept: a bulk business write, which writes many events' rows in one statement: it takes
/// the transaction and a span of `CommittedEvent` (key, request, outcome). `process_batch` calls
/// it once for the events of a batch it commits together; every other path with one event.
template <class F, class S, class D>
concept bulk_business_write = std::invocable<
    F&, typename S::transaction&,
    std::span<const CommittedEvent<typename D::request_type, typename D::outcome_type>>>;

/// Concept: the caller's business write (a booking row, a ledger row), run inside the
/// store's transaction together with the outcome. Per event, it takes the transaction, optionally
/// the key (to record which event wrote the row), the request and the outcome; or it is a
/// `bulk_business_write`.
template <class F, class S, class D>
concept business_write =
    std::invocable<F&, typename S::transaction&, const typename D::request_type&,
                   const typename D::outcome_type&> ||
    std::invocable<F&, typename S::transaction&, const Key&, const typename D::request_type&,
                   const typename D::outcome_type&> || bulk_business_write<F, S, D>;

/**
 * Concept: a store that can report the signals and keep itself small.
 *
 * `signals(window)` reads the three signals; `record_mismatch` keeps a downstream answer that
 * differed from the stored one; `purge(older_than, batch)` deletes finished rows (committed or
 * failed, never in flight or escalated) that finished longer ago than `older_than`, `batch` rows
 * per statement, and returns how many it deleted.
 */
template <class S>
concept monitored_store = requires(S& s, std::chrono::seconds window, const Key& key,
                                   std::string_view bytes, std::size_t limit) {
  { s.signals(window) } -> std::same_as<StoreSignals>;
  s.record_mismatch(key, bytes, bytes, bytes);
  { s.mismatches(limit) } -> std::same_as<std::vector<Mismatch>>;
  { s.purge(window, limit) } -> std::same_as<std::size_t>;
};

/**
 * Concept: a store whose rows end even when their event never finished: `expire(key, lifetime)`
 * deletes one key's row when its life is over (committed or failed more than `lifetime` ago, or
 * in flight with its lease ended and untouched as long; never an escalated row or a live lease)
 * and says whether it did; `purge_abandoned(older_than, batch)` deletes the in-flight rows whose
 * lease ended and that nothing touched for `older_than`, `batch` per statement, and returns how
 * many. The server side's endpoint needs it; `Retention` uses it with `abandoned_after`.
 */
template <class S>
concept expiring_store = monitored_store<S> &&
    requires(S& s, std::chrono::seconds lifetime, const Key& key, std::size_t limit) {
  { s.expire(key, lifetime) } -> std::same_as<bool>;
  { s.purge_abandoned(lifetime, limit) } -> std::same_as<std::size_t>;
};

/**
 * Concept: what the gate and the reconciler tell an observer, so users feed their own metrics
 * and logs without the library choosing a dependency. Called on the worker's thread; keep it
 * cheap and thread-safe.
 */
template <class O>
concept observer = requires(O& o, const Key& key, Status status, std::chrono::nanoseconds took,
                            std::string_view bytes) {
  o.on_result(key, status, took);
  o.on_reconciled(key, status);
  o.on_mismatch(key, bytes, bytes);
};

/// Where a store reads "now" from: leases, staleness and timestamps are measured with it.
/// Injectable so tests can expire leases without sleeping.
using WallClock = std::function<std::chrono::system_clock::time_point()>;

}  // namespace idemgate
