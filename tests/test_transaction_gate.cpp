// TransactionGate on SqliteStore: its options at their extremes, what it counts, labels, bad
// requests and a business write that breaks its transaction. What every store shares about one
// event in one transaction is in the conformance suite (conformance/one_transaction.hpp); the
// crash and wire faults on PostgreSQL are in tests/postgres.

#include "support/sqlite_files.hpp"

#include <idemgate/prometheus.hpp>
#include <idemgate/signals.hpp>
#include <idemgate/store/sqlite.hpp>
#include <idemgate/transaction_gate.hpp>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

using idemgate::Key;
using idemgate::SqliteStore;
using idemgate::SqliteTransaction;
using idemgate::Status;
using idemgate::TransactionGate;
using idemgate::TransactionGateOptions;
using namespace std::chrono_literals;

/// An outcome whose codec refuses to encode an empty receipt.
struct Receipt {
  std::string text;
};

template <>
struct idemgate::codec<Receipt> {
  static void encode(const Receipt& r, std::string& out) {
    if (r.text.empty()) throw idemgate::CodecError("an empty receipt has no encoding");
    out = r.text;
  }
  static Receipt decode(std::string_view in) { return {std::string(in)}; }
};

namespace {

using Write = std::function<std::string(SqliteTransaction&, const std::string&)>;
using LedgerGate = TransactionGate<SqliteStore, std::string, std::string, Write>;

class TransactionGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_.migrate();
    auto raw = idemgate::test::sqlite::open_raw(db_);
    idemgate::detail::sqlite::exec(raw.get(), "CREATE TABLE debits (account TEXT NOT NULL)");
  }

  std::int64_t debits() {
    return idemgate::test::sqlite::count(db_, "SELECT count(*) FROM debits");
  }

  /// One debit row per event, through the store's transaction.
  static std::string debit(SqliteTransaction& tx, const std::string& account) {
    tx.exec("INSERT INTO debits (account) VALUES (?)", account);
    return "debited " + account;
  }

  static Key key_of(const std::string& id) { return idemgate::derive_key("ledger.debit", id); }

  idemgate::test::sqlite::TempDir dir_;
  std::string db_ = dir_.file("idemgate.db");
  SqliteStore store_{db_};
};

TEST_F(TransactionGateTest, OptionsOutsideTheirRangeAreRefusedSayingWhy) {
  const auto refused = [&](TransactionGateOptions options, const char* names) {
    try {
      LedgerGate gate("ledger.debit", store_, debit, options);
      ADD_FAILURE() << "accepted " << names;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  refused({.lock_timeout = 0ms}, "lock_timeout");
  refused({.lock_timeout = -1ms}, "lock_timeout");
  refused({.lock_timeout = 3'600'001ms}, "lock_timeout");
  refused({.max_request_bytes = 0}, "max_request_bytes");
  refused({.max_request_bytes = (std::size_t{64} << 20) + 1}, "max_request_bytes");
  // The extremes themselves work.
  LedgerGate shortest("ledger.debit", store_, debit, {.lock_timeout = 1ms, .max_request_bytes = 1});
  EXPECT_EQ(shortest.process(key_of("one byte"), "A").status(), Status::processed);
  LedgerGate longest("ledger.debit", store_, debit,
                     {.lock_timeout = 1h, .max_request_bytes = std::size_t{64} << 20});
  EXPECT_EQ(longest.process(key_of("one byte"), "A").status(), Status::duplicate);
}

TEST_F(TransactionGateTest, ARequestOverTheLimitIsRefusedAndNothingIsWritten) {
  LedgerGate gate("ledger.debit", store_, debit, {.max_request_bytes = 8});
  try {
    (void)gate.process(key_of("big"), "ACME-123456789");
    ADD_FAILURE() << "a request over the limit was accepted";
  } catch (const idemgate::RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("TransactionGateOptions::max_request_bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(store_.for_gate("ledger.debit").find(key_of("big")).has_value());
  EXPECT_EQ(debits(), 0);
  // In a batch, that message alone fails.
  const std::vector<idemgate::BatchMessage<std::string>> batch{
      {"m1", key_of("big"), "ACME-123456789"}, {"m2", key_of("small"), "ACME-1"}};
  const auto result = gate.process_batch(batch);
  EXPECT_EQ(result.items()[0].result.status(), Status::failed);
  EXPECT_EQ(result.items()[1].result.status(), Status::processed);
  EXPECT_EQ(debits(), 1);
}

TEST_F(TransactionGateTest, CountersCountEveryResultAndRenderWithTheGateLabel) {
  idemgate::Counters counters{"ledger.debit"};
  TransactionGate<SqliteStore, std::string, std::string, Write, idemgate::Counters> gate(
      "ledger.debit", store_, debit, {}, counters);
  EXPECT_EQ(gate.process(key_of("1"), "A").status(), Status::processed);
  EXPECT_EQ(gate.process(key_of("1"), "A").status(), Status::duplicate);
  EXPECT_EQ(gate.process(key_of("1"), "B").status(), Status::conflict);
  const std::vector<idemgate::BatchMessage<std::string>> batch{{"m1", key_of("2"), "C"},
                                                               {"m2", key_of("2"), "C"}};
  (void)gate.process_batch(batch);
  EXPECT_EQ(counters.count(Status::processed), 2u);
  EXPECT_EQ(counters.count(Status::duplicate), 2u);
  EXPECT_EQ(counters.count(Status::conflict), 1u);
  const std::string text = idemgate::render_prometheus(
      counters, store_.for_gate("ledger.debit").signals(std::chrono::hours(1)));
  EXPECT_NE(text.find("gate=\"ledger.debit\""), std::string::npos) << text;
  // The signals read from the log see every reservation that reached the store: two new keys and
  // the two that met key 1 (the batch's second copy was answered inside the batch).
  const auto signals = store_.for_gate("ledger.debit").signals(1h);
  EXPECT_EQ(signals.events, 4);
  EXPECT_EQ(signals.duplicates, 2);
  EXPECT_EQ(signals.in_flight, 0);
  // Counters made for another gate are refused.
  idemgate::Counters other{"ledger.credit"};
  EXPECT_THROW((TransactionGate<SqliteStore, std::string, std::string, Write, idemgate::Counters>(
                   "ledger.debit", store_, debit, {}, other)),
               std::invalid_argument);
}

TEST_F(TransactionGateTest, ALabelIsKeptOnlyWhenTheOptionSaysSo) {
  LedgerGate plain("ledger.debit", store_, debit);
  LedgerGate labelled("ledger.debit", store_, debit, {.keep_labels = true});
  const auto a = idemgate::derive_labelled_key("ledger.debit", "evt_1");
  const auto b = idemgate::derive_labelled_key("ledger.debit", "evt_2");
  EXPECT_EQ(plain.process(a, "A").status(), Status::processed);
  EXPECT_EQ(labelled.process(b, "B").status(), Status::processed);
  EXPECT_EQ(store_.for_gate("ledger.debit").find(a.key)->label, "");
  EXPECT_EQ(store_.for_gate("ledger.debit").find(b.key)->label, b.label);
}

TEST_F(TransactionGateTest, AWriteThatBreaksTheTransactionCommitsNothingAndIsNamed) {
  LedgerGate gate("ledger.debit", store_, [](SqliteTransaction& tx, const std::string& account) {
    const std::string result = debit(tx, account);
    // A careless write: its own ROLLBACK, swallowed.
    sqlite3_exec(tx.db(), "ROLLBACK", nullptr, nullptr, nullptr);
    return result;
  });
  EXPECT_THROW((void)gate.process(key_of("broken"), "A"), idemgate::BusinessWriteError);
  EXPECT_FALSE(store_.for_gate("ledger.debit").find(key_of("broken")).has_value());
  EXPECT_EQ(debits(), 0);
  // In a batch it is that message's `retry`.
  const std::vector<idemgate::BatchMessage<std::string>> batch{{"m1", key_of("broken"), "A"}};
  EXPECT_EQ(gate.process_batch(batch).retry_ids(), std::vector<std::string>{"m1"});
  EXPECT_EQ(debits(), 0);
}

// An outcome its codec cannot encode: the write is rolled back with the key, and in a batch the
// message is answered `retry` naming the codec, not the business write.
TEST_F(TransactionGateTest, AnOutcomeItsCodecRefusesCommitsNothingAndIsNamed) {
  TransactionGate<SqliteStore, std::string, Receipt,
                  std::function<Receipt(SqliteTransaction&, const std::string&)>>
      gate("ledger.debit", store_, [](SqliteTransaction& tx, const std::string& account) {
        (void)debit(tx, account);
        return Receipt{account == "B" ? "" : "receipt " + account};
      });
  EXPECT_THROW((void)gate.process(key_of("unencodable"), "B"), idemgate::CodecError);
  EXPECT_FALSE(store_.for_gate("ledger.debit").find(key_of("unencodable")).has_value());
  EXPECT_EQ(debits(), 0);
  const std::vector<idemgate::BatchMessage<std::string>> batch{{"m1", key_of("unencodable"), "B"},
                                                               {"m2", key_of("fine"), "A"}};
  const auto items = gate.process_batch(batch).items();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].result.status(), Status::retry);
  EXPECT_NE(items[0].result.reason().find("the outcome's codec threw: an empty receipt"),
            std::string::npos)
      << items[0].result.reason();
  EXPECT_EQ(items[1].result.status(), Status::processed);
  EXPECT_EQ(debits(), 1) << "only the encodable event's write";
}

}  // namespace
