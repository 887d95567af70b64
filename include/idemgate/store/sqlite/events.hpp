// SPDX-License-Identifier: MIT
// SqliteStore's per-event path: reserve, commit, fail, escalate, release, find.
#pragma once

#include "../../errors.hpp"
#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/protocol.hpp"
#include "../log/row.hpp"
#include "../log/text.hpp"
#include "options.hpp"
#include "session.hpp"
#include "sql/events.hpp"
#include "transaction.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace idemgate::detail::sqlite {

/// One event's way through the log: its reservation, its commit with the business write, or its
/// failure, escalation or release; and its row. Every write is one `BEGIN IMMEDIATE` transaction.
class EventPath {
 public:
  /// On the handle's scope.
  explicit EventPath(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `SqliteStore::reserve`.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease, std::string_view label) {
    return s_.run("reserving a key", &key, [&]() -> Reservation {
      s_.begin();
      // Read after the write lock is held: time spent waiting must not shorten the lease.
      Reservation reservation =
          reserve_row(key, fingerprint, request, s_.now_micros(), lease, label);
      s_.end("reserving a key");
      return reservation;
    });
  }

  /// The body of `reserve` inside an open write transaction, at `now`.
  Reservation reserve_row(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                          std::int64_t now, std::chrono::milliseconds lease,
                          std::string_view label) {
    const SqliteBlob fingerprint_blob{
        {reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()}};
    const std::int64_t until = later(now, lease);
    std::string label_buffer;
    label = detail::stored_view(label, label_buffer);
    if (!gate_.empty()) (void)s_.change(sql::sqlite::adopt_key, "reserving a key", gate_, key);
    if (s_.change(sql::sqlite::reserve, "reserving a key", gate_, key, until, fingerprint_blob,
                  SqliteBlob{request}, now, label) == 1)
      return Reservation::acquired(1);
    Reservation found;
    bool take_over = false;
    {
      // The key exists (the write lock is held since BEGIN): count the duplicate, read the row.
      auto& met_row = s_.statement(sql::sqlite::duplicate);
      ResetGuard guard(met_row);
      met_row.bind("reserving a key", gate_, key);
      if (!met_row.step("reserving a key"))
        throw StoreError("idemgate: the reservation of key " + key.hex() + " in " + s_.table() +
                         " neither inserted nor found its row; check the table's PRIMARY KEY "
                         "(compare it with SqliteStore::schema_sql())");
      const std::string stored_fingerprint = met_row.bytes(2);
      const bool same =
          stored_fingerprint.size() == fingerprint.size() &&
          std::memcmp(stored_fingerprint.data(), fingerprint.data(), fingerprint.size()) == 0;
      found = Reservation::existing(met_row.int64(0), parse_record_status(met_row.bytes(1)), same,
                                    met_row.bytes(4), met_row.bytes(5));
      found.held = held(found.status, met_row.int64(3) >= now, met_row.int64(6) != 0);
      // One transaction reserves: it never meets a row of its own.
      take_over = met(found.status, same, met_row.int64(3) >= now, false) == Met::expired;
    }
    if (take_over) {
      auto& take = s_.statement(sql::sqlite::take_over);
      ResetGuard guard(take);
      take.bind("taking over a lease", gate_, key, found.fence, until, now);
      if (take.step("taking over a lease")) return Reservation::taken_over(take.int64(0));
    }
    // The duplicate counted above is kept.
    return found;
  }

  /// See `SqliteStore::commit`.
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    return s_.run("committing", &key, [&] {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      if (s_.change(sql::sqlite::commit, "committing", gate_, key, fence, SqliteBlob{result},
                    now) == 0)
        return missed(key, fence, RecordStatus::committed);
      const CommitItem row{key, fence, {}};
      s_.run_business(gate_, std::span<const CommitItem>(&row, 1), now, business);
      s_.end_confirmed("commit", key);
      return CommitStatus::committed;
    });
  }

  /// See `SqliteStore::commit_computed`.
  template <class Produce>
  CommitStatus commit_computed(const Key& key, std::int64_t fence, Produce&& produce) {
    return s_.run("committing", &key, [&] {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      if (s_.change(sql::sqlite::commit, "committing", gate_, key, fence,
                    SqliteBlob{std::string_view()}, now) == 0)
        return missed(key, fence, RecordStatus::committed);
      std::string result;
      auto write = [&](SqliteTransaction& tx) { result = produce(tx); };
      const CommitItem row{key, fence, {}};
      s_.run_business(gate_, std::span<const CommitItem>(&row, 1), now, write);
      s_.change(sql::sqlite::set_result, "committing", gate_, key, fence,
                SqliteBlob{std::string_view(result)});
      s_.end_confirmed("commit", key);
      return CommitStatus::committed;
    });
  }

  /// See `SqliteStore::commit_once`.
  template <class Produce>
  OnceResult commit_once(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                         std::string_view label, Produce&& produce) {
    return s_.run("committing", &key, [&]() -> OnceResult {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      // The row is never seen in flight: it commits settled, or not at all.
      const Reservation held =
          reserve_row(key, fingerprint, request, now, std::chrono::milliseconds(0), label);
      if (held.kind == Reservation::Kind::existing) {
        s_.end("reserving a key");  // the duplicate it counted
        return OnceResult::existing(held);
      }
      if (s_.change(sql::sqlite::commit, "committing", gate_, key, held.fence,
                    SqliteBlob{std::string_view()}, now) == 0)
        throw StoreError("idemgate: the row of key " + key.hex() + " in " + s_.table() +
                         " changed inside this transaction; nothing was written. Do not ack.");
      std::string result;
      auto write = [&](SqliteTransaction& tx) { result = produce(tx); };
      const CommitItem row{key, held.fence, {}};
      s_.run_business(gate_, std::span<const CommitItem>(&row, 1), now, write);
      s_.change(sql::sqlite::set_result, "committing", gate_, key, held.fence,
                SqliteBlob{std::string_view(result)});
      s_.end_confirmed("commit", key);
      return OnceResult::committed(std::move(result), held.kind == Reservation::Kind::taken_over);
    });
  }

  /// See `SqliteStore::fail` and `SqliteStore::escalate`: stores `target` with `reason`, only
  /// if `fence` still holds (`committed` also when this fence already stored it).
  CommitStatus settle(const sql::Statement& statement, const char* doing, const Key& key,
                      std::int64_t fence, std::string_view reason, RecordStatus target) {
    std::string buffer;
    const std::string_view stored = detail::stored_view(reason, buffer);
    return s_.run(doing, &key, [&] {
      s_.begin();
      if (s_.change(statement, doing, gate_, key, fence, stored, s_.now_micros()) == 0)
        return missed(key, fence, target);
      s_.end(doing);
      return CommitStatus::committed;
    });
  }

  /// See `SqliteStore::release`.
  bool release(const Key& key, std::int64_t fence, std::string_view reason,
               std::chrono::milliseconds hold = std::chrono::milliseconds(0)) {
    const std::string stored = detail::held_reason(reason, hold);
    return s_.run("releasing a key", &key, [&] {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      const std::int64_t until = hold.count() > 0 ? later(now, hold) : ended_lease;
      const bool released = s_.change(sql::sqlite::release, "releasing a key", gate_, key, fence,
                                      until, now, stored) > 0;
      s_.end("releasing a key");
      return released;
    });
  }

  /// See `SqliteStore::find`.
  std::optional<Record> find(const Key& key) {
    return s_.run("reading a key", &key, [&]() -> std::optional<Record> {
      auto& read = s_.statement(sql::sqlite::find);
      ResetGuard guard(read);
      read.bind("reading a key", gate_, key);
      if (!read.step("reading a key")) return std::nullopt;
      return to_record(Row{read});
    });
  }

 private:
  // A fenced write that touched no row: rolled back, and answered from the row as it stands.
  CommitStatus missed(const Key& key, std::int64_t fence, RecordStatus target) {
    const CommitStatus earlier = s_.settled_earlier(gate_, key, fence, target);
    s_.rollback();
    return earlier;
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::sqlite
