// SPDX-License-Identifier: MIT
// PostgresStore: the production store on PostgreSQL (libpqxx, idemgate::postgres). The class holds
// its API; its parts live in store/postgres/, one role each, and its SQL in store/postgres/sql/.
#pragma once

#include "../concepts.hpp"
#include "../detail/postgres/connection_pool.hpp"
#include "../gate_name.hpp"
#include "../record.hpp"
#include "../signals.hpp"
#include "log/migration.hpp"
#include "postgres/batches.hpp"
#include "postgres/business_write.hpp"
#include "postgres/events.hpp"
#include "postgres/generations.hpp"
#include "postgres/group_commit.hpp"
#include "postgres/leases.hpp"
#include "postgres/monitoring.hpp"
#include "postgres/operator.hpp"
#include "postgres/options.hpp"
#include "postgres/schema.hpp"
#include "postgres/session.hpp"
#include "postgres/sql/all.hpp"
#include "sql.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate {

/**
 * The production store: an idempotency log in PostgreSQL, through libpqxx.
 *
 * Thread-safe: it owns a fixed pool of `PostgresOptions::pool_size` connections, and every call
 * checks one out for the length of its statement or transaction, so N worker threads can share
 * one store over M connections. Broken connections are reopened on their next checkout.
 *
 * Durations given to its methods are clamped to ±1000 years (`detail::max_sql_duration`), so
 * PostgreSQL's interval arithmetic never overflows: `duration::max()` means forever.
 *
 * Example:
 *   idemgate::PostgresStore store{"postgresql://app@127.0.0.1/app", {.pool_size = 4}};
 *   store.migrate();
 */
class PostgresStore {
 public:
  /// The business write's transaction: write your business rows with it.
  using transaction = pqxx::work;

  /// Connects to `uri`, a URI (`postgresql://user@h1:5432,h2:5432/db?target_session_attrs=
  /// read-write` follows a failover) or key=value pairs. A string libpq cannot read throws
  /// `StoreError` here. The first connection is tried now; when the server cannot be reached the
  /// store says so in its log (`PostgresOptions::log`) and starts anyway: every call opens the
  /// connection it needs, and fails with `StoreError` (do not ack) until the server is back.
  explicit PostgresStore(std::string uri, PostgresOptions options = {})
      : session_(std::make_shared<detail::postgres::Session>(uri, std::move(options))) {}

  /// A handle on the same log and connections that sees only the rows of gate `name`.
  [[nodiscard]] PostgresStore for_gate(const GateName& name) const {
    return PostgresStore(session_, name.str());
  }
  /// The gate whose rows this handle sees ("" for rows that belong to no gate).
  [[nodiscard]] const std::string& gate() const noexcept { return gate_; }

  // --- The schema -------------------------------------------------------------------------------

  /// The log's schema for a table name as one script: the `<table>_migrations` table, then every
  /// numbered step (`migrations()`) with the record of it, each statement on its own (as psql runs
  /// a script: the indexes are built concurrently). Shipped as `docs/schema.sql`. With
  /// `partitioned`, step 6 (`generations`) follows: the log of `PostgresOptions::partitioned_log`.
  [[nodiscard]] static std::string schema_sql(const std::string& table = "idemgate_log",
                                              bool partitioned = false) {
    return detail::postgres::Schema::script(table, partitioned);
  }

  /// The numbered steps of the log's schema, oldest first, as data (`{log}` stands for the table).
  [[nodiscard]] static std::span<const sql::Migration> migrations() noexcept {
    return sql::postgres::migrations;
  }

  /// One of the store's statements (`idemgate::sql::postgres`) as it is sent for the log `table`.
  [[nodiscard]] static std::string statement_sql(const sql::Statement& statement,
                                                 const std::string& table = "idemgate_log") {
    return detail::postgres::Session::render_for(table, statement.text);
  }

  /**
   * Applies the numbered steps of the log's schema that it lacks, and records each in
   * `<table>_migrations`; creates the log when it is missing. A log made before versions were
   * recorded is recognised step by step: the steps it has are recorded as found, the rest
   * applied. Returns what it did. Idempotent and safe from several processes at once (they take
   * turns). Other sessions go on writing while it runs: the indexes are built concurrently, and no
   * statement holds a lock that blocks writers for longer than a catalog change
   * (docs/operations.md has the measured wait); a new log is made in one transaction. Behind a
   * transaction pooler (`PostgresPooling::transaction`) everything runs in one transaction
   * instead, which blocks writers while the indexes are built: migrate through a direct
   * connection there. When the server cannot be reached, it waits for it up to
   * `PostgresOptions::startup_wait`, trying again with backoff and logging each failure, then
   * throws `StoreError`: a consumer started during an outage migrates as soon as the database is
   * back.
   */
  MigrationReport migrate() { return schema().migrate(); }

  /// Gives this handle's gate the rows that belong to no gate (written before logs knew their
  /// gates), up to `limit` of them in statements of at most 10,000 rows, except keys this gate
  /// already holds; returns how many it moved. Throws `std::logic_error` on a handle scoped to
  /// no gate.
  std::size_t adopt_unowned_rows(std::size_t limit) { return schema().adopt_unowned_rows(limit); }

  // --- One event --------------------------------------------------------------------------------

  /// Inserts the key as in flight in one statement, takes over an expired lease with a fence
  /// bump, or reports what is stored.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    return events().reserve(key, fingerprint, request, lease, {});
  }

  /// Like `reserve`, and keeps `label` with a new row (a stored row keeps its own label).
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease, std::string_view label) {
    return events().reserve(key, fingerprint, request, lease, label);
  }

  /// Runs `business` and marks the key committed with `result`, in one transaction, only if
  /// `fence` still holds. A broken connection is retried on a fresh one (the fence makes a
  /// repeated commit a no-op once one attempt landed).
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    return events().commit(key, fence, result, std::forward<BusinessWrite>(business));
  }

  /**
   * Like `commit`, for a result that only the transaction can give: runs `produce(pqxx::work&)`
   * and stores the string it returns as the result, in the same transaction, only if `fence`
   * still holds. Whatever `produce` throws rolls everything back and propagates. A broken
   * connection is retried on a fresh one, where `produce` runs again (its first transaction did
   * not commit). The server side (`server/endpoint.hpp`) runs a request's handler this way.
   */
  template <class Produce>
  CommitStatus commit_computed(const Key& key, std::int64_t fence, Produce&& produce) {
    return events().commit_computed(key, fence, std::forward<Produce>(produce));
  }

  /**
   * One event in one transaction, for a side effect that is only the business write in this
   * database: reserves the key (the reservation statement), runs `produce(pqxx::work&)` and marks
   * the row committed with the string it returns, then commits once. No row is ever seen in
   * flight: a crash or a throw rolls everything back, key included. A concurrent transaction of
   * the same key waits on the uncommitted row up to `wait` (`SET LOCAL lock_timeout`, which bounds
   * the business write's lock waits too), then is answered `busy`; once it commits, the key is
   * `existing` with its stored outcome (a duplicate counted). A stranded in-flight row of the
   * same request is taken over in the same transaction. A broken connection is retried on a
   * fresh one (a COMMIT whose reply was lost is recognised as this call's own), a lost deadlock
   * runs the whole transaction again; what `produce` throws propagates. `TransactionGate` calls
   * it.
   */
  template <class Produce>
  OnceResult commit_once(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                         std::string_view label, std::chrono::milliseconds wait,
                         Produce&& produce) {
    return events().commit_once(key, fingerprint, request, label, wait,
                                std::forward<Produce>(produce));
  }

  /// Stores a permanent failure, only if `fence` still holds.
  CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    return events().settle(sql::postgres::fail, key, fence, reason, RecordStatus::failed);
  }

  /// Parks the key for a human, only if `fence` still holds.
  CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    return events().settle(sql::postgres::escalate, key, fence, reason, RecordStatus::escalated);
  }

  /// Gives back an in-flight reservation this caller holds after a transient failure: its lease
  /// ends now, so the next delivery takes the key over at once (with a higher fence). False when
  /// the fence no longer holds.
  bool release(const Key& key, std::int64_t fence) { return events().release(key, fence, {}); }

  /// Like `release`, and keeps `reason` (when not empty) as why this attempt gave the event back;
  /// the reconciler shows it when it gives up on the event. A release that fails is logged
  /// (`PostgresOptions::log`) and thrown.
  bool release(const Key& key, std::int64_t fence, std::string_view reason) {
    return events().release(key, fence, reason);
  }

  /// Like `release(key, fence, reason)`, and holds the key for `hold` before the next attempt
  /// may take it over: a redelivery meanwhile finds it held (`Reservation::held`; the gate
  /// answers `retry`, see `GateOptions::retry_backoff`).
  /// A hold of 0 ends the lease now.
  bool release(const Key& key, std::int64_t fence, std::string_view reason,
               std::chrono::milliseconds hold) {
    return events().release(key, fence, reason, hold);
  }

  /// The stored row, if any.
  std::optional<Record> find(const Key& key) { return events().find(key); }

  // --- Leases -----------------------------------------------------------------------------------

  /// Extends the leases the caller still holds to `lease` from now, in one statement; returns how
  /// many it extended (a lease taken over meanwhile is not, nor one whose row another
  /// transaction is writing: see `renew`).
  std::size_t extend(std::span<const HeldLease> held, std::chrono::milliseconds lease) {
    const std::vector<LeaseRenewal> renewed = renew(held, lease);
    return static_cast<std::size_t>(
        std::count(renewed.begin(), renewed.end(), LeaseRenewal::extended));
  }

  /// Renews the leases the caller still holds to `lease` from now, in one statement, on the
  /// renewal connection; says per lease (in order) whether it was extended, its fence is gone,
  /// or its row was busy: another transaction was writing it (a commit group's members are
  /// locked until its COMMIT), and the renewal skipped it instead of waiting, so that one busy
  /// row never holds up the renewal of every other lease.
  std::vector<LeaseRenewal> renew(std::span<const HeldLease> held,
                                  std::chrono::milliseconds lease) {
    return detail::postgres::Leases(scope()).renew(held, lease);
  }

  /// Takes over up to `limit` in-flight rows whose lease expired and that have not changed for
  /// `stale_after`, bumping their fence; rows another reconciler is taking are skipped.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    return detail::postgres::Leases(scope()).take_stale(limit, stale_after, lease);
  }

  // --- Batches ----------------------------------------------------------------------------------

  /// Reserves many keys in one statement (`unnest` of the key array): one reservation per item,
  /// in order. Items whose row committed after the statement's snapshot, and expired leases,
  /// fall back to `reserve` one by one. Keys must be distinct.
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) {
    return batches().reserve_batch(items, lease);
  }

  /// Commits many outcomes in one transaction: `business(tx, index)` and the item's fenced update
  /// for every item, then one COMMIT (one WAL flush for the batch). All or nothing: when a fence
  /// no longer holds or a business write throws, nothing is written and the answer is nullopt —
  /// commit the items one by one instead (`Gate::process_batch` does). A business write that broke
  /// the transaction throws `BusinessWriteError` naming its key: then nothing may be retried item
  /// by item. After an in-doubt COMMIT it asks whether the batch landed before answering.
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_batch(std::span<const CommitItem> items,
                                                        BusinessWrite&& business) {
    return batches().commit_batch(items, std::forward<BusinessWrite>(business));
  }

  /**
   * Like `commit_batch`, for a business write that writes every item's rows at once (one
   * multi-row statement): runs `business(tx)` once, then marks every item committed in one
   * fenced statement, and commits when that statement changed every item's row. All or nothing:
   * when a fence no longer holds or `business` throws (its SQL failed included), nothing is
   * written and the answer is nullopt — commit the items one by one instead
   * (`Gate::process_batch` does, with a `bulk_business_write`). A business write that broke the
   * transaction and went on throws `BusinessWriteError` naming the first item's key. After an
   * in-doubt COMMIT it asks whether the batch landed before answering.
   */
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_bulk(std::span<const CommitItem> items,
                                                       BusinessWrite&& business) {
    return batches().commit_bulk(items, std::forward<BusinessWrite>(business));
  }

  /**
   * Commits many outcomes in one transaction (one WAL flush), each item under its own savepoint:
   * the item's fenced update, then `business(tx, index)` when the fence held. An item whose fence
   * no longer holds is not written, and one whose business write throws is rolled back to its
   * savepoint alone: the others commit. Answers one `ItemCommit` per item, in order; a thrown
   * item's answer carries what it threw. A business write that broke the whole transaction (see
   * `commit`) is answered with `BusinessWriteError` and the group runs again without it, from the
   * start. A broken connection is retried like `commit`'s, asking after an in-doubt COMMIT which
   * items landed; throws `StoreError` when `commit_attempts` run out. `Gate` uses it for group
   * commit (`GateOptions::coalesce`).
   */
  template <class BusinessWrite>
  std::vector<ItemCommit> commit_each(std::span<const CommitItem> items, BusinessWrite&& business) {
    return detail::postgres::GroupCommit(scope()).commit_each(
        items, std::forward<BusinessWrite>(business));
  }

  // --- The operator's queue and history ---------------------------------------------------------

  /// Up to `limit` escalated rows, oldest first.
  std::vector<Record> escalated(std::size_t limit) { return operators().escalated(limit); }

  /// Commits an escalated row with `result` and the business write in one transaction; false
  /// if the row is not escalated (already resolved, or never parked).
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    return operators().resolve(key, result, std::forward<BusinessWrite>(business));
  }

  /// Puts a failed event back in flight under a new fence with its lease ended, so the next
  /// delivery or the reconciler claims again under the same key (a downstream that honours keys
  /// returns its original outcome if it had one). Returns 1, or 0 when the key is not failed.
  std::size_t redrive_failed(const Key& key) { return operators().redrive_failed(key); }

  /// Re-drives up to `limit` failed events whose failure was stored in [`from`, `to`), for
  /// example every event an expired credential failed.
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    return operators().redrive_failed(from, to, limit);
  }

  /// Re-drives up to `limit` failed rows of this gate whose reason or cause (`cause_of`) is
  /// exactly `reason`, oldest failure first, as `redrive_failed(key)` does (rows another session is
  /// changing are skipped); returns how many changed. The rows' history keeps the reason.
  std::size_t redrive_cause(std::string_view reason, std::size_t limit) {
    return operators().redrive_cause(reason, limit);
  }

  /// Up to `query.limit` rows of this gate that match `query`, the newest change first. An
  /// operator's query: it scans the gate's rows (the failed and escalated ones by index).
  std::vector<Record> rows(const RowQuery& query) { return operators().rows(query); }

  /// How many rows of this gate match `query` (its limit aside).
  std::int64_t count(const RowQuery& query) { return operators().count(query); }

  /// This gate's failed and escalated rows grouped by status and cause (the first line of
  /// their reasons, `cause_of`), most rows first (then the most recent), at most `limit` groups.
  std::vector<Cause> causes(std::size_t limit) { return operators().causes(limit); }

  /// The gates that have rows in this log, sorted, whichever gate this handle is scoped to
  /// (rows of no gate are not listed). One step of the primary key's index per gate.
  std::vector<std::string> gates() { return operators().gates(); }

  // --- Signals and retention --------------------------------------------------------------------

  /// The three signals over the events reserved in the last `window`, and the oldest
  /// transaction open in the database (`StoreSignals::oldest_snapshot`), in one round trip.
  StoreSignals signals(std::chrono::seconds window) { return monitoring().signals(window); }

  /// Keeps a downstream answer that differed from the stored one.
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    monitoring().record_mismatch(key, stored, observed, source);
  }

  /// Up to `limit` recorded mismatches, newest first.
  std::vector<Mismatch> mismatches(std::size_t limit) { return monitoring().mismatches(limit); }

  /// Deletes committed and failed rows that finished more than `older_than` ago, `batch` rows per
  /// statement (each its own short transaction, skipping rows locked by live traffic); never
  /// in-flight or escalated rows. Returns how many it deleted. When it deleted any, it ends with
  /// a `VACUUM` of the log (skipped while another vacuum holds the table), so the space of those
  /// rows, and of the versions the commits left behind, is reused at once rather than at
  /// autovacuum's next turn; a vacuum that fails (the role does not own the table) is logged
  /// and leaves the work to autovacuum.
  ///
  /// On a log of generations (`PostgresOptions::partitioned_log`) it first starts the next
  /// generation when the current one began `older_than` ago or earlier. It then empties whole
  /// (truncates) each older generation whose every row it may delete, and deletes the gate's
  /// rows of the others in key order, in batches that go on where the one before stopped, each
  /// generation it deleted rows from that way vacuumed after (only those: not the current one
  /// just started, whose plans would otherwise scan it whole). It ends by dropping every older
  /// generation left empty (`drop_empty_generations`): their space goes back at once, whatever
  /// snapshot another session holds. While a transaction older than `older_than` is open in the
  /// database, it leaves the rows of the generation the current one followed until the current
  /// one is `older_than` old: under that snapshot their deletes would give no space back, and
  /// that generation goes whole a window later.
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    if (!partitioned_log()) return monitoring().purge(older_than, batch);
    detail::postgres::Generations generations = generations_of_log();
    generations.start_if_older_than(older_than);
    const std::size_t deleted = generations.purge(older_than, batch);
    generations.drop_empty();
    return deleted;
  }

  /// Whether this store opens its log as a log of generations (`PostgresOptions::partitioned_log`).
  [[nodiscard]] bool partitioned_log() const noexcept {
    return session_->options().partitioned_log;
  }

  /// The generations of a partitioned log (`PostgresOptions::partitioned_log`), oldest first.
  std::vector<LogGeneration> generations() { return generations_of_log().list(); }

  /// Starts the next generation of a partitioned log now, once the statements in flight on the
  /// log finished (`purge` does it when the current one is older than its window); returns its
  /// number. Throws `StoreError` on a log without generations.
  int start_generation() { return generations_of_log().start_next(); }

  /// Drops each generation of a partitioned log older than the current one that holds no row
  /// (detached without blocking writers, then dropped); returns how many. An interrupted detach
  /// is finished. Throws `StoreError` on a log without generations.
  std::size_t drop_empty_generations() { return generations_of_log().drop_empty(); }

  /// Deletes abandoned attempts: rows in flight whose lease ended and that nothing touched (no
  /// retry, no takeover, no reconciler pass) for `older_than`, `batch` rows per statement; never a
  /// live lease, a finished or an escalated row. For gates no reconciler finishes (an endpoint's),
  /// or whose reconciler's passes would have touched the row long since: `Retention` calls it
  /// with `RetentionOptions::abandoned_after`. Returns how many it deleted.
  /// Ends with a `VACUUM` as `purge` does.
  std::size_t purge_abandoned(std::chrono::seconds older_than, std::size_t batch) {
    return monitoring().purge_abandoned(older_than, batch);
  }

  /// Deletes the row of `key` when its life is over: committed or failed more than `lifetime`
  /// ago, or in flight with its lease ended and untouched as long (an attempt that never
  /// committed). Never an escalated row or a live lease. True when it deleted the row; the key is
  /// then new to the gate.
  bool expire(const Key& key, std::chrono::seconds lifetime) {
    return monitoring().expire(key, lifetime);
  }

  // --- Connections ------------------------------------------------------------------------------

  /// Whether reservations skip the WAL flush (`PostgresOptions::relaxed_reservations`).
  [[nodiscard]] bool relaxed_reservations() const noexcept { return session_->relaxed(); }

  /// Whether a `Gate`'s outcomes skip the WAL flush (`PostgresOptions::relaxed_outcomes`).
  [[nodiscard]] bool relaxed_outcomes() const noexcept { return session_->relaxed_outcomes(); }

  /// Connections the store closed because a statement went unanswered for
  /// `PostgresOptions::reply_timeout` (a partition that nothing else reported).
  [[nodiscard]] std::size_t connections_cut() const noexcept { return session_->connections_cut(); }

  /// The table this store writes.
  [[nodiscard]] const std::string& table() const noexcept { return session_->table(); }

  /// Checks a connection out of the store's pool, for work beside the gate (tests, tools). It
  /// goes back to the pool when the lease is destroyed; after a `pqxx::broken_connection`, call
  /// `mark_broken()` on the lease so the pool reopens it. The reply watchdog
  /// (`PostgresOptions::reply_timeout`) leaves this connection alone.
  detail::ConnectionPool::Lease connection() { return session_->pool().acquire(false); }

 private:
  PostgresStore(std::shared_ptr<detail::postgres::Session> session, std::string gate)
      : session_(std::move(session)), gate_(std::move(gate)) {}

  [[nodiscard]] detail::postgres::Scope scope() noexcept { return {*session_, gate_}; }
  detail::postgres::EventPath events() { return detail::postgres::EventPath(scope()); }
  detail::postgres::Batches batches() { return detail::postgres::Batches(scope()); }
  detail::postgres::OperatorQueue operators() { return detail::postgres::OperatorQueue(scope()); }
  detail::postgres::Monitoring monitoring() { return detail::postgres::Monitoring(scope()); }
  detail::postgres::Generations generations_of_log() {
    return detail::postgres::Generations(scope());
  }
  detail::postgres::Schema schema() { return detail::postgres::Schema(scope()); }

  // Everything the handles on one log share: options, statements and connection pools.
  std::shared_ptr<detail::postgres::Session> session_;
  std::string gate_;  // bound as $1 of every statement
};

static_assert(store<PostgresStore>);
static_assert(monitored_store<PostgresStore>);
static_assert(explaining_store<PostgresStore>);
static_assert(lease_extending_store<PostgresStore>);
static_assert(lease_renewing_store<PostgresStore>);
static_assert(redrivable_store<PostgresStore>);
static_assert(labelling_store<PostgresStore>);
static_assert(operable_store<PostgresStore>);

}  // namespace idemgate
