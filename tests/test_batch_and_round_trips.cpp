// Round trips counted at the server, batches, relaxed reservations and the duplicate cache.
// With IDEMGATE_TEST_THROUGH=pgbouncer (a second ctest run), the stores go through PgBouncer in
// transaction pooling mode with PostgresPooling::transaction; the counts are read at the server.

#include "support/fake_terminal.hpp"
#include "support/pg_bookings.hpp"
#include "support/pgbouncer.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"
#include "support/taken_over_midway.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

using idemgate::BatchMessage;
using idemgate::CommitStatus;
using idemgate::Gate;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::PostgresStore;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::SlotRequest;
using idemgate::test::store_options;
using idemgate::test::store_uri;
namespace pq = idemgate::detail::pq;
using namespace std::chrono_literals;

namespace {

/// A database of its own, so statement counts at the server are this test's alone.
class OwnDatabase {
 public:
  OwnDatabase() {
    name_ = "rt_" + std::to_string(::getpid()) + "_" +
            std::to_string(reinterpret_cast<std::uintptr_t>(this) % 100000);
    idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + name_);
    idemgate::test::pg_exec("CREATE DATABASE " + name_);
    const std::string base = idemgate::test::pg_uri();
    uri_ = base.substr(0, base.rfind('/') + 1) + name_;
  }
  ~OwnDatabase() { idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)"); }
  const std::string& uri() const { return uri_; }
  const std::string& name() const { return name_; }

  void exec(const std::string& sql) const { idemgate::test::pg_exec_on(uri_, sql); }
  std::int64_t count(const std::string& sql) const {
    return idemgate::test::pg_count_on(uri_, sql);
  }

 private:
  std::string name_, uri_;
};

/// Statements the server ran in one database since the last reset, by text.
std::map<std::string, std::int64_t> statements_in(const OwnDatabase& db) {
  std::map<std::string, std::int64_t> calls;
  idemgate::test::pg_exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  const auto rows = idemgate::test::pg_exec(
      "SELECT query, calls FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
      "WHERE datname = '" +
      db.name() + "')");
  for (const auto& row : rows) calls[row[0].c_str()] += row[1].as<std::int64_t>();
  return calls;
}

std::int64_t total(const std::map<std::string, std::int64_t>& calls) {
  std::int64_t n = 0;
  for (const auto& [query, count] : calls) n += count;
  return n;
}

std::string describe(const std::map<std::string, std::int64_t>& calls) {
  std::string out;
  for (const auto& [query, count] : calls) out += std::to_string(count) + "x " + query + "\n";
  return out;
}

/// Takes out of `calls` the SAVEPOINT and RELEASE that ride in front of each status update after
/// a business write, in the same round trip (they make the update fail if the business write
/// ended the transaction itself), and answers how many such checks there were.
std::int64_t take_open_transaction_checks(std::map<std::string, std::int64_t>& calls) {
  const auto savepoints = calls.extract("SAVEPOINT idemgate_open");
  const auto releases = calls.extract("RELEASE SAVEPOINT idemgate_open");
  const std::int64_t s = savepoints ? savepoints.mapped() : 0;
  const std::int64_t r = releases ? releases.mapped() : 0;
  EXPECT_EQ(s, r) << "every check's savepoint is released at once";
  return s;
}

void reset_statement_counts() {
  // The view and the reset live in whichever database has the extension; they cover all.
  idemgate::test::pg_exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  idemgate::test::pg_exec("SELECT pg_stat_statements_reset()");
}

}  // namespace

TEST(RoundTrips, FirstDeliveryAddsTwoStatementsToTheBusinessWriteAndADuplicateCostsOne) {
  ASSERT_FALSE(idemgate::test::pg_uri().empty());
  OwnDatabase db;
  db.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  db.exec(idemgate::test::bookings_ddl("bookings"));
  PostgresStore store(store_uri(db.uri()), store_options({}));
  store.migrate();
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal, idemgate::test::PgBookingWriter{"bookings"}};
  ASSERT_EQ(gate.process(idemgate::derive_key("rt", "warm-up"), {"C0", "w"}).status(),
            Status::processed);  // statements are prepared on first use

  // The business write alone, in its own transaction, through the same driver.
  {
    auto lease = store.connection();
    reset_statement_counts();
    pqxx::work tx(lease.connection());
    idemgate::test::PgBookingWriter{"bookings"}(tx, idemgate::derive_key("rt", "bare"), {"C1", "w"},
                                                "slot-x");
    tx.commit();
  }
  const auto bare = statements_in(db);

  reset_statement_counts();
  ASSERT_EQ(gate.process(idemgate::derive_key("rt", "first"), {"C2", "w"}).status(),
            Status::processed);
  auto first = statements_in(db);
  EXPECT_EQ(take_open_transaction_checks(first), 1) << describe(first);

  reset_statement_counts();
  ASSERT_EQ(gate.process(idemgate::derive_key("rt", "first"), {"C2", "w"}).status(),
            Status::duplicate);
  const auto duplicate = statements_in(db);

  EXPECT_EQ(total(bare), 3) << describe(bare);
  EXPECT_LE(total(first) - total(bare), 2) << describe(first);
  EXPECT_EQ(total(duplicate), 1) << describe(duplicate);
  for (const auto& [query, count] : first)
    EXPECT_EQ(query.find("SELECT status, fence"), std::string::npos)
        << "the happy path makes no extra reads:\n"
        << describe(first);
}

TEST(RoundTrips, BatchOfTenReservesInOneStatementAndCommitsInOneTransaction) {
  ASSERT_FALSE(idemgate::test::pg_uri().empty());
  OwnDatabase db;
  db.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  db.exec(idemgate::test::bookings_ddl("bookings"));
  PostgresStore store(store_uri(db.uri()), store_options({}));
  store.migrate();
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal, idemgate::test::PgBookingWriter{"bookings"}};
  std::vector<BatchMessage<SlotRequest>> warm{{"m", idemgate::derive_key("b", "warm"), {"C", "w"}}};
  (void)gate.process_batch(warm);

  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back({"msg-" + std::to_string(i),
                     idemgate::derive_key("b", std::to_string(i)),
                     {"C" + std::to_string(i), "w"}});
  reset_statement_counts();
  const auto result = gate.process_batch(batch);
  auto calls = statements_in(db);
  for (const auto& item : result.items()) EXPECT_EQ(item.result.status(), Status::processed);
  // One reservation, BEGIN, ten business inserts each followed by its fenced update (so that a
  // business write that breaks the transaction is caught before the next one runs), COMMIT. Each
  // update carries its check in its own round trip.
  EXPECT_EQ(take_open_transaction_checks(calls), 10) << describe(calls);
  EXPECT_EQ(total(calls), 23) << describe(calls);
  EXPECT_EQ(db.count("SELECT count(*) FROM bookings"), 11);
}

TEST(RoundTrips, BatchOfTenWithABulkWriteIsOneReservationOneInsertOneUpdateAndOneCommit) {
  ASSERT_FALSE(idemgate::test::pg_uri().empty());
  OwnDatabase db;
  db.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  db.exec(idemgate::test::bookings_ddl("bookings"));
  PostgresStore store(store_uri(db.uri()), store_options({}));
  store.migrate();
  FakeTerminal<> terminal;
  std::atomic<int> calls{0};
  Gate gate{"ect.claim_slot", store, terminal,
            idemgate::test::PgBulkBookingWriter{"bookings", nullptr, &calls}};
  std::vector<BatchMessage<SlotRequest>> warm{
      {"m", idemgate::derive_key("b", "warm"), {"C", "w"}},
      {"n", idemgate::derive_key("b", "warm2"), {"D", "w"}}};
  (void)gate.process_batch(warm);

  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back({"msg-" + std::to_string(i),
                     idemgate::derive_key("b", std::to_string(i)),
                     {"C" + std::to_string(i), "w"}});
  calls = 0;
  reset_statement_counts();
  const auto result = gate.process_batch(batch);
  auto calls_at_server = statements_in(db);
  for (const auto& item : result.items()) EXPECT_EQ(item.result.status(), Status::processed);
  EXPECT_EQ(calls.load(), 1) << "one bulk write for the batch";
  // One reservation, BEGIN, the bulk INSERT, one fenced UPDATE for the ten rows (with its check
  // in its round trip), COMMIT.
  EXPECT_EQ(take_open_transaction_checks(calls_at_server), 1) << describe(calls_at_server);
  EXPECT_EQ(total(calls_at_server), 5) << describe(calls_at_server);
  EXPECT_EQ(db.count("SELECT count(*) FROM bookings"), 12);

  // A single event is the bulk write with one event: the same statements as the per-event form
  // (reservation, BEGIN, INSERT, fenced UPDATE, COMMIT).
  calls = 0;
  reset_statement_counts();
  ASSERT_EQ(gate.process(idemgate::derive_key("b", "single"), {"S", "w"}).status(),
            Status::processed);
  auto single = statements_in(db);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(take_open_transaction_checks(single), 1) << describe(single);
  EXPECT_EQ(total(single), 5) << describe(single);
}

TEST(Batch, ABatchLongerThanItsLeaseKeepsItsLeasesOnPostgres) {
  ASSERT_FALSE(idemgate::test::pg_uri().empty());
  OwnDatabase db;
  db.exec(idemgate::test::bookings_ddl("bookings"));
  PostgresStore store(store_uri(db.uri()), store_options({}));
  store.migrate();
  // A second consumer, where the redelivery lands: its handle on the gate's rows.
  const PostgresStore second(store_uri(db.uri()), store_options({}));
  auto other = second.for_gate("ect.claim_slot");
  FakeTerminal<> terminal;
  terminal.set_delay(80ms);  // 10 claims: 800 ms against a lease of 300 ms
  Gate gate{"ect.claim_slot",
            store,
            terminal,
            idemgate::test::PgBookingWriter{"bookings"},
            {.lease = 300ms}};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back({"msg-" + std::to_string(i),
                     idemgate::derive_key("slow", std::to_string(i)),
                     {"C" + std::to_string(i), "w"}});
  std::atomic<int> taken_over{0};
  std::thread redelivery([&] {
    std::this_thread::sleep_for(600ms);
    const std::string bytes = gate.encode_request(batch.back().request);
    const auto r = other.reserve(batch.back().key, idemgate::detail::sha256(bytes), bytes, 300ms);
    if (r.kind != idemgate::Reservation::Kind::existing) ++taken_over;
  });
  const auto result = gate.process_batch(batch);
  redelivery.join();
  EXPECT_EQ(taken_over.load(), 0) << "the batch's own lease was still live";
  for (const auto& item : result.items())
    EXPECT_EQ(item.result.status(), Status::processed) << item.message_id;
  EXPECT_EQ(db.count("SELECT count(*) FROM bookings"), 10);
}

TEST(Batch, ResultsPerMessageWithDuplicatesInsideTheBatchAndRetryIds) {
  MemoryStore store;
  FakeTerminal<> terminal;
  terminal.ignores_keys = true;
  int bookings = 0;
  Gate gate{"ect.claim_slot", store, terminal,
            [&](MemoryStore::transaction& tx, const SlotRequest&, const std::string&) {
              tx.on_commit([&] { ++bookings; });
            }};
  const Key done = idemgate::derive_key("b", "done");
  (void)gate.process(done, {"C0", "w"});
  terminal.before = [](const SlotRequest& r,
                       const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (r.container == "C503") return idemgate::TransientFailure{"503"};
    if (r.container == "C422") return idemgate::PermanentFailure{"422"};
    return std::nullopt;
  };
  const Key twice = idemgate::derive_key("b", "twice");
  std::vector<BatchMessage<SlotRequest>> batch{
      {"m1", twice, {"C1", "w"}},
      {"m2", done, {"C0", "w"}},
      {"m3", idemgate::derive_key("b", "503"), {"C503", "w"}},
      {"m4", twice, {"C1", "w"}},
      {"m5", idemgate::derive_key("b", "422"), {"C422", "w"}},
      {"m6", idemgate::derive_key("b", "bad"), {"C\n", "w"}},
  };
  const auto result = gate.process_batch(batch);
  ASSERT_EQ(result.items().size(), 6u);
  EXPECT_EQ(result.items()[0].result.status(), Status::processed);
  EXPECT_EQ(result.items()[1].result.status(), Status::duplicate);
  EXPECT_EQ(result.items()[2].result.status(), Status::retry);
  EXPECT_EQ(result.items()[3].result.status(), Status::duplicate);
  EXPECT_EQ(result.items()[3].result.outcome(), result.items()[0].result.outcome());
  EXPECT_EQ(result.items()[4].result.status(), Status::failed);
  EXPECT_EQ(result.items()[5].result.status(), Status::failed) << "an unencodable request";
  EXPECT_EQ(result.retry_ids(), std::vector<std::string>{"m3"});
  EXPECT_EQ(bookings, 2);
  // One claim per distinct new event of the batch (C1 once for m1 and m4, C503, C422), after
  // the one of the earlier delivery (C0); the terminal ignores keys, so each claim that got
  // through is a slot of its own.
  EXPECT_EQ(terminal.calls(), 4);
  EXPECT_EQ(terminal.slots_issued(), 2);
  EXPECT_EQ(terminal.slots_for("C1"), 1u);
}

class PostgresBatch : public idemgate::test::PgBookingsTest {};

TEST(Batch, SameKeyWithDifferentRequestsInOneBatchIsAConflict) {
  MemoryStore store;
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal,
            [](MemoryStore::transaction&, const SlotRequest&, const std::string&) {}};
  const Key key = idemgate::derive_key("b", "clash");
  std::vector<BatchMessage<SlotRequest>> batch{
      {"m1", key, {"C1", "w"}}, {"m2", key, {"C1", "other window"}}, {"m3", key, {"C1", "w"}}};
  const auto result = gate.process_batch(batch);
  EXPECT_EQ(result.items()[0].result.status(), Status::processed);
  EXPECT_EQ(result.items()[1].result.status(), Status::conflict);
  EXPECT_EQ(result.items()[2].result.status(), Status::duplicate);
  EXPECT_EQ(gate.process(key, {"C1", "other window"}).status(), Status::conflict)
      << "the same answer as process() gives";
}

TEST(Batch, UnusableFirstCopyDoesNotSinkAUsableLaterOne) {
  MemoryStore store;
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal,
            [](MemoryStore::transaction&, const SlotRequest&, const std::string&) {}};
  const Key key = idemgate::derive_key("b", "unusable first");
  std::vector<BatchMessage<SlotRequest>> batch{{"m1", key, {"C\n", "w"}}, {"m2", key, {"C", "w"}}};
  const auto result = gate.process_batch(batch);
  EXPECT_EQ(result.items()[0].result.status(), Status::failed);
  EXPECT_EQ(result.items()[1].result.status(), Status::processed);
}

TEST_F(PostgresBatch, BatchesFromFourThreadsWithOverlappingKeysClaimEachEventOnce) {
  PostgresStore store(store_uri(uri), store_options({.table = log, .pool_size = 4}));
  store.migrate();
  FakeTerminal<> terminal;
  terminal.ignores_keys = true;  // a second claim for an event would be a second slot
  Gate gate{"ect.claim_slot", store, terminal, booking_writer()};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&, w] {
      for (int b = 0; b < 10; ++b) {
        std::vector<BatchMessage<SlotRequest>> batch;
        for (int i = 0; i < 10; ++i) {
          const int event = (b * 10 + i + w * 3) % 60;  // the workers' batches overlap
          batch.push_back({"w" + std::to_string(w) + "-" + std::to_string(i),
                           idemgate::derive_key("batch", std::to_string(event)),
                           {"C" + std::to_string(event), "w"}});
        }
        for (const auto& item : gate.process_batch(batch).items())
          EXPECT_TRUE(item.result.should_ack()) << to_string(item.result.status());
      }
    });
  for (auto& t : workers) t.join();
  EXPECT_EQ(terminal.calls(), 60) << "each event claimed once";
  EXPECT_EQ(terminal.slots_issued(), 60);
  EXPECT_EQ(booking_count(), 60);
  EXPECT_EQ(idemgate::test::pg_count("SELECT count(DISTINCT source_event) FROM " + bookings), 60);
}

TEST_F(PostgresBatch, OneRefusedBusinessWriteDoesNotTakeTheOthersDown) {
  PostgresStore store(store_uri(uri), store_options({.table = log}));
  store.migrate();
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal,
            [&](pqxx::work& tx, const Key& key, const SlotRequest& r, const std::string& slot) {
              if (r.container == "REFUSED") throw std::runtime_error("TMS refused");
              booking_writer()(tx, key, r, slot);
            }};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 5; ++i)
    batch.push_back({"m" + std::to_string(i),
                     idemgate::derive_key("refuse", std::to_string(i)),
                     {i == 2 ? "REFUSED" : "C" + std::to_string(i), "w"}});
  const auto result = gate.process_batch(batch);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(result.items()[static_cast<std::size_t>(i)].result.status(),
              i == 2 ? Status::retry : Status::processed)
        << i;
  EXPECT_EQ(result.retry_ids(), std::vector<std::string>{"m2"});
  EXPECT_EQ(booking_count(), 4);
  EXPECT_EQ(gate.store().find(idemgate::derive_key("refuse", "2"))->status,
            RecordStatus::in_flight);
}

TEST_F(PostgresBatch, AnItemWhoseLeaseWasTakenOverCommitsNothingOfTheBatch) {
  PostgresStore store(store_uri(uri), store_options({.table = log}));
  store.migrate();
  const std::string request = "request";
  const idemgate::Fingerprint fingerprint = idemgate::detail::sha256(request);
  std::vector<Key> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(idemgate::derive_key("stale batch", std::to_string(i)));
    ASSERT_EQ(store.reserve(keys.back(), fingerprint, request, 1min).fence, 1);
  }
  // The middle event's lease ended and its redelivery took it over under fence 2.
  ASSERT_TRUE(store.release(keys[1], 1));
  const auto taken = store.reserve(keys[1], fingerprint, request, 1min);
  ASSERT_EQ(taken.kind, idemgate::Reservation::Kind::taken_over);
  ASSERT_EQ(taken.fence, 2);

  // A batch that still presents fence 1 for all three commits nothing at all: not the stale
  // item, not the others, no business row. The caller then commits item by item.
  const std::vector<idemgate::CommitItem> items{
      {keys[0], 1, "slot-0"}, {keys[1], 1, "slot-1"}, {keys[2], 1, "slot-2"}};
  const auto statuses = store.commit_batch(items, [&](pqxx::work& tx, std::size_t i) {
    booking_writer()(tx, items[i].key, {"C" + std::to_string(i), "w"},
                     std::string(items[i].result));
  });
  EXPECT_FALSE(statuses.has_value()) << "a fence moved: the batch must not commit";
  EXPECT_EQ(booking_count(), 0);
  for (const Key& key : keys) EXPECT_EQ(store.find(key)->status, RecordStatus::in_flight);
  EXPECT_EQ(store.find(keys[1])->fence, 2) << "the redelivery still holds its event";

  // Through the gate: a worker stalls on one event of its batch past the lease, a redelivery
  // takes that event over; the batch commits the other two and loses that one.
  // The consumer where the redelivery lands: its handle on the gate's rows.
  const PostgresStore second(store_uri(uri), store_options({.table = log}));
  auto other = second.for_gate("ect.claim_slot");
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal, booking_writer()};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 3; ++i)
    batch.push_back({"m" + std::to_string(i),
                     idemgate::derive_key("stale gate batch", std::to_string(i)),
                     {"C" + std::to_string(i), "w"}});
  idemgate::test::take_over_midway(terminal, gate, other, batch[1]);
  const auto result = gate.process_batch(batch);
  EXPECT_EQ(result.items()[0].result.status(), Status::processed);
  EXPECT_EQ(result.items()[1].result.status(), Status::lost_lease);
  EXPECT_EQ(result.items()[2].result.status(), Status::processed);
  EXPECT_EQ(booking_count(), 2);
  EXPECT_EQ(gate.store().find(batch[1].key)->status, RecordStatus::in_flight);
}

TEST_F(PostgresBatch, ABulkCommitWithAMovedFenceCommitsNothingAndOnlyThatEventLosesItsLease) {
  PostgresStore store(store_uri(uri), store_options({.table = log}));
  store.migrate();
  const std::string request = "request";
  const idemgate::Fingerprint fingerprint = idemgate::detail::sha256(request);
  std::vector<Key> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(idemgate::derive_key("stale bulk", std::to_string(i)));
    ASSERT_EQ(store.reserve(keys.back(), fingerprint, request, 1min).fence, 1);
  }
  ASSERT_TRUE(store.release(keys[1], 1));
  ASSERT_EQ(store.reserve(keys[1], fingerprint, request, 1min).fence, 2);

  // The store: one bulk write and one fenced update for all three, which changes two rows of
  // three: nothing is committed, not even the bulk write's rows.
  const std::vector<idemgate::CommitItem> items{
      {keys[0], 1, "slot-0"}, {keys[1], 1, "slot-1"}, {keys[2], 1, "slot-2"}};
  int writes = 0;
  const auto statuses = store.commit_bulk(items, [&](pqxx::work& tx) {
    ++writes;
    for (const auto& item : items)
      booking_writer()(tx, item.key, {"C", "w"}, std::string(item.result));
  });
  EXPECT_FALSE(statuses.has_value()) << "a fence moved: the batch must not commit";
  EXPECT_EQ(writes, 1);
  EXPECT_EQ(booking_count(), 0);
  for (const Key& key : keys) EXPECT_EQ(store.find(key)->status, RecordStatus::in_flight);
  EXPECT_EQ(store.find(keys[1])->fence, 2) << "the redelivery still holds its event";
  // The same fences that all hold commit together.
  const std::vector<idemgate::CommitItem> held{{keys[0], 1, "slot-0"}, {keys[2], 1, "slot-2"}};
  const auto together = store.commit_bulk(held, [&](pqxx::work& tx) {
    for (const auto& item : held)
      booking_writer()(tx, item.key, {"C", "w"}, std::string(item.result));
  });
  ASSERT_TRUE(together.has_value());
  EXPECT_EQ(*together, std::vector<CommitStatus>(2, CommitStatus::committed));
  EXPECT_EQ(booking_count(), 2);

  // Through the gate: a redelivery takes the middle event over while the batch works; the bulk
  // commit is refused whole, and the gate commits the events one by one, each with a bulk write
  // of one event: the middle one loses its lease, the others commit.
  const PostgresStore second(store_uri(uri), store_options({.table = log}));
  auto other = second.for_gate("ect.claim_slot");
  FakeTerminal<> terminal;
  std::atomic<int> events{0}, calls{0};
  Gate gate{"ect.claim_slot", store, terminal,
            idemgate::test::PgBulkBookingWriter{bookings, &events, &calls}};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 3; ++i)
    batch.push_back({"m" + std::to_string(i),
                     idemgate::derive_key("stale bulk gate", std::to_string(i)),
                     {"C" + std::to_string(i), "w"}});
  idemgate::test::take_over_midway(terminal, gate, other, batch[1]);
  const auto result = gate.process_batch(batch);
  EXPECT_EQ(result.items()[0].result.status(), Status::processed);
  EXPECT_EQ(result.items()[1].result.status(), Status::lost_lease);
  EXPECT_EQ(result.items()[2].result.status(), Status::processed);
  EXPECT_EQ(calls.load(), 4) << "the refused bulk write, then one per event";
  EXPECT_EQ(events.load(), 6);
  EXPECT_EQ(booking_count(), 4);
  EXPECT_EQ(gate.store().find(batch[1].key)->status, RecordStatus::in_flight);
  EXPECT_EQ(gate.store().find(batch[1].key)->fence, 2);
  expect_no_half_state();
}

TEST_F(PostgresBatch, ABulkWriteThatThrowsForOneEventCostsOnlyThatEvent) {
  PostgresStore store(store_uri(uri), store_options({.table = log}));
  store.migrate();
  FakeTerminal<> terminal;
  std::atomic<int> calls{0};
  idemgate::test::PgBulkBookingWriter writer{bookings, nullptr, &calls};
  writer.after = [](pqxx::work&, auto events) {
    for (const auto& event : events)
      if (event.request.container == "REFUSED") throw std::runtime_error("TMS refused");
  };
  Gate gate{"ect.claim_slot", store, terminal, writer};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 5; ++i)
    batch.push_back({"m" + std::to_string(i),
                     idemgate::derive_key("bulk refuse", std::to_string(i)),
                     {i == 2 ? "REFUSED" : "C" + std::to_string(i), "w"}});
  const auto result = gate.process_batch(batch);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(result.items()[static_cast<std::size_t>(i)].result.status(),
              i == 2 ? Status::retry : Status::processed)
        << i;
  EXPECT_EQ(result.retry_ids(), std::vector<std::string>{"m2"});
  EXPECT_EQ(calls.load(), 6) << "the batch's call, then one per event";
  EXPECT_EQ(booking_count(), 4);
  const auto refused = gate.store().find(batch[2].key);
  EXPECT_EQ(refused->status, RecordStatus::in_flight);
  EXPECT_LT(refused->lease_until, std::chrono::system_clock::now())
      << "its lease was ended for the redelivery";
  expect_no_half_state();
}

TEST_F(PostgresBatch, ABulkWriteWhoseSqlFailsForOneEventCostsOnlyThatEvent) {
  idemgate::test::pg_exec("ALTER TABLE " + bookings + " ADD CHECK (container <> 'BAD')");
  PostgresStore store(store_uri(uri), store_options({.table = log}));
  store.migrate();
  FakeTerminal<> terminal;
  std::atomic<int> calls{0};
  Gate gate{"ect.claim_slot", store, terminal,
            idemgate::test::PgBulkBookingWriter{bookings, nullptr, &calls}};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 4; ++i)
    batch.push_back({"m" + std::to_string(i),
                     idemgate::derive_key("bulk sql", std::to_string(i)),
                     {i == 1 ? "BAD" : "C" + std::to_string(i), "w"}});
  const auto result = gate.process_batch(batch);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(result.items()[static_cast<std::size_t>(i)].result.status(),
              i == 1 ? Status::retry : Status::processed)
        << i << ": " << result.items()[static_cast<std::size_t>(i)].result.reason();
  EXPECT_EQ(calls.load(), 5) << "the batch's call, then one per event";
  EXPECT_EQ(booking_count(), 3);
  EXPECT_EQ(gate.store().find(batch[1].key)->status, RecordStatus::in_flight);
  expect_no_half_state();
}

TEST_F(PostgresBatch, ABulkWriteThatSwallowsAnSqlErrorCommitsNothingAndGivesEveryLeaseBack) {
  PostgresStore store(store_uri(uri), store_options({.table = log}));
  store.migrate();
  FakeTerminal<> terminal;
  std::atomic<int> calls{0};
  idemgate::test::PgBulkBookingWriter writer{bookings, nullptr, &calls};
  writer.after = [](pqxx::work& tx, auto) {
    try {
      pq::exec(tx, "SELECT * FROM no_such_table");
    } catch (const pqxx::sql_error&) {
      // swallowed: the transaction is broken, and the write goes on
    }
  };
  Gate gate{"ect.claim_slot", store, terminal, writer};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 3; ++i)
    batch.push_back({"m" + std::to_string(i),
                     idemgate::derive_key("bulk swallow", std::to_string(i)),
                     {"C" + std::to_string(i), "w"}});
  const auto result = gate.process_batch(batch);
  for (const auto& item : result.items()) EXPECT_EQ(item.result.status(), Status::retry);
  EXPECT_EQ(calls.load(), 1) << "nothing runs again outside the broken transaction";
  EXPECT_EQ(booking_count(), 0);
  for (const auto& message : batch) {
    const auto row = gate.store().find(message.key);
    EXPECT_EQ(row->status, RecordStatus::in_flight);
    EXPECT_LT(row->lease_until, std::chrono::system_clock::now()) << "its lease was given back";
  }
}

TEST_F(PostgresBatch, EveryBatchReservationThatMeetsAKeyIsCountedOnItsRow) {
  PostgresStore store(store_uri(uri), store_options({.table = log}));
  store.migrate();
  const std::string request = "request";
  const idemgate::Fingerprint fingerprint = idemgate::detail::sha256(request);
  const Key a = idemgate::derive_key("counted", "a");
  const Key b = idemgate::derive_key("counted", "b");
  const Key c = idemgate::derive_key("counted", "c");
  auto reserve = [&](const std::vector<Key>& keys) {
    std::vector<idemgate::ReserveItem> items;
    for (const Key& key : keys) items.push_back({key, fingerprint, request});
    return store.reserve_batch(items, 1min);
  };
  for (const auto& r : reserve({a, b})) EXPECT_EQ(r.kind, idemgate::Reservation::Kind::acquired);
  const auto again = reserve({a, b, c});  // a and b met again (in flight), c new
  EXPECT_EQ(again[0].kind, idemgate::Reservation::Kind::existing);
  EXPECT_EQ(again[2].kind, idemgate::Reservation::Kind::acquired);
  ASSERT_EQ(store.commit(b, 1, "slot-b", [](pqxx::work&) {}), idemgate::CommitStatus::committed);
  const auto third = reserve({a, b});  // both met once more, b now committed
  EXPECT_EQ(third[1].status, RecordStatus::committed);

  EXPECT_EQ(store.find(a)->duplicates, 2);
  EXPECT_EQ(store.find(b)->duplicates, 2);
  EXPECT_EQ(store.find(c)->duplicates, 0);
  EXPECT_EQ(store.signals(1h).duplicates, 4) << "the duplicate signal sees the batches' meetings";
}

TEST_F(PostgresBatch, RelaxedReservationsKeepExclusionAndCommitsDurable) {
  PostgresStore store(store_uri(uri),
                      store_options({.table = log, .pool_size = 4, .relaxed_reservations = true}));
  store.migrate();
  EXPECT_TRUE(store.relaxed_reservations());
  {
    auto lease = store.connection();
    pqxx::nontransaction tx(lease.connection());
    EXPECT_EQ(std::string(pq::exec(tx, "SHOW synchronous_commit")[0][0].c_str()), "on")
        << "commits stay durable";
  }
  FakeTerminal<> terminal;
  terminal.set_delay(20ms);
  Gate gate{"ect.claim_slot", store, terminal, booking_writer()};
  std::vector<std::thread> racers;
  for (int t = 0; t < 8; ++t)
    racers.emplace_back([&] {
      (void)gate.process(idemgate::derive_key("relaxed", "1"), {"C", "w"});
    });
  for (auto& t : racers) t.join();
  EXPECT_EQ(terminal.calls(), 1) << "exclusion is unchanged";
  EXPECT_EQ(booking_count(), 1);
}

TEST_F(PostgresBatch, RelaxedReservationsSkipTheFlushAndAnInFlightAnswerWaitsForOne) {
  PostgresStore store(store_uri(uri), store_options({.table = log, .relaxed_reservations = true}));
  store.migrate();
  // Every write to the log notes the synchronous_commit it ran under, in order.
  const std::string notes = log + "_notes";
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + notes);
  idemgate::test::pg_exec("DROP FUNCTION IF EXISTS " + notes + "_add()");
  idemgate::test::pg_exec("CREATE TABLE " + notes + " (n bigserial, op text, sync text)");
  idemgate::test::pg_exec("CREATE FUNCTION " + notes +
                          "_add() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO " +
                          notes +
                          " (op, sync) VALUES (TG_OP, current_setting('synchronous_commit')); "
                          "RETURN NULL; END $$");
  idemgate::test::pg_exec("CREATE TRIGGER note AFTER INSERT OR UPDATE ON " + log +
                          " FOR EACH ROW EXECUTE FUNCTION " + notes + "_add()");
  // The notes since the last call, as "OP synchronous_commit", in the order they were written.
  auto written = [&] {
    std::vector<std::string> seen;
    for (const auto& row : idemgate::test::pg_exec("WITH d AS (DELETE FROM " + notes +
                                                   " RETURNING n, op, sync) SELECT op || ' ' || "
                                                   "sync FROM d ORDER BY n"))
      seen.emplace_back(row[0].c_str());
    return seen;
  };
  using Notes = std::vector<std::string>;
  const std::string request = "request";
  const idemgate::Fingerprint fingerprint = idemgate::detail::sha256(request);
  const Key a = idemgate::derive_key("relaxed notes", "a");
  const Key b = idemgate::derive_key("relaxed notes", "b");

  ASSERT_EQ(store.reserve(a, fingerprint, request, 1min).kind,
            idemgate::Reservation::Kind::acquired);
  EXPECT_EQ(written(), (Notes{"INSERT off"})) << "a reservation does not wait for the flush";

  ASSERT_EQ(store.reserve(a, fingerprint, request, 1min).status, RecordStatus::in_flight);
  EXPECT_EQ(written(), (Notes{"UPDATE off", "UPDATE on"}))
      << "the duplicate is counted without a flush, then one synchronous commit flushes the "
         "other attempt's reservation before the in-flight answer goes out";

  std::vector<idemgate::ReserveItem> items{{b, fingerprint, request}, {a, fingerprint, request}};
  const auto batch = store.reserve_batch(items, 1min);
  ASSERT_EQ(batch[0].kind, idemgate::Reservation::Kind::acquired);
  ASSERT_EQ(batch[1].status, RecordStatus::in_flight);
  Notes notes_of_batch = written();
  std::sort(notes_of_batch.begin(), notes_of_batch.end());
  EXPECT_EQ(notes_of_batch, (Notes{"INSERT off", "UPDATE off", "UPDATE on"}))
      << "the batch's statement relaxed, one synchronous commit for its in-flight answer";

  ASSERT_EQ(store.commit(b, 1, "slot-b", [](pqxx::work&) {}), idemgate::CommitStatus::committed);
  EXPECT_EQ(written(), (Notes{"UPDATE on"})) << "commits stay durable";
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + notes);
  idemgate::test::pg_exec("DROP FUNCTION IF EXISTS " + notes + "_add() CASCADE");
}

TEST_F(PostgresBatch, RelaxedReservationLostInACrashIsNeverAcked) {
  PostgresStore store(store_uri(uri), store_options({.table = log, .relaxed_reservations = true}));
  store.migrate();
  FakeTerminal<> terminal;
  // The database loses the asynchronously committed reservation while the downstream works.
  terminal.after = [&](const Key& key,
                       const std::string&) -> std::optional<idemgate::ClaimResult<std::string>> {
    idemgate::test::pg_exec("DELETE FROM " + log + " WHERE key = '" + pq::bytea_param(key.view()) +
                            "'::bytea");
    return std::nullopt;
  };
  Gate gate{"ect.claim_slot", store, terminal, booking_writer()};
  const Key key = idemgate::derive_key("relaxed", "lost");
  EXPECT_THROW((void)gate.process(key, {"C", "w"}), idemgate::StoreError)
      << "do not ack: nobody else holds this event";
  terminal.after = nullptr;
  const auto redelivered = gate.process(key, {"C", "w"});
  EXPECT_EQ(redelivered.status(), Status::processed) << "the redelivery";
  // The lost reservation took the gate's memory of the first claim with it: the redelivery
  // claims again, and only the repeated key turns that claim into the first slot.
  EXPECT_EQ(terminal.keys_claimed(), (std::vector<Key>{key, key}))
      << "the downstream's key was the safety net";
  EXPECT_EQ(redelivered.outcome(), "slot-1");
  EXPECT_EQ(booking_count(), 1);
}

TEST_F(PostgresBatch, RelaxedReservationsAreRefusedWhenTheDownstreamIgnoresKeys) {
  PostgresStore store(store_uri(uri), store_options({.table = log, .relaxed_reservations = true}));
  FakeTerminal<false> blind;
  auto make = [&] {
    Gate gate{"ect.claim_slot", store, blind, booking_writer()};
    (void)gate;
  };
  EXPECT_THROW(make(), std::invalid_argument);
}

TEST(Cache, HotDuplicatesAreAnsweredWithoutTheStoreAndInFlightKeysAreNeverCached) {
  MemoryStore store;
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot",
            store,
            terminal,
            [](MemoryStore::transaction&, const SlotRequest&, const std::string&) {},
            {.cache_capacity = 2}};
  const Key a = idemgate::derive_key("cache", "a");
  ASSERT_EQ(gate.process(a, {"A", "w"}).status(), Status::processed);
  const auto before = gate.store().find(a)->duplicates;
  for (int i = 0; i < 5; ++i) {
    const auto again = gate.process(a, {"A", "w"});
    EXPECT_EQ(again.status(), Status::duplicate);
    EXPECT_EQ(again.outcome(), "slot-1");
  }
  EXPECT_EQ(gate.store().find(a)->duplicates, before) << "answered from the cache";
  EXPECT_EQ(gate.process(a, {"A", "other"}).status(), Status::conflict);

  // An in-flight key is asked of the store every time.
  const Key b = idemgate::derive_key("cache", "b");
  const std::string bytes = gate.encode_request({"B", "w"});
  (void)gate.store().reserve(b, idemgate::detail::sha256(bytes), bytes, 1min);
  EXPECT_EQ(gate.process(b, {"B", "w"}).status(), Status::in_flight);
  EXPECT_EQ(gate.process(b, {"B", "w"}).status(), Status::in_flight);
  EXPECT_EQ(gate.store().find(b)->duplicates, 2);

  // The cache is bounded: the least recently used key falls out and is asked of the store.
  (void)gate.process(idemgate::derive_key("cache", "c"), {"C", "w"});
  (void)gate.process(idemgate::derive_key("cache", "d"), {"D", "w"});
  (void)gate.process(a, {"A", "w"});
  EXPECT_EQ(gate.store().find(a)->duplicates, before + 1);
}
