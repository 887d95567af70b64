// SPDX-License-Identifier: MIT
// The SQLite wrapper under SqliteStore: errors with advice, statements, bindings.
#pragma once

#include "../../errors.hpp"

#include <sqlite3.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace idemgate {

// Bound as blobs; complete wherever a statement binds them (key.hpp, store/sqlite.hpp).
class Key;
struct SqliteBlob;

namespace detail::sqlite {

/// An error SQLite reported, with its extended result code.
class Error : public StoreError {
 public:
  /// An error with SQLite's (extended) result `code` and a message that says what to do.
  Error(int code, const std::string& message) : StoreError(message), code_(code) {}
  /// SQLite's extended result code.
  [[nodiscard]] int code() const noexcept { return code_; }
  /// Whether another connection held the database: the work may be tried again.
  /// `SQLITE_LOCKED` is not: without a shared cache it comes from this very connection (a
  /// statement still running), and waiting cannot end it.
  [[nodiscard]] bool busy() const noexcept { return (code_ & 0xff) == SQLITE_BUSY; }

 private:
  int code_;
};

/// What to do about a damaged file or one that is not a database.
inline constexpr std::string_view restore_advice =
    "The file is not an SQLite database or is damaged: restore it from a backup. Stop every "
    "process that uses the file first, then call SqliteStore::restore_from(backup, path), which "
    "moves the stale -wal and -shm files aside and copies the backup in with SQLite's backup API. "
    "Restoring by hand, move the file's -wal and -shm files aside before copying the backup in "
    "place: SQLite would replay a stale -wal onto the restored file, bringing back old pages "
    "(events then reserved as new) and damaging it. Or point the store at a new file.";

/// What to do about an SQLite error, for messages.
inline std::string advice(int code, std::string_view message) {
  switch (code & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      return std::string(restore_advice);
    case SQLITE_FULL:
      return "The disk is full: free space; nothing was written.";
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return "The database is read-only for this process: check the permissions of the file, "
             "its directory and its -wal and -shm files.";
    case SQLITE_CANTOPEN:
      return "Check that the directory exists and that this process may create and write files "
             "in it.";
    case SQLITE_IOERR:
      return "The disk reported an I/O error: check the disk and the filesystem.";
    case SQLITE_LOCKED:
      return "A statement of this same connection is still running (one the business write "
             "prepared through tx.db() and did not reset or finalize): reset or finalize every "
             "statement before the business write returns. Waiting cannot help; nothing was "
             "written.";
    case SQLITE_CONSTRAINT:
      if (code == SQLITE_CONSTRAINT_COMMITHOOK)
        return "The store refused a commit made inside the business write: the business rows "
               "commit only with the store's own COMMIT, together with the log row. Do not "
               "COMMIT, ROLLBACK or BEGIN in the business write; nothing was written.";
      return "A constraint refused the row: fix the statement or the data; nothing was written.";
    case SQLITE_ERROR:
      if (message.starts_with("no such table"))
        return "A table is missing: for the idempotency log, call SqliteStore::migrate() once "
               "(or apply SqliteStore::schema_sql()); for a business table, create it.";
      if (message.starts_with("no such column") ||
          message.find("has no column named") != std::string_view::npos)
        return "A column is missing: a log made by an earlier version lacks a column this version "
               "needs, so call SqliteStore::migrate() once (it adds them and keeps every row); "
               "for a business table, add the column. Nothing was written.";
      break;
    default:
      break;
  }
  return "Do not ack; the redelivery will try again.";
}

/// The message SQLite holds for `db`, or the generic text for `code` without a connection.
inline std::string message_of(sqlite3* db, int code) {
  return db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(code);
}

/// Throws an `Error` for `code`; `doing` says what the store was doing.
[[noreturn]] inline void raise(sqlite3* db, int code, std::string_view doing) {
  const std::string message = message_of(db, code);
  const char* file = db != nullptr ? sqlite3_db_filename(db, "main") : nullptr;
  std::string where = file != nullptr && *file != '\0' ? std::string(" on ") + file : "";
  throw Error(code, "idemgate: SQLite failed while " + std::string(doing) + where + ": " + message +
                        ". " + advice(code, message));
}

/// Closes a connection (finishing any statements still open).
struct Closer {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};

/// An owned connection.
using Connection = std::unique_ptr<sqlite3, Closer>;

template <class T>
inline constexpr bool is_optional = false;
template <class T>
inline constexpr bool is_optional<std::optional<T>> = true;

template <class T>
inline constexpr bool always_false = false;

// Every parameter outlives the statement's use (bound, stepped and reset within one call), so
// SQLite need not copy it.
inline const sqlite3_destructor_type no_copy = nullptr;

/// Binds one value to parameter `index` (1-based): text, blob, integer, real or NULL.
template <class T>
int bind_one(sqlite3_stmt* statement, int index, const T& value) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, std::nullopt_t> || std::is_same_v<U, std::nullptr_t>) {
    return sqlite3_bind_null(statement, index);
  } else if constexpr (is_optional<U>) {
    return value ? bind_one(statement, index, *value) : sqlite3_bind_null(statement, index);
  } else if constexpr (std::is_same_v<U, SqliteBlob> || std::is_same_v<U, Key>) {
    std::string_view bytes;
    if constexpr (std::is_same_v<U, Key>)
      bytes = value.view();
    else
      bytes = value.bytes;
    // A null pointer would bind NULL; an empty blob must stay an empty blob.
    const char* data = bytes.data() != nullptr ? bytes.data() : "";
    return sqlite3_bind_blob64(statement, index, data, bytes.size(), no_copy);
  } else if constexpr (std::is_same_v<U, bool>) {
    return sqlite3_bind_int64(statement, index, value ? 1 : 0);
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, char>) {
    if constexpr (std::is_unsigned_v<U> && sizeof(U) >= sizeof(sqlite3_int64)) {
      if (value > static_cast<U>(std::numeric_limits<sqlite3_int64>::max()))
        throw std::out_of_range("idemgate: " + std::to_string(value) +
                                " does not fit SQLite's 64-bit signed integers; bind it as text");
    }
    return sqlite3_bind_int64(statement, index, static_cast<sqlite3_int64>(value));
  } else if constexpr (std::is_floating_point_v<U>) {
    return sqlite3_bind_double(statement, index, static_cast<double>(value));
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    const std::string_view text(value);
    const char* data = text.data() != nullptr ? text.data() : "";
    return sqlite3_bind_text64(statement, index, data, text.size(), no_copy, SQLITE_UTF8);
  } else {
    static_assert(always_false<U>,
                  "SQLite parameters are text (std::string, std::string_view, const char*), "
                  "idemgate::SqliteBlob, idemgate::Key (a blob), integers, doubles, std::nullopt "
                  "and std::optional of these");
    return SQLITE_MISUSE;
  }
}

/// A prepared statement, finalized when destroyed.
class Statement {
 public:
  /// Prepares the first statement of `sql` on `db`; `tail` receives what follows it.
  Statement(sqlite3* db, std::string_view sql, std::string_view doing, bool persistent = false,
            std::string_view* tail = nullptr)
      : db_(db) {
    const char* rest = nullptr;
    const int code =
        sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                           persistent ? SQLITE_PREPARE_PERSISTENT : 0u, &statement_, &rest);
    if (code != SQLITE_OK) raise(db, code, doing);
    if (statement_ == nullptr)
      throw std::invalid_argument("idemgate: \"" + std::string(sql) +
                                  "\" holds no SQL statement; pass one statement");
    if (tail != nullptr)
      *tail = rest != nullptr ? sql.substr(static_cast<std::size_t>(rest - sql.data()))
                              : std::string_view();
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(statement_); }

  /// Clears earlier bindings and binds `args` to parameters 1, 2, … in order.
  template <class... Args>
  void bind(std::string_view doing, const Args&... args) {
    sqlite3_reset(statement_);
    sqlite3_clear_bindings(statement_);
    int index = 0;
    [[maybe_unused]] const auto one = [&](const auto& value) {
      const int code = bind_one(statement_, ++index, value);
      if (code != SQLITE_OK) raise(db_, code, doing);
    };
    (one(args), ...);
  }

  /// Steps once: true when a row is ready, false when the statement is done.
  bool step(std::string_view doing) {
    const int code = sqlite3_step(statement_);
    if (code == SQLITE_ROW) return true;
    if (code == SQLITE_DONE) return false;
    // The step's error is what reset reports with the extended code.
    const int detailed = sqlite3_reset(statement_);
    raise(db_, detailed != SQLITE_OK ? detailed : code, doing);
  }

  /// Makes the statement ready to run again and lets go of its parameters.
  void reset() noexcept {
    sqlite3_reset(statement_);
    sqlite3_clear_bindings(statement_);
  }

  /// Whether column `column` of the current row is NULL.
  [[nodiscard]] bool is_null(int column) const {
    return sqlite3_column_type(statement_, column) == SQLITE_NULL;
  }
  /// Column `column` of the current row as an integer.
  [[nodiscard]] std::int64_t int64(int column) const {
    return sqlite3_column_int64(statement_, column);
  }
  /// Column `column` of the current row as bytes (a blob or text); empty when NULL.
  [[nodiscard]] std::string bytes(int column) const {
    const void* data = sqlite3_column_blob(statement_, column);
    const int size = sqlite3_column_bytes(statement_, column);
    if (data == nullptr || size <= 0) return {};
    return {static_cast<const char*>(data), static_cast<std::size_t>(size)};
  }
  /// The raw statement.
  [[nodiscard]] sqlite3_stmt* get() const noexcept { return statement_; }

 private:
  sqlite3* db_;
  sqlite3_stmt* statement_ = nullptr;
};

/// Resets a statement when the scope ends, so no read stays open inside a transaction.
class ResetGuard {
 public:
  /// Guards `statement`.
  explicit ResetGuard(Statement& statement) noexcept : statement_(statement) {}
  ResetGuard(const ResetGuard&) = delete;
  ResetGuard& operator=(const ResetGuard&) = delete;
  ~ResetGuard() { statement_.reset(); }

 private:
  Statement& statement_;
};

/// Runs one statement with parameters to completion; returns the rows it changed.
template <class... Args>
std::int64_t exec(sqlite3* db, std::string_view sql, const Args&... args) {
  std::string_view tail;
  Statement statement(db, sql, "running a statement", false, &tail);
  if (tail.find_first_not_of(" \t\r\n;") != std::string_view::npos)
    throw std::invalid_argument("idemgate: exec runs one SQL statement, but \"" + std::string(sql) +
                                "\" holds more; call exec once per statement");
  statement.bind("binding parameters", args...);
  while (statement.step("running a statement")) {
  }
  statement.reset();
  // sqlite3_changes64 still counts the last write when this statement wrote nothing.
  return sqlite3_stmt_readonly(statement.get()) != 0 ? 0 : sqlite3_changes64(db);
}

/// Runs a query and returns the first column of its first row as an integer (nullopt: no row).
template <class... Args>
std::optional<std::int64_t> query_int(sqlite3* db, std::string_view sql, const Args&... args) {
  Statement statement(db, sql, "running a query");
  statement.bind("binding parameters", args...);
  if (!statement.step("running a query") || statement.is_null(0)) return std::nullopt;
  return statement.int64(0);
}

/// Opens a connection of its own on `path` with `flags`; throws `StoreError` saying `doing`.
inline Connection open_connection(const std::string& path, int flags, std::string_view doing) {
  sqlite3* raw = nullptr;
  const int code = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Connection connection(raw);
  if (code != SQLITE_OK) raise(raw, code, doing);
  sqlite3_extended_result_codes(raw, 1);
  return connection;
}

}  // namespace detail::sqlite
}  // namespace idemgate
