// SPDX-License-Identifier: MIT
// SqliteStore's retention and signals: the health signals, the mismatches, and the purge of
// finished rows.
#pragma once

#include "../../errors.hpp"
#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/row.hpp"
#include "../log/text.hpp"
#include "options.hpp"
#include "session.hpp"
#include "sql/monitoring.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail::sqlite {

/// What keeps a gate's log watched and small: its signals (with the WAL's size), the downstream
/// answers that differed from the stored one, and retention.
class Monitoring {
 public:
  /// On the handle's scope.
  explicit Monitoring(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `SqliteStore::signals`.
  StoreSignals signals(std::chrono::seconds window) {
    return s_.run("reading the signals", nullptr, [&] {
      const std::int64_t now = s_.now_micros();
      auto& read = s_.statement(sql::sqlite::signals);
      ResetGuard guard(read);
      read.bind("reading the signals", gate_, earlier(now, window));
      if (!read.step("reading the signals"))
        throw StoreError("idemgate: the signals query of " + s_.table() + " returned no row");
      // The oldest in-flight row comes as its creation instant in microseconds.
      StoreSignals s = signals_from(Row{read}, window, [now](std::int64_t created) {
        return std::chrono::duration_cast<std::chrono::seconds>(
            std::chrono::microseconds(now - created));
      });
      s.wal_bytes = s_.wal_bytes();
      return s;
    });
  }

  /// See `SqliteStore::record_mismatch`.
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    std::string buffer;
    const std::string_view stored_source = detail::stored_view(source, buffer);
    s_.run("recording a mismatch", &key, [&] {
      s_.begin();
      s_.change(sql::sqlite::record_mismatch, "recording a mismatch", gate_, key,
                SqliteBlob{stored}, SqliteBlob{observed}, stored_source, s_.now_micros());
      s_.end("recording a mismatch");
      return 0;
    });
  }

  /// See `SqliteStore::mismatches`.
  std::vector<Mismatch> mismatches(std::size_t limit) {
    return s_.run("listing mismatches", nullptr, [&] {
      auto& list = s_.statement(sql::sqlite::mismatches);
      ResetGuard guard(list);
      list.bind("listing mismatches", gate_, sql_limit(limit));
      std::vector<Mismatch> found;
      while (list.step("listing mismatches"))
        found.push_back({key_from(list.bytes(0)), list.bytes(1), list.bytes(2), list.bytes(3),
                         from_micros(list.int64(4))});
      return found;
    });
  }

  /// See `SqliteStore::purge`.
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    return delete_in_batches("purging finished rows", batch, [&](std::int64_t now) {
      return s_.change(sql::sqlite::purge, "purging finished rows", gate_, earlier(now, older_than),
                       sql_limit(batch));
    });
  }

  /// See `SqliteStore::purge_abandoned`.
  std::size_t purge_abandoned(std::chrono::seconds older_than, std::size_t batch) {
    return delete_in_batches("purging abandoned attempts", batch, [&](std::int64_t now) {
      return s_.change(sql::sqlite::purge_abandoned, "purging abandoned attempts", gate_,
                       earlier(now, older_than), now, sql_limit(batch));
    });
  }

  /// See `SqliteStore::expire`.
  bool expire(const Key& key, std::chrono::seconds lifetime) {
    return s_.run("expiring a key", nullptr, [&] {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      const std::int64_t changed =
          s_.change(sql::sqlite::expire, "expiring a key", gate_, key, earlier(now, lifetime), now);
      s_.end("expiring a key");
      return changed > 0;
    });
  }

 private:
  // Runs `remove(now)`, one batch's delete as of `now` (µs), each in a write transaction of its
  // own so that workers reserve between batches, until a batch deletes fewer than `batch` rows.
  template <class Remove>
  std::size_t delete_in_batches(const char* doing, std::size_t batch, Remove remove) {
    std::size_t deleted = 0;
    if (batch == 0) return deleted;
    for (;;) {
      const std::int64_t n = s_.run(doing, nullptr, [&] {
        s_.begin();
        const std::int64_t changed = remove(s_.now_micros());
        s_.end(doing);
        return changed;
      });
      deleted += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < batch) return deleted;
    }
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::sqlite
