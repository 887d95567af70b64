// SPDX-License-Identifier: MIT
// PostgresStore's schema and adoption: the numbered migrations applied and recorded, and rows of
// no gate given to one.
#pragma once

#include "../../detail/durations.hpp"
#include "../../detail/postgres/connection_pool.hpp"
#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "../../gate_name.hpp"
#include "../log/migration.hpp"
#include "../log/row.hpp"
#include "../sql.hpp"
#include "failure.hpp"
#include "session.hpp"
#include "sql/schema.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace idemgate::detail::postgres {

/// The log's schema: its numbered migrations (`sql::postgres::migrations`), applied and recorded
/// in `<table>_migrations`; and adoption of the rows of no gate.
class Schema {
 public:
  /// On the handle's scope.
  explicit Schema(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// The whole schema of the log `table` as one script, every step in order with the record of
  /// it (see `PostgresStore::schema_sql`).
  [[nodiscard]] static std::string script(const std::string& table, bool partitioned = false) {
    std::string out =
        Session::render_for(table, sql::postgres::create_migrations.text, false) + ";\n";
    std::vector<sql::Migration> steps(std::begin(sql::postgres::migrations),
                                      std::end(sql::postgres::migrations));
    if (partitioned) steps.push_back(sql::postgres::generations_step);
    for (const sql::Migration& step : steps) {
      out += "\n-- " + std::to_string(step.version) + " " + std::string(step.name) + ": " +
             std::string(step.summary) + "\n";
      for (std::string_view statement : step.statements)
        out += Session::render_for(table, statement, false) + ";\n";
      out += Session::render_for(table,
                                 "INSERT INTO {migrations} (version, name) VALUES (" +
                                     std::to_string(step.version) + ", '" + std::string(step.name) +
                                     "') ON CONFLICT (version) DO NOTHING",
                                 false) +
             ";\n";
    }
    return out;
  }

  /// See `PostgresStore::migrate`.
  MigrationReport migrate() {
    const PostgresOptions& o = s_.options();
    const auto give_up = saturating_add(std::chrono::steady_clock::now(), o.startup_wait);
    for (int n = 1;; ++n) {
      try {
        MigrationReport report = s_.run([&](Lease& c) {
          return s_.pooled_by_transaction() ? in_one_transaction(c) : online(c);
        });
        if (n > 1) s_.log("idemgate: PostgreSQL is back; migrated " + s_.table() + ".");
        if (!report.applied.empty()) s_.log(describe(report));
        return report;
      } catch (const ConnectionUnavailable& e) {
        const auto pause = backoff(o.retry_backoff, n,
                                   [] { return static_cast<std::uint64_t>(new_holder_token()); });
        if (std::chrono::steady_clock::now() + pause >= give_up)
          throw StoreError(std::string(e.what()) + " migrate() waited " +
                           detail::describe(o.startup_wait) +
                           " (PostgresOptions::startup_wait) for it; start it, or call migrate() "
                           "again.");
        s_.log(std::string(e.what()) + " migrate() tries again in " + detail::describe(pause) +
               ".");
        std::this_thread::sleep_for(pause);
      }
    }
  }

  /// See `PostgresStore::adopt_unowned_rows`.
  std::size_t adopt_unowned_rows(std::size_t limit) {
    require_named_scope(gate_, "adopt_unowned_rows");
    std::size_t moved = 0;
    while (moved < limit) {
      const std::size_t batch = std::min<std::size_t>(limit - moved, 10'000);
      const std::int64_t n = s_.run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        return pq::affected_rows(s_.exec(c, tx, sql::postgres::adopt, gate_, sql_limit(batch)));
      });
      moved += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < batch) break;
    }
    s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      (void)s_.exec(c, tx, sql::postgres::adopt_mismatches, gate_);
    });
    return moved;
  }

 private:
  // How a migration sends its SQL: `query` runs one text and returns its rows (reads, records),
  // `step` runs one statement of a step.
  struct Runner {
    std::function<pqxx::result(const std::string&)> query;
    std::function<void(std::string_view)> step;
  };

  // Behind a transaction pooler: everything in one transaction, under a lock held to its end,
  // without CONCURRENTLY (which cannot run in a transaction block): writers wait while the
  // indexes are built.
  MigrationReport in_one_transaction(Lease& c) {
    pqxx::work tx(c.connection());
    pq::exec(tx, std::string(sql::postgres::migration_lock.text));
    MigrationReport report = apply(in(tx));
    tx.commit();
    return report;
  }

  // Directly connected: each step's statements on their own, outside a transaction block, so
  // that the indexes are built concurrently and other sessions go on writing; a log that does
  // not exist yet is made in one transaction (nobody writes it meanwhile).
  MigrationReport online(Lease& c) {
    for (;;) {
      pqxx::nontransaction lock(c.connection());
      if (pq::bool_field(pq::exec(lock, std::string(sql::postgres::try_migration_lock.text))[0][0]))
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    try {
      MigrationReport report;
      const Runner alone{[&](const std::string& text) {
                           pqxx::nontransaction tx(c.connection());
                           return pq::exec(tx, text);
                         },
                         [&](std::string_view statement) { on_its_own(c, statement); }};
      if (!alone.query(s_.render(sql::postgres::log_exists.text))[0][0].as<bool>()) {
        pqxx::work fresh(c.connection());
        report = apply(in(fresh));
        fresh.commit();
      } else {
        report = apply(alone);
      }
      unlock(c);
      return report;
    } catch (...) {
      unlock(c);
      throw;
    }
  }

  // Sends everything in `tx`, without CONCURRENTLY.
  Runner in(pqxx::work& tx) {
    return {[&tx](const std::string& text) { return pq::exec(tx, text); },
            [this, &tx](std::string_view statement) {
              std::string text = s_.render(statement);
              for (auto at = text.find(" CONCURRENTLY"); at != std::string::npos;
                   at = text.find(" CONCURRENTLY"))
                text.erase(at, std::string_view(" CONCURRENTLY").size());
              pq::exec(tx, text);
            }};
  }

  // Records the found steps of a log made before versions were recorded, then applies the steps
  // it lacks, each recorded once done.
  MigrationReport apply(const Runner& runner) {
    runner.query(s_.render(sql::postgres::create_migrations.text));
    const pqxx::result state = runner.query(s_.render(sql::postgres::migrated_version.text));
    MigrationReport report;
    report.table = s_.table();
    const bool exists = pq::bool_field(state[0][1]);
    report.from_version = exists ? static_cast<int>(pq::int_field(state[0][0])) : 0;
    int version = report.from_version;
    if (exists && version == 0) {
      for (const sql::Migration& step : sql::postgres::migrations) {
        if (!pq::bool_field(runner.query(s_.render(step.present))[0][0])) break;
        found(runner, step, report);
        version = step.version;
      }
    }
    for (const sql::Migration& step : sql::postgres::migrations) {
      if (step.version <= version) continue;
      run(runner, step, report);
      version = step.version;
    }
    partition(runner, report, version);
    report.to_version = std::max(version, report.from_version);
    return report;
  }

  // Step 6 (`generations`), for a log of `PostgresOptions::partitioned_log` only; a partitioned
  // log opened without the option is refused, since its reservations would not find the keys of
  // earlier generations, and so is one with a unique index besides its key.
  void partition(const Runner& runner, MigrationReport& report, int& version) {
    const sql::Migration& step = sql::postgres::generations_step;
    const bool partitioned =
        pq::bool_field(runner.query(s_.render(sql::postgres::log_partitioned.text))[0][0]);
    if (!s_.options().partitioned_log) {
      if (partitioned)
        throw StoreError("idemgate: " + s_.table() +
                         " is partitioned by generation; open it with "
                         "PostgresOptions::partitioned_log = true, as every process of this log "
                         "must.");
      return;
    }
    if (version < step.version) {
      if (partitioned)
        found(runner, step, report);
      else
        run(runner, step, report);
      version = step.version;
    }
    const std::string extra =
        pq::text_field(runner.query(s_.render(sql::postgres::extra_unique_indexes.text))[0][0]);
    if (!extra.empty())
      throw StoreError("idemgate: " + s_.table() + " has a unique index besides its key (" + extra +
                       "). A reservation takes a conflict on any unique index of a generation "
                       "for its key's; drop that index, or keep what it guards in another table.");
  }

  // Records `step` as already in the log's shape.
  void found(const Runner& runner, const sql::Migration& step, MigrationReport& report) {
    record(runner, step, "found in place");
    report.found.push_back({step.version, std::string(step.name), std::string(step.summary)});
  }

  // Applies `step`'s statements in order, then records it.
  void run(const Runner& runner, const sql::Migration& step, MigrationReport& report) {
    const auto started = std::chrono::steady_clock::now();
    for (std::string_view statement : step.statements) runner.step(statement);
    record(runner, step, "");
    report.applied.push_back({step.version, std::string(step.name), std::string(step.summary),
                              std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - started)});
  }

  // Runs one migration statement on its own, outside a transaction block. A CREATE INDEX
  // CONCURRENTLY that was interrupted (a crash, a cancelled migration) leaves an invalid index
  // of its name behind, which IF NOT EXISTS would keep: it is dropped first.
  void on_its_own(Lease& c, std::string_view statement) {
    const std::string text = s_.render(statement);
    const std::string_view create = "INDEX CONCURRENTLY IF NOT EXISTS ";
    const auto on = text.find(" ON ");
    const auto exists = text.find(create);
    if (text.starts_with("CREATE") && on != std::string::npos && exists != std::string::npos) {
      const auto from = exists + create.size();
      const std::string index = s_.render("{log_schema}") + text.substr(from, on - from);
      pqxx::nontransaction check(c.connection());
      if (!pq::exec_params(check, s_.render(sql::postgres::invalid_index.text), index).empty())
        pq::exec(check, "DROP INDEX CONCURRENTLY IF EXISTS " + index);
    }
    pqxx::nontransaction step(c.connection());
    pq::exec(step, text);
  }

  void record(const Runner& runner, const sql::Migration& step, std::string_view note) {
    const std::string literals[] = {std::to_string(step.version),
                                    "'" + std::string(step.name) + "'",
                                    "'" + std::string(note) + "'"};
    runner.query(
        sql_text::with_literals(s_.render(sql::postgres::record_migration.text), literals));
  }

  void unlock(Lease& c) noexcept {
    try {
      pqxx::nontransaction tx(c.connection());
      pq::exec(tx, std::string(sql::postgres::migration_unlock.text));
    } catch (...) {
      // A broken connection ended its session, and the session's lock with it.
    }
  }

  static std::string describe(const MigrationReport& report) {
    std::string line = "idemgate: migrated " + report.table + " from version " +
                       std::to_string(report.from_version) + " to " +
                       std::to_string(report.to_version) + ":";
    for (const MigrationStep& step : report.applied)
      line += " " + std::to_string(step.version) + " " + step.name + ";";
    line.back() = '.';
    return line;
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
