// The PostgreSQL log's numbered migrations: a log of every earlier released shape, with rows in
// it, brought to the newest shape step by step (online, and through a transaction pooler) with
// every row kept and readable and the same shape as a new log; a step that fails recorded only up
// to the last step that finished, and resumed.

#include "support/pg_fault_proxy.hpp"
#include "support/postgres.hpp"
#include "support/released_logs.hpp"
#include "support/released_rows.hpp"
#include "support/upgrade_race.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

namespace {

using idemgate::Key;
using idemgate::MigrationReport;
using idemgate::PostgresStore;
using idemgate::test::pg_count;
using idemgate::test::pg_exec;
using namespace std::chrono_literals;

constexpr int rows = 40;
constexpr int newest = 5;

/// The key and fingerprint the released rows give event `i`.
Key key_of(int i) {
  return idemgate::test::released_pg_key(i);
}
idemgate::Fingerprint fingerprint_of(int i) {
  return idemgate::test::released_pg_fingerprint(i);
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

/// The log's shape as the catalog reports it (columns, constraints, indexes of the log, its
/// mismatches and its migrations), with the table's name replaced by `T`, for comparing two
/// logs whatever their column order or statements' text.
std::set<std::string> shape_of(const std::string& table) {
  std::set<std::string> shape;
  const std::string name = table.substr(table.find('.') + 1);
  const auto generic = [&](std::string text) {
    for (auto at = text.find(name); at != std::string::npos; at = text.find(name, at))
      text.replace(at, name.size(), "T");
    return text;
  };
  for (const std::string& t : {table, table + "_mismatches", table + "_migrations"}) {
    for (const auto& row :
         pg_exec("SELECT attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull ||"
                 " ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') FROM pg_attribute AS a"
                 " LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
                 " WHERE a.attrelid = to_regclass('" +
                 t + "') AND a.attnum > 0 AND NOT a.attisdropped"))
      shape.insert(generic(t) + " column " + row[0].c_str());
    for (const auto& row : pg_exec("SELECT conname || ' ' || pg_get_constraintdef(oid) || ' ' ||"
                                   " convalidated FROM pg_constraint WHERE conrelid = "
                                   "to_regclass('" +
                                   t + "')"))
      shape.insert(generic(t) + " constraint " + generic(row[0].c_str()));
    for (const auto& row : pg_exec("SELECT pg_get_indexdef(indexrelid) || ' ' || indisvalid FROM "
                                   "pg_index WHERE indrelid = to_regclass('" +
                                   t + "')"))
      shape.insert(generic(t) + " index " + generic(row[0].c_str()));
  }
  return shape;
}

/// One released shape of the log (a name like "2-bigint" for the variant), made and filled.
struct Released {
  int shape;
  bool bigint_duplicates;
};

class ReleasedPostgresLog : public ::testing::TestWithParam<Released> {
 protected:
  void SetUp() override {
    uri = idemgate::test::pg_uri();
    ASSERT_FALSE(uri.empty());
    log = idemgate::test::unique_table("rel");
    fresh = idemgate::test::unique_table("new");
  }
  void TearDown() override {
    if (!uri.empty())
      pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + log + "_migrations, " +
              fresh + ", " + fresh + "_mismatches, " + fresh + "_migrations");
  }

  void make_released(const Released& r, const std::string& table, int n) {
    pg_exec("BEGIN; " +
            (r.bigint_duplicates ? idemgate::test::released_pg_log_2_bigint(table)
                                 : idemgate::test::released_pg_log(r.shape, table)) +
            idemgate::test::released_pg_rows(r.shape, table, n) + " COMMIT;");
  }

  std::string uri, log, fresh;
};

}  // namespace

TEST_P(ReleasedPostgresLog, IsUpgradedStepByStepOnlineAndKeepsEveryRowReadable) {
  const Released released = GetParam();
  ASSERT_NO_FATAL_FAILURE(make_released(released, log, rows));

  PostgresStore store(uri, {.table = log});
  const MigrationReport report = store.migrate();
  EXPECT_EQ(report.from_version, 0) << "no version was recorded before";
  EXPECT_EQ(report.to_version, newest);
  EXPECT_EQ(versions(report.found), range(1, released.shape));
  EXPECT_EQ(versions(report.applied), range(released.shape + 1, newest));
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_migrations WHERE note = 'found in place'"),
            released.shape);
  EXPECT_FALSE(store.migrate().changed());

  for (int i = 1; i <= rows; ++i)
    idemgate::test::expect_released_row(store.find(key_of(i)), i, released.shape);
  EXPECT_EQ(store.mismatches(10).size(), released.shape >= 2 ? 2U : 0U);

  // The newest shape: the same columns, constraints and indexes as a new log made by every step.
  // The one difference kept: a log made by shape 2 keeps its integer `duplicates` column, which
  // widening would rewrite under an exclusive lock; the store reads it as a bigint.
  PostgresStore(uri, {.table = fresh}).migrate();
  std::set<std::string> expected;
  for (std::string line : shape_of(fresh)) {
    if (released.shape == 2 && !released.bigint_duplicates &&
        line.starts_with("T column duplicates bigint"))
      line.replace(std::string_view("T column duplicates ").size(), 6, "integer");
    expected.insert(line);
  }
  EXPECT_EQ(shape_of(log), expected);

  auto gate = store.for_gate("ect.claim_slot");
  EXPECT_EQ(gate.adopt_unowned_rows(1000), static_cast<std::size_t>(rows));
  EXPECT_EQ(gate.take_stale(100, 0ms, 1min).size(), static_cast<std::size_t>(rows / 4))
      << "the in-flight rows, leases expired";
  const Key key = idemgate::derive_key("ect.claim_slot", "after the upgrade");
  const auto reserved = gate.reserve(key, idemgate::detail::sha256("request"), "request", 1min);
  ASSERT_EQ(reserved.kind, idemgate::Reservation::Kind::acquired);
  EXPECT_EQ(gate.commit(key, reserved.fence, "slot", [](pqxx::work&) {}),
            idemgate::CommitStatus::committed);
  EXPECT_EQ(gate.causes(10).size(), 2U) << "one reason failed, one escalated";
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReleasedPostgresLog,
                         ::testing::Values(Released{1, false}, Released{2, false},
                                           Released{2, true}, Released{3, false},
                                           Released{4, false}, Released{5, false}),
                         [](const auto& released) {
                           return "shape" + std::to_string(released.param.shape) +
                                  (released.param.bigint_duplicates ? "_bigint" : "");
                         });

TEST(PostgresMigrations, ANewLogIsMadeInOneTransactionAndEachStepIsRecorded) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  pg_exec("CREATE SCHEMA IF NOT EXISTS ops");
  const std::string log = "ops." + idemgate::test::unique_table("new");
  PostgresStore store(uri, {.table = log});
  const MigrationReport report = store.migrate();
  EXPECT_EQ(report.from_version, 0);
  EXPECT_EQ(versions(report.applied), range(1, newest));
  EXPECT_TRUE(report.found.empty());
  ASSERT_EQ(PostgresStore::migrations().size(), static_cast<std::size_t>(newest));
  for (std::size_t i = 0; i < PostgresStore::migrations().size(); ++i)
    EXPECT_EQ(PostgresStore::migrations()[i].version, static_cast<int>(i) + 1) << "no gaps";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_migrations WHERE note = ''"), newest);
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_index WHERE indrelid = to_regclass('" + log +
                     "') AND NOT indisvalid"),
            0);
  pg_exec("DROP TABLE " + log + ", " + log + "_mismatches, " + log + "_migrations");
}

TEST(PostgresMigrations, ThroughATransactionPoolerAReleasedLogIsUpgradedInOneTransaction) {
  const char* through = std::getenv("IDEMGATE_TEST_PGBOUNCER");
  ASSERT_TRUE(through != nullptr && *through != '\0')
      << "IDEMGATE_TEST_PGBOUNCER is not set: scripts/test starts PgBouncer and exports it";
  const std::string log = idemgate::test::unique_table("pooled");
  pg_exec("BEGIN; " + idemgate::test::released_pg_log(3, log) +
          idemgate::test::released_pg_rows(3, log, rows) + " COMMIT;");
  PostgresStore store(through, {.table = log, .pooling = idemgate::PostgresPooling::transaction});
  const MigrationReport report = store.migrate();
  EXPECT_EQ(versions(report.found), range(1, 3));
  EXPECT_EQ(versions(report.applied), range(4, newest));
  EXPECT_TRUE(store.find(key_of(2)).has_value());
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + " WHERE gate = ''"), rows);
  pg_exec("DROP TABLE " + log + ", " + log + "_mismatches, " + log + "_migrations");
}

TEST(PostgresMigrations, AStepThatFailsIsRecordedOnlyUpToTheLastStepThatFinishedAndResumes) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  const std::string log = idemgate::test::unique_table("stuck");
  pg_exec("BEGIN; " + idemgate::test::released_pg_log(3, log) +
          idemgate::test::released_pg_rows(3, log, rows) + " COMMIT;");
  // Something in the way of step 4's new primary key: a table where its index should be.
  pg_exec("CREATE TABLE " + log + "_gate_key (x integer)");
  PostgresStore store(uri, {.table = log});
  EXPECT_ANY_THROW(store.migrate());
  EXPECT_EQ(pg_count("SELECT max(version) FROM " + log + "_migrations"), 3)
      << "steps 1 to 3 found, step 4 not recorded";
  EXPECT_EQ(pg_count("SELECT indnatts FROM pg_index WHERE indrelid = to_regclass('" + log +
                     "') AND indisprimary"),
            1)
      << "still keyed by the key alone: the swap did not happen";

  pg_exec("DROP TABLE " + log + "_gate_key");
  const MigrationReport report = store.migrate();
  EXPECT_EQ(report.from_version, 3);
  EXPECT_EQ(versions(report.applied), range(4, newest)) << "step 4 again from its start";
  EXPECT_EQ(pg_count("SELECT indnatts FROM pg_index WHERE indrelid = to_regclass('" + log +
                     "') AND indisprimary"),
            2);
  EXPECT_TRUE(store.find(key_of(1)).has_value());
  pg_exec("DROP TABLE " + log + ", " + log + "_mismatches, " + log + "_migrations");
}

// An upgrade in any order doubles nothing. A log written before gates, migrated; then two
// replicas of this version (processes) serve a redelivery of every event while a third process
// adopts the rows of no gate a few at a time. A reservation that meets a row of no gate takes it
// over and answers from it: no event the earlier version finished is booked again, a dead
// worker's event is booked once, and adoption never collides with a reservation. The earlier
// version's own reservation is refused after the migration (its ON CONFLICT (key) has no unique
// index to match any more), so a replica of it left running cannot book either.
TEST(PostgresMigrations, AnUpgradeServedBeforeAdoptionNeverProcessesAFinishedEventAgain) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  constexpr int events = 400;
  const std::string log = idemgate::test::unique_table("race");
  const std::string bookings = log + "_bookings";
  pg_exec("BEGIN; " + idemgate::test::released_pg_log(3, log) +
          idemgate::test::released_pg_rows(3, log, events) + " COMMIT;");
  pg_exec("CREATE TABLE " + bookings + " (key bytea NOT NULL)");
  PostgresStore(uri, {.table = log}).migrate();
  EXPECT_ANY_THROW(pg_exec("INSERT INTO " + log +
                           " (key, status, fence, lease_until, fingerprint, request, holder, "
                           "attempts) VALUES ('\\x01', 'in_flight', 1, now(), '\\x02', "
                           "'\\x03', 7, 1) ON CONFLICT (key) DO NOTHING"))
      << "the earlier version's reservation still runs on the upgraded log";

  const auto book = [&](pqxx::work& tx, const Key& key) {
    tx.exec("INSERT INTO " + bookings + " (key) VALUES ('\\x" + key.hex() + "'::bytea)");
  };
  const auto replica = [&](const std::vector<int>& order) {
    return idemgate::test::forked([&, order] {
      PostgresStore store(uri, {.table = log, .pool_size = 1});
      auto gate = store.for_gate("ect.claim_slot");
      idemgate::test::serve_redeliveries(gate, order, key_of, fingerprint_of, book);
    });
  };
  const pid_t adopter = idemgate::test::forked([&] {
    PostgresStore store(uri, {.table = log, .pool_size = 1});
    auto gate = store.for_gate("ect.claim_slot");
    while (gate.adopt_unowned_rows(3) > 0) {
    }
  });
  const pid_t up = replica(idemgate::test::upward(events));
  const pid_t down = replica(idemgate::test::downward(events));
  EXPECT_EQ(idemgate::test::exit_status(adopter), 0) << "adoption failed in the race";
  EXPECT_EQ(idemgate::test::exit_status(up), 0);
  EXPECT_EQ(idemgate::test::exit_status(down), 0);

  PostgresStore store(uri, {.table = log});
  auto gate = store.for_gate("ect.claim_slot");
  (void)gate.adopt_unowned_rows(events);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + " WHERE gate = ''"), 0);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + " WHERE gate = 'ect.claim_slot'"), events);
  idemgate::test::expect_finished_events_never_booked_again(events, [&](int i) {
    return pg_count("SELECT count(*) FROM " + bookings + " WHERE key = '\\x" + key_of(i).hex() +
                    "'::bytea");
  });
  EXPECT_EQ(store.mismatches(10).size(), 0U) << "the mismatches went with their rows";
  EXPECT_EQ(gate.mismatches(10).size(), 2U);
  pg_exec("DROP TABLE " + log + ", " + log + "_mismatches, " + log + "_migrations, " + bookings);
}

// The reservation that takes a row of no gate over commits, and its reply is lost on the wire:
// the store sends it again, meets the row now the gate's, and answers it as the duplicate it is,
// with the stored outcome; nothing is claimed anew.
TEST(PostgresMigrations, ATakeoverOfARowOfNoGateWhoseReplyIsLostIsStillADuplicate) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  const std::string log = idemgate::test::unique_table("lost");
  pg_exec("BEGIN; " + idemgate::test::released_pg_log(3, log) +
          idemgate::test::released_pg_rows(3, log, 4) + " COMMIT;");
  PostgresStore(uri, {.table = log}).migrate();
  idemgate::test::PgFaultProxy proxy{uri};
  PostgresStore through(proxy.uri(), {.table = log, .pool_size = 1});
  auto gate = through.for_gate("ect.claim_slot");
  proxy.arm(idemgate::test::Fault::lose_reply, "idemgate_reserve");
  const auto met = gate.reserve(key_of(1), fingerprint_of(1), "{\"order\":1}", 30s);
  EXPECT_TRUE(proxy.wait_fired(5s)) << "the reply was not lost";
  EXPECT_EQ(met.kind, idemgate::Reservation::Kind::existing);
  EXPECT_EQ(met.status, idemgate::RecordStatus::committed);
  EXPECT_EQ(met.result, "{\"booking\":1}");
  EXPECT_EQ(
      pg_count("SELECT count(*) FROM " + log + " WHERE key = '\\x" + key_of(1).hex() + "'::bytea"),
      1)
      << "one row of the key: the gate's";
  EXPECT_EQ(gate.find(key_of(1))->gate, "ect.claim_slot");
  pg_exec("DROP TABLE " + log + ", " + log + "_mismatches, " + log + "_migrations");
}
