// SPDX-License-Identifier: MIT
// PostgresStore's generations (`PostgresOptions::partitioned_log`): starting the next one,
// listing them, and dropping the ones left empty.
#pragma once

#include "../../detail/postgres/connection_pool.hpp"
#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "session.hpp"
#include "sql/generations.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate {

/// One generation of a partitioned log (`PostgresStore::generations`).
struct LogGeneration {
  /// Its number: 0 for the rows a log held when it was partitioned, then 1, 2, …
  int number = 0;
  /// Whether reservations write into it now.
  bool current = false;
  /// Its rows as the server's statistics last counted them (-1 before its first analyze).
  std::int64_t rows_estimate = -1;
  /// Its size on disk, indexes included.
  std::int64_t bytes = 0;
  /// Whether a detach of it was interrupted (the next `drop_empty_generations` finishes it).
  bool detach_pending = false;
};

}  // namespace idemgate

namespace idemgate::detail::postgres {

/// The generations of a partitioned log.
class Generations {
 public:
  /// On the handle's scope.
  explicit Generations(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `PostgresStore::generations`.
  std::vector<LogGeneration> list() {
    require_partitioned("generations");
    const int current = current_generation(std::chrono::seconds(0)).first;
    const pqxx::result rows = query(s_.render(sql::postgres::list_generations.text));
    std::vector<LogGeneration> found;
    for (const pq::row& row : rows) {
      LogGeneration g;
      g.number = static_cast<int>(pq::int_field(row[0]));
      g.current = g.number == current;
      g.detach_pending = pq::bool_field(row[1]);
      g.rows_estimate = pq::int_field(row[2]);
      g.bytes = pq::int_field(row[3]);
      found.push_back(g);
    }
    return found;
  }

  /// See `PostgresStore::start_generation`.
  int start_next() {
    require_partitioned("start_generation");
    return start_if_older_than(std::chrono::seconds(0)).first;
  }

  /// Starts the next generation when the current one began at least `span` ago; returns the
  /// current generation after it and whether it started one.
  std::pair<int, bool> start_if_older_than(std::chrono::seconds span) {
    const auto [current, due] = current_generation(span);
    if (!due) return {current, false};
    const int next = current + 1;
    // Made first, on its own, so that the lock below is held for the attach alone; made already
    // when an earlier attempt or another session starting the same generation made it.
    try {
      query(with_generation(sql::postgres::create_generation.text, next));
    } catch (const pqxx::sql_error& e) {
      // Another session made it at the same moment: the catalog's unique index answers for it
      // once that session commits (23505), or the table's name or its row type is found taken
      // when that session committed between the checks (42P07, 42710).
      if (!made_elsewhere(pq::sqlstate(e))) throw;
    }
    const std::string attach = with_generation(sql::postgres::attach_generation.text, next);
    const std::string listed = s_.render(sql::postgres::list_generations.text);
    bool started = false;
    try {
      started = s_.run([&](Lease& c) {
        pqxx::work tx(c.connection());
        pq::exec(tx, s_.render(sql::postgres::start_generation[0]));
        pq::exec(tx, s_.render(sql::postgres::start_generation[1]));
        // Attached already when another session started this generation first.
        if (!listed_detach_pending(pq::exec(tx, listed), next)) pq::exec(tx, attach);
        const bool moved = pq::affected_rows(pq::exec_params(
                               tx, s_.render(sql::postgres::start_generation[2]), next)) > 0;
        tx.commit();
        return moved;
      });
    } catch (const pqxx::sql_error& e) {
      // 55P03: a transaction on the log stayed open past the lock's bound; reservations went
      // on in the current generation meanwhile.
      if (e.sqlstate() != "55P03") throw;
      s_.log("idemgate: generation " + std::to_string(next) + " of " + s_.table() +
             " not started: a transaction on the log stayed open longer "
             "than 5 s (" +
             e.what() + "). The next purge tries again.");
      return {current, false};
    }
    if (started)
      s_.log("idemgate: " + s_.table() + " writes into generation " + std::to_string(next) +
             " now.");
    return {started ? next : current_generation(std::chrono::seconds(0)).first, started};
  }

  /// The purge on a log of generations (see `PostgresStore::purge`), generation by generation.
  /// An older generation whose every row the purge may delete is emptied whole (truncated);
  /// otherwise the gate's finished rows past the window go in key order, in batches that go on
  /// where the one before stopped, and the generation is vacuumed after. The current generation is
  /// skipped while it began less than `older_than` ago: what it holds came later. While a
  /// transaction older than the window is open in the database, only the generations whose every
  /// row is past the window are purged (those before the one the current one followed, or that one
  /// too once the current began the window ago): that snapshot keeps what a delete leaves, so
  /// deleting from a generation still filling would give no space back and make every later purge
  /// step over it again. Returns how many rows it deleted.
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    const auto [current, current_due] = current_generation(older_than);
    const bool held = snapshot_held_longer_than(older_than);
    // The newest generation purged: the one before the current (the current one too once it
    // is a window old), one fewer under an old snapshot.
    const int last = current - 1 + (current_due ? 1 : 0) - (held ? 1 : 0);
    const std::int64_t window = sql_duration<std::chrono::seconds>(older_than);
    const std::int64_t limit = sql_limit(batch);
    std::size_t deleted = 0;
    for (const pq::row& row : query(s_.render(sql::postgres::list_generations.text))) {
      const int number = static_cast<int>(pq::int_field(row[0]));
      // A generation pending its detach holds no row.
      if (pq::bool_field(row[1]) || number > last) continue;
      // Every row of an older generation the purge may delete: the generation is emptied whole
      // (a batch of none deletes nothing).
      if (number < current && limit > 0) {
        if (const std::optional<std::int64_t> emptied = empty_whole(number, window)) {
          deleted += static_cast<std::size_t>(*emptied);
          continue;
        }
      }
      const std::string text = with_generation(sql::postgres::purge_generation.text, number);
      std::string after;
      std::size_t swept = 0;
      for (;;) {
        const pqxx::result r = s_.run([&](Lease& c) {
          pqxx::work tx(c.connection());
          pq::exec(tx, std::string(sql::postgres::purge_generation_plan));
          pqxx::result picked =
              pq::exec_params(tx, text, gate_, window, limit, pq::bytea_param(after));
          tx.commit();
          return picked;
        });
        swept += static_cast<std::size_t>(pq::int_field(r[0][1]));
        const std::int64_t picked = pq::int_field(r[0][0]);
        if (picked == 0 || picked < limit) break;
        after = pq::bytea_field(r[0][2]);
      }
      if (swept > 0) vacuum(number);
      deleted += swept;
    }
    return deleted;
  }

  /// See `PostgresStore::drop_empty_generations`.
  std::size_t drop_empty() {
    require_partitioned("drop_empty_generations");
    const int current = current_generation(std::chrono::seconds(0)).first;
    std::size_t dropped = 0;
    for (const pq::row& row : query(s_.render(sql::postgres::list_generations.text))) {
      const int number = static_cast<int>(pq::int_field(row[0]));
      const bool pending = pq::bool_field(row[1]);
      // Nothing writes into an older generation any more: once empty, it stays so.
      if (number >= current) continue;
      if (!pending && !pq::bool_field(query(
                          with_generation(sql::postgres::generation_empty.text, number))[0][0]))
        continue;
      detach(number, pending);
      query(with_generation(sql::postgres::drop_generation.text, number));
      s_.log("idemgate: dropped generation " + std::to_string(number) + " of " + s_.table() +
             ", empty.");
      ++dropped;
    }
    return dropped;
  }

  /// Whether the store's log is partitioned (`PostgresOptions::partitioned_log`).
  [[nodiscard]] bool enabled() const noexcept { return s_.options().partitioned_log; }

 private:
  void require_partitioned(std::string_view call) const {
    if (!enabled())
      throw StoreError("idemgate: " + std::string(call) + "() needs a log of generations: set " +
                       "PostgresOptions::partitioned_log and call migrate().");
  }

  std::pair<int, bool> current_generation(std::chrono::seconds span) {
    const pqxx::result r = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return pq::exec_params(tx, s_.render(sql::postgres::current_generation.text),
                             static_cast<std::int64_t>(span.count()));
    });
    return {static_cast<int>(pq::int_field(r[0][0])), pq::bool_field(r[0][1])};
  }

  // Truncates generation `number` when every row of it is the gate's and past the window;
  // returns how many rows it held, or nullopt (a row to keep, or a statement that held the
  // generation longer than the lock's bound): the purge then deletes row by row.
  std::optional<std::int64_t> empty_whole(int number, std::int64_t window) {
    const std::string kept = with_generation(sql::postgres::generation_kept_rows.text, number);
    const auto count_kept = [&](pqxx::transaction_base& tx) {
      const pqxx::result r = pq::exec_params(tx, kept, gate_, window);
      return std::pair{pq::int_field(r[0][0]), pq::int_field(r[0][1])};
    };
    // First without the lock: a generation with a row to keep is not held back for the count.
    const auto [kept_first, rows_first] = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return count_kept(tx);
    });
    if (kept_first > 0 || rows_first == 0) return std::nullopt;
    try {
      return s_.run([&](Lease& c) -> std::optional<std::int64_t> {
        pqxx::work tx(c.connection());
        pq::exec(tx, s_.render(sql::postgres::empty_generation[0]));
        pq::exec(tx, with_generation(sql::postgres::empty_generation[1], number));
        const auto [kept_now, rows] = count_kept(tx);
        if (kept_now > 0) return std::nullopt;
        pq::exec(tx, with_generation(sql::postgres::empty_generation[2], number));
        tx.commit();
        return rows;
      });
    } catch (const pqxx::sql_error& e) {
      // 55P03: a statement held the generation past the lock's bound.
      if (e.sqlstate() != "55P03") throw;
      return std::nullopt;
    }
  }

  // Whether a transaction open in the database began more than `span` ago.
  bool snapshot_held_longer_than(std::chrono::seconds span) {
    const pqxx::result r = query(s_.render(sql::postgres::oldest_snapshot_age.text));
    return pq::int_field(r[0][0]) > sql_duration<std::chrono::seconds>(span);
  }

  // Whether generation `number`'s detach is pending (nullopt: not attached at all).
  std::optional<bool> detach_pending(int number) {
    return listed_detach_pending(query(s_.render(sql::postgres::list_generations.text)), number);
  }
  // The same, in the rows of `list_generations`.
  static std::optional<bool> listed_detach_pending(const pqxx::result& listed, int number) {
    for (const pq::row& row : listed)
      if (pq::int_field(row[0]) == number) return pq::bool_field(row[1]);
    return std::nullopt;
  }

  // Detaches generation `number`, or finishes its interrupted detach. A detach cut mid-statement
  // and sent again on a fresh connection finds its first transaction committed: it finishes it.
  // A generation another session detached meanwhile is left to the drop.
  void detach(int number, bool pending) {
    try {
      query(with_generation(
          pending ? sql::postgres::finish_detach.text : sql::postgres::detach_generation.text,
          number));
    } catch (const pqxx::sql_error&) {
      const std::optional<bool> now = detach_pending(number);
      if (!now) return;
      if (!*now || pending) throw;
      query(with_generation(sql::postgres::finish_detach.text, number));
    }
  }

  // Vacuums generation `number` after the purge deleted rows from it one by one.
  void vacuum(int number) {
    s_.vacuum_after_purge(with_generation(sql::postgres::vacuum_generation.text, number),
                          "generation " + std::to_string(number) + " of " + s_.table());
  }

  // Whether a failed create of a generation's table met the same table made by another session.
  static bool made_elsewhere(const std::string& sqlstate) {
    return sqlstate == "23505" || sqlstate == "42P07" || sqlstate == "42710";
  }

  // The statement's text for generation `number` (its `{1}`), rendered for the log.
  std::string with_generation(std::string_view text, int number) const {
    std::string filled(text);
    const std::string n = std::to_string(number);
    for (auto at = filled.find("{1}"); at != std::string::npos; at = filled.find("{1}", at))
      filled.replace(at, 3, n);
    return s_.render(filled);
  }

  // One text on its own, outside a transaction block (a concurrent detach cannot run in one).
  pqxx::result query(const std::string& text) {
    return s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return pq::exec(tx, text);
    });
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
