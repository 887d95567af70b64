// SPDX-License-Identifier: MIT
// PostgresStore's per-event path: reserve, commit, fail, escalate, release, find.
#pragma once

#include "../../detail/answers.hpp"
#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/protocol.hpp"
#include "../log/row.hpp"
#include "../log/text.hpp"
#include "session.hpp"
#include "sql/events.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::detail::postgres {

/// One event's way through the log: its reservation, its commit with the business write, or its
/// failure, escalation or release; and its row.
class EventPath {
 public:
  /// On the handle's scope.
  explicit EventPath(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `PostgresStore::reserve`.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease, std::string_view label) {
    const std::string key_param = pq::bytea_param(key.view());
    const std::string fingerprint_param =
        pq::bytea_param({reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()});
    const std::string request_param = pq::bytea_param(request);
    const std::string label_text = detail::stored_text(label);
    const std::int64_t lease_ms = sql_duration<std::chrono::milliseconds>(lease);
    // This attempt's token: when a reply is lost and the statement runs again, the row it finds
    // is recognised as this attempt's own instead of "another worker holds this key".
    const std::int64_t holder = new_holder_token();
    bool tried_takeover = false;
    // Under READ COMMITTED the conflicting row may have committed after this statement's
    // snapshot: the insert then does nothing and the read sees nothing. A new statement has a
    // new snapshot, so the loop ends as soon as the row is visible.
    for (int attempt = 0; attempt < 32; ++attempt) {
      const pqxx::result rows =
          s_.reserving(sql::postgres::reserve, gate_, key_param, fingerprint_param, request_param,
                       lease_ms, holder, label_text);
      if (rows.empty()) continue;
      const pq::row row = rows[0];
      const std::int64_t fence = pq::int_field(row[1]);
      if (pq::bool_field(row[0])) return Reservation::acquired(fence);
      Reservation found = Reservation::existing(fence, parse_record_status(pq::text_field(row[2])),
                                                pq::bool_field(row[3]), pq::bytea_field(row[5]),
                                                pq::text_field(row[6]));
      found.held = held(found.status, pq::bool_field(row[4]), pq::bool_field(row[8]));
      switch (
          met(found.status, found.same_request, pq::bool_field(row[4]), pq::bool_field(row[7]))) {
        case Met::own:
          return tried_takeover ? Reservation::taken_over(fence) : Reservation::acquired(fence);
        case Met::expired: {
          tried_takeover = true;
          const pqxx::result taken =
              s_.reserving(sql::postgres::take_over, gate_, key_param, fence, lease_ms, holder);
          if (!taken.empty()) return Reservation::taken_over(pq::int_field(taken[0][0]));
          // Another worker took it over first, or this attempt's own takeover landed and its
          // reply was lost: read the row again to tell which.
          continue;
        }
        case Met::existing:
          break;
      }
      if (found.status == RecordStatus::in_flight) make_durable(key_param);
      return found;
    }
    throw StoreError("idemgate: the reservation of key " + key.hex() +
                     " kept racing with concurrent releases; the store is overloaded. Do not ack;"
                     " the redelivery will try again.");
  }

  /// See `PostgresStore::commit`.
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    return s_.retrying(committing(key), [&](Lease& c, int attempt) -> CommitStatus {
      if (const auto landed = landed_before(c, key, fence, attempt)) return *landed;
      // The update is an EXECUTE of the prepared commit, prepared here (outside the transaction)
      // if this connection has not yet: the server neither parses nor plans it per event.
      const std::string update =
          s_.outcome_check() + " " +
          s_.execute_text(c, sql::postgres::commit, commit_literals(key, fence, result));
      pqxx::work tx(c.connection());
      // The business write goes first and the fenced update last, sent so that libpqxx checks
      // the transaction is still open: a business write that swallowed an SQL error, or ended
      // the transaction itself, is caught here instead of its statements and the status
      // committing apart.
      s_.run_business_write(key, [&] { business(tx); });
      return finish(c, tx, update, key, fence);
    });
  }

  /// See `PostgresStore::commit_computed`.
  template <class Produce>
  CommitStatus commit_computed(const Key& key, std::int64_t fence, Produce&& produce) {
    return s_.retrying(committing(key), [&](Lease& c, int attempt) -> CommitStatus {
      if (const auto landed = landed_before(c, key, fence, attempt)) return *landed;
      pqxx::work tx(c.connection());
      std::string result;
      s_.run_business_write(key, [&] { result = produce(tx); });
      // The result is known only now, inside the transaction: the update goes as its own text.
      // It always waits for its flush: nothing would run a server's handler again for a
      // response its client already holds, so relaxed outcomes do not apply.
      const std::string update =
          std::string(sql::postgres::open_transaction_check.text) + " " +
          s_.literal_text(sql::postgres::commit, commit_literals(key, fence, result));
      return finish(c, tx, update, key, fence);
    });
  }

  /// See `PostgresStore::commit_once`.
  template <class Produce>
  OnceResult commit_once(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                         std::string_view label, std::chrono::milliseconds wait,
                         Produce&& produce) {
    const std::string key_param = pq::bytea_param(key.view());
    const std::string fingerprint_param =
        pq::bytea_param({reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()});
    const std::string request_param = pq::bytea_param(request);
    const std::string label_text = detail::stored_text(label);
    const std::int64_t wait_ms =
        std::max<std::int64_t>(1, sql_duration<std::chrono::milliseconds>(wait));
    // Recognises this call's own row when a COMMIT's reply was lost and it runs again.
    const std::int64_t holder = new_holder_token();
    for (int deadlocks = 0;; ++deadlocks) {
      bool reserving = true;
      std::optional<OnceResult> outcome = s_.retrying(
          RetriedWork{"transaction", &key, 0,
                      "it committed whole or not at all; the redelivery is answered from the log, "
                      "or runs the event."},
          [&](Lease& c, int) -> std::optional<OnceResult> {
            reserving = true;
            for (const sql::Statement* statement :
                 {&sql::postgres::reserve_committed, &sql::postgres::reserve,
                  &sql::postgres::set_result, &sql::postgres::commit})
              s_.prepare_now(c, *statement);
            pqxx::work tx(c.connection());
            // The common case, a new key: one insert of the row as it will commit.
            std::optional<Reservation> held;
            bool inserted_committed = false;
            if (!s_.exec(c, tx, sql::postgres::reserve_committed, gate_, key_param,
                         fingerprint_param, request_param, holder, label_text,
                         std::to_string(wait_ms), std::string(detail::unfinished_outcome))
                     .empty()) {
              held = Reservation::acquired(1);
              inserted_committed = true;
            }
            // The key has a row: the reservation statement reads it (a row that committed after
            // a statement's snapshot is seen by the next statement).
            // The row is never seen in flight, whatever lease it is given.
            const std::int64_t lease_ms = wait_ms;
            for (int tries = 0; tries < 32 && !held; ++tries) {
              const pqxx::result rows =
                  s_.exec(c, tx, sql::postgres::reserve, gate_, key_param, fingerprint_param,
                          request_param, lease_ms, holder, label_text);
              if (rows.empty()) continue;
              const pq::row row = rows[0];
              const std::int64_t fence = pq::int_field(row[1]);
              if (pq::bool_field(row[0])) {
                held = Reservation::acquired(fence);
                break;
              }
              Reservation found = Reservation::existing(
                  fence, parse_record_status(pq::text_field(row[2])), pq::bool_field(row[3]),
                  pq::bytea_field(row[5]), pq::text_field(row[6]));
              found.held =
                  detail::held(found.status, pq::bool_field(row[4]), pq::bool_field(row[8]));
              const bool mine = pq::bool_field(row[7]);
              // This call's own earlier attempt committed: its COMMIT's reply was lost.
              // (A fence past 1 is this call's own takeover: a new row starts at 1.)
              if (mine && found.status == RecordStatus::committed)
                return OnceResult::committed(std::move(found.result), fence > 1);
              switch (met(found.status, found.same_request, pq::bool_field(row[4]), mine)) {
                case Met::own:
                  held = Reservation::acquired(fence);
                  break;
                case Met::expired: {
                  // A stranded attempt of this request (left by a gate that calls a downstream):
                  // taken over inside this transaction, so it commits settled or not at all.
                  const pqxx::result taken = s_.exec(c, tx, sql::postgres::take_over, gate_,
                                                     key_param, fence, std::int64_t{0}, holder);
                  if (!taken.empty()) held = Reservation::taken_over(pq::int_field(taken[0][0]));
                  break;
                }
                case Met::existing:
                  tx.commit();  // the duplicate it counted
                  return OnceResult::existing(std::move(found));
              }
            }
            if (!held)
              throw StoreError("idemgate: the reservation of key " + key.hex() +
                               " kept racing with concurrent transactions; the store is "
                               "overloaded. Nothing was written. Do not ack.");
            reserving = false;
            std::string result;
            s_.run_business_write(key, [&] { result = produce(tx); });
            const std::string update =
                std::string(sql::postgres::open_transaction_check.text) + " " +
                (inserted_committed
                     ? s_.execute_text(c, sql::postgres::set_result,
                                       std::array<std::string, 4>{
                                           "'" + gate_ + "'", pq::bytea_literal(key.view()),
                                           pq::bytea_literal(result), std::to_string(holder)})
                     : s_.execute_text(c, sql::postgres::commit,
                                       commit_literals(key, held->fence, result)));
            if (pq::affected_rows(s_.checked(tx, update, key)) != 1)
              throw StoreError("idemgate: the row of key " + key.hex() + " in " + s_.table() +
                               " changed under this transaction's own lock; nothing was "
                               "written. Do not ack.");
            tx.commit();
            return OnceResult::committed(std::move(result), held->fence > 1);
          },
          [&](std::exception_ptr error) -> std::optional<OnceResult> {
            try {
              std::rethrow_exception(error);
            } catch (const pqxx::sql_error& e) {
              const std::string state = pq::sqlstate(e);
              // Waited past the bound for a transaction holding the key uncommitted (the lock
              // timeout, or the store's statement timeout when that is shorter).
              if (reserving && (state == "55P03" || state == "57014")) return OnceResult::busy();
              // Lost a deadlock, or a serialisation check: everything was rolled back.
              if (state == "40P01" || state == "40001") {
                if (deadlocks < 4) return std::nullopt;
                throw StoreError("idemgate: the transaction of key " + key.hex() +
                                 " kept deadlocking with concurrent work (" + e.what() +
                                 "); nothing was written. Do not ack.");
              }
              throw;
            }
          });
      if (outcome) return std::move(*outcome);
    }
  }

  /// See `PostgresStore::fail` and `PostgresStore::escalate`: stores `target` with `reason`,
  /// only if `fence` still holds.
  CommitStatus settle(const sql::Statement& statement, const Key& key, std::int64_t fence,
                      std::string_view reason, RecordStatus target) {
    const std::string key_param = pq::bytea_param(key.view());
    const std::string reason_text = detail::stored_text(reason);
    return s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      if (pq::affected_rows(s_.exec(c, tx, statement, gate_, key_param, fence, reason_text)) > 0)
        return CommitStatus::committed;
      return s_.settled_earlier(c, tx, gate_, key_param, fence, target);
    });
  }

  /// See `PostgresStore::release`.
  bool release(const Key& key, std::int64_t fence, std::string_view reason,
               std::chrono::milliseconds hold = std::chrono::milliseconds(0)) {
    const std::string key_param = pq::bytea_param(key.view());
    const std::string reason_text = detail::held_reason(reason, hold);
    const std::int64_t hold_ms = sql_duration<std::chrono::milliseconds>(hold);
    try {
      return s_.run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        return pq::affected_rows(s_.exec(c, tx, sql::postgres::release, gate_, key_param, fence,
                                         reason_text, hold_ms)) > 0;
      });
    } catch (const std::exception& e) {
      // Callers give leases back on their way out of a failure and cannot do anything more
      // about this one: say so here, where it happened.
      s_.log("idemgate: could not release the lease of key " + key.hex() + " (fence " +
             std::to_string(fence) + "): " + e.what() +
             " Safe: the lease runs out by itself, then a redelivery or the reconciler takes the "
             "event over; until then, redeliveries of it answer \"in flight\".");
      throw;
    }
  }

  /// See `PostgresStore::find`.
  std::optional<Record> find(const Key& key) {
    const std::string key_param = pq::bytea_param(key.view());
    const pqxx::result rows = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::find, gate_, key_param);
    });
    if (rows.empty()) return std::nullopt;
    return to_record(PqRow{rows[0]});
  }

  /// With relaxed reservations, an in-flight row another attempt reserved may not be flushed yet:
  /// a database crash could still lose it, and with it the event, once the caller has acked the
  /// "in flight" answer. Before that answer goes out, one synchronous commit on the durable pool
  /// flushes the WAL up to here, the other attempt's reservation included: a no-op update of the
  /// row (a commit that wrote nothing would not wait for the flush). Without relaxed reservations
  /// every reservation is flushed before its answer: nothing to do.
  void make_durable(const std::string& key_param) {
    if (!s_.relaxed()) return;
    s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::make_durable, gate_, key_param);
    });
  }

  /// The literals of the commit's fenced update: gate, key, fence, result.
  [[nodiscard]] std::array<std::string, 4> commit_literals(const Key& key, std::int64_t fence,
                                                           std::string_view result) const {
    return {"'" + gate_ + "'", pq::bytea_literal(key.view()), std::to_string(fence),
            pq::bytea_literal(result)};
  }

 private:
  // How a commit of `key` is named when its attempts fail.
  static RetriedWork committing(const Key& key) { return {"commit", &key}; }

  // A repeated attempt first finds out whether the previous one's COMMIT landed before its
  // connection broke, so that the business write never runs twice for one fence.
  std::optional<CommitStatus> landed_before(Lease& c, const Key& key, std::int64_t fence,
                                            int attempt) {
    if (attempt == 1) return std::nullopt;
    pqxx::nontransaction check(c.connection());
    return s_.settled(c, check, gate_, pq::bytea_param(key.view()), fence, RecordStatus::committed);
  }

  // Sends the fenced update after the business write and commits, or rolls back and says why
  // the fence no longer held.
  CommitStatus finish(Lease& c, pqxx::work& tx, const std::string& update, const Key& key,
                      std::int64_t fence) {
    if (pq::affected_rows(s_.checked(tx, update, key)) == 0) {
      tx.abort();
      pqxx::nontransaction check(c.connection());
      return s_.settled_earlier(c, check, gate_, pq::bytea_param(key.view()), fence,
                                RecordStatus::committed);
    }
    tx.commit();
    return CommitStatus::committed;
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
