#pragma once

// What the SQLite store's tests share: temp directories, connections of their own (like another
// program's), a store on a fresh file with a bookings table, and the booking business write.

#include "slot_request.hpp"

#include <idemgate/store/sqlite.hpp>

#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace idemgate::test::sqlite {

namespace sq = idemgate::detail::sqlite;
using idemgate::Key;
using idemgate::Reservation;
using idemgate::SqliteOptions;
using idemgate::SqliteStore;
using idemgate::SqliteTransaction;
using namespace std::chrono_literals;

/// A fresh temp directory, removed with everything in it; in memory (/dev/shm, where the system
/// has it) when the test is about interleavings, not about the disk's fsync.
class TempDir {
 public:
  /// Where the directory lives.
  enum class Where { disk, memory };

  explicit TempDir(Where where = Where::disk) {
    const std::filesystem::path base =
        where == Where::memory && std::filesystem::is_directory("/dev/shm")
            ? std::filesystem::path("/dev/shm")
            : std::filesystem::temp_directory_path();
    std::string pattern = (base / "idemgate-sqlite-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// A plain connection of its own, like another program's.
inline sq::Connection open_raw(const std::string& path) {
  sqlite3* raw = nullptr;
  const int code = sqlite3_open(path.c_str(), &raw);
  sq::Connection connection(raw);
  if (code != SQLITE_OK) throw std::runtime_error("cannot open " + path);
  sqlite3_busy_timeout(raw, 20000);
  return connection;
}

inline std::int64_t count(const std::string& path, const std::string& sql) {
  auto db = open_raw(path);
  return sq::query_int(db.get(), sql).value_or(-1);
}

inline std::string text(sqlite3* db, const std::string& sql) {
  sq::Statement statement(db, sql, "reading");
  statement.bind("reading");
  return statement.step("reading") ? statement.bytes(0) : std::string();
}

inline const auto fingerprint = idemgate::detail::sha256("request");

inline Reservation reserve(SqliteStore& store, const Key& key,
                           std::chrono::milliseconds lease = 1min) {
  return store.reserve(key, fingerprint, "request", lease);
}

/// A store on a fresh file with the bookings table beside the log.
struct Fixture {
  TempDir dir;
  std::string db = dir.file("idemgate.db");
  SqliteStore store{db, SqliteOptions{.busy_timeout = 20s}};
  Fixture() {
    store.migrate();
    auto raw = open_raw(db);
    sq::exec(raw.get(),
             "CREATE TABLE bookings (id INTEGER PRIMARY KEY, container TEXT NOT NULL, slot TEXT "
             "NOT NULL, source_event BLOB NOT NULL)");
  }
};

/// The business write: one booking per event, tagged with its key. A lambda, not a function:
/// for a function pointer, Gate's constructor parameter `apply` shadows `Gate::apply`.
inline const auto book = [](SqliteTransaction& tx, const Key& key, const SlotRequest& r,
                            const std::string& slot) {
  tx.exec("INSERT INTO bookings (container, slot, source_event) VALUES (?, ?, ?)", r.container,
          slot, key);
};

/// The row's status as another connection sees it: what really committed.
inline std::string committed_status(const std::string& path, const Key& key) {
  auto db = open_raw(path);
  sq::Statement read(db.get(), "SELECT status FROM idemgate_log WHERE key = ?", "reading");
  read.bind("reading", key);
  return read.step("reading") ? read.bytes(0) : std::string("(no row)");
}

/// The size of a file; 0 when it does not exist.
inline std::int64_t file_bytes(const std::string& path) {
  std::error_code missing;
  const auto size = std::filesystem::file_size(path, missing);
  return missing ? 0 : static_cast<std::int64_t>(size);
}

}  // namespace idemgate::test::sqlite
