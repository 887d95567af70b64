// A log of generations (`PostgresOptions::partitioned_log`) on the server in IDEMGATE_TEST_PG:
// a released log with rows turned into one online, a key reserved once across generations, a
// new generation that waits for the reservation in flight in the old one, and a log whose space
// stays flat while another session holds a snapshot open, beside the unpartitioned log that
// grows.

#include "support/postgres.hpp"
#include "support/released_logs.hpp"
#include "support/released_rows.hpp"
#include "support/upgrade_race.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using idemgate::Key;
using idemgate::PostgresOptions;
using idemgate::PostgresStore;
using idemgate::Reservation;
using idemgate::test::pg_count;
using idemgate::test::pg_exec;
using namespace std::chrono_literals;

Key key_of(int i) {
  return Key(idemgate::detail::sha256("event " + std::to_string(i)));
}
idemgate::Fingerprint same_request() {
  return idemgate::detail::sha256("request");
}

class Generations : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(idemgate::test::pg_uri().empty()) << "needs PostgreSQL: set IDEMGATE_TEST_PG";
    log = idemgate::test::unique_table("gen");
    drop();
  }
  void TearDown() override {
    if (idemgate::test::pg_uri().empty()) return;
    drop();
    pg_exec("DROP TABLE IF EXISTS " + log + "_elsewhere");
  }
  void drop() {
    for (const auto& row : pg_exec("SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') AND "
                                   "relname ~ '^" +
                                   log + "(_g[0-9]+)?$'"))
      pg_exec("DROP TABLE IF EXISTS " + std::string(row[0].c_str()));
    pg_exec("DROP TABLE IF EXISTS " + log + "_mismatches, " + log + "_migrations, " + log +
            "_generations");
  }
  PostgresStore store(bool partitioned, std::size_t pool = 4) {
    PostgresOptions o{.table = log, .pool_size = pool, .checkout_timeout = 10s};
    o.partitioned_log = partitioned;
    return PostgresStore(idemgate::test::pg_uri(), o);
  }
  // Reserves and commits `n` events from `first` on, each with a result.
  static void run_events(PostgresStore& s, int first, int n) {
    for (int i = first; i < first + n; ++i) {
      const Reservation r = s.reserve(key_of(i), same_request(), "request", 30s);
      ASSERT_EQ(r.kind, Reservation::Kind::acquired) << i;
      ASSERT_EQ(s.commit(key_of(i), r.fence, "done", [](PostgresStore::transaction&) {}),
                idemgate::CommitStatus::committed);
    }
  }
  std::int64_t generation_of(const Key& key) {
    return pg_count("SELECT generation FROM " + log + " WHERE key = '" +
                    idemgate::detail::pq::bytea_param(key.view()) + "'::bytea");
  }
  // Expects migrate() to refuse the log of generations for the unique index `index`, naming it
  // and saying to drop it.
  void expect_refused_for(const std::string& index) {
    try {
      store(true).migrate();
      ADD_FAILURE() << "migrate() opened a log of generations with the unique index " << index;
    } catch (const idemgate::StoreError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(index), std::string::npos) << what;
      EXPECT_NE(what.find("drop that index"), std::string::npos) << what;
    }
  }
  std::int64_t log_bytes() {
    return pg_count(
        "SELECT CASE WHEN relkind = 'p' THEN (SELECT sum(pg_total_relation_size(relid))"
        " FROM pg_partition_tree(oid)) ELSE pg_total_relation_size(oid) END::bigint "
        "FROM pg_class WHERE oid = '" +
        log + "'::regclass");
  }
  // Starts the next generation from another store of one session, on a thread of its own.
  std::future<int> start_elsewhere() {
    return std::async(std::launch::async, [this] {
      PostgresStore other = store(true, 1);
      return other.start_generation();
    });
  }
  // The log has two generations, and the second is current.
  static void expect_second_generation_current(PostgresStore& s) {
    const std::vector<idemgate::LogGeneration> after = s.generations();
    ASSERT_EQ(after.size(), 2u);
    EXPECT_TRUE(after[1].current);
  }
  // Waits (10 s at most) until `n` starts of a generation wait for the log's lock; returns how
  // many wait then.
  std::int64_t starts_waiting_for_the_log(std::int64_t n) {
    const std::string waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'LOCK TABLE ONLY " + log +
        " IN ACCESS EXCLUSIVE MODE' AND wait_event_type = 'Lock'";
    for (int i = 0; i < 400 && pg_count(waiting) < n; ++i) std::this_thread::sleep_for(25ms);
    return pg_count(waiting);
  }
  // A store on a log of generations whose sessions the server names after the test's log.
  PostgresStore named_store() {
    PostgresOptions o{.table = log, .pool_size = 2, .checkout_timeout = 10s};
    o.partitioned_log = true;
    const std::string& uri = idemgate::test::pg_uri();
    return PostgresStore(uri + (uri.find('?') == std::string::npos ? "?" : "&") +
                             "application_name=" + session_name(),
                         o);
  }
  // Waits (10 s at most) until the sessions of every `named_store` are gone, and with them
  // reported what they counted.
  void wait_for_named_sessions() {
    for (int i = 0; i < 400 && pg_count("SELECT count(*) FROM pg_stat_activity WHERE "
                                        "application_name = '" +
                                        session_name() + "'") > 0;
         ++i)
      std::this_thread::sleep_for(25ms);
  }
  // The index entries the scans of generation 0 read so far, once the sessions of every
  // `named_store`, gone, reported them.
  std::int64_t generation_zero_reads() {
    wait_for_named_sessions();
    return pg_count(
        "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE relname = '" + log +
        "_g0'");
  }
  // A counter of generation `n`'s table (a column of pg_stat_user_tables).
  std::int64_t generation_counter(int n, const std::string& counter) {
    return pg_count("SELECT coalesce(sum(" + counter +
                    "), 0) FROM pg_stat_user_tables WHERE relname = '" + log + "_g" +
                    std::to_string(n) + "'");
  }
  std::string session_name() const { return "purge_" + log; }
  // Waits (10 s at most) until a make of generation 1's table waits for a lock; returns how
  // many wait then.
  std::int64_t makes_of_the_next_generation_waiting() {
    const std::string waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE TABLE IF NOT EXISTS " +
        log + "_g1 %' AND wait_event_type = 'Lock'";
    for (int i = 0; i < 400 && pg_count(waiting) == 0; ++i) std::this_thread::sleep_for(25ms);
    return pg_count(waiting);
  }
  // A statement on generation `n` (`{1}` in its text), rendered for the test's log of generations.
  std::string generation_sql(const idemgate::sql::Statement& statement, int n) const {
    std::string text(statement.text);
    for (auto at = text.find("{1}"); at != std::string::npos; at = text.find("{1}", at))
      text.replace(at, 3, std::to_string(n));
    return idemgate::detail::postgres::Session::render_for(log, text, true, true);
  }
  std::string log;
};

class ReleasedLogWithRows : public Generations, public ::testing::WithParamInterface<int> {};

TEST_P(ReleasedLogWithRows, BecomesGenerationZeroOnlineAndAnswersEveryKeyAcrossGenerations) {
  const int shape = GetParam();
  constexpr int rows = 40;
  pg_exec("BEGIN; " + idemgate::test::released_pg_log(shape, log) +
          idemgate::test::released_pg_rows(shape, log, rows) + " COMMIT;");
  PostgresStore s = store(true);
  const idemgate::MigrationReport report = s.migrate();
  ASSERT_FALSE(report.applied.empty());
  EXPECT_EQ(report.applied.back().version, 6);
  EXPECT_EQ(report.to_version, 6);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), rows);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_g0"), rows);
  const std::vector<idemgate::LogGeneration> before = s.generations();
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].number, 0);
  EXPECT_TRUE(before[0].current);

  // Migrating again changes nothing; a store without the option is refused.
  EXPECT_FALSE(s.migrate().changed());
  try {
    store(false).migrate();
    ADD_FAILURE() << "a partitioned log opened without the option";
  } catch (const idemgate::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("partitioned_log"), std::string::npos) << e.what();
  }

  for (int i = 1; i <= rows; ++i)
    idemgate::test::expect_released_row(s.find(idemgate::test::released_pg_key(i)), i, shape);

  EXPECT_EQ(s.start_generation(), 1);
  // Every released row still answers, from generation 0, while new keys go to generation 1.
  for (int i = 1; i <= rows; ++i)
    EXPECT_EQ(s.reserve(idemgate::test::released_pg_key(i), same_request(), "request", 30s).kind,
              Reservation::Kind::existing)
        << i;
  run_events(s, 0, 5);
  EXPECT_EQ(generation_of(key_of(0)), 1);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), rows + 5);
}

INSTANTIATE_TEST_SUITE_P(EveryReleasedShape, ReleasedLogWithRows, ::testing::Values(1, 2, 3, 4, 5));

// A process without the option, still running with its statements prepared on the log before
// it was partitioned: the event it holds commits, and its next reservation fails without writing
// anything (it would not see the keys of later generations).
TEST_F(Generations, AProcessWithoutTheOptionFinishesItsEventAndThenStops) {
  PostgresStore old = store(false);
  old.migrate();
  const std::int64_t fence = old.reserve(key_of(1), same_request(), "request", 30s).fence;
  store(true).migrate();
  EXPECT_EQ(old.commit(key_of(1), fence, "done", [](PostgresStore::transaction&) {}),
            idemgate::CommitStatus::committed);
  EXPECT_ANY_THROW(old.reserve(key_of(2), same_request(), "request", 30s));
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 1);
  PostgresStore s = store(true);
  EXPECT_EQ(s.reserve(key_of(1), same_request(), "request", 30s).result, "done");
}

TEST_F(Generations, AKeyIsReservedOnceWhicheverGenerationHoldsIt) {
  PostgresStore log_store = store(true);
  log_store.migrate();
  // A named gate: its reservation looks for its own rows in every generation, not only for the
  // rows of no gate.
  PostgresStore s = log_store.for_gate("portbase.notify");
  run_events(s, 0, 3);
  const std::int64_t fence = s.reserve(key_of(9), same_request(), "request", 30s).fence;
  EXPECT_EQ(s.start_generation(), 1);
  EXPECT_EQ(s.start_generation(), 2);
  for (int i = 0; i < 3; ++i) {
    const Reservation again = s.reserve(key_of(i), same_request(), "request", 30s);
    EXPECT_EQ(again.kind, Reservation::Kind::existing);
    EXPECT_EQ(again.status, idemgate::RecordStatus::committed);
    EXPECT_EQ(again.result, "done");
    EXPECT_EQ(generation_of(key_of(i)), 0);
  }
  // The event in flight in generation 0 commits there, and stays one row.
  EXPECT_EQ(s.reserve(key_of(9), same_request(), "request", 30s).kind, Reservation::Kind::existing);
  EXPECT_EQ(s.commit(key_of(9), fence, "late", [](PostgresStore::transaction&) {}),
            idemgate::CommitStatus::committed);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 4);
  run_events(s, 10, 2);
  EXPECT_EQ(generation_of(key_of(10)), 2);
}

// The reservation in flight is a one-transaction event whose business write has not returned:
// its row is uncommitted in generation 0. A new generation must wait for it, or a reservation
// of the same key in the new generation would not see that row and claim the key a second time.
TEST_F(Generations, ANewGenerationWaitsForTheReservationInFlightInTheOldOne) {
  PostgresStore s = store(true);
  s.migrate();
  std::promise<void> inside, release;
  std::shared_future<void> released = release.get_future().share();
  auto first = std::async(std::launch::async, [&] {
    return s.commit_once(key_of(1), same_request(), "request", "", 30s,
                         [&](PostgresStore::transaction&) {
                           inside.set_value();
                           released.wait();
                           return std::string("first");
                         });
  });
  inside.get_future().wait();
  std::atomic<bool> started{false};
  auto second = std::async(std::launch::async, [&] {
    s.start_generation();
    started = true;
    return s.reserve(key_of(1), same_request(), "request", 30s);
  });
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(started) << "the generation started while a reservation was in flight";
  release.set_value();
  EXPECT_EQ(first.get().kind, idemgate::OnceResult::Kind::committed);
  const Reservation again = second.get();
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.result, "first");
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 1);
}

// Eight threads reserve the same keys while generations start one after another: each key is
// claimed once.
TEST_F(Generations, EightThreadsRacingGenerationsClaimEachKeyOnce) {
  PostgresStore s = store(true, 9);
  s.migrate();
  constexpr int keys = 150;
  std::atomic<int> claims{0};
  std::atomic<bool> done{false};
  // A start every few milliseconds, a dozen at most: each holds the log's lock while it
  // attaches, and a tighter, endless loop would let the reservations through one at a time,
  // among hundreds of generations.
  std::thread starter([&] {
    for (int started = 0; !done && started < 12; ++started) {
      s.start_generation();
      std::this_thread::sleep_for(5ms);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < keys; ++i) {
        const int k = (i * 7 + t * 13) % keys;
        if (s.reserve(key_of(k), same_request(), "request", 30s).kind ==
            Reservation::Kind::acquired)
          ++claims;
      }
    });
  for (auto& t : threads) t.join();
  done = true;
  starter.join();
  EXPECT_EQ(claims.load(), keys);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), keys);
  EXPECT_GT(s.generations().back().number, 3);
}

// A start waits for every statement on the log before it attaches the new generation's table
// and makes it current: a server session that was reading the log's list of generations while an
// attach committed could keep the list from before it, and its reservations would then find no
// table for the new generation (what the race above met, once in some thirty runs, before the
// start waited). Here a transaction that read the log holds the start back until it ends.
TEST_F(Generations, AStartWaitsForTheStatementsOnTheLogBeforeItAttachesTheNewGeneration) {
  PostgresStore s = store(true);
  s.migrate();
  run_events(s, 0, 3);
  pqxx::connection reader(idemgate::test::pg_uri());
  pqxx::work reading(reader);
  reading.exec("SELECT count(*) FROM " + log);

  std::future<int> started = start_elsewhere();
  EXPECT_EQ(starts_waiting_for_the_log(1), 1)
      << "the start did not wait for the statement on the log";
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_inherits WHERE inhparent = '" + log + "'::regclass"),
            1)
      << "the new generation was attached while a statement on the log ran";
  EXPECT_EQ(pg_count("SELECT current FROM " + log + "_generations"), 0);
  reading.commit();
  EXPECT_EQ(started.get(), 1);
  run_events(s, 10, 3);
  EXPECT_EQ(generation_of(key_of(10)), 1);
}

// Two sessions that start the same generation at once: one attaches its table and makes it
// current, the other finds it started and changes nothing.
TEST_F(Generations, TwoSessionsStartingTheSameGenerationStartItOnce) {
  PostgresStore s = store(true);
  s.migrate();
  pqxx::connection reader(idemgate::test::pg_uri());
  pqxx::work reading(reader);
  reading.exec("SELECT count(*) FROM " + log);
  std::future<int> first = start_elsewhere();
  std::future<int> second = start_elsewhere();
  EXPECT_EQ(starts_waiting_for_the_log(2), 2) << "the two starts did not meet";
  reading.commit();
  EXPECT_EQ(first.get(), 1);
  EXPECT_EQ(second.get(), 1);
  ASSERT_NO_FATAL_FAILURE(expect_second_generation_current(s));
}

// Another session makes the next generation's table in a transaction still open: the start's
// own make of it waits for that transaction on the catalog's unique index, is refused once it
// commits, and the start attaches the table the other session made.
TEST_F(Generations, AStartWhoseTableAnotherSessionIsMakingUsesThatTable) {
  PostgresStore s = store(true);
  s.migrate();
  pqxx::connection maker(idemgate::test::pg_uri());
  pqxx::work making(maker);
  making.exec(generation_sql(idemgate::sql::postgres::create_generation, 1));
  std::future<int> started = start_elsewhere();
  ASSERT_EQ(makes_of_the_next_generation_waiting(), 1)
      << "the start did not wait for the other session's table";
  making.commit();
  EXPECT_EQ(started.get(), 1);
  ASSERT_NO_FATAL_FAILURE(expect_second_generation_current(s));
  run_events(s, 0, 3);
  EXPECT_EQ(generation_of(key_of(0)), 1);
}

// The start's make of the table found no table of that name, then waited (here for the log,
// whose shape it copies) while another session made it and committed: the make is refused for
// a name now taken, and the start attaches the table the other session made.
TEST_F(Generations, AStartWhoseTableWasMadeWhileItWaitedUsesThatTable) {
  PostgresStore s = store(true);
  s.migrate();
  pqxx::connection locker(idemgate::test::pg_uri());
  pqxx::work locking(locker);
  locking.exec("LOCK TABLE ONLY " + log + " IN ACCESS EXCLUSIVE MODE");
  std::future<int> started = start_elsewhere();
  ASSERT_EQ(makes_of_the_next_generation_waiting(), 1) << "the start did not wait for the log";
  // The same shape, copied from generation 0 (the log itself is locked) without its bound.
  pg_exec("CREATE TABLE " + log + "_g1 (LIKE " + log +
          "_g0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES); ALTER TABLE " + log +
          "_g1 DROP CONSTRAINT " + log + "_g0_bound");
  locking.commit();
  EXPECT_EQ(started.get(), 1);
  ASSERT_NO_FATAL_FAILURE(expect_second_generation_current(s));
  run_events(s, 0, 3);
  EXPECT_EQ(generation_of(key_of(0)), 1);
}

// Another session holds a snapshot open for the whole test: vacuum can reclaim nothing the
// purges delete. The unpartitioned log grows with every window; the partitioned one drops
// each emptied generation and stays flat.
TEST_F(Generations, UnderASnapshotHeldOpenTheLogStaysFlatWhereTheUnpartitionedOneGrows) {
  pg_exec("CREATE TABLE " + log + "_elsewhere (n int)");
  pqxx::connection holder(idemgate::test::pg_uri());
  pqxx::work held(holder, "held");
  held.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
  held.exec("SELECT count(*) FROM " + log + "_elsewhere");

  const auto windows = [&](bool partitioned) {
    PostgresStore s = store(partitioned);
    s.migrate();
    std::vector<std::int64_t> sizes;
    for (int w = 0; w < 5; ++w) {
      run_events(s, w * 1000, 1000);
      s.purge(0s, 10'000);
      sizes.push_back(log_bytes());
    }
    return sizes;
  };
  const std::vector<std::int64_t> plain = windows(false);
  drop();
  const std::vector<std::int64_t> partitioned = windows(true);
  EXPECT_GT(plain.back(), 3 * plain.front()) << "the held snapshot did not stop vacuum";
  EXPECT_LE(partitioned.back(), partitioned.front() * 3 / 2);
  EXPECT_LT(partitioned.back() * 2, plain.back());
  held.commit();
}

// Under a held snapshot the rows a purge deletes stay in their generation's table. The purge
// steps over them once: every batch goes on in key order where the one before stopped, so it
// reads at most two index entries per row it deletes, to pick it (the entries of the row's two
// versions, its reservation's and its commit's, until the server prunes the older; the delete
// reads none), where batches that started over would read the deleted ones again and again
// (here 20 batches of 100 over 2,000 rows: some 30,000 entries; a bitmap of the rest of the
// generation and a sort in every batch, some 40,000).
TEST_F(Generations, UnderASnapshotHeldOpenAPurgeReadsEachDeletedRowOnce) {
  pg_exec("CREATE TABLE " + log + "_elsewhere (n int)");
  {
    PostgresStore s = named_store();
    s.migrate();
    run_events(s, 0, 2000);
    // An attempt in flight keeps generation 0 from being dropped, and its counts with it.
    ASSERT_EQ(s.reserve(key_of(-1), same_request(), "request", 1h).kind,
              Reservation::Kind::acquired);
  }
  const std::int64_t before = generation_zero_reads();

  pqxx::connection holder(idemgate::test::pg_uri());
  pqxx::work held(holder, "held");
  held.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
  held.exec("SELECT count(*) FROM " + log + "_elsewhere");
  {
    PostgresStore s = named_store();
    EXPECT_EQ(s.purge(0s, 100), 2000u);
  }
  const std::int64_t read = generation_zero_reads() - before;
  RecordProperty("index_entries_read", std::to_string(read));
  held.commit();
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_g0"), 1);
  EXPECT_GE(read, 2000) << "the statistics never counted the purge's reads";
  EXPECT_LT(read, 3 * 2000) << "the purge stepped over the rows it deleted again and again";
}

// The statistics of a generation can count its rows while a held snapshot keeps many deleted
// ones in it (autovacuum's analyze runs in the middle of a purge): with few rows counted, a
// delete joined to the batch it picked would hash the batch and read every entry of the gate
// in the generation, deleted ones too, in every batch. Each batch deletes the keys it picked
// and reads their entries alone.
TEST_F(Generations, WithFewRowsCountedAPurgeStillReadsEachDeletedRowOnce) {
  pg_exec("CREATE TABLE " + log + "_elsewhere (n int)");
  pqxx::connection holder(idemgate::test::pg_uri());
  std::optional<pqxx::work> held;
  {
    PostgresStore s = named_store();
    s.migrate();
    run_events(s, 0, 2000);
    ASSERT_EQ(s.reserve(key_of(-1), same_request(), "request", 1h).kind,
              Reservation::Kind::acquired);
    held.emplace(holder, "held");
    held->exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    held->exec("SELECT count(*) FROM " + log + "_elsewhere");
    // 1,600 rows end one by one under the snapshot; the statistics count the 400 left.
    for (int i = 0; i < 1600; ++i) ASSERT_TRUE(s.expire(key_of(i), 0s)) << i;
  }
  pg_exec("ANALYZE " + log + "_g0");
  ASSERT_LT(pg_count("SELECT reltuples::bigint FROM pg_class WHERE relname = '" + log + "_g0'"),
            1000);
  const std::int64_t before = generation_zero_reads();
  {
    PostgresStore s = named_store();
    EXPECT_EQ(s.purge(0s, 100), 400u);
  }
  const std::int64_t read = generation_zero_reads() - before;
  RecordProperty("index_entries_read", std::to_string(read));
  held->commit();
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_g0"), 1);
  // The walk steps once over the entries of all 2,000 rows, two versions each at most (4,400
  // on a quiet machine, up to 8,000 under load), and the deletes read none; a delete that read
  // the gate's entries in each of the 4 batches read some 12,000.
  EXPECT_LT(read, 10000) << "the purge's deletes read entries of rows they did not pick";
}

// The purge plans its batches with scans and sorts it must not use priced out of reach
// (`sql::postgres::purge_generation_plan`); a batch that still planned one of them would cost
// more than the server's threshold for compiling a plan, and pay that compilation in every
// batch (some 200 ms here, for a batch that takes 3).
TEST_F(Generations, APurgeBatchIsPlannedBelowTheCostThatCompilesIt) {
  PostgresStore s = store(true);
  s.migrate();
  run_events(s, 0, 200);
  pqxx::connection c(idemgate::test::pg_uri());
  pqxx::work tx(c);
  tx.exec(std::string(idemgate::sql::postgres::purge_generation_plan));
  tx.exec("PREPARE batch AS " + generation_sql(idemgate::sql::postgres::purge_generation, 0));
  const pqxx::result plan = tx.exec("EXPLAIN EXECUTE batch('', 0, 100, '')");
  const std::string top = plan[0][0].c_str();
  const auto at = top.find("..");
  ASSERT_NE(at, std::string::npos) << top;
  const double cost = std::stod(top.substr(at + 2));
  EXPECT_LT(cost, std::stod(tx.exec("SHOW jit_above_cost")[0][0].c_str())) << top;
}

// The purge vacuums only the generations it deleted rows from one by one. A vacuum of the
// log after it emptied an older generation whole would take in the current one, started a
// moment before, at a page or two: every plan made until its next vacuum (under a held snapshot,
// a whole window) would then scan it whole for each key, however large it grew.
TEST_F(Generations, APurgeLeavesTheCurrentGenerationToBeProbedByKey) {
  PostgresStore s = store(true);
  s.migrate();
  run_events(s, 0, 50);
  pg_exec("UPDATE " + log +
          "_g0 SET created_at = now() - interval '1 day', updated_at = now() - "
          "interval '1 day'");
  ASSERT_EQ(s.start_generation(), 1);
  // Its statistics change only through what the test does.
  pg_exec("ALTER TABLE " + log + "_g1 SET (autovacuum_enabled = false)");
  run_events(s, 50, 30);

  EXPECT_EQ(s.purge(1h, 100), 50u);
  EXPECT_EQ(generation_counter(1, "vacuum_count"), 0)
      << "the purge vacuumed the generation it did not delete from";
  {
    PostgresStore later = named_store();
    run_events(later, 100, 300);
  }
  wait_for_named_sessions();
  EXPECT_LT(generation_counter(1, "seq_scan"), 30)
      << "reservations scanned the whole current generation for their keys";
}

// A generation whose every row the purge may delete is emptied at once (truncated, then dropped):
// no row is deleted one by one. While another gate still has a row in it, the purge deletes
// its own gate's rows one by one and leaves that row; that gate's purge then empties it.
TEST_F(Generations, AGenerationWhoseRowsAllGoIsEmptiedWholeAndAnotherGatesRowsStay) {
  PostgresStore s = store(true);
  s.migrate();
  PostgresStore other = s.for_gate("ect.notify_forwarder");
  run_events(s, 0, 50);
  run_events(other, 1000, 5);
  s.start_generation();
  pg_exec("CREATE TABLE " + log + "_elsewhere (n int)");
  pg_exec("CREATE FUNCTION " + log +
          "_count() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
          "INSERT INTO " +
          log + "_elsewhere VALUES (1); RETURN OLD; END $$");
  pg_exec("CREATE TRIGGER counted AFTER DELETE ON " + log + "_g0 FOR EACH ROW EXECUTE FUNCTION " +
          log + "_count()");

  // No vacuum of it but the purge's (one that met autovacuum's would be skipped).
  pg_exec("ALTER TABLE " + log + "_g0 SET (autovacuum_enabled = false)");
  EXPECT_EQ(s.purge(0s, 1000), 50u);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_elsewhere"), 50)
      << "with another gate's rows in it, the generation is purged row by row";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_g0"), 5);
  EXPECT_EQ(generation_counter(0, "vacuum_count"), 1)
      << "the generation purged row by row was not vacuumed after";

  EXPECT_EQ(other.purge(0s, 1000), 5u);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_elsewhere"), 50)
      << "the last gate's rows were deleted one by one instead of the generation emptied";
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_class WHERE relname = '" + log + "_g0'"), 0);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 0);
  pg_exec("DROP FUNCTION " + log + "_count() CASCADE");
}

// While a transaction older than the window stays open, a purge deletes only in generations
// whose every row is past the window, and leaves the rows of the one that was filling until
// then (deleting them would give no space back under that snapshot); once it ends, they go.
TEST_F(Generations, UnderASnapshotOlderThanTheWindowOnlyWholeGenerationsArePurged) {
  pg_exec("CREATE TABLE " + log + "_elsewhere (n int)");
  PostgresStore s = store(true);
  s.migrate();
  run_events(s, 0, 10);  // generation 0
  s.start_generation();
  run_events(s, 100, 10);  // generation 1, current

  pqxx::connection holder(idemgate::test::pg_uri());
  pqxx::work held(holder, "held");
  held.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
  held.exec("SELECT count(*) FROM " + log + "_elsewhere");
  std::this_thread::sleep_for(3500ms);

  // Generation 1 began more than the window ago: the purge starts generation 2. Every row of
  // generation 0 is past the window (generation 1 began before it); generation 1's rows are
  // too, but the generation it is (the one the current one followed) is not known to be.
  EXPECT_EQ(s.purge(2s, 1000), 10u);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 10);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_g1"), 10);
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_class WHERE relname = '" + log + "_g0'"), 0)
      << "the emptied generation was not dropped";

  held.commit();
  EXPECT_EQ(s.purge(2s, 1000), 10u) << "once the snapshot ended";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 0);
}

// A process killed while it starts a generation, its table made and its lock waiting behind a
// transaction that read the log, changes nothing: reservations go on in the current generation,
// and the next start attaches the table it made and makes that generation current.
TEST_F(Generations, AProcessKilledWhileStartingAGenerationLeavesTheLogAsItWas) {
  PostgresStore s = store(true);
  s.migrate();
  run_events(s, 0, 3);
  pqxx::connection blocker(idemgate::test::pg_uri());
  pqxx::work holding(blocker);
  holding.exec("SELECT count(*) FROM " + log);

  const pid_t starter = idemgate::test::forked([&] {
    PostgresStore other = store(true, 1);
    other.start_generation();
  });
  ASSERT_EQ(starts_waiting_for_the_log(1), 1) << "the start never waited for the lock";
  ::kill(starter, SIGKILL);
  EXPECT_EQ(idemgate::test::exit_status(starter), -1);
  holding.commit();

  EXPECT_EQ(pg_count("SELECT current FROM " + log + "_generations"), 0);
  run_events(s, 10, 3);
  EXPECT_EQ(generation_of(key_of(10)), 0);
  EXPECT_EQ(s.start_generation(), 1);
  run_events(s, 20, 3);
  EXPECT_EQ(generation_of(key_of(20)), 1);
  EXPECT_EQ(s.reserve(key_of(10), same_request(), "request", 30s).kind,
            Reservation::Kind::existing);
}

// The session detaching an emptied generation is cut while the detach waits for a transaction
// that read the log: the generation is left detach-pending, and the same call, sending it again
// on a fresh connection, finishes that detach and drops the generation.
TEST_F(Generations, ADetachCutMidStatementIsFinishedWhenSentAgain) {
  PostgresStore s = store(true);
  s.migrate();
  run_events(s, 0, 3);
  s.start_generation();
  pg_exec("DELETE FROM " + log + "_g0");

  pqxx::connection reader(idemgate::test::pg_uri());
  pqxx::work reading(reader);
  reading.exec("SELECT count(*) FROM " + log);
  auto dropping = std::async(std::launch::async, [&] { return s.drop_empty_generations(); });
  const std::string waiting = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%" + log +
                              "_g0 CONCURRENTLY%' AND wait_event IS NOT NULL";
  for (int i = 0; i < 200 && pg_count(waiting) == 0; ++i) std::this_thread::sleep_for(25ms);
  ASSERT_EQ(pg_count(waiting), 1) << "the detach never waited";
  pg_exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%" + log +
          "_g0 CONCURRENTLY%' AND pid <> pg_backend_pid()");
  // The detach's first transaction committed before the wait: the generation is pending. The
  // store's retry on a fresh connection finds it so and finishes it once the reader is gone.
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_inherits WHERE inhdetachpending AND inhparent = '" +
                     log + "'::regclass"),
            1);
  reading.commit();
  EXPECT_EQ(dropping.get(), 1u);
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_class WHERE relname = '" + log + "_g0'"), 0);
  const std::vector<idemgate::LogGeneration> left = s.generations();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].number, 1);
}

// A reservation's insert into a generation names no conflict index: a unique index besides the
// key would turn its conflicts into the key's, so migrate() refuses the log until it is gone.
TEST_F(Generations, ALogWithAUniqueIndexBesidesItsKeyIsRefusedUntilItIsDropped) {
  store(true).migrate();
  pg_exec("CREATE UNIQUE INDEX " + log + "_by_label ON " + log + " (gate, label, generation)");
  expect_refused_for(log + "_by_label");
  pg_exec("DROP INDEX " + log + "_by_label");
  PostgresStore s = store(true);
  EXPECT_NO_THROW(s.migrate());
  run_events(s, 0, 2);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 2);
}

// A unique index made by hand on one generation's table alone is refused as well; a started
// generation's own key is not.
TEST_F(Generations, AGenerationWithAUniqueIndexOfItsOwnIsRefusedUntilItIsDropped) {
  PostgresStore s = store(true);
  s.migrate();
  ASSERT_EQ(s.start_generation(), 1);
  EXPECT_NO_THROW(store(true).migrate());
  pg_exec("CREATE UNIQUE INDEX " + log + "_g1_by_label ON " + log + "_g1 (gate, label)");
  expect_refused_for(log + "_g1_by_label");
  pg_exec("DROP INDEX " + log + "_g1_by_label");
  EXPECT_NO_THROW(store(true).migrate());
  run_events(s, 0, 2);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + "_g1"), 2);
}

// Left to choose, the server plans a prepared statement again for its first executions, and then
// whenever its estimates make a plan for the given values look cheaper, which a log of
// generations' changing statistics did for up to a sixth of a run's commits or reservations: on a
// log of generations the reservation and the commit's update always run their generic plans.
TEST_F(Generations, TheReservationAndTheCommitRunTheirGenericPlans) {
  PostgresStore s = store(true, 1);
  s.migrate();
  std::int64_t custom_plans = -1;
  for (int i = 0; i < 8; ++i) {
    const Reservation r = s.reserve(key_of(i), same_request(), "request", 30s);
    ASSERT_EQ(r.kind, Reservation::Kind::acquired) << i;
    ASSERT_EQ(
        s.commit(
            key_of(i), r.fence, "done",
            [&](PostgresStore::transaction& tx) {
              custom_plans = idemgate::detail::pq::int_field(tx.exec(
                  "SELECT coalesce(sum(custom_plans), 0) FROM "
                  "pg_prepared_statements WHERE name IN ('idemgate_reserve', 'idemgate_commit')")
                                                                 [0][0]);
            }),
        idemgate::CommitStatus::committed);
  }
  EXPECT_EQ(custom_plans, 0);
}

TEST_F(Generations, CallsOnALogWithoutGenerationsSayWhatToSet) {
  PostgresStore s = store(false);
  s.migrate();
  EXPECT_THROW(s.start_generation(), idemgate::StoreError);
  EXPECT_THROW(s.generations(), idemgate::StoreError);
  EXPECT_THROW(s.drop_empty_generations(), idemgate::StoreError);
}

}  // namespace
