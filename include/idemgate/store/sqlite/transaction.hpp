// SPDX-License-Identifier: MIT
// SqliteTransaction: what a business write gets on SQLite, the store's connection inside its open
// transaction, and the refusal of anything that would commit apart from the log row.
#pragma once

#include "../../detail/sqlite/statement.hpp"
#include "../../errors.hpp"
#include "options.hpp"

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate {

namespace detail::sqlite {
class Session;
}  // namespace detail::sqlite

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
  friend class detail::sqlite::Session;
  explicit SqliteTransaction(sqlite3* db) noexcept : db_(db) {}

  // Outside a transaction every statement commits on its own: refuse it rather than let a
  // business row commit without the log row.
  void require_open(std::string_view sql, bool ran) const {
    if (sqlite3_get_autocommit(db_) != 0)
      throw BusinessWriteError(detail::sqlite::ended_transaction(sql, ran));
  }

  sqlite3* db_;
};

}  // namespace idemgate
