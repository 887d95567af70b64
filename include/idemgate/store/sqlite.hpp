#pragma once

#include "../concepts.hpp"
#include "../record.hpp"
#include "../signals.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
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
  using Clock = std::function<std::chrono::system_clock::time_point()>;

  /// The idempotency log's table: letters, digits and underscores (SQLite has no schemas).
  std::string table = "idemgate_log";
  /// How long a call waits for another connection's write transaction (in this process or
  /// another) before it throws `StoreError`. Writes are short, so a few seconds is plenty.
  std::chrono::milliseconds busy_timeout = std::chrono::seconds(5);
  /// Injected clock for tests (expire leases without sleeping); empty means the system clock.
  Clock clock = {};
};

namespace detail::sqlite {

/// An error SQLite reported, with its extended result code.
class Error : public StoreError {
 public:
  /// An error with SQLite's (extended) result `code` and a message that says what to do.
  Error(int code, const std::string& message) : StoreError(message), code_(code) {}
  /// SQLite's extended result code.
  [[nodiscard]] int code() const noexcept { return code_; }
  /// Whether another connection held a lock: the work may be tried again.
  [[nodiscard]] bool busy() const noexcept {
    return (code_ & 0xff) == SQLITE_BUSY || (code_ & 0xff) == SQLITE_LOCKED;
  }

 private:
  int code_;
};

/// What to do about an SQLite error, for messages.
inline std::string advice(int code, std::string_view message) {
  switch (code & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      return "The file is not an SQLite database or is damaged: restore it from a backup, or "
             "point the store at a new file.";
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
    case SQLITE_CONSTRAINT:
      return "A constraint refused the row: fix the statement or the data; nothing was written.";
    case SQLITE_ERROR:
      if (message.starts_with("no such table"))
        return "A table is missing: for the idempotency log, call SqliteStore::migrate() once "
               "(or apply SqliteStore::schema_sql()); for a business table, create it.";
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

inline bool is_identifier(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  const auto first = static_cast<unsigned char>(name.front());
  if (!(std::isalpha(first) || first == '_')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return std::isalnum(u) || u == '_';
  });
}

/// Checks a table name; throws `std::invalid_argument` that says what to use instead.
inline std::string checked_table_name(std::string table) {
  if (!is_identifier(table))
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

inline std::int64_t to_micros(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

inline std::int64_t to_micros(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

/// The lease end of a released row: before every instant the clock can give.
inline constexpr std::int64_t ended_lease = std::numeric_limits<std::int64_t>::min();

/// Microseconds since the epoch as a time point; values past what the clock's duration holds
/// (such as `ended_lease`) saturate to the clock's minimum or maximum instead of overflowing.
inline std::chrono::system_clock::time_point from_micros(std::int64_t micros) {
  using time_point = std::chrono::system_clock::time_point;
  constexpr std::int64_t lowest =
      std::chrono::duration_cast<std::chrono::microseconds>(time_point::min().time_since_epoch())
          .count();
  constexpr std::int64_t highest =
      std::chrono::duration_cast<std::chrono::microseconds>(time_point::max().time_since_epoch())
          .count();
  if (micros <= lowest) return time_point::min();
  if (micros >= highest) return time_point::max();
  return time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::microseconds(micros)));
}

}  // namespace detail::sqlite

class SqliteStore;

/**
 * The business write's transaction in a `SqliteStore`: the store's connection inside its open
 * `BEGIN IMMEDIATE` transaction, after the fenced status change.
 *
 * Write your business rows with `exec`, or use `db()` with the SQLite C API. Everything written
 * commits together with the outcome, or not at all. Do not BEGIN, COMMIT, ROLLBACK or call the
 * store from inside the business write.
 *
 * Example:
 *   [](idemgate::SqliteTransaction& tx, const idemgate::Key& key, const SlotRequest& r,
 *      const std::string& slot) {
 *     tx.exec("INSERT INTO bookings (container, slot_id, source_event) VALUES (?, ?, ?)",
 *             r.container, slot, key);
 *   }
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
   * discarded. Throws `StoreError` when SQLite refuses the statement (the commit then rolls back).
   *
   * Example:
   *   tx.exec("INSERT INTO ledger (account, cents, memo) VALUES (?, ?, ?)", account, 1250,
   *           std::nullopt);
   */
  template <class... Args>
  std::int64_t exec(std::string_view sql, const Args&... args) {
    try {
      return detail::sqlite::exec(db_, sql, args...);
    } catch (const detail::sqlite::Error& e) {
      throw StoreError(std::string(e.what()) +
                       " (the business write's statement: " + std::string(sql) + ")");
    }
  }

  /// Runs a query and returns the first column of its first row as an integer; nullopt when it
  /// returns no row or NULL. Parameters bind as in `exec`.
  template <class... Args>
  std::optional<std::int64_t> query_int(std::string_view sql, const Args&... args) {
    return detail::sqlite::query_int(db_, sql, args...);
  }

 private:
  friend class SqliteStore;
  explicit SqliteTransaction(sqlite3* db) noexcept : db_(db) {}
  sqlite3* db_;
};

/**
 * The embedded default store: an idempotency log in one SQLite file (WAL mode).
 *
 * Durable: every write is one `BEGIN IMMEDIATE` transaction, synced before it returns
 * (`synchronous=FULL`). Thread-safe: a store owns one connection, guarded by a mutex, so calls
 * from several threads run one after another (SQLite admits one writer at a time anyway).
 * Several stores on one file, in one process or in several, are safe: they wait for each other's
 * write transactions up to `SqliteOptions::busy_timeout` and then throw `StoreError`, never a
 * wrong answer. Open stores after `fork()`, never before, and keep the file on a local disk (WAL
 * needs shared memory, which network filesystems lack).
 *
 * Timestamps are stored as integer microseconds since the Unix epoch. It also reports the
 * gate's health signals and purges finished rows (`monitored_store`, see `Retention`).
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

  /// Opens (and creates if missing) the database at `path` and switches it to WAL mode.
  /// Throws `std::invalid_argument` for an unusable table name, and `StoreError` for a path that
  /// cannot be opened, a file that is not a database, or a database locked past the busy timeout.
  /// `":memory:"` gives a private in-memory database (not durable, one store only).
  explicit SqliteStore(std::string path, SqliteOptions options = {})
      : path_(std::move(path)),
        table_(detail::sqlite::checked_table_name(options.table)),
        busy_timeout_(options.busy_timeout),
        clock_(options.clock ? std::move(options.clock)
                             : Clock([] { return std::chrono::system_clock::now(); })),
        sql_(statements(table_)) {
    if (busy_timeout_.count() < 0 || busy_timeout_.count() > std::numeric_limits<int>::max())
      throw std::invalid_argument(
          "idemgate: SqliteOptions::busy_timeout must be between 0 and 2^31-1 milliseconds");
    open();
  }

  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  /// The schema for a table name: the log with its constraints and indexes, and the
  /// `<table>_mismatches` table.
  [[nodiscard]] static std::string schema_sql(const std::string& table = "idemgate_log") {
    const std::string t = detail::sqlite::checked_table_name(table);
    return "CREATE TABLE IF NOT EXISTS " + t +
           " (\n"
           "  key         BLOB    NOT NULL PRIMARY KEY\n"
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
           "  created_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
           "  updated_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
           "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
           ");\n" +
           indexes_sql(t) +
           "-- Downstream answers that differed from the stored one (healthy: empty).\n" +
           "CREATE TABLE IF NOT EXISTS " + t +
           "_mismatches (\n"
           "  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
           "  stored      BLOB    NOT NULL,\n"
           "  observed    BLOB    NOT NULL,\n"
           "  source      TEXT    NOT NULL,\n"
           "  at          INTEGER NOT NULL   -- microseconds since the Unix epoch\n"
           ");\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_mismatches_at ON " + t + "_mismatches (at);\n";
  }

  /// Creates the tables and indexes if missing, and adds the `duplicates` column to a log made
  /// by an earlier version. Idempotent and safe from several processes at once.
  void migrate() {
    std::lock_guard lock(mutex_);
    run("creating the idemgate table", nullptr, [&] {
      begin();
      // An earlier log lacks the duplicates column; CREATE TABLE IF NOT EXISTS would keep it so.
      const bool upgrade = detail::sqlite::query_int(db_.get(),
                                                     "SELECT EXISTS (SELECT 1 FROM "
                                                     "pragma_table_info(?1)) AND NOT EXISTS "
                                                     "(SELECT 1 FROM pragma_table_info(?1) "
                                                     "WHERE name = 'duplicates')",
                                                     table_)
                               .value_or(0) != 0;
      if (upgrade)
        detail::sqlite::exec(db_.get(), "ALTER TABLE " + table_ +
                                            " ADD COLUMN duplicates INTEGER NOT NULL DEFAULT 0");
      const std::string schema = schema_sql(table_);
      char* error = nullptr;
      const int code = sqlite3_exec(db_.get(), schema.c_str(), nullptr, nullptr, &error);
      sqlite3_free(error);
      if (code != SQLITE_OK) detail::sqlite::raise(db_.get(), code, "creating the idemgate table");
      end("creating the idemgate table");
      return 0;
    });
  }

  /// Inserts the key as in flight, or counts a duplicate and reports what is stored, in one
  /// statement; takes over an expired lease with a fence bump. All in one write transaction.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    const SqliteBlob fingerprint_blob{
        {reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()}};
    std::lock_guard lock(mutex_);
    return run("reserving a key", &key, [&]() -> Reservation {
      const std::int64_t now = now_micros();
      const std::int64_t until = now + detail::sqlite::to_micros(lease);
      begin();
      Reservation found;
      bool take_over = false;
      {
        auto& upsert = statement(sql_.reserve);
        detail::sqlite::ResetGuard guard(upsert);
        upsert.bind("reserving a key", key, until, fingerprint_blob, SqliteBlob{request}, now);
        if (!upsert.step("reserving a key"))
          throw StoreError("idemgate: the reservation of key " + key.hex() + " in " + table_ +
                           " returned no row; check the table's PRIMARY KEY (compare it with "
                           "SqliteStore::schema_sql())");
        // A new row starts at 0 duplicates; a row that was met has at least 1 after the update.
        if (upsert.int64(0) == 0) {
          const std::int64_t fence = upsert.int64(1);
          upsert.reset();
          end("reserving a key");
          return Reservation::acquired(fence);
        }
        const std::string stored_fingerprint = upsert.bytes(3);
        const bool same =
            stored_fingerprint.size() == fingerprint.size() &&
            std::memcmp(stored_fingerprint.data(), fingerprint.data(), fingerprint.size()) == 0;
        found = Reservation::existing(upsert.int64(1), parse_record_status(upsert.bytes(2)), same,
                                      upsert.bytes(5), upsert.bytes(6));
        take_over = found.status == RecordStatus::in_flight && same && upsert.int64(4) < now;
      }
      if (take_over) {
        auto& take = statement(sql_.take_over);
        detail::sqlite::ResetGuard guard(take);
        take.bind("taking over a lease", key, found.fence, until, now);
        if (take.step("taking over a lease")) {
          const std::int64_t taken = take.int64(0);
          take.reset();
          end("taking over a lease");
          return Reservation::taken_over(taken);
        }
      }
      // The duplicate counted above is kept.
      end("reserving a key");
      return found;
    });
  }

  /**
   * Marks the key committed with `result` and runs `business(transaction&)`, in one transaction,
   * only if `fence` still holds. Zero rows updated: rolled back, and `committed` is returned
   * without running `business` when this very fence already committed (a retried commit);
   * otherwise `lost_lease`. Whatever `business` throws rolls everything back and propagates.
   */
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    std::lock_guard lock(mutex_);
    return run("committing", &key, [&] {
      const std::int64_t now = now_micros();
      begin();
      if (change(sql_.commit, "committing", key, fence, SqliteBlob{result}, now) == 0) {
        const CommitStatus earlier = settled_earlier(key, fence, RecordStatus::committed);
        rollback();
        return earlier;
      }
      SqliteTransaction tx(db_.get());
      business(tx);
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
  bool release(const Key& key, std::int64_t fence) {
    std::lock_guard lock(mutex_);
    return run("releasing a key", &key, [&] {
      begin();
      const bool released = change(sql_.release, "releasing a key", key, fence,
                                   detail::sqlite::ended_lease, now_micros()) > 0;
      end("releasing a key");
      return released;
    });
  }

  /// The stored row, if any.
  std::optional<Record> find(const Key& key) {
    std::lock_guard lock(mutex_);
    return run("reading a key", &key, [&]() -> std::optional<Record> {
      auto& read = statement(sql_.find);
      detail::sqlite::ResetGuard guard(read);
      read.bind("reading a key", key);
      if (!read.step("reading a key")) return std::nullopt;
      return to_record(read);
    });
  }

  /// Takes over up to `limit` in-flight rows whose lease expired and that have not changed for
  /// `stale_after`, oldest lease first, bumping their fence and granting a new `lease`. One write
  /// transaction: two reconcilers (threads or processes) never take the same row.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    std::lock_guard lock(mutex_);
    return run("taking stale rows", nullptr, [&] {
      const std::int64_t now = now_micros();
      begin();
      std::vector<Stranded> taken;
      {
        auto& take = statement(sql_.take_stale);
        detail::sqlite::ResetGuard guard(take);
        take.bind("taking stale rows", now, now - detail::sqlite::to_micros(stale_after),
                  now + detail::sqlite::to_micros(lease), sql_limit(limit));
        while (take.step("taking stale rows"))
          taken.push_back({key_from(take.bytes(0)), take.int64(1), take.bytes(2), 0, {}});
      }
      end("taking stale rows");
      return taken;
    });
  }

  /// Up to `limit` escalated rows, oldest first.
  std::vector<Record> escalated(std::size_t limit) {
    std::lock_guard lock(mutex_);
    return run("listing escalated rows", nullptr, [&] {
      auto& list = statement(sql_.escalated);
      detail::sqlite::ResetGuard guard(list);
      list.bind("listing escalated rows", sql_limit(limit));
      std::vector<Record> parked;
      while (list.step("listing escalated rows")) parked.push_back(to_record(list));
      return parked;
    });
  }

  /// Commits an escalated row with `result` and `business(transaction&)` in one transaction;
  /// false (nothing written, `business` not run) if the row is not escalated.
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    std::lock_guard lock(mutex_);
    return run("resolving", &key, [&] {
      begin();
      if (change(sql_.resolve, "resolving", key, SqliteBlob{result}, now_micros()) == 0) {
        rollback();
        return false;
      }
      SqliteTransaction tx(db_.get());
      business(tx);
      end_commit(key);
      return true;
    });
  }

  /// The three signals over the events reserved in the last `window`, read in one statement (one
  /// consistent snapshot).
  StoreSignals signals(std::chrono::seconds window) {
    std::lock_guard lock(mutex_);
    return run("reading the signals", nullptr, [&] {
      const std::int64_t now = now_micros();
      const std::int64_t since =
          now - std::chrono::duration_cast<std::chrono::microseconds>(window).count();
      auto& read = statement(sql_.signals);
      detail::sqlite::ResetGuard guard(read);
      read.bind("reading the signals", since);
      if (!read.step("reading the signals"))
        throw StoreError("idemgate: the signals query of " + table_ + " returned no row");
      StoreSignals s;
      s.window = window;
      s.duplicates = read.int64(1);
      s.events = read.int64(0) + s.duplicates;
      s.in_flight = read.int64(2);
      if (!read.is_null(3))
        s.oldest_in_flight = std::chrono::duration_cast<std::chrono::seconds>(
            std::chrono::microseconds(now - read.int64(3)));
      s.escalated = read.int64(4);
      s.mismatched_keys = read.int64(5);
      s.mismatches_total = read.int64(6);
      return s;
    });
  }

  /// Keeps a downstream answer that differed from the stored one (`source`: where it was seen,
  /// such as "lost_lease" or "reconciler").
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    std::lock_guard lock(mutex_);
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
    std::lock_guard lock(mutex_);
    return run("listing mismatches", nullptr, [&] {
      auto& list = statement(sql_.mismatches);
      detail::sqlite::ResetGuard guard(list);
      list.bind("listing mismatches", sql_limit(limit));
      std::vector<Mismatch> found;
      while (list.step("listing mismatches"))
        found.push_back({key_from(list.bytes(0)), list.bytes(1), list.bytes(2), list.bytes(3),
                         detail::sqlite::from_micros(list.int64(4))});
      return found;
    });
  }

  /**
   * Deletes committed and failed rows that finished more than `older_than` ago, never in-flight or
   * escalated rows, and returns how many it deleted. Each batch of at most `batch` rows is its
   * own short write transaction, so workers (threads and processes) reserve between batches.
   *
   * Example:
   *   store.purge(std::chrono::days(7), 1000);  // or let idemgate::Retention call it
   */
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    std::size_t deleted = 0;
    if (batch == 0) return deleted;
    for (;;) {
      std::lock_guard lock(mutex_);
      const std::int64_t n = run("purging finished rows", nullptr, [&] {
        const std::int64_t cutoff =
            now_micros() -
            std::chrono::duration_cast<std::chrono::microseconds>(older_than).count();
        begin();
        const std::int64_t changed =
            change(sql_.purge, "purging finished rows", cutoff, sql_limit(batch));
        end("purging finished rows");
        return changed;
      });
      deleted += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < batch) return deleted;
    }
  }

  /// The database file's path as given.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The table this store writes.
  [[nodiscard]] const std::string& table() const noexcept { return table_; }
  /// The busy timeout.
  [[nodiscard]] std::chrono::milliseconds busy_timeout() const noexcept { return busy_timeout_; }

 private:
  struct Statements {
    std::string reserve, take_over, commit, fail, escalate, release, find, take_stale, escalated,
        resolve, settled, signals, record_mismatch, mismatches, purge;
  };

  static std::string indexes_sql(const std::string& t) {
    return "-- Stranded work: the reconciler's scan, the in-flight count and the oldest row.\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_in_flight ON " + t +
           " (lease_until) WHERE status = 'in_flight';\n"
           "-- The manual queue and its count.\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_escalated ON " + t +
           " (updated_at) WHERE status = 'escalated';\n"
           "-- Retention and the signals' window.\n"
           "CREATE INDEX IF NOT EXISTS " +
           t + "_created ON " + t + " (created_at);\n";
  }

  static Statements statements(const std::string& t) {
    const std::string columns =
        "key, status, fence, request, fingerprint, result, reason, created_at, updated_at, "
        "lease_until, duplicates";
    Statements s;
    // A new key is inserted; a key that exists counts the duplicate and returns the stored row:
    // one statement either way, so no reservation goes uncounted.
    s.reserve = "INSERT INTO " + t +
                " (key, status, fence, lease_until, fingerprint, request, duplicates, created_at,"
                " updated_at) VALUES (?1, 'in_flight', 1, ?2, ?3, ?4, 0, ?5, ?5)"
                " ON CONFLICT (key) DO UPDATE SET duplicates = duplicates + 1"
                " RETURNING duplicates, fence, status, fingerprint, lease_until, result, reason";
    s.take_over = "UPDATE " + t +
                  " SET fence = fence + 1, lease_until = ?3, updated_at = ?4"
                  " WHERE key = ?1 AND status = 'in_flight' AND fence = ?2 AND lease_until < ?4"
                  " RETURNING fence";
    s.commit = "UPDATE " + t +
               " SET status = 'committed', result = ?3, updated_at = ?4"
               " WHERE key = ?1 AND status = 'in_flight' AND fence = ?2";
    s.fail = "UPDATE " + t +
             " SET status = 'failed', reason = ?3, updated_at = ?4"
             " WHERE key = ?1 AND status = 'in_flight' AND fence = ?2";
    s.escalate = "UPDATE " + t +
                 " SET status = 'escalated', reason = ?3, updated_at = ?4"
                 " WHERE key = ?1 AND status = 'in_flight' AND fence = ?2";
    // The row stays: its lease ends, so the next delivery takes it over with a higher fence (a
    // worker still holding the old fence can never commit), and if no delivery comes back the
    // reconciler finishes the event.
    s.release = "UPDATE " + t +
                " SET lease_until = ?3, updated_at = ?4"
                " WHERE key = ?1 AND status = 'in_flight' AND fence = ?2";
    s.find = "SELECT " + columns + " FROM " + t + " WHERE key = ?1";
    s.take_stale = "UPDATE " + t +
                   " SET fence = fence + 1, lease_until = ?3, updated_at = ?1"
                   " WHERE key IN (SELECT key FROM " +
                   t +
                   " WHERE status = 'in_flight' AND lease_until < ?1 AND updated_at <= ?2"
                   " ORDER BY lease_until LIMIT ?4)"
                   " RETURNING key, fence, request";
    s.escalated = "SELECT " + columns + " FROM " + t +
                  " WHERE status = 'escalated' ORDER BY updated_at, rowid LIMIT ?1";
    s.resolve = "UPDATE " + t +
                " SET status = 'committed', result = ?2, updated_at = ?3"
                " WHERE key = ?1 AND status = 'escalated'";
    s.settled = "SELECT status, fence FROM " + t + " WHERE key = ?1";
    s.signals =
        "SELECT w.events, w.duplicates, f.n, f.oldest, e.n, m.keys, a.n FROM"
        " (SELECT count(*) AS events, coalesce(sum(duplicates), 0) AS duplicates FROM " +
        t +
        " WHERE created_at >= ?1) AS w,"
        " (SELECT count(*) AS n, min(created_at) AS oldest FROM " +
        t +
        " WHERE status = 'in_flight') AS f,"
        " (SELECT count(*) AS n FROM " +
        t +
        " WHERE status = 'escalated') AS e,"
        " (SELECT count(DISTINCT key) AS keys FROM " +
        t +
        "_mismatches WHERE at >= ?1) AS m,"
        " (SELECT count(*) AS n FROM " +
        t + "_mismatches) AS a";
    s.record_mismatch = "INSERT INTO " + t +
                        "_mismatches (key, stored, observed, source, at)"
                        " VALUES (?1, ?2, ?3, ?4, ?5)";
    // rowid breaks ties between mismatches recorded in the same microsecond.
    s.mismatches = "SELECT key, stored, observed, source, at FROM " + t +
                   "_mismatches ORDER BY at DESC, rowid DESC LIMIT ?1";
    s.purge = "DELETE FROM " + t + " WHERE key IN (SELECT key FROM " + t +
              " WHERE created_at < ?1 AND updated_at < ?1 AND status IN ('committed', 'failed') "
              "LIMIT ?2)";
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
    sqlite3_busy_timeout(db_.get(), static_cast<int>(busy_timeout_.count()));
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
      return 0;
    });
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

  // Runs one unit of work. Anything thrown rolls back an open transaction. When another
  // connection kept the database locked (past SQLite's own busy wait, or where SQLite cannot
  // wait, such as a WAL recovery), the work is tried again until the busy timeout has passed:
  // every unit is a whole transaction, so trying it again is safe.
  template <class Work>
  auto run(std::string_view doing, const Key* key, Work&& work) -> decltype(work()) {
    const auto deadline = std::chrono::steady_clock::now() + busy_timeout_;
    for (int attempt = 0;; ++attempt) {
      try {
        return work();
      } catch (const detail::sqlite::Error& e) {
        rollback_quietly();
        if (!e.busy()) throw;
        if (std::chrono::steady_clock::now() >= deadline) throw locked(doing, key);
      } catch (...) {
        rollback_quietly();
        throw;
      }
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min(1 << std::min(attempt, 6), 50)));
    }
  }

  StoreError locked(std::string_view doing, const Key* key) const {
    return StoreError(
        "idemgate: the SQLite database at " + path_ +
        " stayed locked by another connection for longer than the busy timeout (" +
        std::to_string(busy_timeout_.count()) + " ms) while " + std::string(doing) +
        (key != nullptr ? std::string(1, ' ').append(key->hex()) : std::string()) +
        "; nothing was written. Do not ack: the redelivery will try again. If it persists, find "
        "the process holding a long write transaction, or raise SqliteOptions::busy_timeout.");
  }

  void begin() {
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
    update.bind(doing, args...);
    while (update.step(doing)) {
    }
    return sqlite3_changes64(db_.get());
  }

  // After a fenced update touched no row: was it this fence's own earlier attempt that landed?
  CommitStatus settled_earlier(const Key& key, std::int64_t fence, RecordStatus target) {
    auto& read = statement(sql_.settled);
    detail::sqlite::ResetGuard guard(read);
    read.bind("checking an earlier attempt", key);
    if (!read.step("checking an earlier attempt"))
      throw StoreError("idemgate: the reservation of this event is gone from " + path_ +
                       " (lost in a crash or a restore?); nothing was written. Do not ack: the "
                       "redelivery reserves it again.");
    const RecordStatus status = parse_record_status(read.bytes(0));
    const std::int64_t stored = read.int64(1);
    if (status == RecordStatus::in_flight && stored < fence)
      throw StoreError("idemgate: the event's row in " + path_ + " is back at fence " +
                       std::to_string(stored) + ", below this attempt's " + std::to_string(fence) +
                       " (its takeover was lost in a crash or a restore); nothing was written. "
                       "Do not ack: the redelivery or the reconciler takes it over again.");
    if (status == target && stored == fence) return CommitStatus::committed;
    return CommitStatus::lost_lease;
  }

  CommitStatus settle(const std::string& sql, std::string_view doing, const Key& key,
                      std::int64_t fence, std::string_view reason, RecordStatus target) {
    std::lock_guard lock(mutex_);
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

  static std::int64_t sql_limit(std::size_t limit) {
    constexpr auto most = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());
    return static_cast<std::int64_t>(std::min(limit, most));
  }

  static Key key_from(const std::string& bytes) {
    Key::bytes_type raw{};
    if (bytes.size() != raw.size())
      throw StoreError("idemgate: the store holds a key of " + std::to_string(bytes.size()) +
                       " bytes; expected 32. Was the table written by another program?");
    std::memcpy(raw.data(), bytes.data(), raw.size());
    return Key(raw);
  }

  static Record to_record(const detail::sqlite::Statement& row) {
    Record record;
    record.key = key_from(row.bytes(0));
    record.status = parse_record_status(row.bytes(1));
    record.fence = row.int64(2);
    record.request = row.bytes(3);
    const std::string fingerprint = row.bytes(4);
    if (fingerprint.size() == record.fingerprint.size())
      std::memcpy(record.fingerprint.data(), fingerprint.data(), fingerprint.size());
    if (!row.is_null(5)) record.result = row.bytes(5);
    record.reason = row.bytes(6);
    record.created_at = detail::sqlite::from_micros(row.int64(7));
    record.updated_at = detail::sqlite::from_micros(row.int64(8));
    record.lease_until = detail::sqlite::from_micros(row.int64(9));
    record.duplicates = row.int64(10);
    return record;
  }

  std::string path_;
  std::string table_;
  std::chrono::milliseconds busy_timeout_;
  Clock clock_;
  Statements sql_;
  detail::sqlite::Connection db_;
  std::unordered_map<std::string, std::unique_ptr<detail::sqlite::Statement>> cache_;
  std::mutex mutex_;
};

static_assert(store<SqliteStore>);
static_assert(monitored_store<SqliteStore>);

}  // namespace idemgate
