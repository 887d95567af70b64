// SPDX-License-Identifier: MIT
// The graceful_stop example's parts, shared with its test: the events, the slow slot API and the
// business write.
#pragma once

#include <idemgate/idemgate.hpp>
#include <idemgate/store/sqlite.hpp>

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

namespace graceful_stop {

/// The container of event `n` of the feed.
inline std::string container_of(int n) {
  std::string digits = std::to_string(n);
  return "MSKU" + std::string(7 - std::min<std::size_t>(7, digits.size()), '0') + digits;
}

/// The key of event `n`: from what the upstream controls, never the delivery.
inline idemgate::Key key_of(int n) {
  return idemgate::derive_key("graceful_stop.claim", std::to_string(n));
}

/// A slot API whose every call takes `delay`; it honours Idempotency-Key, so a claim repeated
/// under the same key (a redelivery after a stop) gets the slot of the first one.
struct SlowTerminal {
  using request_type = std::string;  // the container
  using outcome_type = std::string;  // the slot
  static constexpr bool honours_idempotency_key = true;
  std::chrono::milliseconds delay{0};

  idemgate::ClaimResult<std::string> claim(const std::string& container, const idemgate::Key& key) {
    std::printf("calling %s\n", container.c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(delay);
    return "slot-" + key.hex().substr(0, 8);
  }
};

/// Creates the log and the bookings table beside it.
inline void prepare(idemgate::SqliteStore& store, const std::string& path) {
  store.migrate();
  sqlite3* db = nullptr;
  const bool ok =
      sqlite3_open(path.c_str(), &db) == SQLITE_OK &&
      sqlite3_exec(db,
                   "CREATE TABLE IF NOT EXISTS bookings (container TEXT NOT NULL, slot TEXT NOT "
                   "NULL)",
                   nullptr, nullptr, nullptr) == SQLITE_OK;
  sqlite3_close(db);
  if (!ok) throw std::runtime_error("cannot create the bookings table in " + path);
}

/// The business write: one booking per event, in the log's transaction.
inline const auto book = [](idemgate::SqliteTransaction& tx, const std::string& container,
                            const std::string& slot) {
  tx.exec("INSERT INTO bookings (container, slot) VALUES (?, ?)", container, slot);
};

}  // namespace graceful_stop
