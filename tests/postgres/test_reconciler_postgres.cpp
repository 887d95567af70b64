// Crash and fault tests of the gate and the reconciler on real PostgreSQL.

#include "support/child_process.hpp"
#include "support/fake_terminal.hpp"
#include "support/pg_bookings.hpp"
#include "support/pg_cluster.hpp"
#include "support/pg_terminal.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/transaction_gate.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::PostgresStore;
using idemgate::Reconciler;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::pg_count;
using idemgate::test::pg_count_on;
using idemgate::test::pg_exec;
using idemgate::test::pg_exec_on;
using idemgate::test::SlotRequest;
namespace pq = idemgate::detail::pq;
using namespace std::chrono_literals;

namespace {

/// The invariants every scenario ends with.
void expect_invariants(const std::string& uri, const std::string& log, const std::string& bookings,
                       std::int64_t events) {
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + bookings), events) << "one row per event";
  EXPECT_EQ(pg_count_on(uri, "SELECT count(DISTINCT source_event) FROM " + bookings), events);
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + log + " WHERE status = 'in_flight'"), 0)
      << "nothing left in flight after the final reconciler pass";
  idemgate::test::expect_no_half_state(uri, log, bookings);
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + bookings + " b JOIN " + log +
                                 " l ON l.key = b.source_event WHERE l.result <> "
                                 "convert_to(b.slot_id, 'UTF8')"),
            0)
      << "the booked slot is the stored outcome";
}

/// Every claim `fake` received carried its event's key (`derive_key(scope, container)`), and
/// each of the `events` containers was claimed: a repeated claim is safe only under that key.
void expect_every_claim_under_its_events_key(const FakeTerminal<>& fake, std::string_view scope,
                                             int events) {
  std::set<std::string> containers;
  for (const auto& claim : fake.received()) {
    EXPECT_EQ(claim.key, idemgate::derive_key(scope, claim.container))
        << "a claim for " << claim.container << " under another key";
    containers.insert(claim.container);
  }
  EXPECT_EQ(containers.size(), static_cast<std::size_t>(events));
}

class PostgresFaults : public idemgate::test::PgBookingsTest {
 protected:
  void SetUp() override {
    PgBookingsTest::SetUp();
    terminal = idemgate::test::unique_table("term");
  }
  void TearDown() override {
    if (!uri.empty()) pg_exec("DROP TABLE IF EXISTS " + terminal + ", " + terminal + "_answers");
    PgBookingsTest::TearDown();
  }
  std::string terminal;
};

}  // namespace

class KilledConsumer : public PostgresFaults, public ::testing::WithParamInterface<const char*> {};

TEST_P(KilledConsumer, ReconcilerFinishesTheEventAfterSigkill) {
  const std::string point = GetParam();
  PostgresStore store(uri, {.table = log});
  store.migrate();
  idemgate::test::PgTerminal::create(uri, terminal);
  {
    idemgate::test::ChildProcess consumer(
        {FAULT_CONSUMER_PATH, uri, log, bookings, terminal, point, "CIS-9", "MSKU7000037"});
    ASSERT_EQ(consumer.read_line(), "FAULT_POINT " + point);
    consumer.kill_now();
  }
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-9", "MSKU7000037");
  EXPECT_EQ(store.for_gate("ect.claim_slot").find(key)->status, RecordStatus::in_flight)
      << "the consumer's gate holds the event";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + bookings), 0);
  const std::int64_t claims_before = pg_count("SELECT count(*) FROM " + terminal + "_answers");
  EXPECT_EQ(claims_before, point == "before_claim" ? 0 : 1);

  idemgate::test::PgTerminal pg_terminal(uri, terminal);
  Gate gate{"ect.claim_slot", store, pg_terminal, booking_writer(), {.lease = 300ms}};
  Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  // The killed backend may still hold its row lock for a moment; the reconciler skips locked
  // rows, so pass again until the row is free.
  idemgate::ReconcileReport report;
  for (int i = 0; i < 100 && report.taken == 0; ++i) {
    std::this_thread::sleep_for(50ms);
    report = reconciler.run_once();
  }
  EXPECT_EQ(report.taken, 1u);
  if (point == "before_claim")
    EXPECT_EQ(report.reclaimed, 1u);
  else
    EXPECT_EQ(report.found, 1u) << "the slot the terminal holds is reused";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + terminal), 1) << "one slot at the terminal";
  EXPECT_EQ(pg_count("SELECT count(*) FROM (SELECT key FROM " + terminal +
                     "_answers GROUP BY key HAVING count(DISTINCT slot) > 1) d"),
            0);
  expect_invariants(uri, log, bookings, 1);
  EXPECT_EQ(gate.process(key, {"MSKU7000037", "2025-06-09T07:00"}).status(), Status::duplicate);
}

INSTANTIATE_TEST_SUITE_P(AtEachFaultPoint, KilledConsumer,
                         ::testing::Values("before_claim", "after_claim", "before_commit"));

// A TransactionGate's consumer killed (SIGKILL) inside its transaction, after its business row:
// while it lives, a duplicate waits on its uncommitted key and is sent back at the lock timeout;
// once it dies, the server rolls back the key and the business row together, nothing is left
// for anyone to finish, and the redelivery runs the event as new.
TEST_F(PostgresFaults, AOneTransactionConsumerKilledMidTransactionLeavesNothingBehind) {
  PostgresStore store(uri, {.table = log});
  store.migrate();
  idemgate::test::PgTerminal::create(uri, terminal);
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-10", "MSKU7000038");
  using OnceGate = idemgate::TransactionGate<
      PostgresStore, SlotRequest, std::string,
      std::function<std::string(pqxx::work&, const Key&, const SlotRequest&)>>;
  std::atomic<int> writes{0};
  const auto once_gate = [&](std::chrono::milliseconds lock_timeout) {
    return OnceGate("ect.claim_slot", store,
                    [&](pqxx::work& tx, const Key& k, const SlotRequest& r) {
                      ++writes;
                      booking_writer()(tx, k, r, "redelivered-slot");
                      return std::string("redelivered-slot");
                    },
                    {.lock_timeout = lock_timeout});
  };
  {
    idemgate::test::ChildProcess consumer({FAULT_CONSUMER_PATH, uri, log, bookings, terminal,
                                           "one_transaction_mid_write", "CIS-10", "MSKU7000038"});
    ASSERT_EQ(consumer.read_line(), "FAULT_POINT one_transaction_mid_write");
    EXPECT_EQ(pg_count("SELECT count(*) FROM " + log), 0) << "an uncommitted key is seen";
    auto impatient = once_gate(200ms);
    const auto waited = impatient.process(key, {"MSKU7000038", "2025-06-09T07:00"});
    EXPECT_EQ(waited.status(), Status::retry) << waited.reason();
    EXPECT_FALSE(waited.should_ack());
    consumer.kill_now();
  }
  EXPECT_EQ(writes.load(), 0);
  // The killed backend's transaction ends when the server sees its socket close; a redelivery
  // waits for that (the default lock timeout), then finds the key free.
  auto gate = once_gate(std::chrono::seconds(5));
  const auto redelivered = gate.process(key, {"MSKU7000038", "2025-06-09T07:00"});
  EXPECT_EQ(redelivered.status(), Status::processed) << redelivered.reason();
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + bookings), 1);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + bookings + " WHERE slot_id = 'own-slot'"), 0)
      << "the killed transaction's business row survived it";
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log + " WHERE status <> 'committed'"), 0);
  EXPECT_EQ(gate.process(key, {"MSKU7000038", "2025-06-09T07:00"}).status(), Status::duplicate);
  expect_invariants(uri, log, bookings, 1);
}

// A business write that commits the one transaction itself, before the outcome is stored: what
// it wrote commits with the key's row, and that row is answered `escalated` ever after, never as
// an empty outcome, for a human to settle.
TEST_F(PostgresFaults, AOneTransactionWriteThatCommitsItselfLeavesItsEventEscalated) {
  PostgresStore store(uri, {.table = log});
  store.migrate();
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-11", "MSKU7000039");
  idemgate::TransactionGate<PostgresStore, SlotRequest, std::string,
                            std::function<std::string(pqxx::work&, const Key&, const SlotRequest&)>>
      gate("ect.claim_slot", store, [&](pqxx::work& tx, const Key& k, const SlotRequest& r) {
        booking_writer()(tx, k, r, "own-slot");
        (void)pq::exec(tx, "COMMIT");
        return std::string("own-slot");
      });
  EXPECT_ANY_THROW((void)gate.process(key, {"MSKU7000039", "2025-06-09T07:00"}));
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + bookings), 1) << "the write's own COMMIT held";
  const auto again = gate.process(key, {"MSKU7000039", "2025-06-09T07:00"});
  EXPECT_EQ(again.status(), Status::escalated);
  EXPECT_NE(again.reason().find("ended its own transaction"), std::string::npos) << again.reason();
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + bookings), 1);
}

TEST_F(PostgresFaults, TwoReconcilersOverFiveHundredStaleRowsNeverDoubleWork) {
  PostgresStore seed(uri, {.table = log});
  seed.migrate();
  FakeTerminal<> fake;
  fake.ignores_keys = true;  // a row claimed twice would show as a second slot
  {
    Gate gate{"ect.claim_slot", seed, fake, booking_writer(), {.lease = 1ms}};
    for (int i = 0; i < 500; ++i) {
      const SlotRequest r{"C" + std::to_string(i), "w"};
      const std::string bytes = gate.encode_request(r);
      (void)gate.store().reserve(idemgate::derive_key("s", r.container),
                                 idemgate::detail::sha256(bytes), bytes, 1ms);
    }
  }
  std::this_thread::sleep_for(10ms);
  std::atomic<std::size_t> taken{0};
  std::vector<std::thread> reconcilers;
  for (int r = 0; r < 2; ++r)
    reconcilers.emplace_back([&] {
      PostgresStore store(uri, {.table = log});
      Gate gate{"ect.claim_slot", store, fake, booking_writer(), {.lease = 1min}};
      Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 25}};
      for (;;) {
        const auto report = reconciler.run_once();
        EXPECT_EQ(report.errors, 0u) << report.first_error;
        if (report.taken == 0) break;
        taken += report.taken;
      }
    });
  for (auto& t : reconcilers) t.join();
  EXPECT_EQ(taken.load(), 500u) << "every row taken exactly once";
  EXPECT_EQ(fake.calls(), 500) << "no row claimed twice";
  EXPECT_EQ(fake.slots_issued(), 500) << "every claim got through once";
  expect_invariants(uri, log, bookings, 500);
}

TEST_F(PostgresFaults, LostAcknowledgementAndServiceUnavailableBurstsNeverDoubleASlot) {
  PostgresStore store(uri, {.table = log, .pool_size = 4});
  store.migrate();
  FakeTerminal<> fake;
  std::atomic<int> answers{0};
  // Every third answer is lost after the terminal committed the slot; every fifth call meets a
  // 503 burst before it reaches the terminal; every seventh times out after committing.
  fake.before = [&](const SlotRequest&,
                    const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (++answers % 5 == 0) return idemgate::TransientFailure{"503 Service Unavailable"};
    return std::nullopt;
  };
  fake.after = [&](const Key&,
                   const std::string&) -> std::optional<idemgate::ClaimResult<std::string>> {
    const int n = answers.load();
    if (n % 3 == 0) return idemgate::TransientFailure{"connection reset after the request"};
    if (n % 7 == 0) return idemgate::TransientFailure{"read timeout"};
    return std::nullopt;
  };
  // The queue below redelivers at once, as fast as the loop turns: no back-off, so that its
  // redeliveries meet the faults instead of holds.
  Gate gate{"ect.claim_slot",
            store,
            fake,
            booking_writer(),
            {.retry_backoff = std::chrono::milliseconds(0)}};
  std::deque<int> queue;
  for (int i = 0; i < 60; ++i) queue.push_back(i);
  int redeliveries = 0;
  while (!queue.empty() && redeliveries < 10000) {
    const int i = queue.front();
    queue.pop_front();
    const SlotRequest r{"C" + std::to_string(i), "w"};
    const auto result = gate.process(idemgate::derive_key("s", r.container), r);
    if (!result.should_ack()) {
      queue.push_back(i);
      ++redeliveries;
    }
  }
  EXPECT_TRUE(queue.empty());
  EXPECT_GT(redeliveries, 0);
  // A lost answer makes the redelivery claim again (the gate cannot know the terminal committed
  // the slot): every such claim must carry its event's key, the same every time, and the
  // booked slot must be the one the terminal holds under that key.
  expect_every_claim_under_its_events_key(fake, "s", 60);
  EXPECT_GT(fake.calls(), 60) << "lost answers were claimed again";
  expect_invariants(uri, log, bookings, 60);
  for (int i = 0; i < 60; ++i) {
    const Key key = idemgate::derive_key("s", "C" + std::to_string(i));
    EXPECT_EQ(gate.store().find(key)->result, fake.lookup(key).outcome())
        << "event " << i << " booked a slot the terminal does not hold under its key";
  }
}

TEST(PostgresRestart, ServerRestartMidRunOfAThousandEventsLosesAndDoublesNothing) {
  idemgate::test::PgCluster cluster;
  const std::string uri = cluster.uri();
  const std::string log = "idemgate_log", bookings = "bookings";
  pg_exec_on(uri, idemgate::test::bookings_ddl(bookings));
  PostgresStore store(uri, {.table = log, .pool_size = 4, .checkout_timeout = 60s});
  store.migrate();
  FakeTerminal<> fake;
  Gate gate{
      "ect.claim_slot", store, fake, idemgate::test::PgBookingWriter{bookings}, {.lease = 500ms}};

  // 1,000 events, 300 of them delivered twice, shuffled.
  std::vector<int> deliveries;
  for (int i = 0; i < 1000; ++i) deliveries.push_back(i);
  for (int i = 0; i < 300; ++i) deliveries.push_back(i * 3);
  std::shuffle(deliveries.begin(), deliveries.end(), std::mt19937(7));
  std::mutex queue_mutex;
  std::deque<int> queue(deliveries.begin(), deliveries.end());
  std::atomic<int> acked{0}, store_errors{0}, other_errors{0};
  std::mutex other_error_mutex;
  std::string other_error;
  // A gate that never recovered would leave deliveries in the queue: the workers give up then.
  const auto give_up_at = std::chrono::steady_clock::now() + 3min;

  // After 400 acks the workers hold until the server is down, so that some deliveries meet the
  // outage however fast the rest of the queue would drain.
  std::atomic<bool> server_down{false};

  auto worker = [&] {
    while (std::chrono::steady_clock::now() < give_up_at) {
      while (acked.load() >= 400 && !server_down.load()) std::this_thread::sleep_for(1ms);
      int i;
      {
        std::lock_guard lock(queue_mutex);
        if (queue.empty()) return;
        i = queue.front();
        queue.pop_front();
      }
      const SlotRequest r{"C" + std::to_string(i), "w"};
      bool ack = false;
      try {
        ack = gate.process(idemgate::derive_key("restart", r.container), r).should_ack();
      } catch (const idemgate::StoreError&) {
        ++store_errors;  // the database is down: do not ack; the queue redelivers later
        std::this_thread::sleep_for(20ms);
      } catch (const std::exception& e) {
        ++other_errors;  // not what the store promises for an outage
        {
          std::lock_guard lock(other_error_mutex);
          other_error = e.what();
        }
        std::this_thread::sleep_for(20ms);
      }
      if (ack) {
        ++acked;
      } else {
        std::lock_guard lock(queue_mutex);
        queue.push_back(i);
      }
    }
  };
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) workers.emplace_back(worker);
  while (acked.load() < 400) std::this_thread::sleep_for(1ms);
  cluster.stop();
  server_down = true;
  std::this_thread::sleep_for(300ms);
  const int errors_while_down = store_errors.load();
  const int acked_before_restart = acked.load();
  cluster.start();
  for (auto& w : workers) w.join();
  EXPECT_GT(errors_while_down, 0) << "the outage was reported as a StoreError (do not ack)";
  EXPECT_EQ(other_errors.load(), 0) << "the outage surfaced as another exception: " << other_error;
  EXPECT_TRUE(queue.empty()) << queue.size() << " deliveries never acked after the restart";
  EXPECT_GT(acked.load(), acked_before_restart) << "the gate worked again after the restart";
  EXPECT_EQ(acked.load(), 1300) << "every delivery acked once, none dropped";

  std::this_thread::sleep_for(600ms);  // let the leases of interrupted rows expire
  Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 1000}};
  const auto report = reconciler.run_once();
  EXPECT_EQ(report.errors, 0u) << report.first_error;
  expect_every_claim_under_its_events_key(fake, "restart", 1000);
  expect_invariants(uri, log, bookings, 1000);
}

// Relaxed outcomes (PostgresOptions::relaxed_outcomes), on every path that commits a Gate's
// outcomes: two events processed and acked, then the database crashes. The outcomes its crash
// loses (the batch's both, or the last single event's: the next reservation's durable commit
// flushes the one before it) are rows in flight again under their durable reservations, without
// their bookings, and the reconciler finishes each under its original key: the slot the
// terminal handed out, one booking, no second claim. Without the option the same crash loses
// nothing.
class CrashAfterOutcomes : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(CrashAfterOutcomes, AnAckedOutcomeIsKeptOrFinishedByTheReconciler) {
  const std::string path = std::get<0>(GetParam());
  const bool relaxed = std::get<1>(GetParam());
  // The WAL writer waits 10 s and the background writer writes no pages, so a commit that did
  // not wait for its flush is still in the WAL buffers when the server crashes.
  idemgate::test::PgCluster cluster("-c wal_writer_delay=10s -c bgwriter_lru_maxpages=0");
  const std::string uri = cluster.uri(), log = "idemgate_log", bookings = "bookings";
  pg_exec_on(uri, idemgate::test::bookings_ddl(bookings));
  FakeTerminal<> fake;
  const std::vector<SlotRequest> requests{{"MSKU1000001", "w"}, {"MSKU1000002", "w"}};
  std::vector<idemgate::BatchMessage<SlotRequest>> batch;
  for (const SlotRequest& r : requests)
    batch.push_back({r.container, idemgate::derive_key("relaxed outcomes", r.container), r});
  std::vector<Status> answers;
  {
    PostgresStore store(uri, {.table = log, .relaxed_outcomes = relaxed});
    store.migrate();
    EXPECT_EQ(store.relaxed_outcomes(), relaxed);
    const auto run = [&](auto&& gate) {
      if (path == "batch" || path == "bulk") {
        for (const auto& item : gate.process_batch(batch).items())
          answers.push_back(item.result.status());
      } else {
        for (const auto& message : batch)
          answers.push_back(gate.process(message.key, message.request).status());
      }
    };
    if (path == "bulk")
      run(Gate{"ect.claim_slot",
               store,
               fake,
               idemgate::test::PgBulkBookingWriter{bookings},
               {.lease = 300ms}});
    else
      run(Gate{"ect.claim_slot",
               store,
               fake,
               idemgate::test::PgBookingWriter{bookings},
               {.lease = 300ms, .coalesce = {.enabled = path == "coalesced"}}});
  }
  ASSERT_EQ(answers, std::vector<Status>(2, Status::processed)) << "both acked";
  ASSERT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + bookings), 2);
  cluster.crash();
  cluster.start();

  const std::int64_t lost = !relaxed ? 0 : (path == "batch" || path == "bulk") ? 2 : 1;
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + log + " WHERE status = 'in_flight'"), lost)
      << "rows whose acked outcome the crash lost";
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + log), 2) << "every reservation survives";
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + bookings), 2 - lost);
  idemgate::test::expect_no_half_state(uri, log, bookings);

  PostgresStore store(uri, {.table = log});
  Gate gate{
      "ect.claim_slot", store, fake, idemgate::test::PgBookingWriter{bookings}, {.lease = 300ms}};
  Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  std::size_t found = 0;
  for (int i = 0; i < 100 && found < static_cast<std::size_t>(lost); ++i) {
    std::this_thread::sleep_for(50ms);  // until the leases taken before the crash run out
    const auto report = reconciler.run_once();
    EXPECT_EQ(report.errors, 0u) << report.first_error;
    found += report.found;
  }
  EXPECT_EQ(found, static_cast<std::size_t>(lost)) << "each finished from the terminal's answer";
  EXPECT_EQ(fake.calls(), 2) << "no event claimed twice";
  expect_every_claim_under_its_events_key(fake, "relaxed outcomes", 2);
  expect_invariants(uri, log, bookings, 2);
  for (const auto& message : batch)
    EXPECT_EQ(gate.process(message.key, message.request).status(), Status::duplicate);
}

INSTANTIATE_TEST_SUITE_P(
    EveryCommitPath, CrashAfterOutcomes,
    ::testing::Combine(::testing::Values("single", "coalesced", "batch", "bulk"),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<CrashAfterOutcomes::ParamType>& param_info) {
      return std::string(std::get<0>(param_info.param)) +
             (std::get<1>(param_info.param) ? "_relaxed" : "_durable");
    });

// A TransactionGate's commit is the only record of its event: it waits for its flush even on a
// store with relaxed outcomes, and the same crash keeps the row and its booking.
TEST(RelaxedOutcomes, AOneTransactionCommitStaysDurable) {
  idemgate::test::PgCluster cluster("-c wal_writer_delay=10s -c bgwriter_lru_maxpages=0");
  const std::string uri = cluster.uri(), log = "idemgate_log", bookings = "bookings";
  pg_exec_on(uri, idemgate::test::bookings_ddl(bookings));
  const Key key = idemgate::derive_key("relaxed outcomes", "one transaction");
  {
    PostgresStore store(uri, {.table = log, .relaxed_outcomes = true});
    store.migrate();
    idemgate::TransactionGate<
        PostgresStore, SlotRequest, std::string,
        std::function<std::string(pqxx::work&, const Key&, const SlotRequest&)>>
        gate("ect.claim_slot", store, [&](pqxx::work& tx, const Key& k, const SlotRequest& r) {
          idemgate::test::PgBookingWriter{bookings}(tx, k, r, "own-slot");
          return std::string("own-slot");
        });
    ASSERT_EQ(gate.process(key, {"MSKU1000003", "w"}).status(), Status::processed);
  }
  cluster.crash();
  cluster.start();
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + log + " WHERE status = 'committed'"), 1)
      << "the crash lost an acked one-transaction event";
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + bookings), 1);
}

TEST(RelaxedReservations, AnInFlightAnswerRestsOnAReservationThatSurvivesACrash) {
  // The WAL writer waits 10 s, so an unflushed relaxed reservation stays in the WAL buffers.
  idemgate::test::PgCluster cluster("-c wal_writer_delay=10s");
  const std::string log = "relaxed_log";
  PostgresStore first(cluster.uri(), {.table = log, .relaxed_reservations = true});
  first.migrate();
  PostgresStore second(cluster.uri(), {.table = log, .relaxed_reservations = true});
  const Key key = idemgate::derive_key("relaxed", "crash");
  const auto fingerprint = idemgate::detail::sha256("request");
  // A worker reserves (not flushed yet) and dies; the redelivery meets its live lease and is
  // answered "in flight", which the queue acks: nobody but the reconciler will finish the event.
  ASSERT_EQ(first.reserve(key, fingerprint, "request", 1min).kind,
            idemgate::Reservation::Kind::acquired);
  const auto redelivery = second.reserve(key, fingerprint, "request", 1min);
  ASSERT_EQ(redelivery.kind, idemgate::Reservation::Kind::existing);
  ASSERT_EQ(redelivery.status, RecordStatus::in_flight);
  cluster.crash();
  cluster.start();
  PostgresStore after(cluster.uri(), {.table = log});
  const auto row = after.find(key);
  ASSERT_TRUE(row.has_value())
      << "the database crash lost the reservation an acked in_flight answer rested on";
  EXPECT_EQ(row->status, RecordStatus::in_flight) << "the reconciler finishes it";
}
