#pragma once

/// The ledger on SQLite: its tables live in the same file as the idempotency log, and every
/// event's rows are written on the store's connection in the gate's transaction, so they commit
/// together with the event's outcome or not at all.

#include "ledger.hpp"

#include <idemgate/store/sqlite.hpp>

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace prepaid {

namespace detail {

/// A few statements on one SQLite connection, nothing more: the ledger's own connection (which
/// creates the tables and reads accounts back), or the store's inside the gate's transaction.
class SqliteDb {
 public:
  /// One row of a query's result.
  class Row {
   public:
    explicit Row(sqlite3_stmt* statement) : statement_(statement) {}
    /// Column `i` as an integer.
    [[nodiscard]] std::int64_t integer(int i) const { return sqlite3_column_int64(statement_, i); }
    /// Column `i` as text (or blob bytes).
    [[nodiscard]] std::string text(int i) const {
      const void* data = sqlite3_column_blob(statement_, i);
      const int size = sqlite3_column_bytes(statement_, i);
      if (data == nullptr || size <= 0) return {};
      return {static_cast<const char*>(data), static_cast<std::size_t>(size)};
    }

   private:
    sqlite3_stmt* statement_;
  };

  /// Opens a connection of its own to `path` (created by the store already) with a busy
  /// timeout.
  SqliteDb(const std::string& path, std::chrono::milliseconds busy_timeout) {
    sqlite3* raw = nullptr;
    const int code = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr);
    owned_.reset(raw);
    db_ = raw;
    if (code != SQLITE_OK) fail(code, "opening " + path);
    sqlite3_busy_timeout(db_, static_cast<int>(busy_timeout.count()));
  }

  /// Runs statements on `db`, a connection someone else owns (the store's `tx.db()`).
  explicit SqliteDb(sqlite3* db) noexcept : db_(db) {}

  /// Runs several statements without parameters.
  void run_script(const std::string& sql) {
    char* error = nullptr;
    const int code = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error);
    sqlite3_free(error);
    if (code != SQLITE_OK) fail(code, "running " + sql);
  }

  /// Runs one statement and calls `on_row(const Row&)` for each row it returns.
  template <class OnRow, class... Args>
  void query(std::string_view sql, OnRow&& on_row, const Args&... args) {
    sqlite3_stmt* raw = nullptr;
    int code = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &raw, nullptr);
    const std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> statement(raw,
                                                                               sqlite3_finalize);
    if (code != SQLITE_OK) fail(code, "preparing " + std::string(sql));
    int index = 0;
    (bind(raw, ++index, args), ...);
    while ((code = sqlite3_step(raw)) == SQLITE_ROW) on_row(Row(raw));
    if (code != SQLITE_DONE) fail(code, "running " + std::string(sql));
  }

  /// The first column of the first row, if any.
  template <class... Args>
  std::optional<std::int64_t> integer(std::string_view sql, const Args&... args) {
    std::optional<std::int64_t> out;
    query(
        sql,
        [&](const Row& row) {
          if (!out) out = row.integer(0);
        },
        args...);
    return out;
  }

  /// Rolls back an open transaction, if any; never throws.
  void rollback() noexcept {
    if (sqlite3_get_autocommit(db_) == 0) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }

 private:
  struct Closer {
    void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
  };

  template <class T>
  void bind(sqlite3_stmt* statement, int index, const T& value) {
    int code = SQLITE_OK;
    if constexpr (std::is_same_v<T, idemgate::Key>) {
      code = sqlite3_bind_blob(statement, index, value.bytes().data(),
                               static_cast<int>(value.bytes().size()), SQLITE_STATIC);
    } else if constexpr (std::is_integral_v<T>) {
      code = sqlite3_bind_int64(statement, index, static_cast<sqlite3_int64>(value));
    } else {
      const std::string_view text(value);
      code = sqlite3_bind_text(statement, index, text.data(), static_cast<int>(text.size()),
                               SQLITE_STATIC);
    }
    if (code != SQLITE_OK) fail(code, "binding a parameter");
  }

  [[noreturn]] void fail(int code, const std::string& doing) const {
    throw idemgate::StoreError("prepaid: SQLite failed while " + doing + ": " +
                               (db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(code)));
  }

  std::unique_ptr<sqlite3, Closer> owned_;  // empty for a connection someone else owns
  sqlite3* db_ = nullptr;
};

}  // namespace detail

/**
 * The prepaid ledger on SQLite. Each event's rows are written on the store's connection, in the
 * gate's `BEGIN IMMEDIATE` transaction (SQLite's single writer lock orders concurrent events);
 * the ledger's own connection to the file creates the tables and reads accounts back.
 *
 * Example:
 *   idemgate::SqliteStore store{path};
 *   store.migrate();
 *   prepaid::SqliteLedger ledger{path};
 *   ledger.migrate();
 */
class SqliteLedger {
 public:
  /// The store whose transaction writes the ledger's rows.
  using store_type = idemgate::SqliteStore;

  /// Opens the ledger's connection to the database file at `path`.
  explicit SqliteLedger(const std::string& path, LedgerConfig config = {})
      : config_(std::move(config)), db_(path, std::chrono::seconds(5)) {}

  /// The ledger's tables, for SQLite.
  [[nodiscard]] static std::string schema_sql() {
    return R"sql(
CREATE TABLE IF NOT EXISTS prepaid_accounts (
  account       TEXT    PRIMARY KEY,
  balance_cents INTEGER NOT NULL CHECK (balance_cents >= 0));
CREATE TABLE IF NOT EXISTS prepaid_debits (
  debit_id      INTEGER PRIMARY KEY,
  message_id    TEXT    NOT NULL UNIQUE,
  account       TEXT    NOT NULL REFERENCES prepaid_accounts (account),
  cost_cents    INTEGER NOT NULL CHECK (cost_cents >= 0),
  event_id      TEXT    NOT NULL,
  idem_key      BLOB    NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS prepaid_inbox (
  inbox_id      INTEGER PRIMARY KEY,
  message_id    TEXT    NOT NULL UNIQUE,
  account       TEXT    NOT NULL REFERENCES prepaid_accounts (account),
  sender        TEXT    NOT NULL,
  body          TEXT    NOT NULL,
  event_id      TEXT    NOT NULL,
  idem_key      BLOB    NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS prepaid_events (
  event_id      TEXT    PRIMARY KEY,
  account       TEXT    NOT NULL,
  kind          TEXT    NOT NULL CHECK (kind IN ('debit', 'inbox')),
  entry_id      INTEGER NOT NULL,
  message_id    TEXT    NOT NULL,
  reused        INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS prepaid_debits_account ON prepaid_debits (account);
CREATE INDEX IF NOT EXISTS prepaid_inbox_account ON prepaid_inbox (account);
CREATE INDEX IF NOT EXISTS prepaid_events_account ON prepaid_events (account);
)sql";
  }

  /// Creates the ledger's tables if missing.
  void migrate() {
    std::lock_guard lock(mutex_);
    db_.run_script("BEGIN IMMEDIATE;" + schema_sql() + "COMMIT;");
  }

  /**
   * The event's whole effect, in the gate's transaction on the store's connection: the ledger's
   * decision (see `claim_entry`) under a savepoint, rolled back to on a refusal so that a refused
   * event writes nothing on the ledger, then the event's record beside the row it points at.
   * The gate stores the decision with the key and commits them all at once.
   */
  Decision write(idemgate::SqliteTransaction& tx, const idemgate::Key& key, const Event& event) {
    tx.exec("SAVEPOINT prepaid_claim");
    Tx claim{tx, detail::SqliteDb(tx.db())};
    const Decision decision = claim_entry(claim, event, key, config_.initial_balance_cents);
    if (std::holds_alternative<Refusal>(decision)) tx.exec("ROLLBACK TO prepaid_claim");
    tx.exec("RELEASE prepaid_claim");
    if (const auto* entry = std::get_if<Entry>(&decision)) record(tx, event, *entry);
    if (event.message_id == config_.exit_before_commit) std::_Exit(3);
    return decision;
  }

  /// The account with its rows, read in one snapshot; nullopt when it was never used.
  std::optional<Account> account(std::string_view id) {
    std::lock_guard lock(mutex_);
    try {
      db_.run_script("BEGIN");
      std::optional<Account> out = read_account(id);
      db_.run_script("COMMIT");
      return out;
    } catch (...) {
      db_.rollback();
      throw;
    }
  }

 private:
  // The event record: which ledger row the event points at.
  static void record(idemgate::SqliteTransaction& tx, const Event& event, const Entry& entry) {
    tx.exec(
        "INSERT INTO prepaid_events (event_id, account, kind, entry_id, message_id, reused)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        event.event_id, event.account, entry.kind == Entry::Kind::debit ? "debit" : "inbox",
        entry.id, event.message_id, entry.reused);
  }

  // The operations `claim_entry` needs, inside the gate's transaction: plain writes through the
  // store's `exec`, statements that return rows on the same connection.
  struct Tx {
    idemgate::SqliteTransaction& tx;
    detail::SqliteDb db;

    void open_account(const std::string& account, std::int64_t balance) {
      tx.exec(
          "INSERT INTO prepaid_accounts (account, balance_cents) VALUES (?, ?)"
          " ON CONFLICT (account) DO NOTHING",
          account, balance);
    }
    std::optional<std::int64_t> insert_debit(const Event& e, const idemgate::Key& key) {
      return db.integer(
          "INSERT INTO prepaid_debits (message_id, account, cost_cents, event_id, idem_key)"
          " VALUES (?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING RETURNING debit_id",
          e.message_id, e.account, e.cost_cents, e.event_id, key);
    }
    bool take_balance(const std::string& account, std::int64_t cost) {
      return tx.exec(
                 "UPDATE prepaid_accounts SET balance_cents = balance_cents - ?2"
                 " WHERE account = ?1 AND balance_cents >= ?2",
                 account, cost) == 1;
    }
    std::optional<std::int64_t> insert_inbox(const Event& e, const idemgate::Key& key) {
      return db.integer(
          "INSERT INTO prepaid_inbox (message_id, account, sender, body, event_id, idem_key)"
          " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING RETURNING inbox_id",
          e.message_id, e.account, e.from, e.text, e.event_id, key);
    }
    HeldRow find_debit(const std::string& message_id, const idemgate::Key& key) {
      return find(
          "SELECT debit_id, account, cost_cents, idem_key = ?2 FROM prepaid_debits"
          " WHERE message_id = ?1",
          message_id, key);
    }
    HeldRow find_inbox(const std::string& message_id, const idemgate::Key& key) {
      return find(
          "SELECT inbox_id, account, 0, idem_key = ?2 FROM prepaid_inbox WHERE message_id = ?1",
          message_id, key);
    }
    HeldRow find(std::string_view sql, const std::string& message_id, const idemgate::Key& key) {
      std::optional<HeldRow> held;
      db.query(
          sql,
          [&](const detail::SqliteDb::Row& row) {
            held = HeldRow{row.integer(0), row.text(1), row.integer(2), row.integer(3) != 0};
          },
          message_id, key);
      if (!held)
        throw idemgate::StoreError("prepaid: message " + message_id +
                                   " conflicted but cannot be read back");
      return *held;
    }
  };

  std::optional<Account> read_account(std::string_view id) {
    const std::string account(id);
    const auto balance =
        db_.integer("SELECT balance_cents FROM prepaid_accounts WHERE account = ?", account);
    if (!balance) return std::nullopt;
    Account out;
    out.balance_cents = *balance;
    using Row = detail::SqliteDb::Row;
    db_.query(
        "SELECT debit_id, event_id, message_id, cost_cents FROM prepaid_debits"
        " WHERE account = ? ORDER BY debit_id",
        [&](const Row& r) {
          out.debits.push_back({r.integer(0), r.text(1), r.text(2), r.integer(3)});
        },
        account);
    db_.query(
        "SELECT inbox_id, event_id, message_id, sender FROM prepaid_inbox"
        " WHERE account = ? ORDER BY inbox_id",
        [&](const Row& r) {
          out.inbox.push_back({r.integer(0), r.text(1), r.text(2), r.text(3)});
        },
        account);
    db_.query(
        "SELECT event_id, kind, entry_id, message_id, reused FROM prepaid_events"
        " WHERE account = ? ORDER BY rowid",
        [&](const Row& r) {
          out.events.push_back({r.text(0), r.text(1), r.integer(2), r.text(3), r.integer(4) != 0});
        },
        account);
    return out;
  }

  LedgerConfig config_;
  std::mutex mutex_;
  detail::SqliteDb db_;
};

static_assert(ledger_policy<SqliteLedger>);

}  // namespace prepaid
