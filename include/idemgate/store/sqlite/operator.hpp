// SPDX-License-Identifier: MIT
// SqliteStore's operator's queue and history: the manual queue, re-drives, rows by filter, causes
// and gates.
#pragma once

#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/row.hpp"
#include "../log/text.hpp"
#include "options.hpp"
#include "session.hpp"
#include "sql/operator.hpp"
#include "transaction.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail::sqlite {

/// What an operator sees and does: the manual queue and its resolution, re-drives of failed
/// events, rows listed and counted by filters, failures grouped by cause, the gates of the log.
class OperatorQueue {
 public:
  /// On the handle's scope.
  explicit OperatorQueue(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `SqliteStore::escalated`.
  std::vector<Record> escalated(std::size_t limit) {
    return records(sql::sqlite::escalated, "listing escalated rows", sql_limit(limit));
  }

  /// See `SqliteStore::resolve`.
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    return s_.run("resolving", &key, [&] {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      std::int64_t fence = 0;
      {
        auto& update = s_.statement(sql::sqlite::resolve);
        ResetGuard guard(update);
        update.bind("resolving", gate_, key, SqliteBlob{result}, now);
        if (!update.step("resolving")) {
          update.reset();
          s_.rollback();
          return false;
        }
        fence = update.int64(0);
      }
      const CommitItem row{key, fence, {}};
      s_.run_business(gate_, std::span<const CommitItem>(&row, 1), now, business);
      s_.end_confirmed("resolution", key);
      return true;
    });
  }

  /// See `SqliteStore::redrive_failed`.
  std::size_t redrive_failed(const Key& key) {
    return changed(sql::sqlite::redrive_key, "re-driving a failed row", &key, key, ended_lease);
  }

  /// See `SqliteStore::redrive_failed`.
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    return changed(sql::sqlite::redrive_range, "re-driving failed rows", nullptr, to_micros(from),
                   to_micros(to), sql_limit(limit), ended_lease);
  }

  /// See `SqliteStore::redrive_cause`.
  std::size_t redrive_cause(std::string_view reason, std::size_t limit) {
    return changed(sql::sqlite::redrive_cause, "re-driving a cause", nullptr,
                   detail::stored_text(reason), sql_limit(limit), ended_lease);
  }

  /// See `SqliteStore::rows`.
  std::vector<Record> rows(const RowQuery& asked) {
    const RowQuery query = detail::stored_query(asked);
    return s_.run("listing rows", nullptr, [&] {
      auto& list = s_.statement(sql::sqlite::rows);
      ResetGuard guard(list);
      bind_query(list, "listing rows", query);
      std::vector<Record> found;
      while (list.step("listing rows")) found.push_back(to_record(Row{list}));
      return found;
    });
  }

  /// See `SqliteStore::count`.
  std::int64_t count(const RowQuery& asked) {
    const RowQuery query = detail::stored_query(asked);
    return s_.run("counting rows", nullptr, [&] {
      auto& read = s_.statement(sql::sqlite::count);
      ResetGuard guard(read);
      bind_query(read, "counting rows", query);
      return read.step("counting rows") ? read.int64(0) : std::int64_t{0};
    });
  }

  /// See `SqliteStore::causes`.
  std::vector<Cause> causes(std::size_t limit) {
    return s_.run("grouping failures", nullptr, [&] {
      auto& list = s_.statement(sql::sqlite::causes);
      ResetGuard guard(list);
      list.bind("grouping failures", gate_, sql_limit(limit));
      std::vector<Cause> found;
      while (list.step("grouping failures"))
        found.push_back({parse_record_status(list.bytes(0)), list.bytes(1), list.int64(2),
                         from_micros(list.int64(3)), from_micros(list.int64(4))});
      return found;
    });
  }

  /// See `SqliteStore::gates`.
  std::vector<std::string> gates() {
    return s_.run("listing gates", nullptr, [&] {
      auto& list = s_.statement(sql::sqlite::gates);
      ResetGuard guard(list);
      list.bind("listing gates", gate_);
      std::vector<std::string> names;
      while (list.step("listing gates")) names.push_back(list.bytes(0));
      return names;
    });
  }

 private:
  // Runs a re-drive in its own write transaction, with "now" as its last parameter; answers
  // how many rows it changed.
  template <class... Args>
  std::size_t changed(const sql::Statement& statement, const char* doing, const Key* key,
                      const Args&... args) {
    return s_.run(doing, key, [&] {
      s_.begin();
      const std::int64_t n = s_.change(statement, doing, gate_, args..., s_.now_micros());
      s_.end(doing);
      return static_cast<std::size_t>(n);
    });
  }

  template <class... Args>
  std::vector<Record> records(const sql::Statement& statement, const char* doing,
                              const Args&... args) {
    return s_.run(doing, nullptr, [&] {
      auto& list = s_.statement(statement);
      ResetGuard guard(list);
      list.bind(doing, gate_, args...);
      std::vector<Record> found;
      while (list.step(doing)) found.push_back(to_record(Row{list}));
      return found;
    });
  }

  // Binds an operator's query to `rows` or `count` (parameters ?2 to ?7 after the gate).
  void bind_query(Statement& read, std::string_view doing, const RowQuery& query) {
    const auto micros = [](const std::optional<std::chrono::system_clock::time_point>& at) {
      return at ? std::optional<std::int64_t>(to_micros(*at)) : std::nullopt;
    };
    read.bind(
        doing, gate_,
        query.status ? std::optional<std::string_view>(to_string(*query.status)) : std::nullopt,
        query.reason, query.label_contains, micros(query.changed_from), micros(query.changed_to),
        sql_limit(query.limit));
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::sqlite
