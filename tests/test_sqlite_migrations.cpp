// The SQLite log's numbered migrations: a log of every earlier released shape, with rows in it,
// brought to the newest shape step by step with every row kept and readable; a new log made by
// every step; a log with a recorded version given only the steps after it; a step that fails
// leaving the log and its record as they were.

#include "support/released_logs.hpp"
#include "support/released_rows.hpp"
#include "support/sqlite_files.hpp"
#include "support/upgrade_race.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using idemgate::Key;
using idemgate::MigrationReport;
using idemgate::SqliteStore;
using idemgate::test::sqlite::open_raw;
using idemgate::test::sqlite::TempDir;
namespace sq = idemgate::detail::sqlite;
using namespace std::chrono_literals;

constexpr int rows = 40;
constexpr int newest = 5;

/// The key the released rows give event `i`: its number, zero-padded to 32 characters.
Key key_of(int i) {
  char digits[33];
  std::snprintf(digits, sizeof digits, "%032d", i);
  Key::bytes_type raw{};
  for (std::size_t b = 0; b < raw.size(); ++b) raw[b] = static_cast<unsigned char>(digits[b]);
  return Key(raw);
}

/// The fingerprint the released rows give event `i`: 'f' and its number, zero-padded to 31
/// digits.
idemgate::Fingerprint fingerprint_of(int i) {
  char digits[33];
  std::snprintf(digits, sizeof digits, "f%031d", i);
  idemgate::Fingerprint raw{};
  for (std::size_t b = 0; b < raw.size(); ++b) raw[b] = static_cast<unsigned char>(digits[b]);
  return raw;
}

std::vector<int> versions(const std::vector<idemgate::MigrationStep>& steps) {
  std::vector<int> out;
  for (const auto& step : steps) out.push_back(step.version);
  return out;
}

std::vector<int> range(int from, int to) {
  std::vector<int> out;
  for (int v = from; v <= to; ++v) out.push_back(v);
  return out;
}

/// The log's shape as SQLite reports it: its columns and its indexes with their columns and
/// whether they are partial, for comparing two logs whatever their statements' text.
std::set<std::string> shape_of(const std::string& path, const std::string& table) {
  auto db = open_raw(path);
  std::set<std::string> shape;
  for (const std::string& t : {table, table + "_mismatches", table + "_migrations"}) {
    sq::Statement columns(db.get(),
                          "SELECT name, type, \"notnull\", coalesce(dflt_value, ''), pk FROM "
                          "pragma_table_info(?1)",
                          "reading columns");
    columns.bind("reading columns", t);
    while (columns.step("reading columns"))
      shape.insert(t + " column " + columns.bytes(0) + " " + columns.bytes(1) + " " +
                   columns.bytes(2) + " " + columns.bytes(3) + " " + columns.bytes(4));
    sq::Statement indexes(db.get(),
                          "SELECT l.name, l.\"unique\", l.partial, group_concat(i.name, ',') FROM "
                          "pragma_index_list(?1) AS l, pragma_index_info(l.name) AS i "
                          "GROUP BY l.name ORDER BY l.name",
                          "reading indexes");
    indexes.bind("reading indexes", t);
    while (indexes.step("reading indexes"))
      shape.insert(t + " index " + indexes.bytes(0) + " " + indexes.bytes(1) + " " +
                   indexes.bytes(2) + " " + indexes.bytes(3));
  }
  return shape;
}

std::int64_t count(const std::string& path, const std::string& sql) {
  auto db = open_raw(path);
  return sq::query_int(db.get(), sql).value_or(-1);
}

class ReleasedSqliteLog : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(ReleasedSqliteLog, IsUpgradedStepByStepAndKeepsEveryRowReadable) {
  const int shape = GetParam();
  TempDir dir;
  const std::string path = dir.file("log.db");
  {
    auto db = open_raw(path);
    sq::exec(db.get(), "BEGIN");
    for (const std::string& script :
         {idemgate::test::released_sqlite_log(shape, "idemgate_log"),
          idemgate::test::released_sqlite_rows(shape, "idemgate_log", rows)}) {
      char* error = nullptr;
      ASSERT_EQ(sqlite3_exec(db.get(), script.c_str(), nullptr, nullptr, &error), SQLITE_OK)
          << (error != nullptr ? error : "");
    }
    sq::exec(db.get(), "COMMIT");
  }

  SqliteStore store(path);
  const MigrationReport report = store.migrate();
  EXPECT_EQ(report.from_version, 0) << "no version was recorded before";
  EXPECT_EQ(report.to_version, newest);
  EXPECT_EQ(versions(report.found), range(1, shape)) << "the steps the log had, found in place";
  EXPECT_EQ(versions(report.applied), range(shape + 1, newest)) << "the rest, applied";
  EXPECT_EQ(
      count(path, "SELECT count(*) FROM idemgate_log_migrations WHERE note = 'found in place'"),
      shape);
  EXPECT_EQ(count(path, "SELECT max(version) FROM idemgate_log_migrations"), newest);

  const MigrationReport again = store.migrate();
  EXPECT_EQ(again.from_version, newest);
  EXPECT_FALSE(again.changed()) << "nothing left to apply";

  // Every row kept, as the old version wrote it, belonging to no gate.
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = ''"), rows);
  for (int i = 1; i <= rows; ++i)
    idemgate::test::expect_released_row(store.find(key_of(i)), i, shape);
  EXPECT_EQ(store.mismatches(10).size(), shape >= 2 ? 2U : 0U);

  // The upgraded log has the newest shape: the same as a new log made by every step.
  const std::string fresh = dir.file("fresh.db");
  SqliteStore(fresh).migrate();
  EXPECT_EQ(shape_of(path, "idemgate_log"), shape_of(fresh, "idemgate_log"));

  // The gate's work goes on there: its rows adopted, its stranded events taken over, new events
  // reserved and committed, failures grouped.
  auto gate = store.for_gate("ect.claim_slot");
  EXPECT_EQ(gate.adopt_unowned_rows(1000), static_cast<std::size_t>(rows));
  EXPECT_EQ(gate.take_stale(100, 0ms, 1min).size(), static_cast<std::size_t>(rows / 4))
      << "the in-flight rows, leases long expired";
  const Key key = idemgate::derive_key("ect.claim_slot", "after the upgrade");
  const auto reserved = gate.reserve(key, idemgate::detail::sha256("request"), "request", 1min);
  ASSERT_EQ(reserved.kind, idemgate::Reservation::Kind::acquired);
  EXPECT_EQ(gate.commit(key, reserved.fence, "slot", [](idemgate::SqliteTransaction&) {}),
            idemgate::CommitStatus::committed);
  EXPECT_EQ(gate.causes(10).size(), 2U) << "one reason failed, one escalated";
  EXPECT_EQ(gate.signals(std::chrono::hours(24 * 365 * 10)).escalated, rows / 4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReleasedSqliteLog,
                         ::testing::Range(1, idemgate::test::released_shapes + 1),
                         [](const auto& shape) { return "shape" + std::to_string(shape.param); });

TEST(SqliteMigrations, ANewLogIsMadeByEveryStepAndEachIsRecorded) {
  TempDir dir;
  const std::string path = dir.file("log.db");
  SqliteStore store(path, {.table = "bookings_log"});
  const MigrationReport report = store.migrate();
  EXPECT_EQ(report.table, "bookings_log");
  EXPECT_EQ(report.from_version, 0);
  EXPECT_EQ(report.to_version, newest);
  EXPECT_EQ(versions(report.applied), range(1, newest));
  EXPECT_TRUE(report.found.empty());
  ASSERT_EQ(SqliteStore::migrations().size(), static_cast<std::size_t>(newest));
  for (std::size_t i = 0; i < SqliteStore::migrations().size(); ++i) {
    EXPECT_EQ(SqliteStore::migrations()[i].version, static_cast<int>(i) + 1) << "no gaps";
    EXPECT_EQ(report.applied[i].name, std::string(SqliteStore::migrations()[i].name));
  }
  EXPECT_EQ(count(path, "SELECT count(*) FROM bookings_log_migrations WHERE note = ''"), newest);
  auto db = open_raw(path);
  sq::Statement names(db.get(),
                      "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                      "bookings_log_migrations ORDER BY version)",
                      "reading the record");
  ASSERT_TRUE(names.step("reading the record"));
  EXPECT_EQ(names.bytes(0), "log,duplicates,attempts,gates,labels") << "each step by its name";
}

TEST(SqliteMigrations, ALogWithARecordedVersionGetsOnlyTheStepsAfterIt) {
  TempDir dir;
  const std::string path = dir.file("log.db");
  {
    // A log of shape 3 whose version was recorded, as a version with numbered migrations that
    // knew only three of them left it.
    auto db = open_raw(path);
    char* error = nullptr;
    const std::string script =
        idemgate::test::released_sqlite_log(3, "idemgate_log") +
        idemgate::test::released_sqlite_rows(3, "idemgate_log", 8) +
        "CREATE TABLE idemgate_log_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
        " note TEXT NOT NULL DEFAULT '', applied_at INTEGER NOT NULL);"
        "INSERT INTO idemgate_log_migrations VALUES (1, 'log', '', 0), (2, 'duplicates', '', 0),"
        " (3, 'attempts', '', 0);";
    ASSERT_EQ(sqlite3_exec(db.get(), script.c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << (error != nullptr ? error : "");
  }
  SqliteStore store(path);
  const MigrationReport report = store.migrate();
  EXPECT_EQ(report.from_version, 3);
  EXPECT_TRUE(report.found.empty()) << "recorded versions are trusted, not searched";
  EXPECT_EQ(versions(report.applied), range(4, newest));
  EXPECT_TRUE(store.find(key_of(1)).has_value());
}

TEST(SqliteMigrations, AStepThatFailsLeavesTheLogAndItsRecordAsTheyWere) {
  TempDir dir;
  const std::string path = dir.file("log.db");
  {
    auto db = open_raw(path);
    char* error = nullptr;
    // A shape-3 log, and a table in the way of step 4's rebuild.
    const std::string script = idemgate::test::released_sqlite_log(3, "idemgate_log") +
                               idemgate::test::released_sqlite_rows(3, "idemgate_log", 8) +
                               "CREATE TABLE idemgate_log_with_gates (x INTEGER);";
    ASSERT_EQ(sqlite3_exec(db.get(), script.c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << (error != nullptr ? error : "");
  }
  SqliteStore store(path);
  EXPECT_THROW(store.migrate(), idemgate::StoreError);
  EXPECT_EQ(
      count(path, "SELECT count(*) FROM sqlite_master WHERE name = 'idemgate_log_migrations'"), 0)
      << "one transaction: not even the record of versions stays";
  EXPECT_EQ(count(path,
                  "SELECT count(*) FROM pragma_table_info('idemgate_log') WHERE name = "
                  "'gate'"),
            0);
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log"), 8);

  sq::exec(open_raw(path).get(), "DROP TABLE idemgate_log_with_gates");
  const MigrationReport report = store.migrate();
  EXPECT_EQ(versions(report.found), range(1, 3));
  EXPECT_EQ(versions(report.applied), range(4, newest));
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = ''"), 8);
}

// An upgrade in any order doubles nothing (as on PostgreSQL): a log written before gates,
// migrated; two replicas of this version (processes on the one file) serve a redelivery of every
// event while a third adopts the rows of no gate a few at a time. No event the earlier version
// finished is booked again; a dead worker's event is booked once; the earlier version's own
// reservation is refused on the upgraded log.
TEST(SqliteMigrations, AnUpgradeServedBeforeAdoptionNeverProcessesAFinishedEventAgain) {
  constexpr int events = 400;
  TempDir dir;
  const std::string path = dir.file("log.db");
  {
    auto db = open_raw(path);
    sq::exec(db.get(), "BEGIN");
    for (const std::string& script :
         {idemgate::test::released_sqlite_log(3, "idemgate_log"),
          idemgate::test::released_sqlite_rows(3, "idemgate_log", events),
          std::string("CREATE TABLE bookings (key BLOB NOT NULL)")}) {
      char* error = nullptr;
      ASSERT_EQ(sqlite3_exec(db.get(), script.c_str(), nullptr, nullptr, &error), SQLITE_OK)
          << (error != nullptr ? error : "");
    }
    sq::exec(db.get(), "COMMIT");
  }
  SqliteStore(path).migrate();
  {
    auto db = open_raw(path);
    EXPECT_NE(
        sqlite3_exec(db.get(),
                     "INSERT INTO idemgate_log (key, status, fence, lease_until, fingerprint, "
                     "request, duplicates, created_at, updated_at) VALUES (x'01', "
                     "'in_flight', 1, 0, x'02', x'03', 0, 0, 0) ON CONFLICT (key) DO NOTHING",
                     nullptr, nullptr, nullptr),
        SQLITE_OK)
        << "the earlier version's reservation still runs on the upgraded log";
  }

  const auto book = [](idemgate::SqliteTransaction& tx, const Key& key) {
    tx.exec("INSERT INTO bookings (key) VALUES (?)", key);
  };
  const auto replica = [&](const std::vector<int>& order) {
    return idemgate::test::forked([&, order] {
      SqliteStore store(path, {.busy_timeout = 30s});
      auto gate = store.for_gate("ect.claim_slot");
      idemgate::test::serve_redeliveries(gate, order, key_of, fingerprint_of, book);
    });
  };
  const pid_t adopter = idemgate::test::forked([&] {
    SqliteStore store(path, {.busy_timeout = 30s});
    auto gate = store.for_gate("ect.claim_slot");
    while (gate.adopt_unowned_rows(3) > 0) {
    }
  });
  const pid_t up = replica(idemgate::test::upward(events));
  const pid_t down = replica(idemgate::test::downward(events));
  EXPECT_EQ(idemgate::test::exit_status(adopter), 0) << "adoption failed in the race";
  EXPECT_EQ(idemgate::test::exit_status(up), 0);
  EXPECT_EQ(idemgate::test::exit_status(down), 0);

  SqliteStore store(path);
  auto gate = store.for_gate("ect.claim_slot");
  (void)gate.adopt_unowned_rows(events);
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = ''"), 0);
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = 'ect.claim_slot'"), events);
  idemgate::test::expect_finished_events_never_booked_again(events, [&](int i) {
    return count(path, "SELECT count(*) FROM bookings WHERE hex(key) = '" + key_of(i).hex() +
                           "' COLLATE NOCASE");
  });
  EXPECT_EQ(store.mismatches(10).size(), 0U) << "the mismatches went with their rows";
  EXPECT_EQ(gate.mismatches(10).size(), 2U);
}
