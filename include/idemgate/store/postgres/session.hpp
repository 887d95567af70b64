// SPDX-License-Identifier: MIT
// PostgresStore's session rules: its connections, how its statements are prepared and sent, how
// a unit of work is retried, and what a business write's transaction must look like to commit.
#pragma once

#include "../../detail/durations.hpp"
#include "../../detail/postgres/connection_pool.hpp"
#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/protocol.hpp"
#include "../log/row.hpp"
#include "../sql.hpp"
#include "failure.hpp"
#include "options.hpp"
#include "sql/all.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace idemgate::detail::postgres {

using Lease = ConnectionPool::Lease;

/// How a transaction the store retries is named in what it says when an attempt fails (the log
/// line "<what> attempt n of m … failed", and the error once the attempts ran out), built only
/// then.
struct RetriedWork {
  /// "commit", "group commit", "batch commit".
  const char* what;
  /// The key of one event's transaction; nullptr for a batch or a group.
  const Key* key = nullptr;
  /// The events of a batch or a group.
  std::size_t events = 0;
  /// What becomes of one event's row when the attempts run out, after "Do not ack: ".
  const char* then =
      "the row stays in flight and a redelivery after its lease, or the reconciler, finishes it.";
};

/**
 * Everything the handles on one PostgreSQL log share, and the rules every part of the store
 * follows on it: the options, the log's statements rendered for its table, the connection pools,
 * how a statement is prepared and sent, how a unit of work is retried (with `classify` of
 * failure.hpp), and what a business write's transaction must look like to commit.
 */
class Session {
 public:
  /// Opens the pools for `uri` (see `PostgresStore`'s constructor).
  Session(const std::string& uri, PostgresOptions options)
      : options_(checked_options(std::move(options))),
        table_(checked_table_name(options_.table)),
        outcome_check_(std::string(sql::postgres::open_transaction_check.text) +
                       (options_.relaxed_outcomes
                            ? " " + std::string(sql::postgres::relax_outcome.text)
                            : std::string())),
        errors_(table_),
        pool_(uri, options_.pool_size, options_.checkout_timeout, settings({})),
        renewal_pool_(uri, 1, options_.checkout_timeout, settings({}), false) {
    for (std::size_t i = 0; i < std::size(sql::postgres::prepared); ++i) {
      prepared_text_[i] = render(sql::postgres::prepared[i]->text);
      prepared_name_[i] = sql::postgres::prepared[i]->name;
    }
    // Behind a transaction pooler, a session-level SET would stay on whichever server
    // connection ran it and leave other clients' commits, this store's own included, without
    // the WAL flush: relaxed reservations set it per transaction there (reserving).
    if (options_.relaxed_reservations)
      relaxed_pool_ = std::make_unique<ConnectionPool>(
          uri, options_.pool_size, options_.checkout_timeout,
          settings(pooled_by_transaction() ? std::string()
                                           : std::string("SET synchronous_commit = off;")),
          false);
  }

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// The options, checked.
  [[nodiscard]] const PostgresOptions& options() const noexcept { return options_; }
  /// The log's table, as given (optionally schema-qualified).
  [[nodiscard]] const std::string& table() const noexcept { return table_; }
  /// The errors that name the log's table.
  [[nodiscard]] const LogErrors& errors() const noexcept { return errors_; }
  /// The pool of the store's calls.
  [[nodiscard]] ConnectionPool& pool() noexcept { return pool_; }
  /// The one connection of lease renewals, opened at the first renewal.
  [[nodiscard]] ConnectionPool& renewal_pool() noexcept { return renewal_pool_; }
  /// Whether reservations skip the WAL flush (`PostgresOptions::relaxed_reservations`).
  [[nodiscard]] bool relaxed() const noexcept { return relaxed_pool_ != nullptr; }
  /// Whether a `Gate`'s outcomes skip the WAL flush (`PostgresOptions::relaxed_outcomes`).
  [[nodiscard]] bool relaxed_outcomes() const noexcept { return options_.relaxed_outcomes; }
  /// What goes in front of a `Gate`'s fenced commit update, in its round trip: the check that
  /// the business write left the transaction open and, with relaxed outcomes, the transaction's
  /// own `synchronous_commit = off`.
  [[nodiscard]] const std::string& outcome_check() const noexcept { return outcome_check_; }
  /// Whether a transaction pooler stands between the store and the server.
  [[nodiscard]] bool pooled_by_transaction() const noexcept {
    return options_.pooling == PostgresPooling::transaction;
  }
  /// Connections closed because a statement went unanswered (`reply_timeout`).
  [[nodiscard]] std::size_t connections_cut() const noexcept {
    return pool_.silent_connections_cut() + renewal_pool_.silent_connections_cut() +
           (relaxed_pool_ ? relaxed_pool_->silent_connections_cut() : 0);
  }

  /// An SQL text of the store's dialect with its placeholders filled for this log.
  [[nodiscard]] std::string render(std::string_view text) const {
    return render_for(table_, text, true, options_.partitioned_log);
  }

  /// An SQL text of the store's dialect with its placeholders filled for the log `table`:
  /// compacted to one line without comments as the store sends it, or as written (`compact`
  /// false, for a script people read); for a log of generations when `partitioned`
  /// (`PostgresOptions::partitioned_log`), whose rows carry their generation and whose key
  /// includes it.
  [[nodiscard]] static std::string render_for(const std::string& table, std::string_view text,
                                              bool compact = true, bool partitioned = false) {
    const std::string t = checked_table_name(table);
    const auto dot = t.find('.');
    const std::string schema = dot == std::string::npos ? std::string() : t.substr(0, dot + 1);
    const auto variables = [&](std::string_view name) -> std::optional<std::string> {
      if (name == "log") return t;
      if (name == "log_name") return unqualified(t);
      if (name == "log_schema") return schema;
      if (name == "mismatches") return t + "_mismatches";
      if (name == "migrations") return t + "_migrations";
      if (name == "generations") return t + "_generations";
      // A reservation's insert: the generation it writes into, read in its own statement (see
      // sql::postgres::start_generation), and the index its conflicts are tested on. A
      // generation's one unique index is its key, so its insert names none: PostgreSQL 15 maps
      // a named index of the partitioned table to the generation's own by reading the catalog
      // at every insert, which tripled the buffers the insert reads (36 against 11).
      if (name == "generation_column") return std::string(partitioned ? ", generation" : "");
      if (name == "generation_value")
        return partitioned ? ", (SELECT current FROM " + t + "_generations)" : std::string();
      if (name == "conflict_target") return std::string(partitioned ? "" : " (gate, key)");
      // The generations a reservation looks for the gate's key in besides the conflict arbiter,
      // which sees the current one alone (a unique index holds within one generation); a plain
      // log has no other.
      if (name == "older_generation")
        return partitioned ? "generation <> (SELECT current FROM " + t + "_generations)"
                           : std::string("false");
      if (name == "history_limit") return std::to_string(history_limit);
      if (name == "record_columns") return record_columns();
      return std::nullopt;
    };
    if (compact) return sql_text::render(text, variables, sql::postgres::fragments);
    return sql_text::trimmed(sql_text::fill(text, variables, sql::postgres::fragments));
  }

  /// Reports through `PostgresOptions::log`; a log that throws is ignored.
  void log(const std::string& line) const noexcept {
    if (!options_.log) return;
    try {
      options_.log(line);
    } catch (...) {
    }
  }

  /// Runs `vacuum`, the rendered `VACUUM` of `what` after a purge deleted rows from it, outside
  /// a transaction. A vacuum that fails (the role does not own the table) is logged and leaves
  /// the work to autovacuum: the purge stands.
  void vacuum_after_purge(const std::string& vacuum, const std::string& what) {
    try {
      run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        pq::exec(tx, vacuum);
        return 0;
      });
    } catch (const pqxx::sql_error& e) {
      log("idemgate: VACUUM of " + what + " after a purge failed: " + e.what() +
          " The purge stands; autovacuum reclaims the space on its own schedule.");
    }
  }

  /**
   * Runs one of the store's prepared statements (`sql::postgres::prepared`) with the gate as `$1`
   * and `args` after it, preparing it on this connection first if it has not been yet: lazily,
   * per connection, at its first use, so the server sees it at the same moment whether libpqxx
   * prepares at once (7.x, 8.x) or on first use (6.4), and nothing is prepared before migrate()
   * created the table. A missing or outdated log table shows as this statement's SQLSTATE on
   * every version (it is prepared again at its next use). Behind a transaction pooler nothing is
   * prepared: the statement goes unnamed, with its text and parameters, in one round trip.
   */
  template <class Transaction, class... Args>
  pqxx::result exec(Lease& lease, Transaction& tx, const sql::Statement& statement,
                    const std::string& gate, Args&&... args) {
    const std::size_t index = slot(statement);
    const std::string& name = prepared_name_[index];
    try {
      if (pooled_by_transaction())
        return pq::exec_params(tx, prepared_text_[index], gate, std::forward<Args>(args)...);
      if (!lease.prepared(index)) {
        pq::prepare(lease.connection(), name, prepared_text_[index]);
        lease.set_prepared(index);
      }
      return pq::exec_prepared(tx, name, gate, std::forward<Args>(args)...);
    } catch (const pqxx::undefined_table&) {
      throw errors_.missing_table();
    } catch (const pqxx::undefined_column&) {
      throw errors_.outdated_table();
    }
  }

  /// The text that runs prepared statement `statement` with `literals` (SQL literals, the gate's
  /// first) as its parameters, in one text without parameters: `EXECUTE` of the statement,
  /// prepared on this connection now if it was not yet (outside any transaction), so the server
  /// neither parses nor plans it again. Behind a transaction pooler, the statement's own text
  /// with the literals in it.
  [[nodiscard]] std::string execute_text(Lease& lease, const sql::Statement& statement,
                                         std::span<const std::string> literals) {
    const std::size_t index = slot(statement);
    if (pooled_by_transaction()) return sql_text::with_literals(prepared_text_[index], literals);
    prepare_now(lease, statement);
    std::string text = "EXECUTE " + prepared_name_[index] + "(";
    for (std::size_t i = 0; i < literals.size(); ++i) text += (i > 0 ? ", " : "") + literals[i];
    return text + ")";
  }

  /// Prepares `statement` on the lease's connection now, if it was not yet (and unless a
  /// transaction pooler stands between): before a transaction opens, so that `exec` and
  /// `execute_text` inside it neither prepare nor parse.
  void prepare_now(Lease& lease, const sql::Statement& statement) {
    const std::size_t index = slot(statement);
    if (pooled_by_transaction() || lease.prepared(index)) return;
    try {
      pq::prepare_at_once(lease.connection(), prepared_name_[index], prepared_text_[index]);
    } catch (const pqxx::undefined_table&) {
      throw errors_.missing_table();
    } catch (const pqxx::undefined_column&) {
      throw errors_.outdated_table();
    }
    lease.set_prepared(index);
  }

  /// A prepared statement's text as rendered for this log, with `literals` as its parameters.
  [[nodiscard]] std::string literal_text(const sql::Statement& statement,
                                         std::span<const std::string> literals) const {
    return sql_text::with_literals(prepared_text_[slot(statement)], literals);
  }

  /**
   * Runs one unit of work on a connection of `pool`. A unit run this way is safe to repeat
   * (inserts conflict, updates are fenced, reads read): after a `Failure::connection` it runs once
   * more on a fresh connection, after a lost deadlock up to five times in all (the loser was
   * rolled back whole); then it throws `StoreError` (do not ack). Anything else passes unchanged.
   */
  template <class Work>
  auto run_on(ConnectionPool& pool, Work&& work) -> std::invoke_result_t<Work&, Lease&> {
    for (int attempt = 1;; ++attempt) {
      auto lease = pool.acquire();
      try {
        return work(lease);
      } catch (...) {
        const Classified failure = classify(std::current_exception(), lease, errors_);
        if (failure.kind == Failure::other) throw;
        if (failure.kind == Failure::deadlock && attempt >= 5)
          throw StoreError("idemgate: kept deadlocking with concurrent work (" + failure.why +
                           "); nothing was written. Do not ack.");
        if (failure.kind == Failure::connection && attempt >= 2)
          throw StoreError("idemgate: lost the connection to PostgreSQL at " + pool.redacted_uri() +
                           " (" + trimmed(failure.why) +
                           "). Do not ack; the redelivery will try again once the database is "
                           "back.");
      }
    }
  }

  /// `run_on` the pool of the store's calls.
  template <class Work>
  auto run(Work&& work) -> std::invoke_result_t<Work&, Lease&> {
    return run_on(pool_, std::forward<Work>(work));
  }

  /// Runs a reservation statement (reserve, take_over, reserve_batch) with the gate as `$1`, on
  /// the reservation pool. Relaxed reservations behind a transaction pooler run as a transaction
  /// of their own that turns the WAL flush off for itself alone (SET LOCAL): the pooler may give
  /// every transaction another server connection, so the relaxed pool's session-level SET is not
  /// used there. A COMMIT whose outcome is unknown is tried again like a lost connection
  /// (`classify`): each of these statements recognises its own earlier work by its holder token.
  template <class... Args>
  pqxx::result reserving(const sql::Statement& statement, const std::string& gate,
                         const Args&... args) {
    return run_on(relaxed_pool_ ? *relaxed_pool_ : pool_, [&](Lease& c) {
      if (relaxed_pool_ && pooled_by_transaction()) {
        pqxx::work tx(c.connection());
        pq::exec(tx, "SET LOCAL synchronous_commit = off");
        pqxx::result rows = exec(c, tx, statement, gate, args...);
        tx.commit();
        return rows;
      }
      pqxx::nontransaction tx(c.connection());
      return exec(c, tx, statement, gate, args...);
    });
  }

  /**
   * Runs a transaction that must never run twice for one outcome (a commit and its business
   * write), as `attempt(lease, n)`: a `Failure::connection` (a broken connection, a COMMIT whose
   * fate is unknown, a server going away) or a connection that cannot be opened is tried again
   * on a fresh connection after `backoff`, up to `commit_attempts` times in all, and attempt `n`
   * is told its number so that a repeat first looks whether the previous one landed. Any other
   * failure goes to `otherwise(error)`, which rethrows it or answers for it.
   */
  template <class Attempt, class Otherwise>
  auto retrying(const RetriedWork& work, Attempt&& attempt, Otherwise&& otherwise)
      -> std::invoke_result_t<Attempt&, Lease&, int> {
    for (int n = 1;; ++n) {
      std::string why;
      try {
        auto lease = pool_.acquire();
        try {
          prepare_business_statements(lease);
          return attempt(lease, n);
        } catch (...) {
          const Classified failure = classify(std::current_exception(), lease, errors_);
          if (failure.kind != Failure::connection) return otherwise(std::current_exception());
          why = failure.why;
        }
      } catch (const ConnectionUnavailable& e) {
        why = e.what();
      }
      if (n >= options_.commit_attempts) throw given_up(work, n, trimmed(why));
      const auto pause = backoff(options_.retry_backoff, n,
                                 [] { return static_cast<std::uint64_t>(new_holder_token()); });
      log("idemgate: " + std::string(work.what) + " attempt " + std::to_string(n) + " of " +
          std::to_string(options_.commit_attempts) +
          (work.key != nullptr ? " for key " + work.key->hex() : std::string()) + " failed (" +
          trimmed(why) + "); trying again in " + describe(pause) + ".");
      std::this_thread::sleep_for(pause);
    }
  }

  /// `retrying` that passes every other failure on unchanged.
  template <class Attempt>
  auto retrying(const RetriedWork& work, Attempt&& attempt)
      -> std::invoke_result_t<Attempt&, Lease&, int> {
    return retrying(work, std::forward<Attempt>(attempt),
                    [](std::exception_ptr error) -> std::invoke_result_t<Attempt&, Lease&, int> {
                      std::rethrow_exception(error);
                    });
  }

  /// Runs a business write. A statement it sends after it swallowed an SQL error fails with
  /// "current transaction is aborted" on libpqxx 7 and 8 (6.4 ended the transaction instead, see
  /// `checked`): either way the business write broke its transaction, and is named for it.
  template <class Write>
  void run_business_write(const Key& key, Write&& write) const {
    try {
      write();
    } catch (const pqxx::sql_error& e) {
      if (ended_transaction(e)) throw errors_.broken_transaction(key, e.what());
      throw;
    }
  }

  /// Runs the statement that follows a business write through libpqxx's checked path (a
  /// statement without parameters), which refuses to run once the transaction has ended: with
  /// libpqxx 6.4, a failed statement that the business write caught ends the transaction, and
  /// later parameterised statements would run — and commit — on their own.
  pqxx::result checked(pqxx::work& tx, const std::string& text, const Key& key) const {
    try {
      return pq::exec(tx, text);
    } catch (const pqxx::usage_error& e) {
      throw errors_.broken_transaction(key, e.what());
    } catch (const pqxx::sql_error& e) {
      if (ended_transaction(e)) throw errors_.broken_transaction(key, e.what());
      throw;
    }
  }

  /// What a fenced write of `key` under `fence` to `target` that touched nothing answers (see
  /// `after_missed_write`), reading the row back on the caller's connection: a second checkout
  /// could wait on a pool of one.
  template <class Transaction>
  std::optional<CommitStatus> settled(Lease& lease, Transaction& tx, const std::string& gate,
                                      const std::string& key_param, std::int64_t fence,
                                      RecordStatus target) {
    const pqxx::result rows = exec(lease, tx, sql::postgres::settled, gate, key_param);
    std::optional<StoredFence> stored;
    if (!rows.empty())
      stored =
          StoredFence{parse_record_status(pq::text_field(rows[0][0])), pq::int_field(rows[0][1])};
    return after_missed_write(stored, fence, target, table_);
  }

  /// `settled`, where a row still held under this fence means the write lost to nobody yet: a
  /// takeover is under way (`lost_lease`).
  template <class Transaction>
  CommitStatus settled_earlier(Lease& lease, Transaction& tx, const std::string& gate,
                               const std::string& key_param, std::int64_t fence,
                               RecordStatus target) {
    return settled(lease, tx, gate, key_param, fence, target).value_or(CommitStatus::lost_lease);
  }

 private:
  // The error once the attempts of `work` ran out.
  static StoreError given_up(const RetriedWork& work, int attempts, const std::string& why) {
    if (work.key != nullptr)
      return StoreError("idemgate: the " + std::string(work.what) + " of key " + work.key->hex() +
                        " could not be confirmed after " + std::to_string(attempts) +
                        " attempts (" + why + "). Do not ack: " + work.then);
    return StoreError("idemgate: the " + std::string(work.what) + " of " +
                      std::to_string(work.events) + " events failed " + std::to_string(attempts) +
                      " times (" + why +
                      "); nothing was committed, or it could not be confirmed. Do not ack: the "
                      "redelivery or the reconciler finishes them.");
  }

  // The place of a prepared statement in `sql::postgres::prepared`: its bit in a connection's
  // set of prepared statements.
  static std::size_t slot(const sql::Statement& statement) {
    for (std::size_t i = 0; i < std::size(sql::postgres::prepared); ++i)
      if (sql::postgres::prepared[i] == &statement) return i;
    throw std::logic_error("idemgate: the statement " + std::string(statement.name) +
                           " is not in sql::postgres::prepared");
  }

  // Prepares PostgresOptions::business_statements on the lease's connection, those not yet
  // prepared there, before a commit's transaction opens (their bits follow the store's own).
  void prepare_business_statements(Lease& lease) {
    const auto& statements = options_.business_statements;
    for (std::size_t i = 0; i < statements.size(); ++i) {
      const std::size_t bit = std::size(sql::postgres::prepared) + i;
      if (lease.prepared(bit)) continue;
      pq::prepare_at_once(lease.connection(), statements[i].first, statements[i].second);
      lease.set_prepared(bit);
    }
  }

  // The select list of a `Record` in this dialect: the history as text, instants as
  // microseconds since the epoch.
  static std::string record_columns() {
    return record_select_list([](LogColumn column, std::string_view name) {
      const std::string n(name);
      if (column == LogColumn::history) return n + "::text";
      return is_instant(column) ? "(extract(epoch FROM " + n + ") * 1000000)::bigint" : n;
    });
  }

  // The pool's guards against dead connections, from the options.
  ConnectionSettings settings(std::string session_sql) const {
    ConnectionSettings s;
    s.connect_timeout = options_.connect_timeout;
    s.keepalives_idle = options_.keepalives_idle;
    s.keepalives_interval = options_.keepalives_interval;
    s.keepalives_count = static_cast<int>(options_.keepalives_count);
    s.tcp_user_timeout = options_.tcp_user_timeout;
    // Behind a transaction pooler a session-level SET would stay on a server connection other
    // clients share: the statement timeout is then the role's or the server's to set.
    s.statement_timeout =
        pooled_by_transaction() ? std::chrono::milliseconds::zero() : options_.statement_timeout;
    s.reply_timeout = options_.reply_timeout;
    if (options_.partitioned_log && !pooled_by_transaction())
      session_sql = std::string(sql::postgres::generic_plans.text) + session_sql;
    s.session_sql = std::move(session_sql);
    s.log = options_.log;
    return s;
  }

  PostgresOptions options_;
  std::string table_;
  std::string outcome_check_;  // see outcome_check()
  LogErrors errors_;
  std::array<std::string, std::size(sql::postgres::prepared)> prepared_text_;
  std::array<std::string, std::size(sql::postgres::prepared)> prepared_name_;
  ConnectionPool pool_;
  ConnectionPool renewal_pool_;  // lease renewals only (extend)
  std::unique_ptr<ConnectionPool> relaxed_pool_;

  static_assert(std::size(sql::postgres::prepared) + PostgresOptions::max_business_statements <=
                ConnectionPool::max_prepared);
};

/// A handle's view of the session: the session, and the gate whose rows it reads and writes
/// (bound as `$1` of every statement).
struct Scope {
  /// The shared session.
  Session& session;
  /// The handle's gate.
  const std::string& gate;
};

}  // namespace idemgate::detail::postgres
