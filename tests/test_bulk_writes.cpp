// Bulk business writes (one call with every event a batch commits) on MemoryStore and
// SqliteStore: one call per batch, and the guarantees of the per-event form per event — a fence
// that moved, a write that throws or whose statement fails, a write that ends the store's
// transaction. The PostgreSQL cases are in test_batch_and_round_trips and test_wire_faults.

#include "support/fake_terminal.hpp"
#include "support/slot_request.hpp"
#include "support/sqlite_files.hpp"
#include "support/taken_over_midway.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

using idemgate::BatchMessage;
using idemgate::Gate;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::RecordStatus;
using idemgate::SqliteStore;
using idemgate::SqliteTransaction;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

namespace {

using Events = std::span<const idemgate::CommittedEvent<SlotRequest, std::string>>;

constexpr const char* gate_name = "ect.claim_slot";

/// MemoryStore, its bookings written when its transaction commits.
struct MemoryEnv {
  using Store = MemoryStore;
  MemoryStore store;
  std::mutex mutex;
  std::vector<std::string> booked;

  void book(MemoryStore::transaction& tx, Events events) {
    for (const auto& event : events)
      tx.on_commit([this, container = event.request.container] {
        std::lock_guard lock(mutex);
        booked.push_back(container);
      });
  }
  std::int64_t bookings() {
    std::lock_guard lock(mutex);
    return static_cast<std::int64_t>(booked.size());
  }
  /// A statement of the business write that fails (MemoryStore has none: it throws).
  static void failing_statement(MemoryStore::transaction&) {
    throw std::runtime_error("the statement failed");
  }
};

/// SqliteStore on a fresh file, its bookings in a table beside the log.
struct SqliteEnv {
  using Store = SqliteStore;
  idemgate::test::sqlite::Fixture fixture;
  SqliteStore& store = fixture.store;

  static void book(SqliteTransaction& tx, Events events) {
    for (const auto& event : events)
      tx.exec("INSERT INTO bookings (container, slot, source_event) VALUES (?, ?, ?)",
              event.request.container, event.outcome, event.key);
  }
  std::int64_t bookings() const {
    return idemgate::test::sqlite::count(fixture.db, "SELECT count(*) FROM bookings");
  }
  static void failing_statement(SqliteTransaction& tx) {
    tx.exec("INSERT INTO no_such_table VALUES (1)");
  }
};

std::vector<BatchMessage<SlotRequest>> batch_of(const std::string& name, int n,
                                                std::vector<std::string> containers = {}) {
  std::vector<BatchMessage<SlotRequest>> messages;
  for (int i = 0; i < n; ++i) {
    const auto at = static_cast<std::size_t>(i);
    messages.push_back(
        {"m" + std::to_string(i),
         idemgate::derive_key(name, std::to_string(i)),
         {at < containers.size() && !containers[at].empty() ? containers[at]
                                                            : "C" + std::to_string(i),
          "w"}});
  }
  return messages;
}

template <class Env>
class BulkWrites : public ::testing::Test {
 protected:
  using Transaction = typename Env::Store::transaction;

  /// The bulk write: books every event it is given, then runs `after` (a test's fault); counts
  /// the events of each call.
  auto writer() {
    return [this](Transaction& tx, Events events) {
      calls.push_back(events.size());
      env.book(tx, events);
      if (after) after(tx, events);
    };
  }

  Env env;
  std::vector<std::size_t> calls;
  std::function<void(Transaction&, Events)> after;
  FakeTerminal<> terminal;
};

using Stores = ::testing::Types<MemoryEnv, SqliteEnv>;
TYPED_TEST_SUITE(BulkWrites, Stores);

}  // namespace

TYPED_TEST(BulkWrites, ABatchCallsTheWriteOnceWithEveryEventItCommitsAndProcessWithOne) {
  Gate gate{gate_name, this->env.store, this->terminal, this->writer()};
  static_assert(decltype(gate)::bulk_writes);
  auto batch = batch_of("bulk once", 10);
  batch.push_back(batch[0]);  // a copy in the same batch: answered from its first
  batch.back().message_id = "copy";
  const auto result = gate.process_batch(batch);
  for (std::size_t i = 0; i < 10; ++i)
    EXPECT_EQ(result.items()[i].result.status(), Status::processed) << i;
  EXPECT_EQ(result.items()[10].result.status(), Status::duplicate);
  EXPECT_EQ(this->calls, std::vector<std::size_t>{10});
  EXPECT_EQ(this->env.bookings(), 10);
  for (const auto& message : batch)
    EXPECT_EQ(gate.store().find(message.key)->status, RecordStatus::committed);

  EXPECT_EQ(gate.process(idemgate::derive_key("bulk once", "single"), {"S", "w"}).status(),
            Status::processed);
  EXPECT_EQ(this->calls, (std::vector<std::size_t>{10, 1}));
  // The batch delivered again: answered from the log, nothing written.
  for (const auto& item : gate.process_batch(batch).items())
    EXPECT_EQ(item.result.status(), Status::duplicate);
  EXPECT_EQ(this->calls.size(), 2u);
  EXPECT_EQ(this->env.bookings(), 11);
}

TYPED_TEST(BulkWrites, AnEventTakenOverMidBatchLosesOnlyItsOwnLeaseAndTheOthersCommit) {
  Gate gate{gate_name, this->env.store, this->terminal, this->writer()};
  auto other = this->env.store.for_gate(gate_name);  // where the redelivery lands
  const auto batch = batch_of("bulk taken over", 3);
  idemgate::test::take_over_midway(this->terminal, gate, other, batch[1]);
  const auto result = gate.process_batch(batch);
  EXPECT_EQ(result.items()[0].result.status(), Status::processed);
  EXPECT_EQ(result.items()[1].result.status(), Status::lost_lease);
  EXPECT_EQ(result.items()[2].result.status(), Status::processed);
  EXPECT_EQ(this->env.bookings(), 2) << "the batch's write committed nothing of the lost event";
  ASSERT_GE(this->calls.size(), 2u) << "committed one by one after the batch was refused";
  EXPECT_EQ(this->calls.back(), 1u);
  EXPECT_EQ(gate.store().find(batch[1].key)->status, RecordStatus::in_flight);
  EXPECT_EQ(gate.store().find(batch[1].key)->fence, 2);
}

TYPED_TEST(BulkWrites, AWriteThatThrowsForOneEventCostsOnlyThatEvent) {
  Gate gate{gate_name, this->env.store, this->terminal, this->writer()};
  this->after = [](auto&, Events events) {
    for (const auto& event : events)
      if (event.request.container == "REFUSED") throw std::domain_error("the TMS refused");
  };
  const auto batch = batch_of("bulk throws", 5, {"", "", "REFUSED"});
  const auto result = gate.process_batch(batch);
  for (std::size_t i = 0; i < 5; ++i)
    EXPECT_EQ(result.items()[i].result.status(), i == 2 ? Status::retry : Status::processed) << i;
  EXPECT_EQ(result.retry_ids(), std::vector<std::string>{"m2"});
  EXPECT_EQ(this->calls, (std::vector<std::size_t>{5, 1, 1, 1, 1, 1}));
  EXPECT_EQ(this->env.bookings(), 4);
  const auto refused = gate.store().find(batch[2].key);
  EXPECT_EQ(refused->status, RecordStatus::in_flight);
  EXPECT_LT(refused->lease_until, std::chrono::system_clock::now())
      << "its lease was ended for the redelivery";
}

TYPED_TEST(BulkWrites, AWriteWhoseStatementFailsForOneEventCostsOnlyThatEvent) {
  Gate gate{gate_name, this->env.store, this->terminal, this->writer()};
  this->after = [](auto& tx, Events events) {
    for (const auto& event : events)
      if (event.request.container == "BAD") TypeParam::failing_statement(tx);
  };
  const auto batch = batch_of("bulk statement", 4, {"", "BAD"});
  const auto result = gate.process_batch(batch);
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_EQ(result.items()[i].result.status(), i == 1 ? Status::retry : Status::processed) << i;
  EXPECT_EQ(this->env.bookings(), 3);
  EXPECT_EQ(gate.store().find(batch[1].key)->status, RecordStatus::in_flight);
}

// A bulk write that ended the store's transaction and went on: nothing may run again item by
// item (its statements after the end ran outside the transaction); every message answers retry
// and every lease is given back.
TEST(SqliteBulkWrite, AWriteThatEndsTheTransactionCommitsNothingAndGivesEveryLeaseBack) {
  SqliteEnv env;
  FakeTerminal<> terminal;
  int calls = 0;
  Gate gate{gate_name, env.store, terminal, [&](SqliteTransaction& tx, Events events) {
              ++calls;
              SqliteEnv::book(tx, events);
              sqlite3_exec(tx.db(), "ROLLBACK", nullptr, nullptr, nullptr);
            }};
  const auto batch = batch_of("bulk ends", 3);
  const auto result = gate.process_batch(batch);
  for (const auto& item : result.items()) EXPECT_EQ(item.result.status(), Status::retry);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(env.bookings(), 0);
  for (const auto& message : batch) {
    const auto row = gate.store().find(message.key);
    EXPECT_EQ(row->status, RecordStatus::in_flight);
    EXPECT_LT(row->lease_until, std::chrono::system_clock::now()) << "its lease was given back";
  }
}

// SqliteStore::commit_bulk on its own: a fence that moved in the middle refuses the whole batch
// before the write runs; fences that all hold commit in one transaction with one write.
TEST(SqliteBulkWrite, CommitBulkIsAllOrNothing) {
  SqliteEnv env;
  auto& store = env.store;
  std::vector<Key> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(idemgate::derive_key("commit_bulk", std::to_string(i)));
    ASSERT_EQ(idemgate::test::sqlite::reserve(store, keys.back()).fence, 1);
  }
  ASSERT_TRUE(store.release(keys[1], 1));
  ASSERT_EQ(idemgate::test::sqlite::reserve(store, keys[1]).fence, 2);
  int writes = 0;
  const std::vector<idemgate::CommitItem> stale{
      {keys[0], 1, "slot-0"}, {keys[1], 1, "slot-1"}, {keys[2], 1, "slot-2"}};
  EXPECT_FALSE(store.commit_bulk(stale, [&](SqliteTransaction&) { ++writes; }).has_value());
  EXPECT_EQ(writes, 0);
  for (const Key& key : keys) EXPECT_EQ(store.find(key)->status, RecordStatus::in_flight);
  const std::vector<idemgate::CommitItem> held{
      {keys[0], 1, "slot-0"}, {keys[1], 2, "slot-1"}, {keys[2], 1, "slot-2"}};
  const auto statuses = store.commit_bulk(held, [&](SqliteTransaction& tx) {
    ++writes;
    tx.exec("INSERT INTO bookings (container, slot, source_event) VALUES ('C', 's', x'00')");
  });
  ASSERT_TRUE(statuses.has_value());
  EXPECT_EQ(*statuses, std::vector<idemgate::CommitStatus>(3, idemgate::CommitStatus::committed));
  EXPECT_EQ(writes, 1);
  EXPECT_EQ(env.bookings(), 1);
  for (const Key& key : keys) EXPECT_EQ(store.find(key)->status, RecordStatus::committed);
}
