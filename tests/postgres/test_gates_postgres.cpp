// Gates sharing one PostgreSQL log: two services whose workers were killed, each reconciler
// finishing only its own rows; and a populated log of the earlier shape (keyed by key alone)
// migrating in place while a writer goes on and several replicas migrate at once.

#include "support/child_process.hpp"
#include "support/earlier_pg_log.hpp"
#include "support/pg_bookings.hpp"
#include "support/pg_terminal.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::PostgresStore;
using idemgate::Reconciler;
using idemgate::RecordStatus;
using idemgate::test::pg_count;
using idemgate::test::pg_exec;
using namespace std::chrono_literals;

namespace {

/// Runs the reconciler until it took `rows` rows (a killed backend may hold its row lock for a
/// moment, and the scan skips locked rows), at most five seconds.
idemgate::ReconcileReport reconcile(auto& reconciler, std::size_t rows) {
  idemgate::ReconcileReport report;
  for (int i = 0; i < 100 && report.taken < rows; ++i) {
    std::this_thread::sleep_for(50ms);
    report = reconciler.run_once();
  }
  return report;
}

class TwoServices : public idemgate::test::PgBookingsTest {
 protected:
  void SetUp() override {
    PgBookingsTest::SetUp();
    receipts = idemgate::test::unique_table("rcpt");
    slots = idemgate::test::unique_table("slots");
    mails = idemgate::test::unique_table("mails");
    pg_exec(idemgate::test::bookings_ddl(receipts));
  }
  void TearDown() override {
    if (!uri.empty())
      pg_exec("DROP TABLE IF EXISTS " + receipts + ", " + slots + ", " + slots + "_answers, " +
              mails + ", " + mails + "_answers");
    unsetenv("IDEMGATE_FAULT_GATE");
    PgBookingsTest::TearDown();
  }

  /// Starts a consumer of gate `gate` in its own process, lets it claim at `terminal`, and kills
  /// it there (SIGKILL) before it commits.
  void killed_after_claim(const char* gate, const std::string& terminal,
                          const std::string& booked_in) {
    setenv("IDEMGATE_FAULT_GATE", gate, 1);
    idemgate::test::ChildProcess consumer({FAULT_CONSUMER_PATH, uri, log, booked_in, terminal,
                                           "after_claim", "CIS-2025-06-09-1001", "MSKU7000037"});
    ASSERT_EQ(consumer.read_line(), "FAULT_POINT after_claim");
    consumer.kill_now();
  }

  std::string receipts, slots, mails;
};

}  // namespace

TEST_F(TwoServices, EachReconcilerFinishesOnlyItsOwnGatesRowAfterBothWorkersWereKilled) {
  PostgresStore store(uri, {.table = log});
  store.migrate();
  idemgate::test::PgTerminal::create(uri, slots);
  idemgate::test::PgTerminal::create(uri, mails);
  // Two services on one log, one notification: both derive the same key from it.
  ASSERT_NO_FATAL_FAILURE(killed_after_claim("ect.claim_slot", slots, bookings));
  ASSERT_NO_FATAL_FAILURE(killed_after_claim("ect.notify_forwarder", mails, receipts));
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-2025-06-09-1001", "MSKU7000037");
  auto claims_log = store.for_gate("ect.claim_slot");
  auto notices_log = store.for_gate("ect.notify_forwarder");
  ASSERT_EQ(claims_log.find(key)->status, RecordStatus::in_flight);
  ASSERT_EQ(notices_log.find(key)->status, RecordStatus::in_flight);
  EXPECT_FALSE(store.find(key).has_value()) << "no row belongs to no gate";

  idemgate::test::PgTerminal slot_terminal(uri, slots);
  Gate claims{"ect.claim_slot", store, slot_terminal, booking_writer(), {.lease = 300ms}};
  Reconciler claims_reconciler{claims, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  const idemgate::ReconcileReport first = reconcile(claims_reconciler, 1);
  EXPECT_EQ(first.taken, 1u) << "only its own row: the other gate's row is not stranded for it";
  EXPECT_EQ(first.found, 1u) << "the slot the terminal holds is reused";
  EXPECT_EQ(claims_reconciler.run_once().taken, 0u);
  EXPECT_EQ(claims_log.find(key)->status, RecordStatus::committed);
  EXPECT_EQ(notices_log.find(key)->status, RecordStatus::in_flight) << "left to its own gate";
  EXPECT_EQ(notices_log.find(key)->fence, 1) << "not taken over by another gate";
  EXPECT_EQ(booking_count(), 1);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + receipts), 0);
  EXPECT_EQ(claims.store().signals(1h).in_flight, 0);
  EXPECT_EQ(notices_log.signals(1h).in_flight, 1);

  idemgate::test::PgBookingWriter receipt_writer{receipts, nullptr};
  idemgate::test::PgTerminal mail_terminal(uri, mails);
  Gate notices{"ect.notify_forwarder", store, mail_terminal, receipt_writer, {.lease = 300ms}};
  Reconciler notices_reconciler{notices, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  const idemgate::ReconcileReport second = reconcile(notices_reconciler, 1);
  EXPECT_EQ(second.taken, 1u);
  EXPECT_EQ(notices_log.find(key)->status, RecordStatus::committed);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + receipts), 1);
  EXPECT_EQ(booking_count(), 1);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + slots), 1) << "one slot claimed, once";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + mails), 1) << "one notice sent, once";
}

namespace {

/// `n` rows of the earlier shape: every tenth in flight under an expired lease, the rest
/// committed.
void fill_earlier_log(const std::string& t, int n) {
  pg_exec("INSERT INTO " + t +
          " (key, status, lease_until, fingerprint, request, result)"
          " SELECT sha256(int4send(i)), CASE WHEN i % 10 = 0 THEN 'in_flight' ELSE 'committed'"
          " END, now() - interval '1 hour', sha256(int4send(-i)), convert_to('MSKU' || i,"
          " 'UTF8'), CASE WHEN i % 10 = 0 THEN NULL ELSE convert_to('slot-' || i, 'UTF8') END"
          " FROM generate_series(1, " +
          std::to_string(n) + ") AS i");
}

}  // namespace

class EarlierLog : public idemgate::test::PgBookingsTest {};

TEST_F(EarlierLog, MigratesInPlaceWhileAWriterGoesOnAndReplicasMigrateAtOnce) {
  pg_exec(idemgate::test::earlier_pg_log_schema(log));
  fill_earlier_log(log, 20'000);
  // A writer that goes on during the migration with statements both shapes take.
  std::atomic<bool> done{false};
  std::atomic<int> written{0}, writer_errors{0};
  std::thread writer([&] {
    for (int i = 0; !done.load(); ++i) {
      try {
        pg_exec("INSERT INTO " + log +
                " (key, status, lease_until, fingerprint, request, result) VALUES (sha256("
                "convert_to('writer-" +
                std::to_string(i) +
                "', 'UTF8')), 'committed', now(), sha256(''::bytea), ''::bytea, ''::bytea)");
        ++written;
      } catch (const std::exception&) {
        ++writer_errors;
      }
    }
  });
  // Three replicas start at once; each migrates.
  std::atomic<int> migrate_errors{0};
  std::vector<std::thread> replicas;
  for (int r = 0; r < 3; ++r)
    replicas.emplace_back([&] {
      try {
        PostgresStore replica(uri, {.table = log});
        replica.migrate();
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++migrate_errors;
      }
    });
  for (auto& r : replicas) r.join();
  done = true;
  writer.join();
  EXPECT_EQ(migrate_errors.load(), 0);
  EXPECT_EQ(writer_errors.load(), 0) << "the writer was never refused";
  EXPECT_GT(written.load(), 0);

  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 20'000 + written.load()) << "nothing lost";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + " WHERE gate = ''"), 20'000 + written.load())
      << "rows written before belong to no gate";
  EXPECT_EQ(pg_count("SELECT indnatts FROM pg_index WHERE indrelid = '" + log +
                     "'::regclass AND indisprimary"),
            2)
      << "the primary key is (gate, key)";
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_index WHERE indrelid = '" + log +
                     "'::regclass AND NOT indisvalid"),
            0);
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_indexes WHERE tablename = '" + log +
                     "' AND indexname IN ('" + log + "_in_flight', '" + log + "_escalated')"),
            0)
      << "the earlier indexes gave way to the per-gate ones";
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_indexes WHERE tablename = '" + log + "'"), 5);
  EXPECT_EQ(pg_count("SELECT count(*) FROM information_schema.columns WHERE table_name = '" + log +
                     "' AND column_name IN ('label', 'history')"),
            2)
      << "the label and history columns were added";

  PostgresStore store(uri, {.table = log});
  store.migrate();  // a no-op now
  EXPECT_EQ(pg_count("SELECT count(*) FROM pg_indexes WHERE tablename = '" + log + "'"), 5);
  auto claims = store.for_gate("ect.claim_slot");
  EXPECT_TRUE(claims.take_stale(10, 0ms, 1min).empty()) << "no gate owns the earlier rows yet";
  EXPECT_EQ(store.signals(1h).in_flight, 2'000) << "the unscoped handle shows the unowned rows";
  EXPECT_THROW((void)store.adopt_unowned_rows(10), std::logic_error);
  EXPECT_EQ(claims.adopt_unowned_rows(25'000), static_cast<std::size_t>(20'000 + written.load()));
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + " WHERE gate = ''"), 0);
  EXPECT_EQ(claims.signals(1h).in_flight, 2'000);
  EXPECT_EQ(claims.take_stale(5'000, 0ms, 1min).size(), 2'000u)
      << "its reconciler now finishes the stranded ones";
  const Key first = Key(idemgate::detail::sha256(std::string("\0\0\0\1", 4)));
  ASSERT_TRUE(claims.find(first).has_value());
  EXPECT_EQ(claims.find(first)->result, "slot-1");
  EXPECT_EQ(claims.find(first)->gate, "ect.claim_slot");
  EXPECT_EQ(claims.find(first)->label, "") << "an earlier row has no label";
  EXPECT_TRUE(claims.find(first)->history.empty()) << "nor a history";
  EXPECT_EQ(store.gates(), std::vector<std::string>{"ect.claim_slot"});
  EXPECT_EQ(claims.count({.status = idemgate::RecordStatus::in_flight}), 2'000);
  const std::vector<idemgate::Record> held =
      claims.rows({.status = idemgate::RecordStatus::in_flight, .limit = 1});
  ASSERT_EQ(held.size(), 1u);
  ASSERT_EQ(claims.fail(held[0].key, held[0].fence, "422"), idemgate::CommitStatus::committed);
  EXPECT_EQ(claims.redrive_cause("422", 10), 1u);
  const auto redriven = claims.find(held[0].key);
  ASSERT_EQ(redriven->history.size(), 3u) << "an earlier row's history starts after migrating";
  EXPECT_EQ(redriven->history[0].outcome, "taken_over") << "by the reconciler's pass above";
  EXPECT_EQ(redriven->history[1].outcome, "failed");
  EXPECT_EQ(redriven->history[2].outcome, "redriven");
  EXPECT_EQ(redriven->history[2].reason, "422");
}

TEST_F(EarlierLog, AReservationAfterTheUpgradeTakesItsKeysRowOverAndAdoptingTheRest) {
  pg_exec(idemgate::test::earlier_pg_log_schema(log));
  fill_earlier_log(log, 10);
  PostgresStore store(uri, {.table = log});
  store.migrate();
  auto claims = store.for_gate("ect.claim_slot");
  const Key taken = Key(idemgate::detail::sha256(std::string("\0\0\0\2", 4)));
  const auto met = claims.reserve(taken, idemgate::detail::sha256("x"), "x", 1min);
  EXPECT_EQ(met.kind, idemgate::Reservation::Kind::existing) << "reserved anew after the upgrade";
  EXPECT_FALSE(met.same_request) << "another request under the key is a conflict";
  EXPECT_EQ(claims.adopt_unowned_rows(100), 9u);
  EXPECT_FALSE(store.find(taken).has_value());
  EXPECT_EQ(claims.find(taken)->request, "MSKU2") << "the row of the earlier version, moved whole";
}
