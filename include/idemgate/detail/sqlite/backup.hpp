// SPDX-License-Identifier: MIT
// Copying, locking and restoring SQLite database files, for SqliteStore.
#pragma once

#include "../../errors.hpp"
#include "../durations.hpp"
#include "statement.hpp"

#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

namespace idemgate::detail::sqlite {

/// Writes a consistent copy of `source`'s main database to `destination` with SQLite's backup
/// API: first to `<destination>.partial`, then renamed over `destination`.
inline void copy_database(sqlite3* source, const std::string& destination) {
  const std::string partial = destination + ".partial";
  std::error_code ignored;
  std::filesystem::remove(partial, ignored);
  {
    Connection copy = open_connection(partial, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                                      "opening the copy " + partial);
    sqlite3_backup* backup = sqlite3_backup_init(copy.get(), "main", source, "main");
    if (backup == nullptr) raise(copy.get(), sqlite3_extended_errcode(copy.get()), "copying");
    // One step copies every page under one read transaction: a consistent snapshot, while
    // writers in other connections go on.
    const int stepped = sqlite3_backup_step(backup, -1);
    const int finished = sqlite3_backup_finish(backup);
    if (stepped != SQLITE_DONE || finished != SQLITE_OK) {
      const int code = finished != SQLITE_OK ? sqlite3_extended_errcode(copy.get()) : stepped;
      const std::string message = message_of(copy.get(), code);
      copy.reset();
      std::filesystem::remove(partial, ignored);
      throw Error(code, "idemgate: SQLite failed while copying the database to " + destination +
                            ": " + message + ". " + advice(code, message));
    }
  }
  std::error_code renamed;
  std::filesystem::rename(partial, destination, renamed);
  if (renamed)
    throw StoreError("idemgate: cannot move the finished copy " + partial + " to " + destination +
                     ": " + renamed.message() +
                     ". Check that this process may write the directory.");
}

/// Holds an exclusive lock on a database file through SQLite's own file layer, so that no other
/// connection (in this process or another) can be using the file meanwhile.
class ExclusiveFile {
 public:
  /// Locks the file at `path`; false from `locked()` when a connection has it open.
  explicit ExclusiveFile(const std::string& path)
      : connection_(open_connection(path, SQLITE_OPEN_READWRITE, "opening " + path)) {
    sqlite3_file_control(connection_.get(), "main", SQLITE_FCNTL_FILE_POINTER, &file_);
    if (file_ == nullptr || file_->pMethods == nullptr) return;
    // A connection in WAL mode holds a shared lock on the database file as long as it is open,
    // so an exclusive lock is granted only when nobody else has it open.
    if (file_->pMethods->xLock(file_, SQLITE_LOCK_SHARED) != SQLITE_OK) return;
    shared_ = true;
    locked_ = file_->pMethods->xLock(file_, SQLITE_LOCK_EXCLUSIVE) == SQLITE_OK;
  }
  ExclusiveFile(const ExclusiveFile&) = delete;
  ExclusiveFile& operator=(const ExclusiveFile&) = delete;
  ~ExclusiveFile() {
    if (shared_) file_->pMethods->xUnlock(file_, SQLITE_LOCK_NONE);
  }
  /// Whether the lock is held.
  [[nodiscard]] bool locked() const noexcept { return locked_; }

 private:
  Connection connection_;
  sqlite3_file* file_ = nullptr;
  bool shared_ = false;
  bool locked_ = false;
};

/// Replaces the database at `target` with a copy of `backup` (see `SqliteStore::restore_from`).
inline void restore(const std::string& backup, const std::string& target) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(backup, error))
    throw StoreError("idemgate: there is no backup at " + backup +
                     "; pass the path of a file written by SqliteStore::backup_to. Nothing was "
                     "changed.");
  if (fs::exists(target, error) && fs::equivalent(backup, target, error))
    throw std::invalid_argument("idemgate: the backup and the target are the same file (" + target +
                                "); restore from a copy kept elsewhere");
  Connection source = open_connection(backup, SQLITE_OPEN_READONLY, "opening the backup " + backup);
  std::string verdict;
  {
    Statement check(source.get(), "PRAGMA quick_check", "checking the backup " + backup);
    check.bind("checking the backup " + backup);
    while (check.step("checking the backup " + backup)) {
      if (!verdict.empty()) verdict += "; ";
      verdict += check.bytes(0);
    }
  }
  if (verdict != "ok")
    throw StoreError("idemgate: the backup at " + backup + " is damaged (" + verdict +
                     "); restore from an older backup. Nothing was changed.");
  std::optional<ExclusiveFile> exclusive;
  if (fs::exists(target, error)) {
    exclusive.emplace(target);
    if (!exclusive->locked())
      throw StoreError("idemgate: cannot restore " + target +
                       ": a connection, in this process or another, has it open. Stop every "
                       "process that uses it (and close this process's stores on it), then "
                       "restore again. Nothing was changed.");
  }
  // A -wal or -shm left by the instance that used the damaged file belongs to it, not to the
  // backup: SQLite would replay that WAL onto the restored file. Keep them aside for inspection.
  const std::string stale =
      ".stale-" +
      std::to_string(saturating_micros(std::chrono::system_clock::now().time_since_epoch()));
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {
    const std::string file = target + suffix;
    if (!fs::exists(file, error)) continue;
    fs::rename(file, file + stale, error);
    if (error)
      throw StoreError("idemgate: cannot move " + file + " aside before restoring " + target +
                       ": " + error.message() +
                       ". Check that this process may write the directory; the target was not "
                       "changed.");
  }
  copy_database(source.get(), target);
}

}  // namespace idemgate::detail::sqlite
