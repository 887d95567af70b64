// SPDX-License-Identifier: MIT
// SqliteStore's session rules: its one connection and the lock and deadline of every call on it,
// its write transactions and statements, the business write's guard, and the WAL's upkeep.
#pragma once

#include "../../detail/durations.hpp"
#include "../../detail/sqlite/statement.hpp"
#include "../../errors.hpp"
#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/protocol.hpp"
#include "../log/row.hpp"
#include "../sql.hpp"
#include "failure.hpp"
#include "options.hpp"
#include "sql/all.hpp"
#include "transaction.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

namespace idemgate::detail::sqlite {

/**
 * Everything the handles on one SQLite connection share, and the rules every part of the store
 * follows on it: one connection, guarded by a timed lock; one deadline per call, for the lock and
 * for the file; every write a `BEGIN IMMEDIATE` transaction; the business write run under a guard
 * that no commit of its own gets past; the WAL kept small. SQLite's hooks point here, never at a
 * handle, which may be gone while the connection lives on.
 */
class Session {
 public:
  /// Opens (and creates if missing) the database at `path` (see `SqliteStore`'s constructor).
  Session(std::string path, SqliteOptions options)
      : path_(std::move(path)),
        table_(checked_table_name(options.table)),
        busy_timeout_(options.busy_timeout),
        wal_size_limit_(options.wal_size_limit),
        clock_(options.clock ? std::move(options.clock) : SqliteOptions::Clock([] {
          return std::chrono::system_clock::now();
        })),
        failures_(path_, busy_timeout_),
        random_(static_cast<std::uint_fast32_t>(
            std::hash<const void*>{}(this) ^
            static_cast<std::size_t>(
                std::chrono::steady_clock::now().time_since_epoch().count()))) {
    require_in_range("SqliteOptions::busy_timeout", busy_timeout_, std::chrono::milliseconds(0),
                     std::chrono::hours(1), "Writes take milliseconds; a few seconds is plenty.");
    require_in_range("SqliteOptions::wal_size_limit (bytes)", wal_size_limit_,
                     std::size_t{64} << 10, std::size_t{1} << 40,
                     "The default, 64 MiB, suits most logs.");
    for (std::size_t i = 0; i < std::size(idemgate::sql::sqlite::statements); ++i)
      texts_[i] = render(idemgate::sql::sqlite::statements[i]->text);
    open();
  }

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// The database file's path as given.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The log's table.
  [[nodiscard]] const std::string& table() const noexcept { return table_; }
  /// The longest a call waits in all.
  [[nodiscard]] std::chrono::milliseconds busy_timeout() const noexcept { return busy_timeout_; }
  /// The size the WAL is kept to.
  [[nodiscard]] std::size_t wal_size_limit() const noexcept { return wal_size_limit_; }
  /// The errors that name this file.
  [[nodiscard]] const Failures& failures() const noexcept { return failures_; }
  /// The connection.
  [[nodiscard]] sqlite3* db() const noexcept { return db_.get(); }
  /// "Now", in microseconds since the epoch, from the store's clock.
  [[nodiscard]] std::int64_t now_micros() const { return to_micros(clock_()); }

  /// An SQL text of the store's dialect with its placeholders filled for this log.
  [[nodiscard]] std::string render(std::string_view text) const { return render_for(table_, text); }

  /// An SQL text of the store's dialect with its placeholders filled for the log `table`:
  /// compacted as the store sends it, or as written (`compact` false, for a script people read).
  [[nodiscard]] static std::string render_for(const std::string& table, std::string_view text,
                                              bool compact = true) {
    const std::string t = checked_table_name(table);
    const auto variables = [&](std::string_view name) -> std::optional<std::string> {
      if (name == "log") return t;
      if (name == "mismatches") return t + "_mismatches";
      if (name == "migrations") return t + "_migrations";
      if (name == "history_limit") return std::to_string(history_limit);
      if (name == "record_columns")
        return record_select_list([](LogColumn, std::string_view n) { return std::string(n); });
      return std::nullopt;
    };
    const auto& fragments = idemgate::sql::sqlite::fragments;
    if (compact) return sql_text::render(text, variables, fragments);
    return sql_text::trimmed(sql_text::fill(text, variables, fragments));
  }

  /// The prepared statement of one of the store's statements, prepared at its first use.
  Statement& statement(const idemgate::sql::Statement& which) {
    for (std::size_t i = 0; i < std::size(idemgate::sql::sqlite::statements); ++i) {
      if (idemgate::sql::sqlite::statements[i] != &which) continue;
      if (prepared_[i] == nullptr) prepared_[i] = &statement_text(texts_[i]);
      return *prepared_[i];
    }
    return statement_text(render(which.text));
  }

  /// The prepared statement of an SQL text, prepared at its first use and kept.
  Statement& statement_text(const std::string& sql) {
    auto it = cache_.find(sql);
    if (it == cache_.end())
      it = cache_
               .emplace(sql,
                        std::make_unique<Statement>(db_.get(), sql, "preparing a statement", true))
               .first;
    return *it->second;
  }

  /// Runs one of the store's statements with the gate as `?1` and `args` after it, stepping it to
  /// its end; returns the rows it changed.
  template <class... Args>
  std::int64_t change(const idemgate::sql::Statement& which, std::string_view doing,
                      const std::string& gate, const Args&... args) {
    auto& update = statement(which);
    ResetGuard guard(update);
    update.bind(doing, gate, args...);
    while (update.step(doing)) {
    }
    return sqlite3_changes64(db_.get());
  }

  /**
   * Runs one unit of work under the store's lock, within one deadline: the wait for the lock
   * and SQLite's wait for other connections (the busy handler) both end at it. Anything thrown
   * rolls back an open transaction. Where SQLite cannot wait (a WAL recovery in another
   * process), the unit is tried again until the deadline: every unit is a whole transaction, so
   * that is safe, except once the business write has run (it is never run twice).
   */
  template <class Work>
  auto run(const char* doing, const Key* key, Work&& work) -> decltype(work()) {
    const auto started = std::chrono::steady_clock::now();
    const auto deadline = started + busy_timeout_;
    if (holder_thread_.load() == std::this_thread::get_id()) throw failures_.reentered(doing);
    std::unique_lock lock(mutex_, std::defer_lock);
    if (!lock.try_lock()) {
      // Who holds the store now, for the error: by the deadline it may have just let go.
      const Holder before = holder();
      // The wait is against the system clock, re-armed until the steady deadline (a clock that
      // jumps cannot stretch or cut it): libstdc++ then waits in pthread_mutex_timedlock, which
      // the ThreadSanitizer runs of the tests see as a lock (they miss its steady-clock wait).
      for (;;) {
        const auto left = deadline - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero()) {
          Holder last = holder();
          throw failures_.held_in_process(doing, key, last.doing == nullptr ? before : last);
        }
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
      } catch (const Error& e) {
        rollback_quietly();
        if (!Failures::may_run_again(e, business_ran_)) throw;
        if (std::chrono::steady_clock::now() >= deadline) throw failures_.locked(doing, key);
      } catch (...) {
        rollback_quietly();
        throw;
      }
      pause(random_, 0, deadline - std::chrono::steady_clock::now());
    }
  }

  /// Opens a write transaction. Under contention, a store that committed a moment ago steps back
  /// briefly before taking the write lock again, so that waiting processes (polling) get their
  /// turn.
  void begin() {
    const auto now = std::chrono::steady_clock::now();
    if (now - contended_at_ < contention_memory && now - committed_at_ < contention_memory / 50)
      pause(random_, 1, deadline_ - now);
    simple(idemgate::sql::sqlite::begin, "starting a write transaction");
  }

  /// Commits the write transaction.
  void end(std::string_view doing) {
    simple(idemgate::sql::sqlite::commit_transaction, doing);
    committed_at_ = std::chrono::steady_clock::now();
  }

  /// Commits the write transaction of one event's `what` ("commit", "resolution") of `key`, whose
  /// COMMIT must be confirmed: a COMMIT that failed says so, naming the key.
  void end_confirmed(const char* what, const Key& key) {
    try {
      end("committing");
    } catch (const Error& e) {
      failures_.throw_unconfirmed(e, std::string(what) + " of key " + key.hex());
    }
  }

  /// Rolls the write transaction back, if one is open.
  void rollback() {
    if (sqlite3_get_autocommit(db_.get()) != 0) return;
    simple(idemgate::sql::sqlite::rollback, "rolling back");
  }

  /// Resets every statement and rolls back whatever is open, whatever happened.
  void rollback_quietly() noexcept {
    for (auto& [sql, cached] : cache_) cached->reset();
    if (db_ != nullptr && sqlite3_get_autocommit(db_.get()) == 0)
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
  }

  /// Runs one statement without parameters or rows (a savepoint's, a transaction's).
  void simple(const idemgate::sql::Statement& which, std::string_view doing) {
    auto& step = statement(which);
    step.bind(doing);
    step.step(doing);
    step.reset();
  }

  /// What a fenced write of `key` under `fence` to `target` that touched nothing answers (see
  /// `after_missed_write`): committed by this fence's earlier attempt, or lost.
  CommitStatus settled_earlier(const std::string& gate, const Key& key, std::int64_t fence,
                               RecordStatus target) {
    auto& read = statement(idemgate::sql::sqlite::settled);
    ResetGuard guard(read);
    read.bind("checking an earlier attempt", gate, key);
    std::optional<StoredFence> stored;
    if (read.step("checking an earlier attempt"))
      stored = StoredFence{parse_record_status(read.bytes(0)), read.int64(1)};
    return after_missed_write(stored, fence, target, path_).value_or(CommitStatus::lost_lease);
  }

  /**
   * Runs the business write inside the store's transaction, for the log rows `rows` this
   * transaction wrote (their fences, at `now`), then checks that the transaction is still the
   * store's own, with the rows as the store wrote them, before anything may commit: the business
   * write cannot commit on its own (see `SqliteTransaction`). Throws `BusinessWriteError`
   * naming the first row's key otherwise.
   */
  template <class BusinessWrite>
  void run_business(const std::string& gate, std::span<const CommitItem> rows, std::int64_t now,
                    BusinessWrite& business) {
    SqliteTransaction tx(db_.get());
    {
      const Guarding guarding(*this);
      business(tx);
    }
    const std::string running = reset_running_statements();
    std::string cause;
    if (sqlite3_commit_hook(db_.get(), &Session::on_commit, this) != this)
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
               return left_as_written(gate, row.key, row.fence, now);
             }))
      cause = "the log row the store wrote in this transaction is no longer as the store wrote it";
    sqlite3_rollback_hook(db_.get(), &Session::on_rollback, this);
    if (!cause.empty()) throw failures_.broken_transaction(rows.front().key, cause);
  }

  /// The size of the WAL file (nullopt for a database without one).
  [[nodiscard]] std::optional<std::int64_t> wal_bytes() const {
    if (wal_path_.empty()) return std::nullopt;
    std::error_code missing;
    const auto size = std::filesystem::file_size(wal_path_, missing);
    return missing ? 0 : static_cast<std::int64_t>(size);
  }

 private:
  // Marks the store's lock as held by the calling thread, for the errors of calls that wait.
  class Holding {
   public:
    Holding(Session& s, const char* doing) noexcept : s_(s) {
      s_.holder_since_.store(std::chrono::steady_clock::now().time_since_epoch().count());
      s_.holder_doing_.store(doing);
      s_.holder_thread_.store(std::this_thread::get_id());
    }
    Holding(const Holding&) = delete;
    Holding& operator=(const Holding&) = delete;
    ~Holding() {
      s_.holder_thread_.store(std::thread::id());
      s_.holder_doing_.store(nullptr);
      s_.holder_in_business_.store(false);
    }

   private:
    Session& s_;
  };

  // Guards the business write's run: commits are vetoed and rollbacks counted until it ends.
  class Guarding {
   public:
    explicit Guarding(Session& s) noexcept : s_(s) {
      s_.vetoed_ = 0;
      s_.rollbacks_ = 0;
      s_.guarding_ = true;
      s_.business_ran_ = true;
      s_.holder_in_business_.store(true);
    }
    Guarding(const Guarding&) = delete;
    Guarding& operator=(const Guarding&) = delete;
    ~Guarding() {
      s_.guarding_ = false;
      s_.holder_in_business_.store(false);
    }

   private:
    Session& s_;
  };

  void open();

  Holder holder() const noexcept {
    return {holder_doing_.load(), holder_in_business_.load(), holder_since_.load()};
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
  static int on_busy(void* session, int round) {
    auto& s = *static_cast<Session*>(session);
    const auto left = s.deadline_ - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return 0;
    s.contended_at_ = std::chrono::steady_clock::now();
    pause(s.random_, round, left);
    return 1;
  }

  // While the business write runs, no commit may happen: the only commit that may carry its
  // rows is the store's own, with the log row.
  static int on_commit(void* session) {
    auto& s = *static_cast<Session*>(session);
    if (!s.guarding_) return 0;
    ++s.vetoed_;
    return 1;
  }

  static void on_rollback(void* session) {
    auto& s = *static_cast<Session*>(session);
    if (s.guarding_) ++s.rollbacks_;
  }

  // A WAL hook replaces SQLite's automatic checkpoint, so this one keeps it (passive, at
  // SQLite's default of 1000 frames) and notes the WAL's length for keep_wal_small().
  static int on_wal(void* session, sqlite3* db, const char* name, int frames) {
    static_cast<Session*>(session)->wal_frames_ = frames;
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

  bool left_as_written(const std::string& gate, const Key& key, std::int64_t fence,
                       std::int64_t now) {
    auto& read = statement(idemgate::sql::sqlite::left_as_written);
    ResetGuard guard(read);
    read.bind("checking the log row before committing", gate, key, fence, now);
    return read.step("checking the log row before committing") && read.int64(0) == 1;
  }

  // How long a truncating checkpoint may wait for readers, and how long to leave it after one
  // that could not finish (a reader holds a snapshot open).
  static constexpr std::chrono::milliseconds checkpoint_wait{100};
  static constexpr std::chrono::milliseconds checkpoint_pause{2000};
  // How long a store remembers that it had to wait for another connection.
  static constexpr std::chrono::milliseconds contention_memory{100};

  std::string path_;
  std::string table_;
  std::chrono::milliseconds busy_timeout_;
  std::size_t wal_size_limit_;
  SqliteOptions::Clock clock_;
  Failures failures_;
  std::array<std::string, std::size(idemgate::sql::sqlite::statements)> texts_;
  std::array<Statement*, std::size(idemgate::sql::sqlite::statements)> prepared_{};  // in cache_
  Connection db_;
  std::unordered_map<std::string, std::unique_ptr<Statement>> cache_;
  std::timed_mutex mutex_;
  std::minstd_rand random_;
  std::string wal_path_;
  std::int64_t page_size_ = 4096;

  // Guarded by mutex_: the current call's deadline, the business write's guard, the WAL.
  std::chrono::steady_clock::time_point deadline_{};
  bool guarding_ = false;
  bool business_ran_ = false;
  int vetoed_ = 0;
  int rollbacks_ = 0;
  std::int64_t wal_frames_ = 0;
  std::chrono::steady_clock::time_point next_checkpoint_{};
  std::chrono::milliseconds checkpoint_backoff_{0};
  std::chrono::steady_clock::time_point contended_at_{};
  std::chrono::steady_clock::time_point committed_at_{};

  // Who holds mutex_, read by calls that wait for it.
  std::atomic<const char*> holder_doing_{nullptr};
  std::atomic<std::int64_t> holder_since_{0};
  std::atomic<bool> holder_in_business_{false};
  std::atomic<std::thread::id> holder_thread_{};
};

/// A handle's view of the session: the session, and the gate whose rows it reads and writes
/// (bound as `?1` of every statement).
struct Scope {
  /// The shared session.
  Session& session;
  /// The handle's gate.
  const std::string& gate;
};

inline void Session::open() {
  sqlite3* raw = nullptr;
  const int code =
      sqlite3_open_v2(path_.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  db_.reset(raw);  // SQLite allocates a handle even when opening fails
  if (code != SQLITE_OK) {
    const std::string message = message_of(raw, code);
    throw StoreError("idemgate: cannot open the SQLite database at " + path_ + ": " + message +
                     ". " + advice(code, message));
  }
  sqlite3_extended_result_codes(db_.get(), 1);
  sqlite3_busy_handler(db_.get(), &Session::on_busy, this);
  sqlite3_commit_hook(db_.get(), &Session::on_commit, this);
  sqlite3_rollback_hook(db_.get(), &Session::on_rollback, this);
  sqlite3_wal_hook(db_.get(), &Session::on_wal, this);
  // The first statement reads the file's header: a file that is not a database fails here.
  std::string mode;
  run("switching to WAL mode", nullptr, [&] {
    Statement pragma(db_.get(), "PRAGMA journal_mode=WAL", "switching to WAL mode");
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
    exec(db_.get(), "PRAGMA synchronous=FULL");
    // SQLite cuts the WAL back to this size whenever it starts it over.
    exec(db_.get(), "PRAGMA journal_size_limit=" + std::to_string(wal_size_limit_));
    page_size_ = query_int(db_.get(), "PRAGMA page_size").value_or(4096);
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

}  // namespace idemgate::detail::sqlite
