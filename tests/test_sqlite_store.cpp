// SqliteStore on its own: several processes on one file, WAL, bad files, locks, the
// transaction handle, business writes that break their transaction, backup and restore. The
// behaviours every store shares are in test_conformance_sqlite.cpp.

#include "support/child_process.hpp"
#include "support/fake_terminal.hpp"
#include "support/monday.hpp"
#include "support/slot_request.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/prometheus.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <latch>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using idemgate::CommitStatus;
using idemgate::Gate;
using idemgate::Key;
using idemgate::RecordStatus;
using idemgate::Reservation;
using idemgate::SqliteOptions;
using idemgate::SqliteStore;
using idemgate::SqliteTransaction;
using idemgate::StoreError;
using idemgate::StoreSignals;
using idemgate::test::SlotRequest;
using namespace idemgate::test::sqlite;

namespace {

/// The detail lines of SQLite's plan for `sql` (its parameters unbound, so NULL).
std::vector<std::string> plan(sqlite3* db, const std::string& sql) {
  sq::Statement statement(db, "EXPLAIN QUERY PLAN " + sql, "explaining");
  statement.bind("explaining");
  std::vector<std::string> lines;
  while (statement.step("explaining")) lines.push_back(statement.bytes(3));
  return lines;
}

/// Whether a plan reads `table` row by row from start to end (no index narrows it).
bool scans_whole(const std::vector<std::string>& lines, const std::string& table) {
  for (const std::string& line : lines)
    if (line == "SCAN " + table) return true;
  return false;
}

/// Transactions committed to a WAL file since its last reset: frames whose header carries the
/// WAL's salts and a non-zero database size (what marks a commit frame).
int wal_commits(const std::string& wal_path) {
  std::ifstream in(wal_path, std::ios::binary);
  const std::string wal{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto u32 = [&](std::size_t at) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(wal[at])) << 24 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(wal[at + 1])) << 16 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(wal[at + 2])) << 8 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(wal[at + 3]));
  };
  if (wal.size() < 32) return 0;
  const std::size_t frame = 24 + u32(8);
  int commits = 0;
  for (std::size_t at = 32; at + frame <= wal.size(); at += frame) {
    if (u32(at + 8) != u32(16) || u32(at + 12) != u32(20)) break;
    if (u32(at + 4) != 0) ++commits;
  }
  return commits;
}

/// A slot API shared by processes: every claim is logged in its own SQLite file, and the same
/// key always gets the same slot (it honours idempotency keys).
class SharedTerminal {
 public:
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  explicit SharedTerminal(const std::string& path) : db_(open_raw(path)) {}

  static void create(const std::string& path) {
    auto db = open_raw(path);
    sq::exec(db.get(), "PRAGMA journal_mode=WAL");
    sq::exec(db.get(), "CREATE TABLE calls (id INTEGER PRIMARY KEY, key BLOB NOT NULL)");
  }

  idemgate::ClaimResult<std::string> claim(const SlotRequest& request, const Key& key) {
    // One write transaction per call: processes queue for the lock instead of failing.
    sq::exec(db_.get(), "BEGIN IMMEDIATE");
    sq::exec(db_.get(), "INSERT INTO calls (key) VALUES (?)", key);
    sq::exec(db_.get(), "COMMIT");
    return "slot-" + request.container;
  }

 private:
  sq::Connection db_;
};

}  // namespace

TEST(SqliteStore, DatabaseIsInWalModeAndSyncsEveryCommit) {
  Fixture f;
  auto raw = open_raw(f.db);
  EXPECT_EQ(text(raw.get(), "PRAGMA journal_mode"), "wal");
  EXPECT_TRUE(std::filesystem::exists(f.db + "-wal"));
  EXPECT_EQ(f.store.busy_timeout(), 20s);
  EXPECT_EQ(f.store.path(), f.db);
  EXPECT_EQ(f.store.table(), "idemgate_log");
}

TEST(SqliteStore, SeveralProcessesOnOneFileClaimAndBookEachEventOnce) {
  Fixture f;
  const std::string terminal_db = f.dir.file("terminal.db");
  SharedTerminal::create(terminal_db);
  const auto codes = idemgate::test::run_in_children(4, [&](int c) {
    SqliteStore store(f.db, {.busy_timeout = 20s});
    SharedTerminal terminal(terminal_db);
    Gate gate{"ect.claim_slot", store, terminal, book};
    int code = 0;
    for (const auto& n : idemgate::test::monday_deliveries(100 + static_cast<unsigned>(c))) {
      const Key key = idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number);
      if (!gate.process(key, SlotRequest{n.equipment_number, n.preferred_window}).should_ack())
        code = 3;
    }
    return code;
  });
  for (const int code : codes)
    EXPECT_EQ(code, 0) << idemgate::test::child_threw
                       << ": a child threw; 3: a delivery was not acked";
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 39);
  EXPECT_EQ(count(f.db, "SELECT count(DISTINCT source_event) FROM bookings"), 39);
  EXPECT_EQ(count(f.db, "SELECT count(DISTINCT container) FROM bookings"), 39);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM idemgate_log WHERE status = 'committed'"), 39);
  EXPECT_EQ(count(f.db,
                  "SELECT count(*) FROM idemgate_log l WHERE NOT EXISTS (SELECT 1 FROM bookings "
                  "b WHERE b.source_event = l.key)"),
            0);
  EXPECT_EQ(count(terminal_db, "SELECT count(*) FROM calls"), 39)
      << "one downstream claim per key across every process";
  EXPECT_EQ(count(terminal_db, "SELECT count(DISTINCT key) FROM calls"), 39);
}

TEST(SqliteStore, SeveralProcessesTakingStaleRowsNeverTakeTheSameRow) {
  Fixture f;
  constexpr int rows = 60;
  for (int i = 0; i < rows; ++i)
    ASSERT_EQ(reserve(f.store, idemgate::derive_key("stale", std::to_string(i)), 1ms).kind,
              Reservation::Kind::acquired);
  std::this_thread::sleep_for(5ms);
  constexpr int children = 4;
  const auto codes = idemgate::test::run_in_children(children, [&](int c) {
    SqliteStore store(f.db, {.busy_timeout = 20s});
    std::ofstream out(f.dir.file("taken-" + std::to_string(c)));
    for (;;) {
      const auto taken = store.take_stale(3, 0s, 1min);
      if (taken.empty()) return 0;
      for (const auto& s : taken) out << s.key.hex() << ' ' << s.fence << '\n';
    }
  });
  for (const int code : codes) EXPECT_EQ(code, 0) << "a child threw";
  std::vector<std::string> keys;
  for (int c = 0; c < children; ++c) {
    std::ifstream in(f.dir.file("taken-" + std::to_string(c)));
    std::string hex;
    std::int64_t fence = 0;
    while (in >> hex >> fence) {
      keys.push_back(hex);
      EXPECT_EQ(fence, 2);
    }
  }
  EXPECT_EQ(keys.size(), static_cast<std::size_t>(rows)) << "each stale row taken exactly once";
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), static_cast<std::size_t>(rows));
}

TEST(SqliteStore, EightStoresOnOneFileReservingOneKeyHaveExactlyOneWinner) {
  Fixture f;
  for (int round = 0; round < 10; ++round) {
    const Key key = idemgate::derive_key("race", std::to_string(round));
    std::barrier start(8);
    std::atomic<int> winners{0}, errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&] {
        try {
          SqliteStore own(f.db, {.busy_timeout = 20s});
          start.arrive_and_wait();
          // Acquired or taken over: either way this store would call the downstream.
          if (reserve(own, key).kind != Reservation::Kind::existing) ++winners;
        } catch (...) {
          ++errors;
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(winners.load(), 1) << "round " << round;
  }
}

TEST(SqliteStore, ForkedWorkersOpeningStoresOfTheirOwnAcquireEachKeyOnce) {
  // A pre-forking consumer: the parent opened the file and reserved before it forked; each child
  // opens a store of its own (after the fork, as it must) and reserves the same keys in the same
  // order. One child acquires each key; the others find it in flight and are counted.
  Fixture f;
  ASSERT_EQ(reserve(f.store, idemgate::derive_key("fork", "parent")).kind,
            Reservation::Kind::acquired);
  constexpr int children = 4, keys = 24, wrong = 50;
  const auto codes = idemgate::test::run_in_children(children, [&](int) {
    SqliteStore own(f.db, {.busy_timeout = 20s});
    int acquired = 0;
    for (int k = 0; k < keys; ++k) {
      const Reservation r = reserve(own, idemgate::derive_key("fork", std::to_string(k)));
      if (r.kind == Reservation::Kind::acquired)
        ++acquired;
      else if (r.kind != Reservation::Kind::existing || r.status != RecordStatus::in_flight ||
               r.fence != 1)
        return wrong;
    }
    return acquired;
  });
  int acquired = 0;
  for (const int code : codes) {
    EXPECT_LE(code, keys) << (code == wrong ? "a reservation neither acquired nor met the key"
                                            : "a child threw");
    if (code <= keys) acquired += code;
  }
  EXPECT_EQ(acquired, keys) << "one child, and only one, acquired each key";
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM idemgate_log WHERE duplicates = " +
                            std::to_string(children - 1)),
            keys)
      << "every other child's reservation of a key counted as a duplicate";
}

TEST(SqliteStore, AWriterInAnotherConnectionIsWaitedForNotReported) {
  Fixture f;
  // The store reads its clock only once it holds the write lock (the lease runs from then), so
  // its clock says when the reservation got the lock.
  std::atomic<bool> released{false};
  std::atomic<int> reads_while_held{0}, reads_after_release{0};
  SqliteStore waiting(f.db, {.busy_timeout = 20s, .clock = [&] {
                               ++(released.load() ? reads_after_release : reads_while_held);
                               return std::chrono::system_clock::now();
                             }});
  auto locker = open_raw(f.db);
  sq::exec(locker.get(), "BEGIN IMMEDIATE");
  const Key key = idemgate::derive_key("wait", "1");
  std::latch calling(1);
  auto reserving = std::async(std::launch::async, [&] {
    calling.count_down();
    return reserve(waiting, key);
  });
  calling.wait();
  // However long the other connection holds the write lock, the reservation neither returns
  // nor writes; the hold's length is not what is checked.
  for (int i = 0; i < 30 && reserving.wait_for(0s) == std::future_status::timeout; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(reserving.wait_for(0s), std::future_status::timeout)
      << "the reservation returned while another connection held the write lock";
  EXPECT_EQ(reads_while_held.load(), 0) << "the reservation went ahead without the write lock";
  EXPECT_FALSE(f.store.find(key).has_value()) << "nothing is written while the lock is held";
  released = true;
  const auto release_time =
      std::chrono::floor<std::chrono::microseconds>(std::chrono::system_clock::now());
  sq::exec(locker.get(), "COMMIT");
  ASSERT_EQ(reserving.wait_for(30s), std::future_status::ready)
      << "the reservation still waits after the lock was released";
  EXPECT_EQ(reserving.get().kind, Reservation::Kind::acquired);
  EXPECT_GE(reads_after_release.load(), 1) << "it took the write lock after the release";
  EXPECT_GE(f.store.find(key)->lease_until, release_time + 1min)
      << "the lease runs from when the lock was released, so the reservation waited for it";
}

TEST(SqliteStore, LockedDatabasePastTheBusyTimeoutIsAClearErrorAndWritesNothing) {
  Fixture f;
  SqliteStore impatient(f.db, {.busy_timeout = 200ms});
  const Key held = idemgate::derive_key("locked", "held");
  const Reservation r = reserve(impatient, held);
  auto locker = open_raw(f.db);
  sq::exec(locker.get(), "BEGIN EXCLUSIVE");
  sq::exec(locker.get(),
           "INSERT INTO bookings (container, slot, source_event) VALUES ('c', 's', x'00')");

  const Key fresh = idemgate::derive_key("locked", "fresh");
  const auto started = std::chrono::steady_clock::now();
  try {
    (void)reserve(impatient, fresh);
    FAIL() << "a reservation past the busy timeout must throw";
  } catch (const StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("busy timeout (200 ms)"), std::string::npos) << message;
    EXPECT_NE(message.find("Do not ack"), std::string::npos) << message;
    EXPECT_NE(message.find("SqliteOptions::busy_timeout"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  bool business_ran = false;
  EXPECT_THROW((void)impatient.commit(held, r.fence, "slot",
                                      [&](SqliteTransaction& tx) {
                                        business_ran = true;
                                        tx.exec(
                                            "INSERT INTO bookings (container, slot, "
                                            "source_event) VALUES ('c', 's', x'01')");
                                      }),
               StoreError);
  EXPECT_FALSE(business_ran) << "the business write never runs without the write lock";
  EXPECT_THROW((void)impatient.take_stale(10, 0s, 1min), StoreError);
  sq::exec(locker.get(), "ROLLBACK");

  EXPECT_FALSE(impatient.find(fresh).has_value()) << "nothing was written";
  EXPECT_EQ(impatient.find(held)->status, RecordStatus::in_flight);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0);
  EXPECT_EQ(impatient.commit(held, r.fence, "slot", [](SqliteTransaction&) {}),
            CommitStatus::committed)
      << "the store works again once the lock is gone";
}

TEST(SqliteStore, FileThatIsNotADatabaseIsAClearErrorAndStaysUntouched) {
  TempDir dir;
  const std::string path = dir.file("garbage.db");
  std::string garbage;
  for (int i = 0; i < 8192; ++i) garbage += static_cast<char>((i * 7919 + 13) % 251);
  std::ofstream(path, std::ios::binary) << garbage;
  try {
    SqliteStore store(path);
    FAIL() << "a file that is not a database must be refused";
  } catch (const StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("not a database"), std::string::npos) << message;
    EXPECT_NE(message.find("restore it from a backup"), std::string::npos) << message;
  }
  std::ifstream in(path, std::ios::binary);
  const std::string after{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(after, garbage) << "the file is left as it was";
}

TEST(SqliteStore, DamagedPagesAreAClearErrorNotAWrongAnswer) {
  TempDir dir;
  const std::string path = dir.file("damaged.db");
  std::vector<Key> keys;
  {
    SqliteStore store(path);
    store.migrate();
    for (int i = 0; i < 300; ++i) {
      keys.push_back(idemgate::derive_key("damaged", std::to_string(i)));
      ASSERT_EQ(reserve(store, keys.back()).kind, Reservation::Kind::acquired);
    }
  }  // the last connection closing checkpoints the WAL into the file
  ASSERT_FALSE(std::filesystem::exists(path + "-wal"));
  {
    // Keep the header and schema page; scribble over every page after them.
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(std::filesystem::file_size(path));
    file.seekp(8192);
    for (std::streamoff at = 8192; at < size; ++at) file.put(static_cast<char>(at * 31 % 256));
  }
  SqliteStore store(path);
  int errors = 0;
  for (const Key& key : keys) {
    try {
      const auto row = store.find(key);
      // Whatever is still readable must be right.
      if (row.has_value()) {
        EXPECT_EQ(row->key, key);
      }
    } catch (const StoreError& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("restore it from a backup"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_GT(errors, 0) << "damage must be reported";
}

TEST(SqliteStore, UnopenablePathIsAClearError) {
  try {
    SqliteStore store("/nonexistent-idemgate-dir/nested/idemgate.db");
    FAIL() << "a path in a missing directory must be refused";
  } catch (const StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cannot open the SQLite database at /nonexistent-idemgate-dir"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("Check that the directory exists"), std::string::npos) << message;
  }
  TempDir dir;
  EXPECT_THROW(SqliteStore(dir.file("")), StoreError) << "a directory is not a database";
}

TEST(SqliteStore, UnusableTableNameIsRefusedBeforeAnythingIsOpened) {
  TempDir dir;
  const std::string path = dir.file("names.db");
  for (const char* bad :
       {"log; DROP TABLE x", "", "main.idemgate_log", "1log", "sqlite_log", "idemgate-log"})
    EXPECT_THROW(SqliteStore(path, {.table = bad}), std::invalid_argument) << bad;
  EXPECT_FALSE(std::filesystem::exists(path)) << "no file was created for a refused name";
  EXPECT_THROW((void)SqliteStore::schema_sql("x y"), std::invalid_argument);
  EXPECT_THROW(SqliteStore(path, {.busy_timeout = -1ms}), std::invalid_argument);
  SqliteStore store(path, {.table = "Ops_Log_2"});
  store.migrate();
  EXPECT_EQ(reserve(store, idemgate::derive_key("n", "1")).kind, Reservation::Kind::acquired);
}

TEST(SqliteStore, MissingTableSaysToMigrate) {
  TempDir dir;
  SqliteStore store(dir.file("empty.db"));
  try {
    (void)store.find(idemgate::derive_key("a", "b"));
    FAIL() << "a missing table must be reported";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("SqliteStore::migrate()"), std::string::npos) << e.what();
  }
}

TEST(SqliteStore, MigrateIsIdempotentAndTheSchemaRefusesMalformedRows) {
  Fixture f;
  f.store.migrate();
  f.store.migrate();
  auto raw = open_raw(f.db);
  EXPECT_EQ(sq::query_int(raw.get(),
                          "SELECT count(*) FROM sqlite_master WHERE name = 'idemgate_log_in_flight'"
                          " AND sql LIKE '%WHERE status = ''in_flight''%'"),
            1);
  const std::string zeros = "x'" + std::string(64, '0') + "'";
  EXPECT_THROW(sq::exec(raw.get(),
                        "INSERT INTO idemgate_log (key, status, lease_until, "
                        "fingerprint, request, created_at, updated_at) VALUES (x'00', "
                        "'in_flight', 0, " +
                            zeros + ", x'', 0, 0)"),
               StoreError)
      << "a key of the wrong length";
  EXPECT_THROW(sq::exec(raw.get(),
                        "INSERT INTO idemgate_log (key, status, lease_until, "
                        "fingerprint, request, created_at, updated_at) VALUES (" +
                            zeros + ", 'done', 0, " + zeros + ", x'', 0, 0)"),
               StoreError)
      << "an unknown status";
  EXPECT_THROW(sq::exec(raw.get(),
                        "INSERT INTO idemgate_log (key, status, lease_until, "
                        "fingerprint, request, created_at, updated_at) VALUES (" +
                            zeros + ", 'committed', 0, " + zeros + ", x'', 0, 0)"),
               StoreError)
      << "a committed row without a result";
  EXPECT_THROW(sq::exec(raw.get(),
                        "INSERT INTO idemgate_log (key, status, lease_until, "
                        "fingerprint, request, created_at, updated_at) VALUES ('" +
                            std::string(32, 'k') + "', 'in_flight', 0, " + zeros + ", x'', 0, 0)"),
               StoreError)
      << "a key stored as text";
  EXPECT_NE(SqliteStore::schema_sql().find("CHECK (status <> 'committed' OR result IS NOT NULL)"),
            std::string::npos);
}

TEST(SqliteStore, MigrateCreatesTheMismatchTableAndTheIndexesTheSignalsAndPurgeUse) {
  Fixture f;
  auto raw = open_raw(f.db);
  for (const char* index : {"idemgate_log_in_flight", "idemgate_log_escalated",
                            "idemgate_log_created", "idemgate_log_mismatches_at"})
    EXPECT_EQ(sq::query_int(raw.get(),
                            "SELECT count(*) FROM sqlite_master WHERE type = 'index' "
                            "AND name = ?",
                            std::string(index)),
              1)
        << index;
  EXPECT_EQ(sq::query_int(raw.get(),
                          "SELECT count(*) FROM sqlite_master WHERE name = 'idemgate_log_escalated'"
                          " AND sql LIKE '%WHERE status = ''escalated''%'"),
            1)
      << "the escalated index holds only escalated rows";
  // The shapes of the store's reads: each is narrowed by an index, never a walk over the log.
  // Every read is one gate's, and every index leads with the gate.
  const std::vector<std::string> reads = {
      "SELECT count(*), sum(duplicates) FROM idemgate_log WHERE gate = ?2 AND created_at >= ?1",
      "SELECT count(*), min(created_at) FROM idemgate_log WHERE gate = ?1 AND status = "
      "'in_flight'",
      "SELECT count(*) FROM idemgate_log WHERE gate = ?1 AND status = 'escalated'",
      "SELECT count(DISTINCT key) FROM idemgate_log_mismatches WHERE gate = ?2 AND at >= ?1",
      "DELETE FROM idemgate_log WHERE gate = ?3 AND key IN (SELECT key FROM idemgate_log WHERE "
      "gate = ?3 AND created_at < ?1 AND status IN ('committed', 'failed') LIMIT ?2)"};
  for (const std::string& sql : reads) {
    const auto lines = plan(raw.get(), sql);
    EXPECT_FALSE(scans_whole(lines, "idemgate_log")) << sql;
    EXPECT_FALSE(scans_whole(lines, "idemgate_log_mismatches")) << sql;
  }
}

TEST(SqliteStore, MigrateUpgradesALogWithoutTheDuplicatesColumn) {
  TempDir dir;
  const std::string path = dir.file("old.db");
  const Key old = idemgate::derive_key("upgrade", "old");
  {
    // The log as the previous version created it, with one committed event.
    auto raw = open_raw(path);
    sq::exec(raw.get(),
             "CREATE TABLE idemgate_log (key BLOB NOT NULL PRIMARY KEY CHECK (typeof(key) = "
             "'blob' AND length(key) = 32), status TEXT NOT NULL CHECK (status IN ('in_flight', "
             "'committed', 'failed', 'escalated')), fence INTEGER NOT NULL DEFAULT 1 CHECK "
             "(fence > 0), lease_until INTEGER NOT NULL, fingerprint BLOB NOT NULL CHECK "
             "(typeof(fingerprint) = 'blob' AND length(fingerprint) = 32), request BLOB NOT "
             "NULL, result BLOB, reason TEXT, created_at INTEGER NOT NULL, updated_at INTEGER "
             "NOT NULL, CHECK (status <> 'committed' OR result IS NOT NULL))");
    sq::exec(raw.get(),
             "CREATE INDEX idemgate_log_in_flight ON idemgate_log (lease_until) WHERE status = "
             "'in_flight'");
    const auto now = sq::to_micros(std::chrono::system_clock::now());
    sq::exec(raw.get(),
             "INSERT INTO idemgate_log (key, status, fence, lease_until, fingerprint, request, "
             "result, created_at, updated_at) VALUES (?, 'committed', 1, ?, ?, 'request', "
             "'slot-1', ?, ?)",
             old, now,
             idemgate::SqliteBlob{std::string_view(
                 reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size())},
             now, now);
  }
  SqliteStore store(path);
  store.migrate();
  store.migrate();
  EXPECT_EQ(store.find(old)->duplicates, 0);
  const Reservation again = reserve(store, old);
  EXPECT_EQ(again.status, RecordStatus::committed);
  EXPECT_EQ(again.result, "slot-1");
  EXPECT_EQ(store.find(old)->duplicates, 1);
  store.record_mismatch(old, "slot-1", "slot-2", "lost_lease");
  const StoreSignals s = store.signals(std::chrono::hours(1));
  EXPECT_EQ(s.events, 2);
  EXPECT_EQ(s.duplicates, 1);
  EXPECT_EQ(s.mismatched_keys, 1);
  EXPECT_EQ(count(path, "SELECT count(*) FROM sqlite_master WHERE name = 'idemgate_log_created'"),
            1);
}

TEST(SqliteStore, OutcomesSurviveClosingAndReopening) {
  TempDir dir;
  const std::string path = dir.file("durable.db");
  const Key key = idemgate::derive_key("durable", "1");
  {
    SqliteStore store(path);
    store.migrate();
    const Reservation r = reserve(store, key);
    ASSERT_EQ(store.commit(key, r.fence, std::string("slot\0bytes", 10), [](auto&) {}),
              CommitStatus::committed);
  }
  SqliteStore reopened(path);
  const Reservation again = reserve(reopened, key);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.status, RecordStatus::committed);
  EXPECT_EQ(again.result, std::string("slot\0bytes", 10)) << "results are bytes, not C strings";
}

TEST(SqliteStore, EmptyRequestsAndResultsAreStoredAsEmptyNotNull) {
  Fixture f;
  const Key key = idemgate::derive_key("empty", "1");
  const Reservation r = f.store.reserve(key, idemgate::detail::sha256(""), "", 1min);
  ASSERT_EQ(r.kind, Reservation::Kind::acquired);
  ASSERT_EQ(f.store.commit(key, r.fence, "", [](auto&) {}), CommitStatus::committed);
  const auto row = f.store.find(key);
  EXPECT_EQ(row->request, "");
  ASSERT_TRUE(row->result.has_value());
  EXPECT_EQ(*row->result, "");
}

TEST(SqliteStore, TransactionExecBindsTextBlobIntegerRealAndNull) {
  Fixture f;
  auto raw = open_raw(f.db);
  sq::exec(raw.get(), "CREATE TABLE kinds (t TEXT, b BLOB, i INTEGER, r REAL, n, o, k BLOB)");
  const Key key = idemgate::derive_key("kinds", "1");
  const Reservation r = reserve(f.store, key);
  std::int64_t changed = 0;
  ASSERT_EQ(f.store.commit(key, r.fence, "slot",
                           [&](SqliteTransaction& tx) {
                             EXPECT_NE(tx.db(), nullptr);
                             const std::optional<std::string> absent;
                             changed =
                                 tx.exec("INSERT INTO kinds VALUES (?, ?, ?, ?, ?, ?, ?)",
                                         std::string_view("text"), idemgate::SqliteBlob{"\x01\x02"},
                                         std::int64_t{1} << 40, 2.5, std::nullopt, absent, key);
                             EXPECT_EQ(tx.query_int("SELECT count(*) FROM kinds WHERE i = ?",
                                                    std::int64_t{1} << 40),
                                       1);
                           }),
            CommitStatus::committed);
  EXPECT_EQ(changed, 1);
  EXPECT_EQ(text(raw.get(),
                 "SELECT typeof(t) || typeof(b) || typeof(i) || typeof(r) || typeof(n) || "
                 "typeof(o) || typeof(k) FROM kinds"),
            "textblobintegerrealnullnullblob");
  EXPECT_EQ(sq::query_int(raw.get(), "SELECT length(k) FROM kinds"), 32);
  EXPECT_EQ(sq::query_int(raw.get(), "SELECT count(*) FROM kinds WHERE k = ?", key), 1);
}

TEST(SqliteStore, BusinessStatementThatFailsRollsTheCommitBack) {
  Fixture f;
  const Key key = idemgate::derive_key("business", "fails");
  const Reservation r = reserve(f.store, key);
  try {
    (void)f.store.commit(key, r.fence, "slot", [&](SqliteTransaction& tx) {
      book(tx, key, SlotRequest{"MSKU1", "w"}, "slot");
      tx.exec("INSERT INTO no_such_table VALUES (1)");
    });
    FAIL() << "a failing business statement must throw";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_table"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.store.find(key)->status, RecordStatus::in_flight);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0);
  EXPECT_THROW((void)f.store.commit(key, r.fence, "slot",
                                    [](SqliteTransaction& tx) {
                                      tx.exec(
                                          "INSERT INTO bookings VALUES (1, 'a', 'b', x'00'); "
                                          "DELETE FROM bookings");
                                    }),
               std::invalid_argument)
      << "exec runs one statement";
  EXPECT_EQ(f.store.find(key)->status, RecordStatus::in_flight);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0);
}

// The exceptions docs/reference.md lists as leaving process() and process_batch(), on a real
// store: each one means "do not ack", and none of them leaves a committed outcome behind.
TEST(SqliteStore, OnlyTheDocumentedExceptionsLeaveProcessAndNothingIsCommittedWithThem) {
  Fixture f;
  idemgate::test::FakeTerminal<> terminal;
  std::string refuse;  // what the business write throws next: "" nothing, "sql", "plain"
  Gate gate{
      "ect.claim_slot", f.store, terminal,
      [&](SqliteTransaction& tx, const Key& key, const SlotRequest& r, const std::string& slot) {
        if (refuse == "sql") tx.exec("INSERT INTO no_such_table VALUES (1)");
        if (refuse == "plain") throw std::domain_error("the TMS refused the booking");
        book(tx, key, r, slot);
      },
      idemgate::GateOptions{.max_request_bytes = 64}};
  const SlotRequest request{"MSKU1", "w"};

  // RequestError: the request cannot be used; nothing reserved, the downstream not called.
  const Key oversized = idemgate::derive_key("exceptions", "oversized");
  EXPECT_THROW((void)gate.process(oversized, SlotRequest{std::string(100, 'x'), "w"}),
               idemgate::RequestError);
  EXPECT_FALSE(gate.store().find(oversized).has_value());

  // A business write's own exception leaves process() unchanged: an SQL error as StoreError,
  // anything else as what it is. The row stays in flight (its lease ended), nothing booked.
  refuse = "sql";
  const Key sql = idemgate::derive_key("exceptions", "sql");
  EXPECT_THROW((void)gate.process(sql, request), StoreError);
  refuse = "plain";
  const Key plain = idemgate::derive_key("exceptions", "plain");
  EXPECT_THROW((void)gate.process(plain, request), std::domain_error);
  for (const Key& key : {sql, plain}) {
    EXPECT_EQ(committed_status(f.db, key), "in_flight");
  }
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0);

  // In a batch, the same business write costs only its own message: retry, nothing thrown; the
  // request that cannot be used is `failed`.
  const Key batched = idemgate::derive_key("exceptions", "batched");
  const std::vector<idemgate::BatchMessage<SlotRequest>> messages{
      {"m-1", batched, request}, {"m-2", oversized, SlotRequest{std::string(100, 'x'), "w"}}};
  const auto results = gate.process_batch(messages);
  EXPECT_EQ(results.items()[0].result.status(), idemgate::Status::retry);
  EXPECT_EQ(results.items()[1].result.status(), idemgate::Status::failed);
  EXPECT_EQ(results.retry_ids(), std::vector<std::string>{"m-1"});
  refuse.clear();

  // StoreError: the store cannot do its work (here its table is gone). process() and
  // process_batch() throw before the downstream is called; there is no result to ack.
  sq::exec(open_raw(f.db).get(), "DROP TABLE idemgate_log");
  const int calls = terminal.calls();
  const Key unreachable = idemgate::derive_key("exceptions", "unreachable");
  EXPECT_THROW((void)gate.process(unreachable, request), StoreError);
  EXPECT_THROW((void)gate.process_batch(
                   std::vector<idemgate::BatchMessage<SlotRequest>>{{"m-3", unreachable, request}}),
               StoreError);
  EXPECT_EQ(terminal.calls(), calls);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0);
}

TEST(SqliteStore, GateBooksOnceAndAnswersDuplicatesFromTheLog) {
  Fixture f;
  idemgate::test::FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", f.store, terminal, book};
  const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-1", msku.container);
  const auto first = gate.process(key, msku);
  ASSERT_EQ(first.status(), idemgate::Status::processed);
  const auto again = gate.process(key, msku);
  EXPECT_EQ(again.status(), idemgate::Status::duplicate);
  EXPECT_EQ(again.outcome(), first.outcome());
  EXPECT_EQ(terminal.calls(), 1);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 1);
}

TEST(SqliteStore, ReleaseEndsTheLeaseAtTheSmallestTimeAndTheNextDeliveryTakesOver) {
  Fixture f;
  idemgate::test::FakeTerminal<> terminal;
  terminal.ignores_keys = true;  // a claim that got through twice would show as two slots
  int failures = 1;
  terminal.before = [&](const SlotRequest&,
                        const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (failures-- > 0) return idemgate::TransientFailure{"503 from the terminal"};
    return std::nullopt;
  };
  Gate gate{
      "ect.claim_slot", f.store, terminal, book, {.retry_backoff = std::chrono::milliseconds(0)}};
  const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-503", msku.container);
  EXPECT_EQ(gate.process(key, msku).status(), idemgate::Status::retry);
  const auto released = gate.store().find(key);
  ASSERT_TRUE(released.has_value()) << "a released row stays";
  EXPECT_EQ(released->status, RecordStatus::in_flight);
  EXPECT_EQ(released->lease_until, std::chrono::system_clock::time_point::min())
      << "the stored minimum reads back as the earliest time, without overflowing";
  EXPECT_EQ(count(f.db, "SELECT lease_until FROM idemgate_log"),
            std::numeric_limits<std::int64_t>::min());
  const auto next = gate.process(key, msku);
  EXPECT_EQ(next.status(), idemgate::Status::processed);
  EXPECT_TRUE(next.took_over());
  EXPECT_EQ(gate.store().find(key)->fence, 2);
  EXPECT_EQ(gate.process(key, msku).status(), idemgate::Status::duplicate);
  EXPECT_EQ(terminal.calls(), 2) << "the refused claim and the redelivery's";
  EXPECT_EQ(terminal.slots_issued(), 1) << "only the redelivery's claim got through";
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 1);
}

TEST(SqliteStore, ProcessesHammeringOneKeyCountEveryReservationButTheFirstAsADuplicate) {
  Fixture f;
  const Key key = idemgate::derive_key("hammer", "1");
  constexpr int children = 4, per_child = 40;
  const auto codes = idemgate::test::run_in_children(children, [&](int) {
    SqliteStore store(f.db, {.busy_timeout = 20s});
    int acquired = 0;
    for (int i = 0; i < per_child; ++i) {
      const Reservation r = reserve(store, key);
      if (r.kind == Reservation::Kind::acquired)
        ++acquired;
      else if (r.kind != Reservation::Kind::existing || r.fence != 1)
        return 3;
    }
    return acquired <= 1 ? acquired : 3;
  });
  int acquired = 0;
  for (const int code : codes) {
    EXPECT_LE(code, 1) << code << ": " << (code == 3 ? "a wrong reservation" : "a child threw");
    if (code == 1) ++acquired;
  }
  EXPECT_EQ(acquired, 1) << "one process acquired the key";
  EXPECT_EQ(f.store.find(key)->duplicates, children * per_child - 1)
      << "no reservation went uncounted, none was counted twice";
  const StoreSignals s = f.store.signals(std::chrono::hours(1));
  EXPECT_EQ(s.events, children * per_child);
  EXPECT_EQ(s.duplicates, children * per_child - 1);
}

TEST(SqliteStore, PurgeCommitsEachBatchOnItsOwn) {
  Fixture f;
  for (int i = 0; i < 23; ++i) {
    const Key key = idemgate::derive_key("purge", std::to_string(i));
    const Reservation r = reserve(f.store, key);
    ASSERT_EQ(f.store.commit(key, r.fence, "slot", [](SqliteTransaction&) {}),
              CommitStatus::committed);
  }
  const int before = wal_commits(f.db + "-wal");
  ASSERT_GT(before, 23) << "the WAL holds every transaction so far (no checkpoint yet)";
  EXPECT_EQ(f.store.purge(0s, 10), 23u);
  EXPECT_EQ(wal_commits(f.db + "-wal") - before, 3) << "10 + 10 + 3 rows: three transactions";
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM idemgate_log"), 0);
}

TEST(SqliteStore, PurgeMeasuresTheWindowFromWhenTheEventFinished) {
  Fixture f;
  const Key key = idemgate::derive_key("purge window", "1");
  const Reservation r = reserve(f.store, key);
  ASSERT_EQ(f.store.commit(key, r.fence, "slot", [](SqliteTransaction&) {}),
            CommitStatus::committed);
  // Reserved eight days ago, stuck in flight, finished a moment ago: a duplicate may still come.
  const std::int64_t eight_days = std::int64_t{8} * 24 * 3600 * 1000000;
  auto raw = open_raw(f.db);
  sq::exec(raw.get(), "UPDATE idemgate_log SET created_at = created_at - ?", eight_days);
  EXPECT_EQ(f.store.purge(7 * 24h, 10), 0u);
  EXPECT_EQ(reserve(f.store, key).status, RecordStatus::committed) << "still a duplicate";
  sq::exec(raw.get(), "UPDATE idemgate_log SET updated_at = updated_at - ?", eight_days);
  EXPECT_EQ(f.store.purge(7 * 24h, 10), 1u) << "finished eight days ago: past the window";
}

TEST(SqliteStore, PurgeFromAnotherConnectionNeverRemovesAnInFlightRow) {
  Fixture f;
  constexpr int workers = 3, per_worker = 30;
  std::vector<std::vector<Key>> flying(workers), finished(workers);
  std::atomic<bool> done{false};
  std::atomic<std::size_t> purged{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      try {
        SqliteStore own(f.db, {.busy_timeout = 20s});
        for (int i = 0; i < per_worker; ++i) {
          const Key key = idemgate::derive_key("traffic", std::to_string(w), std::to_string(i));
          const Reservation r = reserve(own, key);
          if (i % 3 == 2) {
            flying[w].push_back(key);
            continue;
          }
          if (own.commit(key, r.fence, "slot", [](SqliteTransaction&) {}) !=
              CommitStatus::committed)
            ++errors;
          finished[w].push_back(key);
        }
      } catch (...) {
        ++errors;
      }
    });
  std::thread purger([&] {
    try {
      SqliteStore own(f.db, {.busy_timeout = 20s});
      while (!done.load()) purged += own.purge(0s, 2);
    } catch (...) {
      ++errors;
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  purger.join();
  purged += f.store.purge(0s, 100);
  EXPECT_EQ(errors.load(), 0);
  for (int w = 0; w < workers; ++w) {
    for (const Key& key : flying[w]) EXPECT_EQ(f.store.find(key)->status, RecordStatus::in_flight);
    for (const Key& key : finished[w]) EXPECT_FALSE(f.store.find(key).has_value());
  }
  EXPECT_EQ(purged.load(), static_cast<std::size_t>(workers * per_worker * 2 / 3));
}

// --- the business write cannot commit anything on its own ------------------------------------

namespace {

/// Tables that make SQLite roll a whole transaction back by itself.
void add_rollback_traps(const std::string& path) {
  auto db = open_raw(path);
  sq::exec(db.get(), "CREATE TABLE audit (note TEXT NOT NULL)");
  sq::exec(db.get(),
           "CREATE TRIGGER audit_refuses BEFORE INSERT ON audit WHEN new.note = 'refuse' "
           "BEGIN SELECT RAISE(ROLLBACK, 'audit refused the note'); END");
  sq::exec(db.get(), "CREATE TABLE strict_notes (note TEXT UNIQUE ON CONFLICT ROLLBACK)");
  sq::exec(db.get(), "CREATE TABLE plain_notes (note TEXT UNIQUE)");
  sq::exec(db.get(), "INSERT INTO strict_notes VALUES ('taken')");
  sq::exec(db.get(), "INSERT INTO plain_notes VALUES ('taken')");
}

using Breaker = std::function<void(SqliteTransaction&)>;

/// Statements after whose error SQLite has rolled the whole transaction back.
std::vector<std::pair<std::string, Breaker>> rollback_breakers() {
  return {
      {"RAISE(ROLLBACK)",
       [](SqliteTransaction& tx) { tx.exec("INSERT INTO audit VALUES ('refuse')"); }},
      {"ON CONFLICT ROLLBACK",
       [](SqliteTransaction& tx) { tx.exec("INSERT INTO strict_notes VALUES ('taken')"); }},
      {"OR ROLLBACK",
       [](SqliteTransaction& tx) {
         tx.exec("INSERT OR ROLLBACK INTO plain_notes VALUES ('taken')");
       }},
      {"an interrupt",
       [](SqliteTransaction& tx) {
         sqlite3_progress_handler(
             tx.db(), 1, [](void*) { return 1; }, nullptr);
         try {
           tx.exec("INSERT INTO audit VALUES ('interrupted')");
         } catch (...) {
           sqlite3_progress_handler(tx.db(), 0, nullptr, nullptr);
           throw;
         }
       }},
  };
}

}  // namespace

TEST(SqliteStore, BusinessWriteThatSwallowsAnErrorThatRolledTheTransactionBackCommitsNothing) {
  Fixture f;
  add_rollback_traps(f.db);
  for (const auto& [name, breaker] : rollback_breakers()) {
    // How the business write goes on after swallowing the error: through exec, swallowing the
    // store's refusal too, or through the raw connection.
    for (const std::string how : {"exec", "exec, swallowing again", "db()"}) {
      const Key key = idemgate::derive_key("swallowed", name, how);
      const Reservation r = reserve(f.store, key);
      try {
        (void)f.store.commit(key, r.fence, "slot", [&](SqliteTransaction& tx) {
          try {
            breaker(tx);
          } catch (const StoreError&) {
            // The defect under test: the error is swallowed and the business write goes on.
          }
          if (how == "exec") {
            book(tx, key, SlotRequest{"MSKU1", "w"}, "slot");
          } else if (how == "db()") {
            sqlite3_exec(tx.db(),
                         "INSERT INTO bookings (container, slot, source_event) VALUES ('raw', "
                         "'slot', x'00')",
                         nullptr, nullptr, nullptr);
          } else {
            try {
              book(tx, key, SlotRequest{"MSKU1", "w"}, "slot");
            } catch (const StoreError&) {
            }
          }
        });
        ADD_FAILURE() << name << ", " << how << ": the commit must throw";
      } catch (const StoreError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("business write"), std::string::npos) << message;
        if (how == "exec") {
          EXPECT_NE(message.find("was refused: the store's transaction is no longer open"),
                    std::string::npos)
              << "the next statement is refused at once: " << message;
        }
      }
      EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0)
          << name << ", " << how << ": a business row committed without its log row";
      EXPECT_EQ(committed_status(f.db, key), "in_flight") << name << ", " << how;
    }
  }
  // The store is unharmed: a sound business write commits.
  const Key key = idemgate::derive_key("swallowed", "sound");
  const Reservation r = reserve(f.store, key);
  EXPECT_EQ(f.store.commit(key, r.fence, "slot",
                           [&](SqliteTransaction& tx) {
                             book(tx, key, {"MSKU2", "w"}, "slot");
                           }),
            CommitStatus::committed);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 1);
}

TEST(SqliteStore, GateOverABusinessWriteThatSwallowsRollbacksNeverBooksTwice) {
  Fixture f;
  add_rollback_traps(f.db);
  idemgate::test::FakeTerminal<> terminal;
  std::string note = "refuse";
  Gate gate{
      "ect.claim_slot", f.store, terminal,
      [&](SqliteTransaction& tx, const Key& key, const SlotRequest& r, const std::string& slot) {
        try {
          tx.exec("INSERT INTO audit VALUES (?)", note);
        } catch (const StoreError&) {
          // Swallowed: the audit row is "optional".
        }
        book(tx, key, r, slot);
      }};
  const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-16", msku.container);
  for (int delivery = 0; delivery < 3; ++delivery) {
    try {
      (void)gate.process(key, msku);
      ADD_FAILURE() << "delivery " << delivery << " must not be processed";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("business write"), std::string::npos) << e.what();
    }
  }
  // A reconciler pass over the released row fares no better.
  const auto stranded = gate.store().take_stale(10, 0s, 1min);
  ASSERT_EQ(stranded.size(), 1u);
  EXPECT_THROW((void)gate.store().commit(key, stranded[0].fence, "slot-1",
                                         [&](SqliteTransaction& tx) {
                                           try {
                                             tx.exec("INSERT INTO audit VALUES ('refuse')");
                                           } catch (const StoreError&) {
                                           }
                                           book(tx, key, msku, "slot-1");
                                         }),
               StoreError);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0) << "never booked without the log";
  EXPECT_EQ(committed_status(f.db, key), "in_flight");
  ASSERT_TRUE(gate.store().release(key, stranded[0].fence));

  note = "fine";
  EXPECT_EQ(gate.process(key, msku).status(), idemgate::Status::processed);
  EXPECT_EQ(gate.process(key, msku).status(), idemgate::Status::duplicate);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 1) << "booked exactly once";
  EXPECT_EQ(committed_status(f.db, key), "committed");
}

TEST(SqliteStore, BusinessWriteThatTakesTransactionControlCommitsNothing) {
  Fixture f;
  const auto raw_exec = [](SqliteTransaction& tx, const char* sql) {
    sqlite3_exec(tx.db(), sql, nullptr, nullptr, nullptr);  // its result ignored, as it was
  };
  const std::vector<std::pair<std::string, std::function<void(SqliteTransaction&, const Key&)>>>
      cases = {
          {"ROLLBACK; BEGIN through db()",
           [&](SqliteTransaction& tx, const Key& key) {
             raw_exec(tx, "ROLLBACK; BEGIN");
             book(tx, key, {"MSKU1", "w"}, "slot");
           }},
          {"COMMIT through db()",
           [&](SqliteTransaction& tx, const Key& key) {
             book(tx, key, {"MSKU1", "w"}, "slot");
             raw_exec(tx, "COMMIT");
           }},
          {"COMMIT; BEGIN through db(), then more",
           [&](SqliteTransaction& tx, const Key& key) {
             book(tx, key, {"MSKU1", "w"}, "slot");
             raw_exec(tx, "COMMIT; BEGIN");
             raw_exec(tx,
                      "INSERT INTO bookings (container, slot, source_event) VALUES ('raw', 's', "
                      "x'00')");
           }},
          {"END through exec, swallowed",
           [&](SqliteTransaction& tx, const Key& key) {
             book(tx, key, {"MSKU1", "w"}, "slot");
             try {
               tx.exec("END");
             } catch (const StoreError&) {
             }
           }},
          {"ROLLBACK; BEGIN through db(), then the log row rewritten as the store wrote it",
           [&](SqliteTransaction& tx, const Key& key) {
             const std::int64_t at =
                 *tx.query_int("SELECT updated_at FROM idemgate_log WHERE key = ?", key);
             raw_exec(tx, "ROLLBACK; BEGIN");
             sq::exec(tx.db(),
                      "UPDATE idemgate_log SET status = 'committed', result = 'slot', "
                      "updated_at = ? WHERE key = ?",
                      at, key);
             book(tx, key, {"MSKU1", "w"}, "slot");
           }},
          {"ROLLBACK through exec, swallowed, then BEGIN through db()",
           [&](SqliteTransaction& tx, const Key& key) {
             try {
               tx.exec("ROLLBACK");
             } catch (const StoreError&) {
             }
             raw_exec(tx, "BEGIN");
             book(tx, key, {"MSKU1", "w"}, "slot");
           }},
      };
  for (const auto& [name, business] : cases) {
    const Key key = idemgate::derive_key("control", name);
    const Reservation r = reserve(f.store, key);
    try {
      const CommitStatus status =
          f.store.commit(key, r.fence, "slot", [&](SqliteTransaction& tx) { business(tx, key); });
      ADD_FAILURE() << name << ": answered "
                    << (status == CommitStatus::committed ? "committed" : "lost_lease")
                    << " instead of throwing";
    } catch (const StoreError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("business write"), std::string::npos) << message;
      EXPECT_NE(message.find("stays in flight"), std::string::npos) << message;
    }
    EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0) << name;
    EXPECT_EQ(committed_status(f.db, key), "in_flight") << name << ": the error says in flight";
  }

  // The same through resolve: the row stays escalated and nothing is booked.
  const Key parked = idemgate::derive_key("control", "parked");
  const Reservation p = reserve(f.store, parked);
  ASSERT_EQ(f.store.escalate(parked, p.fence, "no lookup"), CommitStatus::committed);
  EXPECT_THROW((void)f.store.resolve(parked, "slot",
                                     [&](SqliteTransaction& tx) {
                                       raw_exec(tx, "ROLLBACK; BEGIN");
                                       book(tx, parked, {"MSKU9", "w"}, "slot");
                                     }),
               StoreError);
  EXPECT_EQ(committed_status(f.db, parked), "escalated");
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0);
  EXPECT_TRUE(f.store.resolve(parked, "slot", [&](SqliteTransaction& tx) {
    book(tx, parked, {"MSKU9", "w"}, "slot");
  }));
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 1);
}

TEST(SqliteStore, BusinessWriteThatChangesTheLogRowCommitsNothing) {
  Fixture f;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"deletes it", "DELETE FROM idemgate_log WHERE key = ?"},
      {"marks it failed", "UPDATE idemgate_log SET status = 'failed', reason = 'x' WHERE key = ?"},
      {"moves its fence", "UPDATE idemgate_log SET fence = fence + 1 WHERE key = ?"},
  };
  for (const auto& [name, sql] : cases) {
    const Key key = idemgate::derive_key("log row", name);
    const Reservation r = reserve(f.store, key);
    EXPECT_THROW((void)f.store.commit(key, r.fence, "slot",
                                      [&](SqliteTransaction& tx) {
                                        book(tx, key, {"MSKU1", "w"}, "slot");
                                        tx.exec(sql, key);
                                      }),
                 idemgate::BusinessWriteError)
        << name;
    EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0) << name;
    EXPECT_EQ(committed_status(f.db, key), "in_flight") << name;
  }
}

TEST(SqliteStore, BusinessWriteThatLeavesAStatementRunningFailsAtOnceAndRunsOnce) {
  TempDir dir;
  const std::string path = dir.file("running.db");
  SqliteStore store(path, {.busy_timeout = 1s});
  store.migrate();
  {
    auto raw = open_raw(path);
    sq::exec(raw.get(), "CREATE TABLE notes (id INTEGER PRIMARY KEY, note TEXT)");
  }
  for (const char* sql : {"INSERT INTO notes (note) VALUES ('a') RETURNING id",
                          "SELECT 1 FROM sqlite_master UNION ALL SELECT 2"}) {
    const Key key = idemgate::derive_key("running", sql);
    const Reservation r = reserve(store, key);
    int runs = 0;
    sqlite3_stmt* left = nullptr;
    const auto started = std::chrono::steady_clock::now();
    try {
      (void)store.commit(key, r.fence, "slot", [&](SqliteTransaction& tx) {
        ++runs;
        sqlite3_finalize(left);
        sqlite3_prepare_v2(tx.db(), sql, -1, &left, nullptr);
        sqlite3_step(left);  // neither reset nor finalized before returning
      });
      ADD_FAILURE() << sql << ": must throw";
    } catch (const StoreError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("neither reset nor finalized"), std::string::npos) << message;
      EXPECT_NE(message.find(sql), std::string::npos) << message;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - started, 500ms)
        << "an error of this connection is not waited out like another connection's lock";
    sqlite3_finalize(left);
    EXPECT_EQ(runs, 1) << "the business write never runs twice";
    EXPECT_EQ(count(path, "SELECT count(*) FROM notes"), 0);
    EXPECT_EQ(committed_status(path, key), "in_flight");
  }
  EXPECT_FALSE(sq::Error(SQLITE_LOCKED, "locked").busy())
      << "SQLITE_LOCKED comes from this connection: never tried again as if another held it";
}

TEST(SqliteStore, CallingTheStoreFromInsideTheBusinessWriteIsRefusedAtOnce) {
  TempDir dir;
  SqliteStore store(dir.file("reentry.db"), {.busy_timeout = 200ms});
  store.migrate();
  const Key key = idemgate::derive_key("reentry", "1");
  const Reservation r = reserve(store, key);
  EXPECT_THROW(
      (void)store.commit(key, r.fence, "slot", [&](SqliteTransaction&) { (void)store.find(key); }),
      std::logic_error);
  EXPECT_EQ(store.find(key)->status, RecordStatus::in_flight);
}

// --- every call gives up at its deadline, and says what held the store ------------------------

TEST(SqliteStore, ABusinessWriteThatHangsMakesOtherCallsFailAtTheirDeadlineNamingIt) {
  Fixture f;
  SqliteStore shared(f.db, {.busy_timeout = 300ms});
  const Key key = idemgate::derive_key("hang", "1");
  const Reservation r = reserve(shared, key);
  std::promise<void> entered, resume;
  std::once_flag resumed;
  const auto let_it_finish = [&] { std::call_once(resumed, [&] { resume.set_value(); }); };
  auto committing = std::async(std::launch::async, [&] {
    return shared.commit(key, r.fence, "slot", [&](SqliteTransaction& tx) {
      entered.set_value();
      resume.get_future().wait();  // a business write waiting on something slow
      book(tx, key, {"MSKU1", "w"}, "slot");
    });
  });
  entered.get_future().wait();
  const auto expect_named = [&](const char* call, auto&& work) {
    auto waiting = std::async(std::launch::async, [&]() -> std::string {
      try {
        work();
      } catch (const StoreError& e) {
        return e.what();
      }
      return "no error";
    });
    if (waiting.wait_for(3s) != std::future_status::ready) {
      ADD_FAILURE() << call << " waited for the hung business write without end";
      let_it_finish();
    }
    const std::string message = waiting.get();
    EXPECT_NE(message.find("a business write in this process has held the store for"),
              std::string::npos)
        << call << ": " << message;
  };
  expect_named("find", [&] { (void)shared.find(key); });
  expect_named("signals", [&] { (void)shared.signals(1h); });
  expect_named("take_stale", [&] { (void)shared.take_stale(10, 0s, 1min); });
  expect_named("purge", [&] { (void)shared.purge(0s, 10); });
  let_it_finish();
  EXPECT_EQ(committing.get(), CommitStatus::committed);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 1);
}

TEST(SqliteStore, TheLeaseRunsFromWhenTheWriteLockIsHeldNotFromTheCall) {
  Fixture f;
  auto locker = open_raw(f.db);
  sq::exec(locker.get(), "BEGIN IMMEDIATE");
  const Key key = idemgate::derive_key("lease-after-lock", "1");
  auto reserving = std::async(std::launch::async, [&] { return reserve(f.store, key, 1min); });
  std::this_thread::sleep_for(400ms);
  const auto unlocked = std::chrono::system_clock::now();
  sq::exec(locker.get(), "COMMIT");
  ASSERT_EQ(reserving.get().kind, Reservation::Kind::acquired);
  EXPECT_GE(f.store.find(key)->lease_until, unlocked + 1min)
      << "the wait for the write lock shortened the lease";
}

// --- the WAL stays bounded, and its size is a gauge -------------------------------------------

TEST(SqliteStore, TheWalShrinksBackOnceALongReaderLetsGo) {
  Fixture f;
  constexpr std::int64_t limit = 256 << 10;
  SqliteStore writer(f.db, {.busy_timeout = 20s, .wal_size_limit = limit});
  auto reader = open_raw(f.db);
  sq::exec(reader.get(), "BEGIN");
  ASSERT_GE(sq::query_int(reader.get(), "SELECT count(*) FROM idemgate_log"), 0);  // a snapshot
  int next = 0;
  const auto write = [&] {
    const Key key = idemgate::derive_key("long-reader", std::to_string(next++));
    (void)reserve(writer, key);
  };
  while (file_bytes(f.db + "-wal") < 4 * limit) write();
  EXPECT_GT(*writer.signals(1h).wal_bytes, 4 * limit)
      << "a read transaction held open keeps the WAL from starting over: the gauge shows it";
  sq::exec(reader.get(), "COMMIT");
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (file_bytes(f.db + "-wal") > limit && std::chrono::steady_clock::now() < until) {
    write();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_LE(file_bytes(f.db + "-wal"), limit) << "the WAL file never shrank";
}

TEST(SqliteStore, TheWalSizeIsRenderedAsAGaugeOnlyWhereThereIsOne) {
  Fixture f;
  (void)reserve(f.store, idemgate::derive_key("gauge", "1"));
  const StoreSignals s = f.store.signals(1h);
  ASSERT_TRUE(s.wal_bytes.has_value());
  EXPECT_GT(*s.wal_bytes, 0);
  const idemgate::Counters counters;
  const std::string page = idemgate::render_prometheus(counters, s);
  EXPECT_NE(page.find("# TYPE idemgate_wal_bytes gauge\n"), std::string::npos) << page;
  EXPECT_NE(page.find("\nidemgate_wal_bytes " + std::to_string(*s.wal_bytes) + "\n"),
            std::string::npos)
      << page;
  EXPECT_EQ(idemgate::render_prometheus(counters, StoreSignals{}).find("idemgate_wal_bytes"),
            std::string::npos)
      << "stores without a WAL of their own render no WAL gauge";
  SqliteStore in_memory(":memory:");
  in_memory.migrate();
  EXPECT_FALSE(in_memory.signals(1h).wal_bytes.has_value());
}

// --- backup and restore ------------------------------------------------------------------------

TEST(SqliteStore, DamagedFileAdviceSaysHowToRestoreWithoutReplayingTheStaleWal) {
  const std::string advice = sq::advice(SQLITE_CORRUPT, "database disk image is malformed");
  EXPECT_NE(advice.find("restore it from a backup"), std::string::npos) << advice;
  EXPECT_NE(advice.find("Stop every process"), std::string::npos) << advice;
  EXPECT_NE(advice.find("-wal and -shm"), std::string::npos) << advice;
  EXPECT_NE(advice.find("SqliteStore::restore_from"), std::string::npos) << advice;
  EXPECT_EQ(sq::advice(SQLITE_NOTADB, "file is not a database"), advice);
}

TEST(SqliteStore, RestoreKeepsEveryEventOfTheBackupADuplicateDespiteAStaleWal) {
  TempDir dir;
  const std::string db = dir.file("idemgate.db");
  const std::string backup = dir.file("backup.db");
  constexpr int backed_up = 120, later = 80;
  const auto event = [](int i) { return idemgate::derive_key("restore", std::to_string(i)); };
  const auto commit_events = [&](SqliteStore& store, int from, int to) {
    for (int i = from; i < to; ++i) {
      const Reservation r = reserve(store, event(i));
      if (r.kind != Reservation::Kind::acquired ||
          store.commit(event(i), r.fence, "slot", [](SqliteTransaction&) {}) !=
              CommitStatus::committed)
        throw std::runtime_error("event " + std::to_string(i) + " did not commit");
    }
  };
  {
    SqliteStore store(db);
    store.migrate();
    commit_events(store, 0, backed_up);
    store.backup_to(backup);  // online: the file stays open and in use
    EXPECT_FALSE(std::filesystem::exists(backup + ".partial"));
    EXPECT_THROW(SqliteStore::restore_from(backup, db), StoreError)
        << "a store open in this process is a user of the file";
  }
  // Another process goes on after the backup and dies without closing: its WAL stays behind.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    try {
      SqliteStore store(db);
      commit_events(store, backed_up, backed_up + later);
      (void)!::write(ready[1], "1", 1);
      for (;;) ::pause();
    } catch (...) {
    }
    ::_exit(2);
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the child could not commit its events";
  ::close(ready[0]);

  // While the process runs, the restore is refused and changes nothing.
  try {
    SqliteStore::restore_from(backup, db);
    ADD_FAILURE() << "a restore over a file in use must be refused";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("has it open"), std::string::npos) << e.what();
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ASSERT_TRUE(std::filesystem::exists(db + "-wal")) << "the crash left its WAL behind";
  ASSERT_GT(std::filesystem::file_size(db + "-wal"), 0u);

  SqliteStore::restore_from(backup, db);
  bool moved_aside = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("")))
    moved_aside |= entry.path().filename().string().starts_with("idemgate.db-wal.stale-");
  EXPECT_TRUE(moved_aside) << "the stale WAL is kept aside, not replayed";

  SqliteStore restored(db);
  auto raw = open_raw(db);
  EXPECT_EQ(text(raw.get(), "PRAGMA integrity_check"), "ok");
  int duplicates = 0;
  for (int i = 0; i < backed_up; ++i) {
    const Reservation r = reserve(restored, event(i));
    if (r.kind == Reservation::Kind::existing && r.status == RecordStatus::committed) ++duplicates;
  }
  EXPECT_EQ(duplicates, backed_up) << "every event in the backup is a duplicate after the restore";
  EXPECT_EQ(reserve(restored, event(backed_up)).kind, Reservation::Kind::acquired)
      << "events after the backup are new to the restored log";
}

TEST(SqliteStore, RestoreRefusesADamagedBackupAndChangesNothing) {
  TempDir dir;
  const std::string db = dir.file("idemgate.db");
  const std::string backup = dir.file("backup.db");
  {
    SqliteStore store(db);
    store.migrate();
    (void)reserve(store, idemgate::derive_key("kept", "1"));
    store.backup_to(backup);
  }
  {
    std::fstream file(backup, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(4096);
    for (int i = 0; i < 4096; ++i) file.put(static_cast<char>(i * 31 % 256));
  }
  EXPECT_THROW(SqliteStore::restore_from(backup, db), StoreError);
  EXPECT_THROW(SqliteStore::restore_from(dir.file("missing.db"), db), StoreError);
  EXPECT_THROW(SqliteStore::restore_from(db, db), std::invalid_argument);
  SqliteStore store(db);
  EXPECT_EQ(reserve(store, idemgate::derive_key("kept", "1")).kind, Reservation::Kind::existing);
}

// --- the smaller ones --------------------------------------------------------------------------

namespace {

/// The log as a version before `duplicates` and `attempts` created it, with one committed event.
void create_old_log(const std::string& path, const Key& old) {
  auto raw = open_raw(path);
  sq::exec(raw.get(),
           "CREATE TABLE idemgate_log (key BLOB NOT NULL PRIMARY KEY CHECK (typeof(key) = "
           "'blob' AND length(key) = 32), status TEXT NOT NULL CHECK (status IN ('in_flight', "
           "'committed', 'failed', 'escalated')), fence INTEGER NOT NULL DEFAULT 1 CHECK "
           "(fence > 0), lease_until INTEGER NOT NULL, fingerprint BLOB NOT NULL CHECK "
           "(typeof(fingerprint) = 'blob' AND length(fingerprint) = 32), request BLOB NOT "
           "NULL, result BLOB, reason TEXT, created_at INTEGER NOT NULL, updated_at INTEGER "
           "NOT NULL, CHECK (status <> 'committed' OR result IS NOT NULL))");
  const auto now = sq::to_micros(std::chrono::system_clock::now());
  sq::exec(raw.get(),
           "INSERT INTO idemgate_log (key, status, fence, lease_until, fingerprint, request, "
           "result, created_at, updated_at) VALUES (?, 'committed', 1, ?, ?, 'request', "
           "'slot-1', ?, ?)",
           old, now,
           idemgate::SqliteBlob{std::string_view(reinterpret_cast<const char*>(fingerprint.data()),
                                                 fingerprint.size())},
           now, now);
}

}  // namespace

TEST(SqliteStore, ALogMissingAColumnSaysToCallMigrateUntilItIsCalled) {
  TempDir dir;
  const std::string path = dir.file("old.db");
  const Key old = idemgate::derive_key("old", "1");
  create_old_log(path, old);
  SqliteStore store(path);
  const auto says_migrate = [](auto&& call) {
    try {
      call();
    } catch (const StoreError& e) {
      return std::string(e.what()).find("call SqliteStore::migrate()") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(says_migrate([&] { (void)reserve(store, idemgate::derive_key("new", "1")); }));
  EXPECT_TRUE(says_migrate([&] { (void)store.find(old); }));
  EXPECT_TRUE(says_migrate([&] { (void)store.take_stale(10, 0s, 1min); }));
  store.migrate();
  const auto row = store.find(old);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->attempts, 1) << "rows of the earlier log count their one attempt";
  EXPECT_EQ(row->duplicates, 0);
  EXPECT_EQ(row->label, "") << "an earlier row has no label";
  EXPECT_TRUE(row->history.empty()) << "nor a history";
  EXPECT_EQ(count(path,
                  "SELECT count(*) FROM pragma_table_info('idemgate_log') WHERE name IN "
                  "('label', 'history')"),
            2);
  EXPECT_EQ(reserve(store, idemgate::derive_key("new", "1")).kind, Reservation::Kind::acquired);
}

TEST(SqliteStore, AReadOnlyWalIsRefusedWhenTheStoreOpens) {
  TempDir dir;
  const std::string path = dir.file("readonly.db");
  {
    SqliteStore store(path);
    store.migrate();
  }
  // Another connection keeps the file open, so its -wal stays; this process may not write it.
  auto holder = open_raw(path);
  ASSERT_EQ(text(holder.get(), "PRAGMA journal_mode"), "wal");
  sq::exec(holder.get(), "CREATE TABLE IF NOT EXISTS touch (x)");
  ASSERT_TRUE(std::filesystem::exists(path + "-wal"));
  namespace fs = std::filesystem;
  fs::permissions(dir.file(""), fs::perms::all);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                            fs::perms::group_write | fs::perms::others_read |
                            fs::perms::others_write);
  fs::permissions(path + "-shm", fs::perms::owner_read | fs::perms::owner_write |
                                     fs::perms::group_read | fs::perms::group_write |
                                     fs::perms::others_read | fs::perms::others_write);
  fs::permissions(path + "-wal",
                  fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Permissions do not bind root: run as an ordinary user.
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(4);
    try {
      SqliteStore store(path);
      ::_exit(1);  // opened: it would fail only at the first write
    } catch (const StoreError& e) {
      ::_exit(std::string(e.what()).find("read-only") != std::string::npos ? 0 : 2);
    } catch (...) {
      ::_exit(3);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: the store opened; 2: the error does not say read-only; 3: another error; 4: could "
         "not drop privileges";
}

TEST(SqliteStore, DurationMaxMeansForeverAndNeverWraps) {
  Fixture f;
  const Key done = idemgate::derive_key("forever", "done");
  const Reservation d = reserve(f.store, done);
  ASSERT_EQ(f.store.commit(done, d.fence, "slot", [](SqliteTransaction&) {}),
            CommitStatus::committed);
  EXPECT_EQ(f.store.purge(std::chrono::seconds::max(), 100), 0u) << "keep forever deletes nothing";
  EXPECT_TRUE(f.store.find(done).has_value());

  const Key released = idemgate::derive_key("forever", "released");
  ASSERT_TRUE(f.store.release(released, reserve(f.store, released).fence));
  EXPECT_TRUE(f.store.take_stale(10, std::chrono::milliseconds::max(), 1min).empty())
      << "a row is never stale after forever";

  const Key held = idemgate::derive_key("forever", "held");
  ASSERT_EQ(reserve(f.store, held, std::chrono::milliseconds::max()).kind,
            Reservation::Kind::acquired);
  EXPECT_EQ(f.store.find(held)->lease_until, std::chrono::system_clock::time_point::max())
      << "a lease of max() runs forever";
  EXPECT_EQ(reserve(f.store, held).kind, Reservation::Kind::existing) << "and is never taken over";

  const auto taken = f.store.take_stale(10, 0s, std::chrono::milliseconds::max());
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(f.store.find(released)->lease_until, std::chrono::system_clock::time_point::max());

  const StoreSignals s = f.store.signals(std::chrono::seconds::max());
  EXPECT_EQ(s.events, 3 + 1) << "a window of max() covers every event (and its duplicate)";
}

TEST(SqliteStore, OptionsOutOfRangeAreRefusedNamingTheOption) {
  TempDir dir;
  const std::string path = dir.file("options.db");
  const auto refused = [&](SqliteOptions options, const std::string& name) {
    try {
      SqliteStore store(path, std::move(options));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()).find(name) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused({.busy_timeout = -1ms}, "SqliteOptions::busy_timeout"));
  EXPECT_TRUE(
      refused({.busy_timeout = std::chrono::milliseconds::max()}, "SqliteOptions::busy_timeout"));
  EXPECT_TRUE(refused({.wal_size_limit = 0}, "SqliteOptions::wal_size_limit"));
  EXPECT_TRUE(refused({.wal_size_limit = std::size_t{1} << 50}, "SqliteOptions::wal_size_limit"));
  EXPECT_FALSE(std::filesystem::exists(path)) << "nothing is opened for refused options";
  SqliteStore store(path, {.busy_timeout = 0ms, .wal_size_limit = 64 << 10});
  EXPECT_EQ(store.wal_size_limit(), std::size_t{64} << 10);
}

// --- attempts and re-driving failed rows -------------------------------------------------------

TEST(SqliteStore, AttemptsCountEveryHolderAndRetryingRowsAreASignal) {
  Fixture f;
  const Key key = idemgate::derive_key("attempts", "1");
  const Reservation first = reserve(f.store, key);
  EXPECT_EQ(f.store.find(key)->attempts, 1);
  ASSERT_TRUE(f.store.release(key, first.fence));
  EXPECT_EQ(f.store.signals(1h).retrying, 0);
  ASSERT_EQ(reserve(f.store, key).kind, Reservation::Kind::taken_over);
  EXPECT_EQ(f.store.find(key)->attempts, 2);
  EXPECT_EQ(f.store.signals(1h).retrying, 1);
  ASSERT_TRUE(f.store.release(key, 2));
  const auto taken = f.store.take_stale(10, 0s, 1min);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].attempts, 3);
  EXPECT_EQ(count(f.db, "SELECT attempts FROM idemgate_log"), 3);
  ASSERT_EQ(f.store.commit(key, taken[0].fence, "slot", [](SqliteTransaction&) {}),
            CommitStatus::committed);
  EXPECT_EQ(f.store.signals(1h).retrying, 0) << "only in-flight rows are retrying";
}

TEST(SqliteStore, RedrivingFailedRowsHandsThemToTheNextDeliveryOrTheReconciler) {
  Fixture f;
  const auto failed = [&](const std::string& name) {
    const Key key = idemgate::derive_key("redrive", name);
    const Reservation r = reserve(f.store, key);
    EXPECT_EQ(f.store.fail(key, r.fence, "422 unknown container"), CommitStatus::committed);
    return key;
  };
  const Key by_key = failed("by key");
  EXPECT_EQ(f.store.redrive_failed(by_key), 1u);
  EXPECT_EQ(f.store.redrive_failed(by_key), 0u) << "only failed rows are re-driven";
  const auto row = f.store.find(by_key);
  EXPECT_EQ(row->status, RecordStatus::in_flight);
  EXPECT_EQ(row->fence, 2);
  EXPECT_EQ(row->attempts, 2);
  EXPECT_EQ(row->reason, "");
  EXPECT_LT(row->lease_until, std::chrono::system_clock::now());
  const Reservation next = reserve(f.store, by_key);
  EXPECT_EQ(next.kind, Reservation::Kind::taken_over);
  EXPECT_EQ(next.fence, 3);

  const auto before = std::chrono::system_clock::now() - 1s;
  const Key in_range = failed("in range");
  const Key also = failed("also in range");
  const auto after = std::chrono::system_clock::now() + 1s;
  EXPECT_EQ(f.store.redrive_failed(after, after + 1h, 10), 0u) << "outside [from, to)";
  EXPECT_EQ(f.store.redrive_failed(before, after, 1), 1u) << "at most limit rows";
  EXPECT_EQ(f.store.redrive_failed(before, after, 10), 1u);
  const auto stale = f.store.take_stale(10, 0s, 1min);
  std::set<Key> taken;
  for (const auto& s : stale) taken.insert(s.key);
  EXPECT_EQ(taken, (std::set<Key>{in_range, also})) << "the reconciler takes re-driven rows";
  for (const auto& s : stale) EXPECT_EQ(s.attempts, 3);
}

TEST(SqliteStore, RestoreReplacesAFileThatIsNotADatabaseAnyMore) {
  TempDir dir;
  const std::string db = dir.file("idemgate.db");
  const std::string backup = dir.file("backup.db");
  const Key kept = idemgate::derive_key("garbage", "kept");
  {
    SqliteStore store(db);
    store.migrate();
    (void)reserve(store, kept);
    store.backup_to(backup);
  }
  std::ofstream(db, std::ios::binary | std::ios::trunc) << std::string(8192, '\x5a');
  EXPECT_THROW(SqliteStore{db}, StoreError) << "the damaged file is refused";
  SqliteStore::restore_from(backup, db);
  SqliteStore store(db);
  const Reservation again = reserve(store, kept);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.status, RecordStatus::in_flight);
}

// SQLite builds a temporary in-memory table (about 85 KiB of page cache) for every run of a
// statement with RETURNING, and writes a statement journal (64 KiB) for an upsert. Reserving a
// new key through one did both, on top of the table's CHECK, and held about 240 KiB at once:
// past glibc's trim threshold (128 KiB), so once those blocks sat at the top of the heap, every
// event handed them back to the system and faulted them in again (ten times the event's cost).
// A new key is one plain INSERT; only a duplicate reads its row back.
TEST(SqliteStore, ReservingANewKeyHoldsLessThanTheHeapTrimThresholdAtOnce) {
  Fixture f;
  for (int i = 0; i < 20; ++i)  // statements prepared, pages cached
    ASSERT_EQ(reserve(f.store, idemgate::derive_key("warm", std::to_string(i))).kind,
              Reservation::Kind::acquired);
  for (int i = 0; i < 20; ++i) {
    sqlite3_int64 before = 0;
    sqlite3_int64 peak = 0;
    // Resets SQLite's high-water mark of the memory it holds to what it holds now.
    ASSERT_EQ(sqlite3_status64(SQLITE_STATUS_MEMORY_USED, &before, &peak, 1), SQLITE_OK);
    ASSERT_GT(before, 0) << "SQLite counts the memory it holds (SQLITE_CONFIG_MEMSTATUS)";
    const Key key = idemgate::derive_key("new", std::to_string(i));
    ASSERT_EQ(reserve(f.store, key).kind, Reservation::Kind::acquired);
    sqlite3_int64 now = 0;
    ASSERT_EQ(sqlite3_status64(SQLITE_STATUS_MEMORY_USED, &now, &peak, 0), SQLITE_OK);
    EXPECT_LT(peak - before, 128 * 1024) << "reservation " << i;
  }
  // A duplicate still counts and reads the stored row.
  const Reservation again = reserve(f.store, idemgate::derive_key("new", "0"));
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(count(f.db, "SELECT duplicates FROM idemgate_log WHERE key = x'" +
                            idemgate::derive_key("new", "0").hex() + "'"),
            1);
}
