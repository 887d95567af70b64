// SPDX-License-Identifier: MIT
// SqliteStore: the embedded store in one SQLite file (idemgate::sqlite).
#pragma once

#include "../concepts.hpp"
#include "../detail/durations.hpp"
#include "../detail/sqlite/backup.hpp"
#include "../detail/sqlite/statement.hpp"
#include "../gate_name.hpp"
#include "../record.hpp"
#include "../signals.hpp"
#include "log_row.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idemgate {

/// Bytes that `SqliteTransaction::exec` binds as a BLOB (a plain string binds as TEXT).
struct SqliteBlob {
  /// The bytes; they must stay alive until `exec` returns.
  std::string_view bytes;
};

/// Tuning of a `SqliteStore`.
struct SqliteOptions {
  /// Where "now" comes from: leases, staleness and timestamps are measured with it.
  using Clock = WallClock;

  /// The idempotency log's table: letters, digits and underscores (SQLite has no schemas).
  std::string table = "idemgate_log";
  /// The longest any call waits, in all: for another thread's call on the same store, then for
  /// another connection's or process's write transaction. Past it the call throws `StoreError`
  /// ("do not ack"), naming what held the store. Writes take milliseconds, so a few seconds is
  /// plenty. Between 0 ms and 1 hour.
  std::chrono::milliseconds busy_timeout = std::chrono::seconds(5);
  /// The size the write-ahead log (`<file>-wal`) is kept to, in bytes. SQLite checkpoints the
  /// WAL into the database as it goes, but readers in other connections can keep it from
  /// starting over; once it passes this size the store runs a truncating checkpoint, and SQLite
  /// cuts the file back to this size whenever it starts over (`journal_size_limit`). Only a
  /// read transaction held open for long keeps the WAL above it (see `StoreSignals::wal_bytes`).
  /// Between 64 KiB and 1 TiB.
  std::size_t wal_size_limit = std::size_t{64} << 20;
  /// Injected clock for tests (expire leases without sleeping); empty means the system clock.
  Clock clock = {};
};

namespace detail::sqlite {

/// Checks a table name; throws `std::invalid_argument` that says what to use instead.
inline std::string checked_table_name(std::string table) {
  if (!idemgate::detail::is_identifier(table, 63))
    throw std::invalid_argument("idemgate: \"" + table +
                                "\" is not a usable SQLite table name; use a plain name (not "
                                "schema.table) of 1 to 63 letters, digits and underscores, "
                                "starting with a letter or an underscore");
  std::string lower = table;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  });
  if (lower.starts_with("sqlite_"))
    throw std::invalid_argument("idemgate: \"" + table +
                                "\" is reserved by SQLite (names starting with sqlite_); pick "
                                "another table name");
  return table;
}

/// Microseconds since the epoch, clamped instead of overflowing.
inline std::int64_t to_micros(std::chrono::system_clock::time_point t) {
  return idemgate::detail::saturating_micros(t.time_since_epoch());
}

/// Microseconds since the epoch, as a time point the saturating helpers work on.
using MicrosPoint = std::chrono::time_point<std::chrono::system_clock, std::chrono::microseconds>;

/// `at + d` in microseconds since the epoch; `duration::max()` gives the latest instant.
template <class Rep, class Period>
std::int64_t later(std::int64_t at, std::chrono::duration<Rep, Period> d) {
  return idemgate::detail::saturating_add(MicrosPoint(std::chrono::microseconds(at)), d)
      .time_since_epoch()
      .count();
}

/// `at - d` in microseconds since the epoch; `duration::max()` gives the earliest instant.
template <class Rep, class Period>
std::int64_t earlier(std::int64_t at, std::chrono::duration<Rep, Period> d) {
  return idemgate::detail::saturating_sub(MicrosPoint(std::chrono::microseconds(at)), d)
      .time_since_epoch()
      .count();
}

/// The lease end of a released row: before every instant the clock can give.
inline constexpr std::int64_t ended_lease = std::numeric_limits<std::int64_t>::min();

/// One row of a statement as `to_record` and `signals_from` read it (text reads as bytes).
struct Row {
  /// The statement, stepped onto the row.
  const Statement& statement;
  /// Whether column `column` is NULL.
  [[nodiscard]] bool is_null(int column) const { return statement.is_null(column); }
  /// Column `column` as an integer.
  [[nodiscard]] std::int64_t int64(int column) const { return statement.int64(column); }
  /// Column `column` as bytes.
  [[nodiscard]] std::string bytes(int column) const { return statement.bytes(column); }
  /// Column `column` as text.
  [[nodiscard]] std::string text(int column) const { return statement.bytes(column); }
};
static_assert(log_row<Row>);

}  // namespace detail::sqlite

class SqliteStore;

namespace detail::sqlite {

/// Why a business write can no longer write: the store's transaction ended under it.
inline std::string ended_transaction(std::string_view sql, bool ran) {
  return "idemgate: the business write's statement \"" + std::string(sql) +
         (ran ? "\" ended the store's transaction. A statement of the business write ended it"
              : "\" was refused: the store's transaction is no longer open. An earlier "
                "statement of the business write ended it") +
         ", either by itself (BEGIN, COMMIT, ROLLBACK, END) or by failing with an error after "
         "which SQLite rolls the whole transaction back (a trigger's RAISE(ROLLBACK), ON CONFLICT "
         "ROLLBACK or OR ROLLBACK, an interrupt, a full disk, an I/O error, out of memory) that "
         "the business write caught and went on from. Outside the transaction a statement would "
         "commit on its own, without the log row, so the store refuses it and vetoes every "
         "commit until the business write returns. Nothing was committed; let such errors "
         "propagate from the business write.";
}

}  // namespace detail::sqlite

/**
 * The business write's transaction in a `SqliteStore`: the store's connection inside its open
 * `BEGIN IMMEDIATE` transaction, after the fenced status change.
 *
 * Write your business rows with `exec`, or use `db()` with the SQLite C API. Everything written
 * commits together with the outcome, or not at all: the store refuses to run a statement once
 * its transaction has ended, vetoes any commit made while the business write runs, and checks
 * before its own `COMMIT` that it is still in its own transaction with its row as it left it.
 * Do not BEGIN, COMMIT or ROLLBACK, do not swallow SQL errors (SQLite rolls the whole
 * transaction back after some of them), reset or finalize every statement you prepare on
 * `db()`, and do not call the store from inside the business write.
 *
 * Example:
 *   auto book = [](idemgate::SqliteTransaction& tx, const idemgate::Key& key,
 *                  const SlotRequest& r, const std::string& slot) {
 *     tx.exec("INSERT INTO bookings (container, slot_id, source_event) VALUES (?, ?, ?)",
 *             r.container, slot, key);
 *   };
 */
class SqliteTransaction {
 public:
  SqliteTransaction(const SqliteTransaction&) = delete;
  SqliteTransaction& operator=(const SqliteTransaction&) = delete;

  /// The raw connection, inside the open transaction.
  [[nodiscard]] sqlite3* db() const noexcept { return db_; }

  /**
   * Runs one SQL statement with positional parameters (`?`, `?N`) and returns the rows it
   * changed. Parameters bind as: `std::string`, `std::string_view`, `const char*` → TEXT;
   * `SqliteBlob` and `Key` → BLOB; integers and `bool` → INTEGER; floating point → REAL;
   * `std::nullopt` → NULL; `std::optional<T>` → T or NULL. Rows a statement returns are
   * discarded. Throws `StoreError` when SQLite refuses the statement (the commit then rolls
   * back), and when the store's transaction has already ended (see the class comment).
   *
   * Example:
   *   tx.exec("INSERT INTO ledger (account, cents, memo) VALUES (?, ?, ?)", account, 1250,
   *           std::nullopt);
   */
  template <class... Args>
  std::int64_t exec(std::string_view sql, const Args&... args) {
    require_open(sql, false);
    std::int64_t changed = 0;
    try {
      changed = detail::sqlite::exec(db_, sql, args...);
    } catch (const detail::sqlite::Error& e) {
      throw StoreError(std::string(e.what()) +
                       " (the business write's statement: " + std::string(sql) + ")" +
                       (sqlite3_get_autocommit(db_) != 0
                            ? " SQLite rolled the whole transaction back after this error: let "
                              "it propagate; the store refuses every later statement."
                            : ""));
    }
    require_open(sql, true);
    return changed;
  }

  /// Runs a query and returns the first column of its first row as an integer; nullopt when it
  /// returns no row or NULL. Parameters bind as in `exec`.
  template <class... Args>
  std::optional<std::int64_t> query_int(std::string_view sql, const Args&... args) {
    require_open(sql, false);
    return detail::sqlite::query_int(db_, sql, args...);
  }

 private:
  friend class SqliteStore;
  explicit SqliteTransaction(sqlite3* db) noexcept : db_(db) {}

  // Outside a transaction every statement commits on its own: refuse it rather than let a
  // business row commit without the log row.
  void require_open(std::string_view sql, bool ran) const {
    if (sqlite3_get_autocommit(db_) != 0)
      throw BusinessWriteError(detail::sqlite::ended_transaction(sql, ran));
  }

  sqlite3* db_;
};

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
      : SqliteStore(std::make_shared<Shared>(std::move(path), std::move(options)), "") {
    detail::require_in_range("SqliteOptions::busy_timeout", busy_timeout_,
                             std::chrono::milliseconds(0), std::chrono::hours(1),
                             "Writes take milliseconds; a few seconds is plenty.");
    detail::require_in_range("SqliteOptions::wal_size_limit (bytes)", wal_size_limit_,
                             std::size_t{64} << 10, std::size_t{1} << 40,
                             "The default, 64 MiB, suits most logs.");
    open();
  }

  /// A handle on the same connection, scoped to the same gate.
  SqliteStore(const SqliteStore&) = default;
  SqliteStore& operator=(const SqliteStore&) = delete;

  /// A handle on the same connection that reads and writes only the rows of gate `name`.
  [[nodiscard]] SqliteStore for_gate(const GateName& name) const {
    return SqliteStore(shared_, name.str());
  }
  /// The gate whose rows this handle sees ("" for rows that belong to no gate).
  [[nodiscard]] const std::string& gate() const noexcept { return gate_; }

  /// The schema for a table name: the log with its constraints and indexes, and the
  /// `<table>_mismatches` table.
  [[nodiscard]] static std::string schema_sql(const std::string& table = "idemgate_log") {
    const std::string t = detail::sqlite::checked_table_name(table);
    return log_table_sql("CREATE TABLE IF NOT EXISTS ", t) + indexes_sql(t) +
           "-- Downstream answers that differed from the stored one (healthy: empty).\n" +
           "CREATE TABLE IF NOT EXISTS " + t +
           "_mismatches (\n"
           "  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
           "  stored      BLOB    NOT NULL,\n"
           "  observed    BLOB    NOT NULL,\n"
           "  source      TEXT    NOT NULL,\n"
           "  at          INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
           "  gate        TEXT    NOT NULL DEFAULT ''  -- the gate that saw it\n"
           ");\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_mismatches_at ON " + t + "_mismatches (gate, at);\n";
  }

  /**
   * Creates the tables and indexes if missing, and brings a log made by an earlier version to
   * this version's shape, keeping every row: adds the columns it lacks (`duplicates`,
   * `attempts`, `label`, `history`), and gives a log without gates its `gate` column and the
   * primary key (gate, key) by rebuilding the table (SQLite cannot change a primary key in place).
   * Rows written before logs knew their gates belong to no gate (''): assign them with
   * `for_gate(name).adopt_unowned_rows(...)`. All in one write transaction, which writers of
   * other processes wait for (the rebuild copies every row). Idempotent and safe from several
   * processes at once.
   */
  void migrate() {
    run("creating the idemgate table", nullptr, [&] {
      begin();
      const auto lacks = [&](const std::string& table, const char* column) {
        return detail::sqlite::query_int(db_.get(),
                                         "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1)) "
                                         "AND NOT EXISTS (SELECT 1 FROM pragma_table_info(?1) "
                                         "WHERE name = ?2)",
                                         table, column)
                   .value_or(0) != 0;
      };
      // CREATE TABLE IF NOT EXISTS keeps an earlier log as it is: add what it lacks first.
      for (const auto& [column, definition] :
           {std::pair<const char*, const char*>{"duplicates", "INTEGER NOT NULL DEFAULT 0"},
            std::pair<const char*, const char*>{"attempts", "INTEGER NOT NULL DEFAULT 1"},
            std::pair<const char*, const char*>{"label", "TEXT"},
            std::pair<const char*, const char*>{"history", "TEXT"}}) {
        if (lacks(table_, column))
          detail::sqlite::exec(
              db_.get(), "ALTER TABLE " + table_ + " ADD COLUMN " + column + " " + definition);
      }
      if (lacks(table_, "gate")) add_gates_to_log();
      if (lacks(table_ + "_mismatches", "gate")) {
        detail::sqlite::exec(db_.get(), "ALTER TABLE " + table_ +
                                            "_mismatches ADD COLUMN gate TEXT NOT NULL DEFAULT ''");
        // The index on (at) alone is replaced by one on (gate, at) below.
        detail::sqlite::exec(db_.get(), "DROP INDEX IF EXISTS " + table_ + "_mismatches_at");
      }
      const std::string schema = schema_sql(table_);
      char* error = nullptr;
      const int code = sqlite3_exec(db_.get(), schema.c_str(), nullptr, nullptr, &error);
      sqlite3_free(error);
      if (code != SQLITE_OK) detail::sqlite::raise(db_.get(), code, "creating the idemgate table");
      end("creating the idemgate table");
      return 0;
    });
  }

  /// Inserts the key as in flight, or counts a duplicate and reports what is stored; takes over
  /// an expired lease with a fence bump. All in one write transaction; the lease runs from the
  /// moment the write lock is held.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    return reserve(key, fingerprint, request, lease, {});
  }

  /// Like `reserve`, and keeps `label` with a new row (a stored row keeps its own label).
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease, std::string_view label) {
    return run("reserving a key", &key, [&]() -> Reservation {
      begin();
      // Read after the write lock is held: time spent waiting must not shorten the lease.
      Reservation reservation = reserve_row(key, fingerprint, request, now_micros(), lease, label);
      end("reserving a key");
      return reservation;
    });
  }

  /// Reserves many keys in one write transaction (one sync of the log), each as `reserve` would:
  /// one reservation per item, in order. Keys must be distinct. All or nothing: when it throws,
  /// none of them was reserved. `Gate` uses it for group commit (`GateOptions::coalesce`).
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) {
    return run("reserving keys", nullptr, [&] {
      begin();
      const std::int64_t now = now_micros();
      std::vector<Reservation> reservations;
      reservations.reserve(items.size());
      for (const ReserveItem& item : items)
        reservations.push_back(
            reserve_row(item.key, item.fingerprint, item.request, now, lease, item.label));
      end("reserving keys");
      return reservations;
    });
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
    std::vector<ItemCommit> answers(items.size());
    std::vector<std::size_t> open(items.size());  // the items still to commit
    for (std::size_t i = 0; i < items.size(); ++i) open[i] = i;
    return run("committing a group", nullptr, [&] {
      for (std::size_t restarts = 0;; ++restarts) {
        begin();
        const std::int64_t now = now_micros();
        std::vector<std::size_t> included;
        bool broke = false;  // an item ended the transaction: start again without it
        for (std::size_t k = 0; k < open.size();) {
          const std::size_t i = open[k];
          const CommitItem& item = items[i];
          simple("SAVEPOINT idemgate_item", "committing a group");
          try {
            if (change(sql_.commit, "committing", item.key, item.fence, SqliteBlob{item.result},
                       now) == 0) {
              answers[i].status = settled_earlier(item.key, item.fence, RecordStatus::committed);
            } else {
              auto write = [&](SqliteTransaction& tx) { business(tx, i); };
              run_business(item.key, item.fence, now, write);
              release_item_savepoint(item.key);
              included.push_back(i);
              ++k;
              continue;
            }
          } catch (const detail::sqlite::Error& e) {
            if (e.busy()) throw;  // the whole unit: run() decides
            answers[i].error = std::current_exception();
          } catch (...) {
            answers[i].error = std::current_exception();
          }
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));  // settled on its own
          if (!rolled_back_to_savepoint()) {
            broke = true;
            break;
          }
        }
        if (!broke) {
          try {
            end("committing a group");
          } catch (const detail::sqlite::Error& e) {
            if (e.busy()) throw;
            throw StoreError(std::string(e.what()) + " The group commit of " +
                             std::to_string(included.size()) +
                             " events could not be confirmed. Do not ack: the rows stay in "
                             "flight and a redelivery after their lease, or the reconciler, "
                             "finishes them.");
          }
          for (std::size_t i : included) answers[i].status = CommitStatus::committed;
          return answers;
        }
        rollback();
        if (restarts >= items.size())
          throw StoreError("idemgate: the group commit of " + std::to_string(items.size()) +
                           " events on " + path_ +
                           " could not keep its transaction open; nothing was committed. Do "
                           "not ack: the redelivery or the reconciler finishes them.");
      }
    });
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
    if (items.empty()) return std::vector<CommitStatus>{};
    return run("committing a batch", nullptr, [&]() -> std::optional<std::vector<CommitStatus>> {
      begin();
      const std::int64_t now = now_micros();
      for (const CommitItem& item : items)
        if (change(sql_.commit, "committing a batch", item.key, item.fence, SqliteBlob{item.result},
                   now) == 0) {
          rollback();  // a fence moved, or an earlier attempt committed it: item by item decides
          return std::nullopt;
        }
      try {
        auto write = [&](SqliteTransaction& tx) { business(tx); };
        run_business(items, now, write);
      } catch (const BusinessWriteError&) {
        throw;
      } catch (const std::exception&) {
        rollback_quietly();  // the write refused: item by item costs only its own event
        return std::nullopt;
      }
      try {
        end("committing a batch");
      } catch (const detail::sqlite::Error& e) {
        if (e.busy()) throw;
        throw StoreError(std::string(e.what()) + " The batch commit of " +
                         std::to_string(items.size()) +
                         " events could not be confirmed. Do not ack: the rows stay in flight and "
                         "a redelivery after their lease, or the reconciler, finishes them.");
      }
      return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
    });
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
    return run("committing", &key, [&] {
      begin();
      const std::int64_t now = now_micros();
      if (change(sql_.commit, "committing", key, fence, SqliteBlob{result}, now) == 0) {
        const CommitStatus earlier = settled_earlier(key, fence, RecordStatus::committed);
        rollback();
        return earlier;
      }
      run_business(key, fence, now, business);
      end_commit(key);
      return CommitStatus::committed;
    });
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
    return run("committing", &key, [&] {
      begin();
      const std::int64_t now = now_micros();
      if (change(sql_.commit, "committing", key, fence, SqliteBlob{std::string_view()}, now) == 0) {
        const CommitStatus earlier = settled_earlier(key, fence, RecordStatus::committed);
        rollback();
        return earlier;
      }
      std::string result;
      auto write = [&](SqliteTransaction& tx) { result = produce(tx); };
      run_business(key, fence, now, write);
      change(sql_.set_result, "committing", key, fence, SqliteBlob{std::string_view(result)});
      end_commit(key);
      return CommitStatus::committed;
    });
  }

  /// Stores a permanent failure, only if `fence` still holds (`committed` also when this fence
  /// already stored it).
  CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle(sql_.fail, "storing a failure", key, fence, reason, RecordStatus::failed);
  }

  /// Parks the key for a human, only if `fence` still holds (`committed` also when this fence
  /// already parked it).
  CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle(sql_.escalate, "escalating", key, fence, reason, RecordStatus::escalated);
  }

  /// Gives back an in-flight reservation this caller holds after a transient failure: the row
  /// stays in flight and its lease ends now, so the next delivery takes the key over at once
  /// (with a higher fence). False when the fence no longer holds.
  bool release(const Key& key, std::int64_t fence) { return release(key, fence, {}); }

  /// Like `release`, and keeps `reason` (when not empty) as why this attempt gave the event back;
  /// the reconciler shows it when it gives up on the event.
  bool release(const Key& key, std::int64_t fence, std::string_view reason) {
    return run("releasing a key", &key, [&] {
      begin();
      const bool released = change(sql_.release, "releasing a key", key, fence,
                                   detail::sqlite::ended_lease, now_micros(), reason) > 0;
      end("releasing a key");
      return released;
    });
  }

  /// Extends the leases the caller still holds to `lease` from now, in one write transaction;
  /// returns how many it extended (a lease taken over meanwhile is not).
  std::size_t extend(std::span<const HeldLease> held, std::chrono::milliseconds lease) {
    if (held.empty()) return 0;
    return run("extending leases", nullptr, [&] {
      begin();
      const std::int64_t until = detail::sqlite::later(now_micros(), lease);
      std::size_t extended = 0;
      for (const HeldLease& h : held)
        extended += static_cast<std::size_t>(
            change(sql_.extend, "extending leases", h.key, h.fence, until));
      end("extending leases");
      return extended;
    });
  }

  /// The stored row, if any.
  std::optional<Record> find(const Key& key) {
    return run("reading a key", &key, [&]() -> std::optional<Record> {
      auto& read = statement(sql_.find);
      detail::sqlite::ResetGuard guard(read);
      read.bind("reading a key", key, gate_);
      if (!read.step("reading a key")) return std::nullopt;
      return detail::to_record(detail::sqlite::Row{read});
    });
  }

  /// Takes over up to `limit` in-flight rows whose lease expired and that have not changed for
  /// `stale_after`, oldest lease first, bumping their fence and attempts and granting a new
  /// `lease`. One write transaction: two reconcilers (threads or processes) never take the same
  /// row. `duration::max()` means forever (for `stale_after`: nothing is ever stale).
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    return run("taking stale rows", nullptr, [&] {
      begin();
      const std::int64_t now = now_micros();
      std::vector<Stranded> taken;
      {
        auto& take = statement(sql_.take_stale);
        detail::sqlite::ResetGuard guard(take);
        take.bind("taking stale rows", now, detail::sqlite::earlier(now, stale_after),
                  detail::sqlite::later(now, lease), detail::sql_limit(limit), gate_);
        while (take.step("taking stale rows"))
          taken.push_back({detail::key_from(take.bytes(0)), take.int64(1), take.bytes(2),
                           take.int64(3), take.is_null(4) ? std::string() : take.bytes(4)});
      }
      end("taking stale rows");
      return taken;
    });
  }

  /// Up to `limit` escalated rows, oldest first.
  std::vector<Record> escalated(std::size_t limit) {
    return run("listing escalated rows", nullptr, [&] {
      auto& list = statement(sql_.escalated);
      detail::sqlite::ResetGuard guard(list);
      list.bind("listing escalated rows", detail::sql_limit(limit), gate_);
      std::vector<Record> parked;
      while (list.step("listing escalated rows"))
        parked.push_back(detail::to_record(detail::sqlite::Row{list}));
      return parked;
    });
  }

  /// Commits an escalated row with `result` and `business(transaction&)` in one transaction;
  /// false (nothing written, `business` not run) if the row is not escalated. A business write
  /// that ends the store's transaction commits nothing and makes the call throw `StoreError`.
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    return run("resolving", &key, [&] {
      begin();
      const std::int64_t now = now_micros();
      std::int64_t fence = 0;
      {
        auto& update = statement(sql_.resolve);
        detail::sqlite::ResetGuard guard(update);
        update.bind("resolving", key, SqliteBlob{result}, now, gate_);
        if (!update.step("resolving")) {
          update.reset();
          rollback();
          return false;
        }
        fence = update.int64(0);
      }
      run_business(key, fence, now, business);
      end_commit(key);
      return true;
    });
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
  std::size_t redrive_failed(const Key& key) {
    return run("re-driving a failed row", &key, [&] {
      begin();
      const std::int64_t changed = change(sql_.redrive_key, "re-driving a failed row", key,
                                          detail::sqlite::ended_lease, now_micros());
      end("re-driving a failed row");
      return static_cast<std::size_t>(changed);
    });
  }

  /// Re-drives up to `limit` failed rows whose `updated_at` (when they failed) lies in
  /// [`from`, `to`), oldest first, as `redrive_failed(key)` does; returns how many changed.
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    return run("re-driving failed rows", nullptr, [&] {
      begin();
      const std::int64_t changed =
          change(sql_.redrive_range, "re-driving failed rows", detail::sqlite::to_micros(from),
                 detail::sqlite::to_micros(to), detail::sql_limit(limit),
                 detail::sqlite::ended_lease, now_micros());
      end("re-driving failed rows");
      return static_cast<std::size_t>(changed);
    });
  }

  /**
   * Re-drives up to `limit` failed rows of this gate whose reason is exactly `reason`, oldest
   * failure first, as `redrive_failed(key)` does; returns how many changed. The rows' history
   * keeps the reason.
   *
   * Example:
   *   store.redrive_cause("401 token expired", 1000);
   */
  std::size_t redrive_cause(std::string_view reason, std::size_t limit) {
    return run("re-driving a cause", nullptr, [&] {
      begin();
      const std::int64_t changed =
          change(sql_.redrive_cause, "re-driving a cause", reason, detail::sql_limit(limit),
                 detail::sqlite::ended_lease, now_micros());
      end("re-driving a cause");
      return static_cast<std::size_t>(changed);
    });
  }

  /// Up to `query.limit` rows of this gate that match `query`, the newest change first. An
  /// operator's query: filters other than the status scan the gate's rows.
  std::vector<Record> rows(const RowQuery& query) {
    return run("listing rows", nullptr, [&] {
      auto& list = statement(sql_.rows);
      detail::sqlite::ResetGuard guard(list);
      bind_query(list, "listing rows", query);
      std::vector<Record> found;
      while (list.step("listing rows"))
        found.push_back(detail::to_record(detail::sqlite::Row{list}));
      return found;
    });
  }

  /// How many rows of this gate match `query` (its limit aside).
  std::int64_t count(const RowQuery& query) {
    return run("counting rows", nullptr, [&] {
      auto& read = statement(sql_.count);
      detail::sqlite::ResetGuard guard(read);
      bind_query(read, "counting rows", query);
      return read.step("counting rows") ? read.int64(0) : std::int64_t{0};
    });
  }

  /// This gate's failed and escalated rows grouped by status and reason, most rows first (then
  /// the most recent), at most `limit` groups.
  std::vector<Cause> causes(std::size_t limit) {
    return run("grouping failures", nullptr, [&] {
      auto& list = statement(sql_.causes);
      detail::sqlite::ResetGuard guard(list);
      list.bind("grouping failures", detail::sql_limit(limit), gate_);
      std::vector<Cause> found;
      while (list.step("grouping failures"))
        found.push_back({parse_record_status(list.bytes(0)), list.bytes(1), list.int64(2),
                         detail::from_micros(list.int64(3)), detail::from_micros(list.int64(4))});
      return found;
    });
  }

  /// The gates that have rows in this log, sorted, whichever gate this handle is scoped to
  /// (rows of no gate are not listed). One step of the primary key's index per gate.
  std::vector<std::string> gates() {
    return run("listing gates", nullptr, [&] {
      auto& list = statement(sql_.gates);
      detail::sqlite::ResetGuard guard(list);
      list.bind("listing gates");
      std::vector<std::string> names;
      while (list.step("listing gates")) names.push_back(list.bytes(0));
      return names;
    });
  }

  /// The three signals over the events reserved in the last `window`, read in one statement (one
  /// consistent snapshot), with the in-flight rows being retried and the WAL file's size.
  StoreSignals signals(std::chrono::seconds window) {
    return run("reading the signals", nullptr, [&] {
      const std::int64_t now = now_micros();
      const std::int64_t since = detail::sqlite::earlier(now, window);
      auto& read = statement(sql_.signals);
      detail::sqlite::ResetGuard guard(read);
      read.bind("reading the signals", since, gate_);
      if (!read.step("reading the signals"))
        throw StoreError("idemgate: the signals query of " + table_ + " returned no row");
      // The oldest in-flight row comes as its creation instant in microseconds.
      StoreSignals s =
          detail::signals_from(detail::sqlite::Row{read}, window, [now](std::int64_t created) {
            return std::chrono::duration_cast<std::chrono::seconds>(
                std::chrono::microseconds(now - created));
          });
      s.wal_bytes = wal_bytes();
      return s;
    });
  }

  /// Keeps a downstream answer that differed from the stored one (`source`: where it was seen,
  /// such as "lost_lease" or "reconciler").
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    run("recording a mismatch", &key, [&] {
      begin();
      change(sql_.record_mismatch, "recording a mismatch", key, SqliteBlob{stored},
             SqliteBlob{observed}, source, now_micros());
      end("recording a mismatch");
      return 0;
    });
  }

  /// Up to `limit` recorded mismatches, newest first.
  std::vector<Mismatch> mismatches(std::size_t limit) {
    return run("listing mismatches", nullptr, [&] {
      auto& list = statement(sql_.mismatches);
      detail::sqlite::ResetGuard guard(list);
      list.bind("listing mismatches", detail::sql_limit(limit), gate_);
      std::vector<Mismatch> found;
      while (list.step("listing mismatches"))
        found.push_back({detail::key_from(list.bytes(0)), list.bytes(1), list.bytes(2),
                         list.bytes(3), detail::from_micros(list.int64(4))});
      return found;
    });
  }

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
    std::size_t deleted = 0;
    if (batch == 0) return deleted;
    for (;;) {
      const std::int64_t n = run("purging finished rows", nullptr, [&] {
        begin();
        const std::int64_t cutoff = detail::sqlite::earlier(now_micros(), older_than);
        const std::int64_t changed =
            change(sql_.purge, "purging finished rows", cutoff, detail::sql_limit(batch));
        end("purging finished rows");
        return changed;
      });
      deleted += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < batch) return deleted;
    }
  }

  /**
   * Gives this handle's gate the rows that belong to no gate (written before logs knew their
   * gates), up to `limit` of them in one write transaction, except keys this gate already holds;
   * returns how many it moved. Call it until it returns less than `limit`. Throws
   * `std::logic_error` on a handle scoped to no gate.
   *
   * Example:
   *   while (store.for_gate("ect.claim_slot").adopt_unowned_rows(1000) == 1000) {}
   */
  std::size_t adopt_unowned_rows(std::size_t limit) {
    detail::require_named_scope(gate_, "adopt_unowned_rows");
    return run("adopting rows of no gate", nullptr, [&] {
      begin();
      const std::int64_t moved =
          change(sql_.adopt, "adopting rows of no gate", detail::sql_limit(limit));
      end("adopting rows of no gate");
      return static_cast<std::size_t>(moved);
    });
  }

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
    run("backing up", nullptr, [&] {
      detail::sqlite::copy_database(db_.get(), destination);
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
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The table this store writes.
  [[nodiscard]] const std::string& table() const noexcept { return table_; }
  /// The longest a call waits in all (`SqliteOptions::busy_timeout`).
  [[nodiscard]] std::chrono::milliseconds busy_timeout() const noexcept { return busy_timeout_; }
  /// The size the WAL is kept to (`SqliteOptions::wal_size_limit`).
  [[nodiscard]] std::size_t wal_size_limit() const noexcept { return wal_size_limit_; }

 private:
  struct Statements {
    std::string reserve, duplicate, take_over, commit, fail, escalate, release, find, take_stale,
        escalated, resolve, settled, signals, record_mismatch, mismatches, purge, redrive_key,
        redrive_range, left_as_written, extend, adopt, reserve_labelled, redrive_cause, rows, count,
        causes, gates, set_result;
  };

  // Everything the handles on one connection share: the connection, its lock and statements,
  // the options, and the state of the call that holds the lock. SQLite's hooks point here, never
  // at a handle, which may be gone while the connection lives on.
  struct Shared {
    Shared(std::string file, SqliteOptions options)
        : path(std::move(file)),
          table(detail::sqlite::checked_table_name(options.table)),
          busy_timeout(options.busy_timeout),
          wal_size_limit(options.wal_size_limit),
          clock(options.clock ? std::move(options.clock)
                              : Clock([] { return std::chrono::system_clock::now(); })),
          sql(statements(table)),
          random(static_cast<std::uint_fast32_t>(
              std::hash<const void*>{}(this) ^
              static_cast<std::size_t>(
                  std::chrono::steady_clock::now().time_since_epoch().count()))) {}

    std::string path;
    std::string table;
    std::chrono::milliseconds busy_timeout;
    std::size_t wal_size_limit;
    Clock clock;
    Statements sql;
    detail::sqlite::Connection db;
    std::unordered_map<std::string, std::unique_ptr<detail::sqlite::Statement>> cache;
    std::timed_mutex mutex;
    std::minstd_rand random;
    std::string wal_path;
    std::int64_t page_size = 4096;

    // Guarded by mutex: the current call's deadline, the business write's guard, the WAL.
    std::chrono::steady_clock::time_point deadline{};
    bool guarding = false;
    bool business_ran = false;
    int vetoed = 0;
    int rollbacks = 0;
    std::int64_t wal_frames = 0;
    std::chrono::steady_clock::time_point next_checkpoint{};
    std::chrono::milliseconds checkpoint_backoff{0};
    std::chrono::steady_clock::time_point contended_at{};
    std::chrono::steady_clock::time_point committed_at{};

    // Who holds mutex, read by calls that wait for it.
    std::atomic<const char*> holder_doing{nullptr};
    std::atomic<std::int64_t> holder_since{0};
    std::atomic<bool> holder_in_business{false};
    std::atomic<std::thread::id> holder_thread{};
  };

  SqliteStore(std::shared_ptr<Shared> shared, std::string gate)
      : shared_(std::move(shared)),
        gate_(std::move(gate)),
        path_(shared_->path),
        table_(shared_->table),
        busy_timeout_(shared_->busy_timeout),
        wal_size_limit_(shared_->wal_size_limit),
        clock_(shared_->clock),
        sql_(shared_->sql),
        db_(shared_->db),
        cache_(shared_->cache),
        mutex_(shared_->mutex),
        random_(shared_->random),
        wal_path_(shared_->wal_path),
        page_size_(shared_->page_size),
        deadline_(shared_->deadline),
        guarding_(shared_->guarding),
        business_ran_(shared_->business_ran),
        vetoed_(shared_->vetoed),
        rollbacks_(shared_->rollbacks),
        wal_frames_(shared_->wal_frames),
        next_checkpoint_(shared_->next_checkpoint),
        checkpoint_backoff_(shared_->checkpoint_backoff),
        contended_at_(shared_->contended_at),
        committed_at_(shared_->committed_at),
        holder_doing_(shared_->holder_doing),
        holder_since_(shared_->holder_since),
        holder_in_business_(shared_->holder_in_business),
        holder_thread_(shared_->holder_thread) {}

  /// Marks the store's lock as held by the calling thread, for the errors of calls that wait.
  class Holding {
   public:
    Holding(SqliteStore& store, const char* doing) noexcept : store_(store) {
      store_.holder_since_.store(std::chrono::steady_clock::now().time_since_epoch().count());
      store_.holder_doing_.store(doing);
      store_.holder_thread_.store(std::this_thread::get_id());
    }
    Holding(const Holding&) = delete;
    Holding& operator=(const Holding&) = delete;
    ~Holding() {
      store_.holder_thread_.store(std::thread::id());
      store_.holder_doing_.store(nullptr);
      store_.holder_in_business_.store(false);
    }

   private:
    SqliteStore& store_;
  };

  /// Guards the business write's run: commits are vetoed and rollbacks counted until it ends.
  class Guarding {
   public:
    explicit Guarding(SqliteStore& store) noexcept : store_(store) {
      store_.vetoed_ = 0;
      store_.rollbacks_ = 0;
      store_.guarding_ = true;
      store_.business_ran_ = true;
      store_.holder_in_business_.store(true);
    }
    Guarding(const Guarding&) = delete;
    Guarding& operator=(const Guarding&) = delete;
    ~Guarding() {
      store_.guarding_ = false;
      store_.holder_in_business_.store(false);
    }

   private:
    SqliteStore& store_;
  };

  // The log table `t`, created by `create` ("CREATE TABLE IF NOT EXISTS " or "CREATE TABLE ").
  static std::string log_table_sql(std::string_view create, const std::string& t) {
    return std::string(create) + t +
           " (\n"
           "  gate        TEXT    NOT NULL DEFAULT '',  -- the gate the row belongs to ('': none)\n"
           "  key         BLOB    NOT NULL\n"
           "              CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
           "  status      TEXT    NOT NULL\n"
           "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
           "  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
           "  lease_until INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
           "  fingerprint BLOB    NOT NULL\n"
           "              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),\n"
           "  request     BLOB    NOT NULL,\n"
           "  result      BLOB,\n"
           "  reason      TEXT,\n"
           "  duplicates  INTEGER NOT NULL DEFAULT 0,  -- reservations that met this key\n"
           "  attempts    INTEGER NOT NULL DEFAULT 1,  -- 1 + takeovers and re-drives\n"
           "  label       TEXT,  -- a readable label, kept only when asked (GateOptions)\n"
           "  history     TEXT,  -- JSON: the newest ends of attempts and operators' actions\n"
           "  created_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
           "  updated_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
           "  PRIMARY KEY (gate, key),  -- two gates may hold the same key\n"
           "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
           ");\n";
  }

  // Every index leads with the gate: each scan reads only its own gate's rows.
  static std::string indexes_sql(const std::string& t) {
    return "-- Stranded work: the reconciler's scan, the in-flight count and the oldest row.\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_in_flight ON " + t +
           " (gate, lease_until) WHERE status = 'in_flight';\n"
           "-- The manual queue and its count.\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_escalated ON " + t +
           " (gate, updated_at) WHERE status = 'escalated';\n"
           "-- Re-driving failed rows by when they failed.\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_failed ON " + t +
           " (gate, updated_at) WHERE status = 'failed';\n"
           "-- Retention and the signals' window.\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_created ON " + t + " (gate, created_at);\n";
  }

  // Rebuilds a log made before rows knew their gates (primary key: the key alone) with the
  // primary key (gate, key), inside migrate()'s transaction: SQLite cannot change a primary key
  // in place. Its rows are copied as rows of no gate (''); dropping the old table drops its
  // indexes, and migrate() creates the new ones.
  void add_gates_to_log() {
    const std::string rebuilt = table_ + "_with_gates";
    std::string columns;  // every column but the gate, by name: the old log's order may differ
    for (std::string_view name : detail::log_column_names)
      if (name != detail::gate_column) columns.append(columns.empty() ? "" : ", ").append(name);
    detail::sqlite::exec(db_.get(), log_table_sql("CREATE TABLE ", rebuilt));
    detail::sqlite::exec(db_.get(), "INSERT INTO " + rebuilt + " (gate, " + columns +
                                        ") SELECT '', " + columns + " FROM " + table_);
    detail::sqlite::exec(db_.get(), "DROP TABLE " + table_);
    detail::sqlite::exec(db_.get(), "ALTER TABLE " + rebuilt + " RENAME TO " + table_);
  }

  // The row's history with one more entry (`outcome`, `reason`, `at`: SQL expressions) for the
  // attempt the row is at, keeping the newest `history_limit` entries, as JSON text.
  static std::string history_with(std::string_view outcome, std::string_view reason,
                                  std::string_view at) {
    const std::string kept = "coalesce(history, '[]')";
    return "json_insert(CASE WHEN json_array_length(" + kept +
           ") >= " + std::to_string(history_limit) + " THEN json_remove(" + kept +
           ", '$[0]') ELSE " + kept + " END, '$[#]', json_object('attempt', attempts, 'outcome', " +
           std::string(outcome) + ", 'reason', " + std::string(reason) + ", 'at', " +
           std::string(at) + "))";
  }

  // A takeover's history: an entry when the holder's lease ran out, none when it was given
  // back (released or re-driven: those wrote their own, and end the lease at the epoch or
  // before).
  static std::string taken_over_history(std::string_view at) {
    return "CASE WHEN lease_until <= 0 THEN history ELSE " +
           history_with("'" + std::string(detail::taken_over_outcome) + "'",
                        "'" + std::string(detail::lease_expired) + "'", at) +
           " END";
  }

  // Every statement takes the handle's gate as its last parameter (`change` and the reads bind
  // it): a handle never reads or writes another gate's row.
  static Statements statements(const std::string& t) {
    const std::string columns = detail::record_select_list(
        [](detail::LogColumn, std::string_view name) { return std::string(name); });
    Statements s;
    // A new key is inserted; for a key that exists, `duplicate` counts the reservation and
    // returns the stored row, in the same write transaction, so no reservation goes uncounted.
    s.reserve = "INSERT INTO " + t +
                " (gate, key, status, fence, lease_until, fingerprint, request, duplicates,"
                " attempts, created_at, updated_at)"
                " VALUES (?6, ?1, 'in_flight', 1, ?2, ?3, ?4, 0, 1, ?5, ?5)"
                " ON CONFLICT (gate, key) DO NOTHING";
    s.reserve_labelled = "INSERT INTO " + t +
                         " (gate, key, status, fence, lease_until, fingerprint, request,"
                         " duplicates, attempts, created_at, updated_at, label)"
                         " VALUES (?7, ?1, 'in_flight', 1, ?2, ?3, ?4, 0, 1, ?5, ?5, ?6)"
                         " ON CONFLICT (gate, key) DO NOTHING";
    s.duplicate = "UPDATE " + t +
                  " SET duplicates = duplicates + 1 WHERE gate = ?2 AND key = ?1"
                  " RETURNING fence, status, fingerprint, lease_until, result, reason";
    s.take_over = "UPDATE " + t +
                  " SET fence = fence + 1, attempts = attempts + 1, lease_until = ?3,"
                  " updated_at = ?4, history = " +
                  taken_over_history("?4") +
                  " WHERE gate = ?5 AND key = ?1 AND status = 'in_flight' AND fence = ?2"
                  " AND lease_until < ?4 RETURNING fence";
    s.commit = "UPDATE " + t +
               " SET status = 'committed', result = ?3, updated_at = ?4"
               " WHERE gate = ?5 AND key = ?1 AND status = 'in_flight' AND fence = ?2";
    s.fail = "UPDATE " + t + " SET status = 'failed', reason = ?3, updated_at = ?4, history = " +
             history_with("'failed'", "?3", "?4") +
             " WHERE gate = ?5 AND key = ?1 AND status = 'in_flight' AND fence = ?2";
    s.escalate = "UPDATE " + t +
                 " SET status = 'escalated', reason = ?3, updated_at = ?4, history = " +
                 history_with("'escalated'", "?3", "?4") +
                 " WHERE gate = ?5 AND key = ?1 AND status = 'in_flight' AND fence = ?2";
    // The row stays: its lease ends, so the next delivery takes it over with a higher fence (a
    // worker still holding the old fence can never commit), and if no delivery comes back the
    // reconciler finishes the event.
    s.release = "UPDATE " + t +
                " SET lease_until = ?3, updated_at = ?4,"
                " reason = CASE WHEN ?5 = '' THEN reason ELSE ?5 END,"
                " history = CASE WHEN ?5 = '' THEN history ELSE " +
                history_with("'released'", "?5", "?4") +
                " END WHERE gate = ?6 AND key = ?1 AND status = 'in_flight' AND fence = ?2";
    s.extend = "UPDATE " + t +
               " SET lease_until = ?3"
               " WHERE gate = ?4 AND key = ?1 AND status = 'in_flight' AND fence = ?2";
    s.find = "SELECT " + columns + " FROM " + t + " WHERE gate = ?2 AND key = ?1";
    s.take_stale = "UPDATE " + t +
                   " SET fence = fence + 1, attempts = attempts + 1, lease_until = ?3,"
                   " updated_at = ?1, history = " +
                   taken_over_history("?1") + " WHERE gate = ?5 AND key IN (SELECT key FROM " + t +
                   " WHERE gate = ?5 AND status = 'in_flight' AND lease_until < ?1"
                   " AND updated_at <= ?2 ORDER BY lease_until LIMIT ?4)"
                   " RETURNING key, fence, request, attempts, reason";
    s.escalated = "SELECT " + columns + " FROM " + t +
                  " WHERE gate = ?2 AND status = 'escalated' ORDER BY updated_at, rowid LIMIT ?1";
    s.resolve = "UPDATE " + t +
                " SET status = 'committed', result = ?2, updated_at = ?3, history = " +
                history_with("'resolved'", "coalesce(reason, '')", "?3") +
                " WHERE gate = ?4 AND key = ?1 AND status = 'escalated' RETURNING fence";
    s.settled = "SELECT status, fence FROM " + t + " WHERE gate = ?2 AND key = ?1";
    s.signals =
        "SELECT w.events, w.duplicates, f.n, f.oldest, e.n, m.keys, a.n, f.retrying FROM"
        " (SELECT count(*) AS events, coalesce(sum(duplicates), 0) AS duplicates FROM " +
        t +
        " WHERE gate = ?2 AND created_at >= ?1) AS w,"
        " (SELECT count(*) AS n, min(created_at) AS oldest,"
        " coalesce(sum(attempts > 1), 0) AS retrying FROM " +
        t +
        " WHERE gate = ?2 AND status = 'in_flight') AS f,"
        " (SELECT count(*) AS n FROM " +
        t +
        " WHERE gate = ?2 AND status = 'escalated') AS e,"
        " (SELECT count(DISTINCT key) AS keys FROM " +
        t +
        "_mismatches WHERE gate = ?2 AND at >= ?1) AS m,"
        " (SELECT count(*) AS n FROM " +
        t + "_mismatches WHERE gate = ?2) AS a";
    s.record_mismatch = "INSERT INTO " + t +
                        "_mismatches (gate, key, stored, observed, source, at)"
                        " VALUES (?6, ?1, ?2, ?3, ?4, ?5)";
    // rowid breaks ties between mismatches recorded in the same microsecond.
    s.mismatches = "SELECT key, stored, observed, source, at FROM " + t +
                   "_mismatches WHERE gate = ?2 ORDER BY at DESC, rowid DESC LIMIT ?1";
    s.purge = "DELETE FROM " + t + " WHERE gate = ?3 AND key IN (SELECT key FROM " + t +
              " WHERE gate = ?3 AND created_at < ?1 AND updated_at < ?1"
              " AND status IN ('committed', 'failed') LIMIT ?2)";
    // A re-driven row is in flight under a new fence with its lease ended: the next delivery
    // takes it over at once, or the reconciler does.
    // The history keeps the reason the re-drive clears.
    const auto redrive = [&t](const char* lease, const char* now) {
      return "UPDATE " + t +
             " SET status = 'in_flight', fence = fence + 1, attempts = attempts + 1,"
             " reason = NULL, history = " +
             history_with("'redriven'", "coalesce(reason, '')", now) + ", lease_until = " + lease +
             ", updated_at = " + now;
    };
    s.redrive_key = redrive("?2", "?3") + " WHERE gate = ?4 AND key = ?1 AND status = 'failed'";
    s.redrive_range = redrive("?4", "?5") + " WHERE gate = ?6 AND key IN (SELECT key FROM " + t +
                      " WHERE gate = ?6 AND status = 'failed' AND updated_at >= ?1"
                      " AND updated_at < ?2 ORDER BY updated_at LIMIT ?3)";
    s.redrive_cause = redrive("?3", "?4") + " WHERE gate = ?5 AND key IN (SELECT key FROM " + t +
                      " WHERE gate = ?5 AND status = 'failed' AND coalesce(reason, '') = ?1"
                      " ORDER BY updated_at LIMIT ?2)";
    // An operator's filters: each parameter that is NULL (or '' for the label) matches any row.
    const std::string filter =
        " WHERE gate = ?7 AND (?1 IS NULL OR status = ?1)"
        " AND (?2 IS NULL OR coalesce(reason, '') = ?2)"
        " AND (?3 = '' OR instr(coalesce(label, ''), ?3) > 0)"
        " AND (?4 IS NULL OR updated_at >= ?4) AND (?5 IS NULL OR updated_at < ?5)";
    s.rows =
        "SELECT " + columns + " FROM " + t + filter + " ORDER BY updated_at DESC, key LIMIT ?6";
    s.count = "SELECT count(*) FROM " + t + filter;
    s.causes =
        "SELECT status, coalesce(reason, ''), count(*), min(updated_at), max(updated_at)"
        " FROM " +
        t +
        " WHERE gate = ?2 AND status IN ('failed', 'escalated')"
        " GROUP BY status, coalesce(reason, '')"
        " ORDER BY count(*) DESC, max(updated_at) DESC LIMIT ?1";
    // One step of the primary key's index per gate, however many rows each holds.
    s.gates = "WITH RECURSIVE g(name) AS (SELECT min(gate) FROM " + t +
              " WHERE gate > '' UNION ALL SELECT (SELECT min(gate) FROM " + t +
              " WHERE gate > g.name) FROM g WHERE g.name IS NOT NULL)"
              " SELECT name FROM g WHERE name IS NOT NULL";
    // commit_computed's result, written once its producer ran, under the commit's fence.
    s.set_result = "UPDATE " + t + " SET result = ?3" +
                   " WHERE gate = ?4 AND key = ?1 AND status = 'committed' AND fence = ?2";
    s.left_as_written = "SELECT count(*) FROM " + t +
                        " WHERE gate = ?4 AND key = ?1 AND status = 'committed' AND fence = ?2"
                        " AND updated_at = ?3";
    // Rows of no gate move to the handle's gate, except keys it already holds.
    s.adopt = "UPDATE " + t + " SET gate = ?2 WHERE gate = '' AND key IN (SELECT u.key FROM " + t +
              " AS u WHERE u.gate = '' AND NOT EXISTS (SELECT 1 FROM " + t +
              " AS held WHERE held.gate = ?2 AND held.key = u.key) LIMIT ?1)";
    return s;
  }

  void open() {
    sqlite3* raw = nullptr;
    const int code =
        sqlite3_open_v2(path_.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    db_.reset(raw);  // SQLite allocates a handle even when opening fails
    if (code != SQLITE_OK) {
      const std::string message = detail::sqlite::message_of(raw, code);
      throw StoreError("idemgate: cannot open the SQLite database at " + path_ + ": " + message +
                       ". " + detail::sqlite::advice(code, message));
    }
    sqlite3_extended_result_codes(db_.get(), 1);
    // The hooks get the shared state: the connection outlives any one handle.
    sqlite3_busy_handler(db_.get(), &SqliteStore::on_busy, shared_.get());
    sqlite3_commit_hook(db_.get(), &SqliteStore::on_commit, shared_.get());
    sqlite3_rollback_hook(db_.get(), &SqliteStore::on_rollback, shared_.get());
    sqlite3_wal_hook(db_.get(), &SqliteStore::on_wal, shared_.get());
    // The first statement reads the file's header: a file that is not a database fails here.
    std::string mode;
    run("switching to WAL mode", nullptr, [&] {
      detail::sqlite::Statement pragma(db_.get(), "PRAGMA journal_mode=WAL",
                                       "switching to WAL mode");
      if (pragma.step("switching to WAL mode")) mode = pragma.bytes(0);
      return 0;
    });
    const bool in_memory = path_.empty() || path_ == ":memory:";
    if (!in_memory && mode != "wal")
      throw StoreError("idemgate: the SQLite database at " + path_ +
                       " cannot use WAL mode (it stays in \"" + mode +
                       "\" mode); several processes could not share it safely. Put it on a "
                       "local filesystem (not NFS or SMB) that supports shared memory.");
    run("configuring the connection", nullptr, [&] {
      detail::sqlite::exec(db_.get(), "PRAGMA synchronous=FULL");
      // SQLite cuts the WAL back to this size whenever it starts it over.
      detail::sqlite::exec(db_.get(),
                           "PRAGMA journal_size_limit=" + std::to_string(wal_size_limit_));
      page_size_ = detail::sqlite::query_int(db_.get(), "PRAGMA page_size").value_or(4096);
      return 0;
    });
    const char* file = sqlite3_db_filename(db_.get(), "main");
    if (!in_memory && file != nullptr && *file != '\0') wal_path_ = sqlite3_filename_wal(file);
    // A file, -wal or -shm this process may only read opens without complaint and fails at the
    // first write: take the write lock once now, so the constructor says so.
    run("checking that this process can write the database", nullptr, [&] {
      begin();
      rollback();
      return 0;
    });
  }

  // The body of `reserve` inside an open write transaction, at `now`.
  Reservation reserve_row(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                          std::int64_t now, std::chrono::milliseconds lease,
                          std::string_view label) {
    const SqliteBlob fingerprint_blob{
        {reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()}};
    const std::int64_t until = detail::sqlite::later(now, lease);
    // A new key: one INSERT, with no RETURNING (SQLite builds a temporary table per run for
    // one) and no statement journal, so the common case allocates nothing per event.
    const bool inserted = label.empty()
                              ? change(sql_.reserve, "reserving a key", key, until,
                                       fingerprint_blob, SqliteBlob{request}, now) == 1
                              : change(sql_.reserve_labelled, "reserving a key", key, until,
                                       fingerprint_blob, SqliteBlob{request}, now, label) == 1;
    if (inserted) return Reservation::acquired(1);
    Reservation found;
    bool take_over = false;
    {
      // The key exists (the write lock is held since BEGIN): count the duplicate, read the row.
      auto& met = statement(sql_.duplicate);
      detail::sqlite::ResetGuard guard(met);
      met.bind("reserving a key", key, gate_);
      if (!met.step("reserving a key"))
        throw StoreError("idemgate: the reservation of key " + key.hex() + " in " + table_ +
                         " neither inserted nor found its row; check the table's PRIMARY KEY "
                         "(compare it with SqliteStore::schema_sql())");
      const std::string stored_fingerprint = met.bytes(2);
      const bool same =
          stored_fingerprint.size() == fingerprint.size() &&
          std::memcmp(stored_fingerprint.data(), fingerprint.data(), fingerprint.size()) == 0;
      found = Reservation::existing(met.int64(0), parse_record_status(met.bytes(1)), same,
                                    met.bytes(4), met.bytes(5));
      take_over = found.status == RecordStatus::in_flight && same && met.int64(3) < now;
    }
    if (take_over) {
      auto& take = statement(sql_.take_over);
      detail::sqlite::ResetGuard guard(take);
      take.bind("taking over a lease", key, found.fence, until, now, gate_);
      if (take.step("taking over a lease")) return Reservation::taken_over(take.int64(0));
    }
    // The duplicate counted above is kept.
    return found;
  }

  detail::sqlite::Statement& statement(const std::string& sql) {
    auto it = cache_.find(sql);
    if (it == cache_.end())
      it = cache_
               .emplace(sql, std::make_unique<detail::sqlite::Statement>(
                                 db_.get(), sql, "preparing a statement", true))
               .first;
    return *it->second;
  }

  // Runs one unit of work under the store's lock, within one deadline: the wait for the lock
  // and SQLite's wait for other connections (the busy handler) both end at it. Anything thrown
  // rolls back an open transaction. Where SQLite cannot wait (a WAL recovery in another
  // process), the unit is tried again until the deadline: every unit is a whole transaction, so
  // that is safe, except once the business write has run (it is never run twice).
  template <class Work>
  auto run(const char* doing, const Key* key, Work&& work) -> decltype(work()) {
    const auto started = std::chrono::steady_clock::now();
    const auto deadline = started + busy_timeout_;
    if (holder_thread_.load() == std::this_thread::get_id()) throw reentered(doing);
    std::unique_lock lock(mutex_, std::defer_lock);
    if (!lock.try_lock()) {
      // Who holds the store now, for the error: by the deadline it may have just let go.
      const Holder before = holder();
      // The wait is against the system clock, re-armed until the steady deadline (a clock that
      // jumps cannot stretch or cut it): libstdc++ then waits in pthread_mutex_timedlock, which
      // the ThreadSanitizer runs of the tests see as a lock (they miss its steady-clock wait).
      for (;;) {
        const auto left = deadline - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero())
          throw held_in_process(doing, key, before);
        if (lock.try_lock_until(
                std::chrono::system_clock::now() +
                std::chrono::duration_cast<std::chrono::system_clock::duration>(left)))
          break;
      }
    }
    const Holding holding(*this, doing);
    deadline_ = deadline;
    for (;;) {
      business_ran_ = false;
      try {
        auto result = work();
        keep_wal_small();
        return result;
      } catch (const detail::sqlite::Error& e) {
        rollback_quietly();
        if (!e.busy() || business_ran_) throw;
        if (std::chrono::steady_clock::now() >= deadline) throw locked(doing, key);
      } catch (...) {
        rollback_quietly();
        throw;
      }
      pause(random_, 0, deadline - std::chrono::steady_clock::now());
    }
  }

  // A short, capped, jittered sleep: waiters in several processes poll often enough that short
  // transactions cannot starve one of them, and never in step with each other.
  static void pause(std::minstd_rand& random, int round, std::chrono::steady_clock::duration left) {
    if (left <= std::chrono::steady_clock::duration::zero()) return;
    const std::int64_t cap = std::min<std::int64_t>(2000, std::int64_t{50} << std::min(round, 6));
    std::uniform_int_distribution<std::int64_t> pick(cap / 2, cap);
    const std::chrono::steady_clock::duration sleep = std::chrono::microseconds(pick(random));
    std::this_thread::sleep_for(std::min(sleep, left));
  }

  // SQLite's busy handler: wait for another connection's lock until the call's deadline.
  static int on_busy(void* shared, int round) {
    auto& state = *static_cast<Shared*>(shared);
    const auto left = state.deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return 0;
    state.contended_at = std::chrono::steady_clock::now();
    pause(state.random, round, left);
    return 1;
  }

  // While the business write runs, no commit may happen: the only commit that may carry its
  // rows is the store's own, with the log row.
  static int on_commit(void* shared) {
    auto& state = *static_cast<Shared*>(shared);
    if (!state.guarding) return 0;
    ++state.vetoed;
    return 1;
  }

  static void on_rollback(void* shared) {
    auto& state = *static_cast<Shared*>(shared);
    if (state.guarding) ++state.rollbacks;
  }

  // A WAL hook replaces SQLite's automatic checkpoint, so this one keeps it (passive, at
  // SQLite's default of 1000 frames) and notes the WAL's length for keep_wal_small().
  static int on_wal(void* shared, sqlite3* db, const char* name, int frames) {
    static_cast<Shared*>(shared)->wal_frames = frames;
    if (frames >= 1000)
      sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    return SQLITE_OK;
  }

  // Readers in other connections can keep the passive checkpoints from ever starting the WAL
  // over, and it then grows without end. Past the limit, a truncating checkpoint waits briefly
  // for the readers to step off the WAL and cuts it to nothing. A reader that holds one read
  // transaction open blocks it; the next write after a pause tries again.
  void keep_wal_small() {
    const std::int64_t frames = std::exchange(wal_frames_, 0);
    if (frames == 0 || wal_path_.empty()) return;
    const std::int64_t bytes = 32 + frames * (page_size_ + 24);
    if (bytes <= static_cast<std::int64_t>(wal_size_limit_)) return;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_checkpoint_) return;
    const auto saved = std::exchange(deadline_, std::min(deadline_, now + checkpoint_wait));
    const int code =
        sqlite3_wal_checkpoint_v2(db_.get(), "main", SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr);
    deadline_ = saved;
    // A reader still on the WAL: try again soon, then less and less often while it stays.
    checkpoint_backoff_ =
        code == SQLITE_OK ? std::chrono::milliseconds(0)
                          : std::clamp(checkpoint_backoff_ * 2, checkpoint_wait, checkpoint_pause);
    next_checkpoint_ = now + checkpoint_backoff_;
  }

  std::optional<std::int64_t> wal_bytes() const {
    if (wal_path_.empty()) return std::nullopt;
    std::error_code missing;
    const auto size = std::filesystem::file_size(wal_path_, missing);
    return missing ? 0 : static_cast<std::int64_t>(size);
  }

  // Runs the business write inside the store's transaction, then checks that the transaction is
  // still the store's own, with the row as the store wrote it, before anything may commit.
  template <class BusinessWrite>
  void run_business(const Key& key, std::int64_t fence, std::int64_t now, BusinessWrite& business) {
    const CommitItem row{key, fence, {}};
    run_business(std::span<const CommitItem>(&row, 1), now, business);
  }

  // The same for a business write that writes the rows of many log rows at once (`commit_bulk`);
  // an error names the first row's key.
  template <class BusinessWrite>
  void run_business(std::span<const CommitItem> rows, std::int64_t now, BusinessWrite& business) {
    const Key& key = rows.front().key;
    SqliteTransaction tx(db_.get());
    {
      const Guarding guarding(*this);
      business(tx);
    }
    const std::string running = reset_running_statements();
    std::string cause;
    if (sqlite3_commit_hook(db_.get(), &SqliteStore::on_commit, shared_.get()) != shared_.get())
      cause = "it replaced the store's commit hook (sqlite3_commit_hook on tx.db())";
    else if (vetoed_ > 0)
      cause = "it committed, or tried to, on its own: the store refused " +
              std::to_string(vetoed_) +
              " commit(s) made while it ran (a COMMIT or END, or a statement run after the "
              "store's transaction had ended)";
    else if (sqlite3_get_autocommit(db_.get()) != 0)
      cause =
          "the store's transaction is no longer open (a ROLLBACK of its own, or an error after "
          "which SQLite rolled the whole transaction back, caught and gone on from)";
    else if (rollbacks_ > 0)
      cause =
          "the store's transaction was rolled back while it ran (a ROLLBACK of its own, or an "
          "error after which SQLite rolled the whole transaction back, caught and gone on from) "
          "and another transaction was begun in its place";
    else if (!running.empty())
      cause = "it left a statement running, neither reset nor finalized (the store reset it): " +
              running;
    else if (!std::all_of(rows.begin(), rows.end(), [&](const CommitItem& row) {
               return left_as_written(row.key, row.fence, now);
             }))
      cause = "the log row the store wrote in this transaction is no longer as the store wrote it";
    sqlite3_rollback_hook(db_.get(), &SqliteStore::on_rollback, shared_.get());
    if (!cause.empty())
      throw BusinessWriteError(
          "idemgate: the business write for key " + key.hex() + " on " + path_ +
          " broke the store's transaction: " + cause +
          ". Nothing was committed: the row stays in flight and none of the "
          "business write's rows were written. Do not ack; fix the business write: "
          "let SQL errors propagate (SQLite rolls the whole transaction back after a "
          "trigger's RAISE(ROLLBACK), ON CONFLICT ROLLBACK, an interrupt, a full "
          "disk, an I/O error or out of memory), never BEGIN, COMMIT or ROLLBACK "
          "through tx.db(), and reset or finalize every statement it prepares.");
  }

  // The statements still running on the connection (after the business write, only its own),
  // reset so that none keeps a read open on the file; empty when there is none.
  std::string reset_running_statements() const {
    std::string running;
    for (sqlite3_stmt* s = sqlite3_next_stmt(db_.get(), nullptr); s != nullptr;
         s = sqlite3_next_stmt(db_.get(), s)) {
      if (sqlite3_stmt_busy(s) == 0) continue;
      const char* sql = sqlite3_sql(s);
      running += (running.empty() ? "" : "; ") +
                 std::string(sql != nullptr ? sql : "(a statement without SQL text)");
      sqlite3_reset(s);
    }
    return running;
  }

  bool left_as_written(const Key& key, std::int64_t fence, std::int64_t now) {
    auto& read = statement(sql_.left_as_written);
    detail::sqlite::ResetGuard guard(read);
    read.bind("checking the log row before committing", key, fence, now, gate_);
    return read.step("checking the log row before committing") && read.int64(0) == 1;
  }

  std::logic_error reentered(const char* doing) const {
    return std::logic_error(std::string("idemgate: the store was called (") + doing +
                            ") from inside its own business write on " + path_ +
                            "; that call could never get the store. Do not call the store from "
                            "inside the business write: write through its transaction only.");
  }

  // A snapshot of who holds the store's lock.
  struct Holder {
    const char* doing = nullptr;
    bool business = false;
    std::int64_t since = 0;
  };

  Holder holder() const noexcept {
    return {holder_doing_.load(), holder_in_business_.load(), holder_since_.load()};
  }

  StoreError held_in_process(const char* doing, const Key* key, const Holder& before) const {
    Holder last = holder();
    if (last.doing == nullptr) last = before;
    const char* what = last.doing;
    const bool business = last.business;
    const auto held = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now().time_since_epoch() -
        std::chrono::steady_clock::duration(last.since));
    const std::string for_how_long =
        " has held the store for " + std::to_string(held.count()) + " ms";
    std::string who;
    if (business)
      who = "a business write in this process" + for_how_long + " (" +
            (what != nullptr ? what : "committing") + ")";
    else if (what != nullptr)
      who = "another call in this process (" + std::string(what) + ")" + for_how_long;
    else
      who = "other calls in this process kept the store busy";
    return StoreError(
        "idemgate: " + who + "; " + doing +
        (key != nullptr ? std::string(1, ' ').append(key->hex()) : std::string()) + " on " + path_ +
        " gave up at the busy timeout (" + std::to_string(busy_timeout_.count()) +
        " ms); nothing was written. Do not ack: the redelivery will try again. " +
        (business ? "A business write must not wait on anything slow (a network call, a lock, a "
                    "queue): do that before the commit, or raise SqliteOptions::busy_timeout."
                  : "Threads share one store's connection one at a time: give busy threads "
                    "stores of their own, or raise SqliteOptions::busy_timeout."));
  }

  StoreError locked(const char* doing, const Key* key) const {
    return StoreError(
        "idemgate: another connection or process held the write lock on " + path_ +
        " for the whole busy timeout (" + std::to_string(busy_timeout_.count()) + " ms) while " +
        doing + (key != nullptr ? std::string(1, ' ').append(key->hex()) : std::string()) +
        "; nothing was written. Do not ack: the redelivery will try again. If it persists, find "
        "the connection that keeps a write transaction open (a business write waiting on "
        "something, a tool with an open transaction), or raise SqliteOptions::busy_timeout.");
  }

  void begin() {
    // Under contention, a store that committed a moment ago steps back briefly before taking
    // the write lock again, so that waiting processes (polling) get their turn.
    const auto now = std::chrono::steady_clock::now();
    if (now - contended_at_ < contention_memory && now - committed_at_ < contention_memory / 50)
      pause(random_, 1, deadline_ - now);
    auto& start = statement("BEGIN IMMEDIATE");
    start.bind("starting a write transaction");
    start.step("starting a write transaction");
    start.reset();
  }

  void end(std::string_view doing) {
    auto& finish = statement("COMMIT");
    finish.bind(doing);
    finish.step(doing);
    finish.reset();
    committed_at_ = std::chrono::steady_clock::now();
  }

  // A failed COMMIT leaves the outcome unknown to the caller, as with any database.
  void end_commit(const Key& key) {
    try {
      end("committing");
    } catch (const detail::sqlite::Error& e) {
      if (e.busy()) throw;
      throw StoreError(std::string(e.what()) + " The commit of key " + key.hex() +
                       " could not be confirmed. Do not ack: the row stays in flight and a "
                       "redelivery after its lease, or the reconciler, finishes it.");
    }
  }

  // Runs one statement without parameters or rows (a savepoint's).
  void simple(const char* sql, std::string_view doing) {
    auto& step = statement(sql);
    step.bind(doing);
    step.step(doing);
    step.reset();
  }

  // Ends the current item's savepoint of a group commit, after its business write: gone only if
  // the business write released it or rolled back past it.
  void release_item_savepoint(const Key& key) {
    try {
      simple("RELEASE SAVEPOINT idemgate_item", "committing a group");
    } catch (const detail::sqlite::Error& e) {
      if (e.busy()) throw;
      throw BusinessWriteError(
          "idemgate: the business write for key " + key.hex() + " on " + path_ +
          " broke the store's transaction: the store's savepoint for it is gone (" + e.what() +
          "). Nothing of it was committed: the row stays in flight. Do not ack; fix the "
          "business write: never RELEASE or ROLLBACK TO a savepoint it did not make.");
    }
  }

  // Undoes the current item of a group commit; false when the transaction is gone.
  bool rolled_back_to_savepoint() {
    if (sqlite3_get_autocommit(db_.get()) != 0) return false;
    try {
      simple("ROLLBACK TO SAVEPOINT idemgate_item", "committing a group");
      simple("RELEASE SAVEPOINT idemgate_item", "committing a group");
      return true;
    } catch (const detail::sqlite::Error&) {
      return false;
    }
  }

  void rollback() {
    if (sqlite3_get_autocommit(db_.get()) != 0) return;
    auto& undo = statement("ROLLBACK");
    undo.bind("rolling back");
    undo.step("rolling back");
    undo.reset();
  }

  void rollback_quietly() noexcept {
    for (auto& [sql, cached] : cache_) cached->reset();
    if (db_ != nullptr && sqlite3_get_autocommit(db_.get()) == 0)
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
  }

  template <class... Args>
  std::int64_t change(const std::string& sql, std::string_view doing, const Args&... args) {
    auto& update = statement(sql);
    detail::sqlite::ResetGuard guard(update);
    update.bind(doing, args..., gate_);
    while (update.step(doing)) {
    }
    return sqlite3_changes64(db_.get());
  }

  // After a fenced update touched no row: was it this fence's own earlier attempt that landed?
  CommitStatus settled_earlier(const Key& key, std::int64_t fence, RecordStatus target) {
    auto& read = statement(sql_.settled);
    detail::sqlite::ResetGuard guard(read);
    read.bind("checking an earlier attempt", key, gate_);
    if (!read.step("checking an earlier attempt"))
      throw StoreError("idemgate: the reservation of this event is gone from " + path_ +
                       " (lost in a crash or a restore?); nothing was written. Do not ack: the "
                       "redelivery reserves it again.");
    const RecordStatus status = parse_record_status(read.bytes(0));
    const std::int64_t stored = read.int64(1);
    const detail::Settled settled = detail::settled_state(status, stored, fence, target);
    if (settled == detail::Settled::fence_went_back)
      throw StoreError("idemgate: the event's row in " + path_ + " is back at fence " +
                       std::to_string(stored) + ", below this attempt's " + std::to_string(fence) +
                       " (its takeover was lost in a crash or a restore); nothing was written. "
                       "Do not ack: the redelivery or the reconciler takes it over again.");
    if (settled == detail::Settled::by_this_attempt) return CommitStatus::committed;
    return CommitStatus::lost_lease;
  }

  CommitStatus settle(const std::string& sql, const char* doing, const Key& key, std::int64_t fence,
                      std::string_view reason, RecordStatus target) {
    return run(doing, &key, [&] {
      begin();
      if (change(sql, doing, key, fence, reason, now_micros()) == 0) {
        const CommitStatus earlier = settled_earlier(key, fence, target);
        rollback();
        return earlier;
      }
      end(doing);
      return CommitStatus::committed;
    });
  }

  std::int64_t now_micros() const { return detail::sqlite::to_micros(clock_()); }

  // Binds an operator's query to `rows` or `count` (parameters ?1 to ?7, see statements()).
  void bind_query(detail::sqlite::Statement& read, std::string_view doing, const RowQuery& query) {
    const auto micros = [](const std::optional<std::chrono::system_clock::time_point>& at) {
      return at ? std::optional<std::int64_t>(detail::sqlite::to_micros(*at)) : std::nullopt;
    };
    read.bind(
        doing,
        query.status ? std::optional<std::string_view>(to_string(*query.status)) : std::nullopt,
        query.reason, query.label_contains, micros(query.changed_from), micros(query.changed_to),
        detail::sql_limit(query.limit), gate_);
  }

  // How long a truncating checkpoint may wait for readers, and how long to leave it after one
  // that could not finish (a reader holds a snapshot open).
  static constexpr std::chrono::milliseconds checkpoint_wait{100};
  static constexpr std::chrono::milliseconds checkpoint_pause{2000};
  // How long a store remembers that it had to wait for another connection.
  static constexpr std::chrono::milliseconds contention_memory{100};

  std::shared_ptr<Shared> shared_;
  std::string gate_;
  // This handle's view of the shared state, under the names the methods use.
  std::string& path_;
  std::string& table_;
  std::chrono::milliseconds& busy_timeout_;
  std::size_t& wal_size_limit_;
  Clock& clock_;
  Statements& sql_;
  detail::sqlite::Connection& db_;
  std::unordered_map<std::string, std::unique_ptr<detail::sqlite::Statement>>& cache_;
  std::timed_mutex& mutex_;
  std::minstd_rand& random_;
  std::string& wal_path_;
  std::int64_t& page_size_;
  std::chrono::steady_clock::time_point& deadline_;
  bool& guarding_;
  bool& business_ran_;
  int& vetoed_;
  int& rollbacks_;
  std::int64_t& wal_frames_;
  std::chrono::steady_clock::time_point& next_checkpoint_;
  std::chrono::milliseconds& checkpoint_backoff_;
  std::chrono::steady_clock::time_point& contended_at_;
  std::chrono::steady_clock::time_point& committed_at_;
  std::atomic<const char*>& holder_doing_;
  std::atomic<std::int64_t>& holder_since_;
  std::atomic<bool>& holder_in_business_;
  std::atomic<std::thread::id>& holder_thread_;
};

static_assert(store<SqliteStore>);
static_assert(monitored_store<SqliteStore>);
static_assert(explaining_store<SqliteStore>);
static_assert(lease_extending_store<SqliteStore>);
static_assert(redrivable_store<SqliteStore>);
static_assert(labelling_store<SqliteStore>);
static_assert(operable_store<SqliteStore>);

}  // namespace idemgate
