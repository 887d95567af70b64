// SPDX-License-Identifier: MIT
// SqliteStore: the embedded store in one SQLite file (idemgate::sqlite). The class holds its API;
// its parts live in store/sqlite/, one role each, and its SQL in store/sqlite/sql/.
#pragma once

#include "../concepts.hpp"
#include "../detail/sqlite/backup.hpp"
#include "../gate_name.hpp"
#include "../record.hpp"
#include "../signals.hpp"
#include "log/migration.hpp"
#include "sql.hpp"
#include "sqlite/batches.hpp"
#include "sqlite/events.hpp"
#include "sqlite/leases.hpp"
#include "sqlite/monitoring.hpp"
#include "sqlite/operator.hpp"
#include "sqlite/options.hpp"
#include "sqlite/schema.hpp"
#include "sqlite/session.hpp"
#include "sqlite/sql/all.hpp"
#include "sqlite/transaction.hpp"

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
 * The embedded default store: an idempotency log in one SQLite file (WAL mode).
 *
 * Durable: every write is one `BEGIN IMMEDIATE` transaction, synced before it returns
 * (`synchronous=FULL`). Thread-safe: a store owns one connection, guarded by a timed lock, so
 * calls from several threads run one after another (SQLite admits one writer at a time anyway).
 * Several stores on one file, in one process or in several, are safe: they wait for each other's
 * write transactions. No call waits longer than `SqliteOptions::busy_timeout` in all (for the
 * lock, then for the file): past it, it throws `StoreError` naming what held the store, never a
 * wrong answer. Open stores after `fork()`, never before, and keep the file on a local disk (WAL
 * needs shared memory, which network filesystems lack).
 *
 * The business write cannot commit anything on its own: whatever it does (a swallowed error
 * that rolled the transaction back, its own BEGIN, COMMIT or ROLLBACK), no business row commits
 * without its log row, and the call throws `StoreError` naming the business write.
 *
 * Timestamps are stored as integer microseconds since the Unix epoch. It also reports the
 * gate's health signals with the WAL's size, purges finished rows (`monitored_store`, see
 * `Retention`), and backs up and restores the file online (`backup_to`, `restore_from`).
 *
 * A store object is a handle: a copy, and `for_gate(name)`, share its connection and lock, and
 * a handle from `for_gate` reads and writes only the rows of gate `name` (the log's primary key
 * is the gate and the key). The constructor's handle sees the rows of no gate ("").
 *
 * Example:
 *   idemgate::SqliteStore store{"/var/lib/app/idemgate.db", {.busy_timeout = 3s}};
 *   store.migrate();
 */
class SqliteStore {
 public:
  /// The business write's transaction.
  using transaction = SqliteTransaction;
  /// The clock leases are measured with.
  using Clock = SqliteOptions::Clock;

  /// Opens (and creates if missing) the database at `path`, switches it to WAL mode and checks
  /// that this process can write it. Throws `std::invalid_argument` for an unusable table name
  /// or an option out of range, and `StoreError` for a path that cannot be opened, a file that
  /// is not a database, a database this process cannot write (the file, its directory or its
  /// -wal and -shm files read-only), or one locked past the busy timeout. `":memory:"` gives a
  /// private in-memory database (not durable, one store only).
  explicit SqliteStore(std::string path, SqliteOptions options = {})
      : session_(std::make_shared<detail::sqlite::Session>(std::move(path), std::move(options))) {}

  /// A handle on the same connection, scoped to the same gate.
  SqliteStore(const SqliteStore&) = default;
  SqliteStore& operator=(const SqliteStore&) = delete;

  /// A handle on the same connection that reads and writes only the rows of gate `name`.
  [[nodiscard]] SqliteStore for_gate(const GateName& name) const {
    return SqliteStore(session_, name.str());
  }
  /// The gate whose rows this handle sees ("" for rows that belong to no gate).
  [[nodiscard]] const std::string& gate() const noexcept { return gate_; }

  // --- The schema -------------------------------------------------------------------------------

  /// The log's schema for a table name as one script: the `<table>_migrations` table, then every
  /// numbered step (`migrations()`) with the record of it. Run it in one transaction.
  [[nodiscard]] static std::string schema_sql(const std::string& table = "idemgate_log") {
    return detail::sqlite::Schema::script(table);
  }

  /// The numbered steps of the log's schema, oldest first, as data (`{log}` stands for the table).
  [[nodiscard]] static std::span<const sql::Migration> migrations() noexcept {
    return sql::sqlite::migrations;
  }

  /// One of the store's statements (`idemgate::sql::sqlite`) as it is sent for the log `table`.
  [[nodiscard]] static std::string statement_sql(const sql::Statement& statement,
                                                 const std::string& table = "idemgate_log") {
    return detail::sqlite::Session::render_for(table, statement.text);
  }

  /**
   * Applies the numbered steps of the log's schema that it lacks, and records each in
   * `<table>_migrations`; creates the log when it is missing. A log made before versions were
   * recorded is recognised step by step: the steps it has are recorded as found, the rest
   * applied, keeping every row (a log without gates is rebuilt with the primary key (gate, key):
   * SQLite cannot change a primary key in place; its rows belong to no gate, '', until
   * `for_gate(name).adopt_unowned_rows(...)` assigns them). Returns what it did. All in one write
   * transaction, which writers of other processes wait for. Idempotent and safe from several
   * processes at once.
   */
  MigrationReport migrate() { return schema().migrate(); }

  /**
   * Gives this handle's gate the rows that belong to no gate (written before logs knew their
   * gates), up to `limit` of them in one write transaction, except keys this gate already holds;
   * returns how many it moved. Call it until it returns less than `limit`. Throws
   * `std::logic_error` on a handle scoped to no gate.
   *
   * Example:
   *   while (store.for_gate("ect.claim_slot").adopt_unowned_rows(1000) == 1000) {}
   */
  std::size_t adopt_unowned_rows(std::size_t limit) { return schema().adopt_unowned_rows(limit); }

  // --- One event --------------------------------------------------------------------------------

  /// Inserts the key as in flight, or counts a duplicate and reports what is stored; takes over
  /// an expired lease with a fence bump. All in one write transaction; the lease runs from the
  /// moment the write lock is held.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    return events().reserve(key, fingerprint, request, lease, {});
  }

  /// Like `reserve`, and keeps `label` with a new row (a stored row keeps its own label).
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease, std::string_view label) {
    return events().reserve(key, fingerprint, request, lease, label);
  }

  /**
   * Marks the key committed with `result` and runs `business(transaction&)`, in one transaction,
   * only if `fence` still holds. Zero rows updated: rolled back, and `committed` is returned
   * without running `business` when this very fence already committed (a retried commit);
   * otherwise `lost_lease`. Whatever `business` throws rolls everything back and propagates.
   * A business write that ends the store's transaction (see `SqliteTransaction`) commits
   * nothing and makes the call throw `StoreError`; the row stays in flight.
   */
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    return events().commit(key, fence, result, std::forward<BusinessWrite>(business));
  }

  /**
   * Like `commit`, for a result that only the transaction can give: runs `produce(transaction&)`
   * and stores the string it returns as the result, in the same transaction, only if `fence`
   * still holds (when it does not, `produce` is not run). Whatever `produce` throws rolls
   * everything back and propagates. The server side (`server/endpoint.hpp`) runs a request's
   * handler this way, so its writes and the stored response commit together.
   */
  template <class Produce>
  CommitStatus commit_computed(const Key& key, std::int64_t fence, Produce&& produce) {
    return events().commit_computed(key, fence, std::forward<Produce>(produce));
  }

  /**
   * One event in one write transaction, for a side effect that is only the business write in
   * this database: reserves the key, runs `produce(SqliteTransaction&)` and marks the row
   * committed with the string it returns, then commits once. No row is ever seen in flight: a
   * crash or a throw rolls everything back, key included. A concurrent transaction (another
   * thread, another process) waits for the write lock up to `SqliteOptions::busy_timeout`, then
   * gets `StoreError`; after the first commits, its key is `existing` (`wait` is not used: the
   * busy timeout bounds every wait of this store). `TransactionGate` calls it.
   */
  template <class Produce>
  OnceResult commit_once(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                         std::string_view label, std::chrono::milliseconds /*wait*/,
                         Produce&& produce) {
    return events().commit_once(key, fingerprint, request, label, std::forward<Produce>(produce));
  }

  /// Stores a permanent failure, only if `fence` still holds (`committed` also when this fence
  /// already stored it).
  CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    return events().settle(sql::sqlite::fail, "storing a failure", key, fence, reason,
                           RecordStatus::failed);
  }

  /// Parks the key for a human, only if `fence` still holds (`committed` also when this fence
  /// already parked it).
  CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    return events().settle(sql::sqlite::escalate, "escalating", key, fence, reason,
                           RecordStatus::escalated);
  }

  /// Gives back an in-flight reservation this caller holds after a transient failure: the row
  /// stays in flight and its lease ends now, so the next delivery takes the key over at once
  /// (with a higher fence). False when the fence no longer holds.
  bool release(const Key& key, std::int64_t fence) { return events().release(key, fence, {}); }

  /// Like `release`, and keeps `reason` (when not empty) as why this attempt gave the event back;
  /// the reconciler shows it when it gives up on the event.
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

  /// Extends the leases the caller still holds to `lease` from now, in one write transaction;
  /// returns how many it extended (a lease taken over meanwhile is not).
  std::size_t extend(std::span<const HeldLease> held, std::chrono::milliseconds lease) {
    return detail::sqlite::Leases(scope()).extend(held, lease);
  }

  /// Takes over up to `limit` in-flight rows whose lease expired and that have not changed for
  /// `stale_after`, oldest lease first, bumping their fence and attempts and granting a new
  /// `lease`. One write transaction: two reconcilers (threads or processes) never take the same
  /// row. `duration::max()` means forever (for `stale_after`: nothing is ever stale).
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    return detail::sqlite::Leases(scope()).take_stale(limit, stale_after, lease);
  }

  // --- Batches ----------------------------------------------------------------------------------

  /// Reserves many keys in one write transaction (one sync of the log), each as `reserve` would:
  /// one reservation per item, in order. Keys must be distinct. All or nothing: when it throws,
  /// none of them was reserved. `Gate` uses it for group commit (`GateOptions::coalesce`).
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) {
    return batches().reserve_batch(items, lease);
  }

  /**
   * Commits many outcomes in one write transaction (one sync), each item under its own savepoint:
   * its fenced update and `business(tx, index)`. An item whose fence no longer holds, or whose
   * business write throws, is rolled back to its savepoint alone: the others commit. Answers one
   * `ItemCommit` per item, in order; a thrown item's answer carries what it threw. A business
   * write that ended the whole transaction (see `commit`) is answered with its
   * `BusinessWriteError`, and the group runs again without it. `Gate` uses it for group commit
   * (`GateOptions::coalesce`).
   */
  template <class BusinessWrite>
  std::vector<ItemCommit> commit_each(std::span<const CommitItem> items, BusinessWrite&& business) {
    return batches().commit_each(items, std::forward<BusinessWrite>(business));
  }

  /**
   * Commits many outcomes in one write transaction (one sync) with one business write for all of
   * them: every item's fenced update, then `business(transaction&)` once (a multi-row write), then
   * one COMMIT. All or nothing: when a fence no longer holds or `business` throws (its SQL failed
   * included), nothing is written and the answer is nullopt — commit the items one by one instead
   * (`Gate::process_batch` does, with a `bulk_business_write`). A business write that broke the
   * store's transaction (see `commit`) throws its `BusinessWriteError`; a COMMIT that failed
   * throws `StoreError`.
   */
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_bulk(std::span<const CommitItem> items,
                                                       BusinessWrite&& business) {
    return batches().commit_bulk(items, std::forward<BusinessWrite>(business));
  }

  // --- The operator's queue and history ---------------------------------------------------------

  /// Up to `limit` escalated rows, oldest first.
  std::vector<Record> escalated(std::size_t limit) { return operators().escalated(limit); }

  /// Commits an escalated row with `result` and `business(transaction&)` in one transaction;
  /// false (nothing written, `business` not run) if the row is not escalated. A business write
  /// that ends the store's transaction commits nothing and makes the call throw `StoreError`.
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    return operators().resolve(key, result, std::forward<BusinessWrite>(business));
  }

  /**
   * Re-drives one failed event: turns its `failed` row back into `in_flight` with fence + 1,
   * attempts + 1, its lease ended and its reason cleared, so the next delivery (`reserve`
   * answers `taken_over`) or the reconciler claims it again under the same key. Returns how
   * many rows changed (0 when the row is not failed).
   *
   * Example:
   *   store.redrive_failed(idemgate::derive_key("ect.claim_slot", id, container));
   */
  std::size_t redrive_failed(const Key& key) { return operators().redrive_failed(key); }

  /// Re-drives up to `limit` failed rows whose `updated_at` (when they failed) lies in
  /// [`from`, `to`), oldest first, as `redrive_failed(key)` does; returns how many changed.
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    return operators().redrive_failed(from, to, limit);
  }

  /**
   * Re-drives up to `limit` failed rows of this gate whose reason or cause (`cause_of`) is
   * exactly `reason`, oldest failure first, as `redrive_failed(key)` does; returns how many
   * changed. The rows' history keeps the reason.
   *
   * Example:
   *   store.redrive_cause("POST https://terminal.example/slots answered 401", 1000);
   */
  std::size_t redrive_cause(std::string_view reason, std::size_t limit) {
    return operators().redrive_cause(reason, limit);
  }

  /// Up to `query.limit` rows of this gate that match `query`, the newest change first. An
  /// operator's query: filters other than the status scan the gate's rows.
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

  /// The three signals over the events reserved in the last `window`, read in one statement (one
  /// consistent snapshot), with the in-flight rows being retried and the WAL file's size.
  StoreSignals signals(std::chrono::seconds window) { return monitoring().signals(window); }

  /// Keeps a downstream answer that differed from the stored one (`source`: where it was seen,
  /// such as "lost_lease" or "reconciler").
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    monitoring().record_mismatch(key, stored, observed, source);
  }

  /// Up to `limit` recorded mismatches, newest first.
  std::vector<Mismatch> mismatches(std::size_t limit) { return monitoring().mismatches(limit); }

  /**
   * Deletes committed and failed rows that finished more than `older_than` ago, never in-flight or
   * escalated rows, and returns how many it deleted. Each batch of at most `batch` rows is its
   * own short write transaction, so workers (threads and processes) reserve between batches.
   * `seconds::max()` keeps every row.
   *
   * Example:
   *   store.purge(std::chrono::days(7), 1000);  // or let idemgate::Retention call it
   */
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    return monitoring().purge(older_than, batch);
  }

  /// Deletes abandoned attempts: rows in flight whose lease ended and that nothing touched (no
  /// retry, no takeover, no reconciler pass) for `older_than`, `batch` rows per statement; never a
  /// live lease, a finished or an escalated row. For gates no reconciler finishes (an endpoint's),
  /// or whose reconciler's passes would have touched the row long since: `Retention` calls it
  /// with `RetentionOptions::abandoned_after`. Returns how many it deleted.
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

  // --- The file ---------------------------------------------------------------------------------

  /**
   * Writes a consistent copy of the database to `destination` while the store stays in use
   * (SQLite's online backup API): other processes keep reserving and committing, and this
   * store's other threads wait until the copy is written. The copy is written beside
   * `destination` and renamed over it once complete, so `destination` is never half written.
   * Throws `StoreError` when it cannot write there.
   *
   * Example:
   *   store.backup_to("/var/backups/idemgate-" + today + ".db");
   */
  void backup_to(const std::string& destination) {
    session_->run("backing up", nullptr, [&] {
      detail::sqlite::copy_database(session_->db(), destination);
      return 0;
    });
  }

  /**
   * Restores the database at `target` from the copy at `backup` (made by `backup_to`, or any
   * sound SQLite file). Call it with every process that uses `target` stopped: it refuses
   * (`StoreError`) while a connection, in this process or another, has `target` open. It checks
   * the backup (`PRAGMA quick_check`), moves `target`'s stale `-wal` and `-shm` files aside
   * (renamed with a `.stale-<time>` suffix: SQLite would replay a stale WAL onto the restored
   * file), and replaces `target` with a copy of the backup written by SQLite's backup API.
   * Events in the backup are duplicates again after the restore; events processed after the
   * backup was taken are new to the restored log.
   *
   * Example:
   *   idemgate::SqliteStore::restore_from("/var/backups/idemgate.db", "/var/lib/app/idemgate.db");
   */
  static void restore_from(const std::string& backup, const std::string& target) {
    detail::sqlite::restore(backup, target);
  }

  /// The database file's path as given.
  [[nodiscard]] const std::string& path() const noexcept { return session_->path(); }
  /// The table this store writes.
  [[nodiscard]] const std::string& table() const noexcept { return session_->table(); }
  /// The longest a call waits in all (`SqliteOptions::busy_timeout`).
  [[nodiscard]] std::chrono::milliseconds busy_timeout() const noexcept {
    return session_->busy_timeout();
  }
  /// The size the WAL is kept to (`SqliteOptions::wal_size_limit`).
  [[nodiscard]] std::size_t wal_size_limit() const noexcept { return session_->wal_size_limit(); }

 private:
  SqliteStore(std::shared_ptr<detail::sqlite::Session> session, std::string gate)
      : session_(std::move(session)), gate_(std::move(gate)) {}

  [[nodiscard]] detail::sqlite::Scope scope() noexcept { return {*session_, gate_}; }
  detail::sqlite::EventPath events() { return detail::sqlite::EventPath(scope()); }
  detail::sqlite::Batches batches() { return detail::sqlite::Batches(scope()); }
  detail::sqlite::OperatorQueue operators() { return detail::sqlite::OperatorQueue(scope()); }
  detail::sqlite::Monitoring monitoring() { return detail::sqlite::Monitoring(scope()); }
  detail::sqlite::Schema schema() { return detail::sqlite::Schema(scope()); }

  // Everything the handles on one connection share: the connection, its lock and statements,
  // the options, and the state of the call that holds the lock.
  std::shared_ptr<detail::sqlite::Session> session_;
  std::string gate_;  // bound as ?1 of every statement
};

static_assert(store<SqliteStore>);
static_assert(monitored_store<SqliteStore>);
static_assert(explaining_store<SqliteStore>);
static_assert(lease_extending_store<SqliteStore>);
static_assert(redrivable_store<SqliteStore>);
static_assert(labelling_store<SqliteStore>);
static_assert(operable_store<SqliteStore>);

}  // namespace idemgate
