// The PostgreSQL store under wire faults at each of its statements, through a protocol-aware
// proxy: a lost reply (the server ran the statement, the store never heard), a cut in the middle
// of the statement (the server never ran it), a delay, a blackhole. Each test drives one store
// operation through the gate, the reconciler or retention as a user would, then finishes what
// was left in flight with a reconciler pass and checks on the server:
//   - one business row per committed event, none for an event not committed;
//   - no acked answer unless the event is committed, failed or escalated (no one else works on
//     these events, so an acked event still in flight is one nobody will finish);
//   - fences never go backwards;
//   - nothing in flight after the final pass.
// With group commit (GateOptions::coalesce), three deliveries at once share one reservation
// statement and one commit transaction, and the wire breaks at each statement of the group.
// A StoreError is an acceptable answer to a fault (the caller does not ack and the redelivery
// finishes the event); any other exception, or a wrong answer, is not.

#include "support/fake_terminal.hpp"
#include "support/pg_bookings.hpp"
#include "support/pg_fault_proxy.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/retention.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/transaction_gate.hpp>

#include <cxxabi.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <typeinfo>
#include <vector>

namespace idemgate {
// Statuses by name in failure messages.
inline void PrintTo(Status status, std::ostream* out) {
  *out << to_string(status);
}
inline void PrintTo(RecordStatus status, std::ostream* out) {
  *out << to_string(status);
}
}  // namespace idemgate

using idemgate::BatchMessage;
using idemgate::Gate;
using idemgate::Key;
using idemgate::PostgresStore;
using idemgate::Reconciler;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::StoreError;
using idemgate::test::FakeTerminal;
using idemgate::test::Fault;
using idemgate::test::pg_count;
using idemgate::test::pg_exec;
using idemgate::test::PgFaultProxy;
using idemgate::test::SlotRequest;
namespace pq = idemgate::detail::pq;
using namespace std::chrono_literals;

namespace {

/// The business write: one booking per event; counts how often it ran (committed or not).
using BookingWriter = idemgate::test::PgBookingWriter;

/// The gate of every test here: its workers and reconcilers are replicas of one service.
constexpr const char* gate_name = "ect.claim_slot";

using KeyedGate = Gate<PostgresStore, FakeTerminal<>, BookingWriter>;
using UnkeyedGate = Gate<PostgresStore, FakeTerminal<false>, BookingWriter>;
/// A gate whose business write is a bulk write: one INSERT for every event a batch commits.
using BulkGate = Gate<PostgresStore, FakeTerminal<>, idemgate::test::PgBulkBookingWriter>;

/// Every store operation a wire fault is injected into.
enum class Operation {
  reserve,
  take_over,
  commit,
  fail,
  release,
  escalate,
  take_stale,
  reserve_batch,
  commit_batch,
  purge,
  resolve,
  bulk_write,
  bulk_update,
  bulk_commit,
};

/// What the wire does to the operation's statement.
enum class Wire { lost_reply, cut, delay };

/// Where an event must stand at the end.
enum class Final { committed, failed, escalated, purged_with_booking, purged_without_booking };

std::string type_name(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string text = status == 0 && name != nullptr ? name : typeid(e).name();
  std::free(name);
  return text;
}

class WireFaultTest : public idemgate::test::PgBookingsTest {
 protected:
  void SetUp() override {
    PgBookingsTest::SetUp();
    PostgresStore direct(uri, idemgate::PostgresOptions{.table = log});
    direct.migrate();
    direct_ = std::make_unique<PostgresStore>(direct.for_gate(gate_name));
    proxy_ = std::make_unique<PgFaultProxy>(uri);
  }

  void TearDown() override {
    proxy_.reset();
    direct_.reset();
    PgBookingsTest::TearDown();
  }

  // --- building blocks -----------------------------------------------------------------------

  /// A store whose every statement goes through the proxy, scoped to the tests' gate.
  std::unique_ptr<PostgresStore> proxied_store(std::size_t pool_size = 1) {
    const PostgresStore proxied(proxy_->uri(),
                                idemgate::PostgresOptions{.table = log,
                                                          .pool_size = pool_size,
                                                          .checkout_timeout = 10s,
                                                          .relaxed_outcomes = relaxed_outcomes_});
    return std::make_unique<PostgresStore>(proxied.for_gate(gate_name));
  }

  BookingWriter writer() { return booking_writer(&business_writes_); }

  /// Whether `proxied_store` relaxes outcomes (`PostgresOptions::relaxed_outcomes`).
  bool relaxed_outcomes_ = false;

  KeyedGate gate_on(PostgresStore& store, std::chrono::milliseconds lease = 1s,
                    std::chrono::milliseconds backoff = 0ms) {
    return KeyedGate(gate_name, store, terminal_, writer(),
                     {.lease = lease, .retry_backoff = backoff});
  }

  BulkGate bulk_gate_on(PostgresStore& store) {
    return BulkGate(gate_name, store, terminal_,
                    idemgate::test::PgBulkBookingWriter{bookings, &business_writes_},
                    {.lease = 1s});
  }

  UnkeyedGate unkeyed_gate_on(PostgresStore& store) {
    return UnkeyedGate(gate_name, store, unkeyed_terminal_, writer(), {.lease = 1s});
  }

  static Key key_of(int n) { return idemgate::derive_key("wire", std::to_string(n)); }
  static SlotRequest request_of(int n) { return {"MSKU700" + std::to_string(n), "w"}; }

  std::vector<BatchMessage<SlotRequest>> batch_of(int n) {
    std::vector<BatchMessage<SlotRequest>> messages;
    for (int i = 1; i <= n; ++i)
      messages.push_back({"m" + std::to_string(i), key_of(i), request_of(i)});
    return messages;
  }

  /// An in-flight row whose worker died: reserved directly, its lease already over.
  void seed_stranded(int n) {
    std::string bytes;
    idemgate::codec<SlotRequest>::encode(request_of(n), bytes);
    const auto reservation =
        direct_->reserve(key_of(n), idemgate::detail::sha256(bytes), bytes, 1ms);
    ASSERT_EQ(reservation.kind, idemgate::Reservation::Kind::acquired);
    std::this_thread::sleep_for(20ms);
  }

  /// Breaks the wire at `statement` the way this test's mode says.
  void inject(const std::string& statement) {
    switch (wire_) {
      case Wire::lost_reply:
        proxy_->arm(Fault::lose_reply, statement);
        break;
      case Wire::cut:
        proxy_->arm(Fault::cut, statement);
        break;
      case Wire::delay:
        // 100 ms each way: 200 ms per round trip.
        proxy_->delay(100ms);
        break;
    }
  }

  /// The fault did happen (or the delay held messages); the delay ends here.
  void expect_wire_was_broken() {
    check_fences("at the fault");
    if (wire_ == Wire::delay) {
      EXPECT_GT(proxy_->delayed_messages(), 0u);
      proxy_->delay(0ms);
      return;
    }
    EXPECT_TRUE(proxy_->wait_fired(5s)) << "the fault never met its statement";
  }

  /// Runs one call; an answer, or nothing after a StoreError (acceptable under a fault, not under
  /// a delay). Any other exception fails the test.
  template <class Call>
  auto attempt(const char* what, Call&& call) -> std::optional<decltype(call())> {
    try {
      return call();
    } catch (const StoreError& e) {
      if (wire_ == Wire::delay) ADD_FAILURE() << what << " failed under a mere delay: " << e.what();
      return std::nullopt;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " threw " << type_name(e) << " (" << e.what()
                    << ") instead of answering or throwing idemgate::StoreError";
      return std::nullopt;
    }
  }

  /// An acked answer only for an event that is finished: in these tests no other worker holds
  /// any event, so an acked event left in flight is one that nobody will finish.
  template <class Result>
  void expect_ack_only_if_finished(const Key& key, const Result& result) {
    if (!result.should_ack()) return;
    const auto row = direct_->find(key);
    ASSERT_TRUE(row.has_value()) << "acked an event the store does not hold";
    EXPECT_NE(row->status, RecordStatus::in_flight)
        << "the gate answered '" << idemgate::to_string(result.status())
        << "', which acks the message, while the event is in flight and nobody is working on it ("
        << result.reason() << ")";
  }

  void expect_final(int n, Final final) { finals_[key_of(n)] = final; }

  /// Fences read now are at least the ones read before.
  void check_fences(const char* stage) {
    const pqxx::result rows = pg_exec("SELECT encode(key, 'hex'), fence FROM " + log);
    for (const pq::row& row : rows) {
      const std::string key = row[0].c_str();
      const std::int64_t fence = pq::int_field(row[1]);
      auto [it, fresh] = fences_.try_emplace(key, fence);
      if (!fresh) {
        EXPECT_GE(fence, it->second) << "the fence of " << key << " went backwards " << stage;
        it->second = fence;
      }
    }
  }

  bool lease_over(int n) {
    return pg_count("SELECT count(*) FROM " + log + " WHERE key = decode('" + key_of(n).hex() +
                    "', 'hex') AND lease_until < now()") == 1;
  }

  std::int64_t bookings_of(const Key& key) {
    return pg_count("SELECT count(*) FROM " + bookings + " WHERE source_event = decode('" +
                    key.hex() + "', 'hex')");
  }

  /// Finishes what is left in flight with reconciler passes on a direct connection (waiting for
  /// leases to run out), then checks every invariant.
  void finish_and_check() {
    proxy_->delay(0ms);
    proxy_->heal();
    check_fences("during the operation");
    KeyedGate gate(gate_name, *direct_, terminal_, writer(), {.lease = 5s});
    Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 100}};
    const std::string in_flight = "FROM " + log + " WHERE status = 'in_flight'";
    for (int pass = 0; pass < 5 && pg_count("SELECT count(*) " + in_flight) > 0; ++pass) {
      const std::int64_t wait_ms = pg_count(
          "SELECT coalesce(ceil(extract(epoch FROM max(lease_until) - now()) * 1000), 0)::bigint " +
          in_flight);
      if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms + 20));
      const auto report = reconciler.run_once();
      EXPECT_EQ(report.errors, 0u) << report.first_error;
    }
    check_fences("in the final reconciler pass");

    EXPECT_EQ(pg_count("SELECT count(*) " + in_flight), 0) << "in flight after the final pass";
    std::int64_t booked = 0;
    for (const auto& [key, final] : finals_) {
      const auto row = direct_->find(key);
      const bool purged =
          final == Final::purged_with_booking || final == Final::purged_without_booking;
      const bool committed = final == Final::committed || final == Final::purged_with_booking;
      if (purged) {
        EXPECT_FALSE(row.has_value()) << "a finished row past the window was kept";
      } else if (row) {
        const RecordStatus want = final == Final::committed ? RecordStatus::committed
                                  : final == Final::failed  ? RecordStatus::failed
                                                            : RecordStatus::escalated;
        EXPECT_EQ(row->status, want)
            << "event " << key.hex() << " ends " << idemgate::to_string(row->status);
      } else {
        ADD_FAILURE() << "event " << key.hex() << " is missing from the log";
      }
      EXPECT_EQ(bookings_of(key), committed ? 1 : 0)
          << "business rows of event " << key.hex() << ": one if committed, else none";
      booked += committed ? 1 : 0;
    }
    EXPECT_EQ(pg_count("SELECT count(*) FROM " + bookings), booked)
        << "a business row for an event not committed";
    EXPECT_EQ(pg_count("SELECT count(*) FROM " + bookings + " b JOIN " + log +
                       " l ON l.key = b.source_event WHERE l.result <> convert_to(b.slot_id, "
                       "'UTF8')"),
              0)
        << "the booked slot is the stored outcome";
  }

  // --- one scenario per operation ------------------------------------------------------------

  void reserve() {
    auto store = proxied_store();
    auto gate = gate_on(*store);
    expect_final(1, Final::committed);
    inject("idemgate_reserve");
    const auto result =
        attempt("Gate::process", [&] { return gate.process(key_of(1), request_of(1)); });
    expect_wire_was_broken();
    if (!result) return;
    EXPECT_EQ(result->status(), Status::processed)
        << "the caller holds the reservation it made; it must carry on (" << result->reason()
        << ")";
    expect_ack_only_if_finished(key_of(1), *result);
  }

  void take_over() {
    seed_stranded(1);
    check_fences("after the seed");
    auto store = proxied_store();
    auto gate = gate_on(*store);
    expect_final(1, Final::committed);
    inject("idemgate_take_over");
    const auto result =
        attempt("Gate::process", [&] { return gate.process(key_of(1), request_of(1)); });
    expect_wire_was_broken();
    if (!result) return;
    EXPECT_EQ(result->status(), Status::processed)
        << "the caller took the expired lease over; it must carry on (" << result->reason() << ")";
    EXPECT_TRUE(result->took_over());
    expect_ack_only_if_finished(key_of(1), *result);
  }

  void commit() {
    auto store = proxied_store();
    auto gate = gate_on(*store);
    expect_final(1, Final::committed);
    inject("COMMIT");
    const auto result =
        attempt("Gate::process", [&] { return gate.process(key_of(1), request_of(1)); });
    expect_wire_was_broken();
    if (!result) return;
    EXPECT_EQ(result->status(), Status::processed) << result->reason();
    expect_ack_only_if_finished(key_of(1), *result);
    if (wire_ != Wire::cut) {
      EXPECT_EQ(business_writes_.load(), 1)
          << "the business write ran again after the transaction holding it had committed";
    }
  }

  void fail() {
    terminal_.before = [](const SlotRequest&,
                          const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
      return idemgate::PermanentFailure{"unknown container"};
    };
    auto store = proxied_store();
    auto gate = gate_on(*store);
    expect_final(1, Final::failed);
    inject("idemgate_fail");
    const auto result =
        attempt("Gate::process", [&] { return gate.process(key_of(1), request_of(1)); });
    expect_wire_was_broken();
    if (!result) return;
    EXPECT_EQ(result->status(), Status::failed) << result->reason();
    expect_ack_only_if_finished(key_of(1), *result);
  }

  void release() {
    terminal_.before = [this](const SlotRequest&,
                              const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
      if (first_claim_.exchange(false)) return idemgate::TransientFailure{"503"};
      return std::nullopt;
    };
    // The release holds the key for a 200 ms back-off, far under the 5 s lease: a release that
    // did not land would leave the lease, and the redelivery after the hold would wait for it.
    auto store = proxied_store();
    auto gate = gate_on(*store, 5s, 200ms);
    expect_final(1, Final::committed);
    inject("idemgate_release");
    const auto result =
        attempt("Gate::process", [&] { return gate.process(key_of(1), request_of(1)); });
    expect_wire_was_broken();
    std::this_thread::sleep_for(250ms);
    if (result) {
      EXPECT_EQ(result->status(), Status::retry) << result->reason();
      EXPECT_TRUE(lease_over(1)) << "the lease was not ended: the redelivery would wait for it";
    }
    const auto again =
        attempt("the redelivery", [&] { return gate.process(key_of(1), request_of(1)); });
    if (!again) return;
    EXPECT_EQ(again->status(), Status::processed) << again->reason();
    EXPECT_TRUE(again->took_over());
    expect_ack_only_if_finished(key_of(1), *again);
  }

  void escalate() {
    auto store = proxied_store();
    auto gate = unkeyed_gate_on(*store);
    expect_final(1, Final::escalated);
    inject("idemgate_escalate");
    const auto result =
        attempt("Gate::process", [&] { return gate.process(key_of(1), request_of(1)); });
    expect_wire_was_broken();
    if (!result) return;
    EXPECT_EQ(result->status(), Status::escalated) << result->reason();
    expect_ack_only_if_finished(key_of(1), *result);
  }

  void take_stale() {
    seed_stranded(1);
    check_fences("after the seed");
    auto store = proxied_store();
    auto gate = gate_on(*store);
    Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
    expect_final(1, Final::committed);
    inject("idemgate_take_stale");
    const auto report = attempt("Reconciler::run_once", [&] { return reconciler.run_once(); });
    expect_wire_was_broken();
    if (!report) return;
    EXPECT_EQ(report->taken, 1u)
        << "the pass moved the row's fence and lease but does not know it took the row";
    EXPECT_EQ(report->reclaimed, 1u);
    EXPECT_EQ(report->errors, 0u) << report->first_error;
    const auto row = direct_->find(key_of(1));
    ASSERT_TRUE(row.has_value());
    EXPECT_EQ(row->status, RecordStatus::committed) << "the pass left the stranded row unfinished";
    if (row->status == RecordStatus::in_flight) {
      EXPECT_TRUE(lease_over(1)) << "the row is held under a live lease by no one";
    }
  }

  void reserve_batch() {
    auto store = proxied_store();
    auto gate = gate_on(*store);
    for (int i = 1; i <= 3; ++i) expect_final(i, Final::committed);
    const auto messages = batch_of(3);
    inject("idemgate_reserve_batch");
    const auto batch = attempt("Gate::process_batch", [&] { return gate.process_batch(messages); });
    expect_wire_was_broken();
    if (!batch) return;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& result = batch->items()[i].result;
      EXPECT_EQ(result.status(), Status::processed)
          << "message " << i << ": the caller holds the reservations it made (" << result.reason()
          << ")";
      expect_ack_only_if_finished(messages[i].key, result);
    }
  }

  void commit_batch() {
    auto store = proxied_store();
    auto gate = gate_on(*store);
    for (int i = 1; i <= 3; ++i) expect_final(i, Final::committed);
    const auto messages = batch_of(3);
    inject("COMMIT");
    const auto batch = attempt("Gate::process_batch", [&] { return gate.process_batch(messages); });
    expect_wire_was_broken();
    if (!batch) return;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& result = batch->items()[i].result;
      EXPECT_EQ(result.status(), Status::processed) << "message " << i << ": " << result.reason();
      expect_ack_only_if_finished(messages[i].key, result);
    }
    if (wire_ != Wire::cut) {
      EXPECT_EQ(business_writes_.load(), 3)
          << "the business writes ran again after the transaction holding them had committed";
    }
  }

  /// A batch of three with a bulk write, the wire broken at `statement` of its one commit
  /// transaction: the bulk INSERT, the fenced UPDATE of the three rows, or the COMMIT.
  void bulk_commit(const std::string& statement) {
    auto store = proxied_store();
    auto gate = bulk_gate_on(*store);
    for (int i = 1; i <= 3; ++i) expect_final(i, Final::committed);
    const auto messages = batch_of(3);
    inject(statement);
    const auto batch = attempt("Gate::process_batch", [&] { return gate.process_batch(messages); });
    expect_wire_was_broken();
    if (!batch) return;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& result = batch->items()[i].result;
      EXPECT_EQ(result.status(), Status::processed) << "message " << i << ": " << result.reason();
      expect_ack_only_if_finished(messages[i].key, result);
    }
    if (wire_ != Wire::cut && statement == "COMMIT") {
      EXPECT_EQ(business_writes_.load(), 3)
          << "the bulk write ran again after the transaction holding it had committed";
    }
  }

  void purge() {
    // Two committed events, one failed, one escalated, all finished an hour ago.
    terminal_.before = [](const SlotRequest& r,
                          const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
      if (r == request_of(4)) return idemgate::PermanentFailure{"unknown container"};
      return std::nullopt;
    };
    {
      auto seeding = gate_on(*direct_);
      for (int n : {1, 2, 4}) (void)seeding.process(key_of(n), request_of(n));
      auto parking = unkeyed_gate_on(*direct_);
      (void)parking.process(key_of(3), request_of(3));
    }
    pg_exec("UPDATE " + log +
            " SET created_at = now() - interval '1 hour', updated_at = now() - interval '1 hour'");
    expect_final(1, Final::purged_with_booking);
    expect_final(2, Final::purged_with_booking);
    expect_final(3, Final::escalated);
    expect_final(4, Final::purged_without_booking);
    auto store = proxied_store();
    idemgate::Retention retention{*store, {.keep = 1min, .batch = 100}};
    inject("idemgate_purge");
    const auto deleted = attempt("Retention::run_once", [&] { return retention.run_once(); });
    expect_wire_was_broken();
    // After a lost reply the retry finds nothing left to delete, so the count may fall short.
    if (deleted && wire_ != Wire::lost_reply) {
      EXPECT_EQ(*deleted, 3u);
    }
  }

  void resolve() {
    {
      auto parking = unkeyed_gate_on(*direct_);
      ASSERT_EQ(parking.process(key_of(1), request_of(1)).status(), Status::escalated);
    }
    auto store = proxied_store();
    auto gate = unkeyed_gate_on(*store);
    expect_final(1, Final::committed);
    inject("COMMIT");
    const auto resolved = attempt(
        "Gate::resolve", [&] { return gate.resolve(key_of(1), std::string("slot-manual")); });
    expect_wire_was_broken();
    if (resolved) {
      EXPECT_TRUE(*resolved) << "the resolution committed but was reported as not done";
    }
    if (wire_ != Wire::cut) {
      EXPECT_EQ(business_writes_.load(), 1)
          << "the business write ran again after the transaction holding it had committed";
    }
    if (!resolved.value_or(false)) {
      // The operator, told nothing or an error, resolves again with the same outcome.
      (void)attempt("the repeated Gate::resolve",
                    [&] { return gate.resolve(key_of(1), std::string("slot-manual")); });
    }
    EXPECT_FALSE(gate.resolve(key_of(1), std::string("slot-other"))) << "resolved twice";
  }

  void run(Operation operation, Wire wire) {
    wire_ = wire;
    switch (operation) {
      case Operation::reserve:
        reserve();
        break;
      case Operation::take_over:
        take_over();
        break;
      case Operation::commit:
        commit();
        break;
      case Operation::fail:
        fail();
        break;
      case Operation::release:
        release();
        break;
      case Operation::escalate:
        escalate();
        break;
      case Operation::take_stale:
        take_stale();
        break;
      case Operation::reserve_batch:
        reserve_batch();
        break;
      case Operation::commit_batch:
        commit_batch();
        break;
      case Operation::purge:
        purge();
        break;
      case Operation::resolve:
        resolve();
        break;
      case Operation::bulk_write:
        bulk_commit("SELECT * FROM unnest($1::text[]");
        break;
      case Operation::bulk_update:
        bulk_commit("result = v.result");
        break;
      case Operation::bulk_commit:
        bulk_commit("COMMIT");
        break;
    }
    finish_and_check();
  }

  std::unique_ptr<PostgresStore> direct_;
  std::unique_ptr<PgFaultProxy> proxy_;
  FakeTerminal<> terminal_;
  FakeTerminal<false> unkeyed_terminal_;
  std::atomic<int> business_writes_{0};
  std::atomic<bool> first_claim_{true};
  Wire wire_ = Wire::delay;
  std::map<Key, Final> finals_;
  std::map<std::string, std::int64_t> fences_;
};

/// Group commit (GateOptions::coalesce) under the same faults: three deliveries at once on a
/// coalescing gate share one reservation statement and one commit transaction (each event's
/// business write and fenced update under its own savepoint), and the wire breaks at one
/// statement of the group.
class CoalescedWireFaultTest : public WireFaultTest {
 protected:
  using Write =
      std::function<void(pqxx::work&, const Key&, const SlotRequest&, const std::string&)>;
  using CoalescingGate = Gate<PostgresStore, FakeTerminal<>, Write>;

  static constexpr int events = 3;

  /// A gate whose groups wait (up to a second) until all three deliveries joined; `before_` and
  /// `after_`, when set, run at the start and at the end of every business write.
  CoalescingGate coalescing_gate_on(PostgresStore& store, std::chrono::milliseconds lease = 2s) {
    return CoalescingGate(
        gate_name, store, terminal_,
        [this](pqxx::work& tx, const Key& key, const SlotRequest& r, const std::string& slot) {
          if (before_) before_(tx, key);
          writer()(tx, key, r, slot);
          if (after_) after_(tx, key);
        },
        {.lease = lease,
         .coalesce = {
             .enabled = true, .window = 1s, .max_events = static_cast<std::size_t>(events)}});
  }

  /// Delivers events 1..3 at once; each answer, or nothing after a StoreError.
  std::vector<std::optional<idemgate::Result<std::string>>> deliver_at_once(CoalescingGate& gate) {
    std::vector<std::optional<idemgate::Result<std::string>>> results(events);
    std::vector<std::thread> threads;
    for (int n = 1; n <= events; ++n)
      threads.emplace_back([&, n] {
        results[static_cast<std::size_t>(n - 1)] =
            attempt("Gate::process", [&] { return gate.process(key_of(n), request_of(n)); });
      });
    for (auto& t : threads) t.join();
    return results;
  }

  /// Who finishes an event the first delivery did not ack: its redelivery, on the same gate.
  void redeliver_unacked(CoalescingGate& gate,
                         const std::vector<std::optional<idemgate::Result<std::string>>>& first) {
    for (int n = 1; n <= events; ++n) {
      const auto& result = first[static_cast<std::size_t>(n - 1)];
      if (result && result->should_ack()) continue;
      const auto again =
          attempt("the redelivery", [&] { return gate.process(key_of(n), request_of(n)); });
      if (again) expect_ack_only_if_finished(key_of(n), *again);
    }
  }

  /// The wire breaks at the `skip`-th statement after the first matching `pattern`, inside a
  /// group of three; every event ends committed and booked once.
  void break_group_at(const std::string& pattern, int skip, Wire wire) {
    wire_ = wire;
    auto store = proxied_store(4);
    auto gate = coalescing_gate_on(*store);
    for (int n = 1; n <= events; ++n) expect_final(n, Final::committed);
    if (wire == Wire::delay)
      proxy_->delay(100ms);
    else
      proxy_->arm(wire == Wire::lost_reply ? Fault::lose_reply : Fault::cut, pattern, skip);
    const auto results = deliver_at_once(gate);
    expect_wire_was_broken();
    const auto stats = gate.coalescing();
    EXPECT_EQ(stats.reservation_groups, 1u) << "the three reservations were not one group";
    EXPECT_EQ(stats.reservations, 3u);
    EXPECT_EQ(stats.commit_groups, 1u) << "the three commits were not one group";
    EXPECT_EQ(stats.commits, 3u);
    for (int n = 1; n <= events; ++n) {
      const auto& result = results[static_cast<std::size_t>(n - 1)];
      if (!result) continue;
      // The store retries a broken group on a fresh connection, asking after an unheard COMMIT
      // which items landed: each caller holds its lease throughout and ends processed.
      EXPECT_EQ(result->status(), Status::processed) << "event " << n << ": " << result->reason();
      expect_ack_only_if_finished(key_of(n), *result);
    }
    redeliver_unacked(gate, results);
    finish_and_check();
  }

  std::function<void(pqxx::work&, const Key&)> before_, after_;
};

/// A statement of a group, and which of its matches the wire breaks at.
struct GroupStatement {
  const char* name;
  const char* pattern;  // empty: the business write (this test's INSERT)
  int skip;
};

constexpr std::array<GroupStatement, 6> group_statements = {{
    {"reservation", "idemgate_reserve_batch", 0},
    {"first_savepoint", "SAVEPOINT idemgate_item", 0},
    {"second_savepoint", "SAVEPOINT idemgate_item", 1},
    {"second_business_write", "", 1},
    {"third_fenced_update", "SET status = 'committed'", 2},
    {"commit", "COMMIT", 0},
}};

class EveryGroupStatement : public CoalescedWireFaultTest,
                            public ::testing::WithParamInterface<GroupStatement> {
 protected:
  void run_group(Wire wire) {
    const GroupStatement& at = GetParam();
    const std::string pattern =
        *at.pattern != '\0' ? std::string(at.pattern) : "INSERT INTO " + bookings;
    break_group_at(pattern, at.skip, wire);
    if (wire == Wire::lost_reply && std::string(at.name) == "commit") {
      EXPECT_EQ(business_writes_.load(), 3)
          << "a business write ran again after the group's COMMIT had landed unheard";
    }
  }
};

constexpr std::array<const char*, 14> operation_names = {
    "reserve",  "take_over",  "commit",        "fail",         "release",
    "escalate", "take_stale", "reserve_batch", "commit_batch", "purge",
    "resolve",  "bulk_write", "bulk_update",   "bulk_commit"};

void PrintTo(Operation operation, std::ostream* out) {
  *out << operation_names[static_cast<std::size_t>(operation)];
}

class EveryOperation : public WireFaultTest, public ::testing::WithParamInterface<Operation> {};

}  // namespace

TEST_P(EveryOperation, LostReplyKeepsEveryInvariant) {
  run(GetParam(), Wire::lost_reply);
}

TEST_P(EveryOperation, CutMidStatementKeepsEveryInvariant) {
  run(GetParam(), Wire::cut);
}

TEST_P(EveryOperation, DelayOf200MsPerRoundTripChangesNothing) {
  run(GetParam(), Wire::delay);
}

INSTANTIATE_TEST_SUITE_P(
    Store, EveryOperation,
    ::testing::Values(Operation::reserve, Operation::take_over, Operation::commit, Operation::fail,
                      Operation::release, Operation::escalate, Operation::take_stale,
                      Operation::reserve_batch, Operation::commit_batch, Operation::purge,
                      Operation::resolve, Operation::bulk_write, Operation::bulk_update,
                      Operation::bulk_commit),
    [](const ::testing::TestParamInfo<Operation>& tested) {
      return std::string(operation_names[static_cast<std::size_t>(tested.param)]);
    });

// The commits of relaxed outcomes, whose COMMIT does not wait for its flush: a reply lost after
// the server committed is found landed by the retry (visible before it is flushed), and a cut
// mid-statement leaves the event to its redelivery; the business write never runs twice for one
// landed commit.
class RelaxedOutcomeCommits : public EveryOperation {
 protected:
  void SetUp() override {
    EveryOperation::SetUp();
    relaxed_outcomes_ = true;
  }
};

TEST_P(RelaxedOutcomeCommits, LostReplyKeepsEveryInvariant) {
  run(GetParam(), Wire::lost_reply);
}

TEST_P(RelaxedOutcomeCommits, CutMidStatementKeepsEveryInvariant) {
  run(GetParam(), Wire::cut);
}

INSTANTIATE_TEST_SUITE_P(Store, RelaxedOutcomeCommits,
                         ::testing::Values(Operation::commit, Operation::commit_batch,
                                           Operation::bulk_commit),
                         [](const ::testing::TestParamInfo<Operation>& tested) {
                           return std::string(
                               operation_names[static_cast<std::size_t>(tested.param)]);
                         });

// One event in one transaction (TransactionGate): the wire breaks at each of its statements. A
// broken transaction rolled back whole, key included; a COMMIT whose reply was lost is found
// landed by the next attempt, which neither writes again nor answers "duplicate".
struct OnceStatement {
  const char* name;
  const char* pattern;  // empty: the business write (this test's INSERT)
};

constexpr std::array<OnceStatement, 4> once_statements = {{
    {"reservation", "idemgate_reserve_committed"},
    {"business_write", ""},
    {"result_update", "EXECUTE idemgate_set_result"},
    {"commit", "COMMIT"},
}};

class EveryOnceStatement : public WireFaultTest,
                           public ::testing::WithParamInterface<std::tuple<OnceStatement, Wire>> {
 protected:
  using OnceGate = idemgate::TransactionGate<
      PostgresStore, SlotRequest, std::string,
      std::function<std::string(pqxx::work&, const Key&, const SlotRequest&)>>;

  OnceGate once_gate_on(PostgresStore& store) {
    return OnceGate(gate_name, store, [this](pqxx::work& tx, const Key& key, const SlotRequest& r) {
      const std::string slot = "slot-" + r.container;
      writer()(tx, key, r, slot);
      return slot;
    });
  }

  void run_once_statement() {
    const auto& [at, wire] = GetParam();
    wire_ = wire;
    const std::string pattern =
        *at.pattern != '\0' ? std::string(at.pattern) : "INSERT INTO " + bookings;
    auto store = proxied_store();
    auto gate = once_gate_on(*store);
    expect_final(1, Final::committed);
    if (wire == Wire::lost_reply || wire == Wire::cut)
      proxy_->arm(wire == Wire::cut ? Fault::cut : Fault::lose_reply, pattern);
    const auto result =
        attempt("TransactionGate::process", [&] { return gate.process(key_of(1), request_of(1)); });
    expect_wire_was_broken();
    if (result) {
      EXPECT_EQ(result->status(), Status::processed)
          << "the store runs a broken transaction again on a fresh connection (" << result->reason()
          << ")";
      EXPECT_EQ(result->outcome(), "slot-" + request_of(1).container);
      expect_ack_only_if_finished(key_of(1), *result);
    } else {
      // Nothing acked: the redelivery, on a healed wire, finds the event committed or absent.
      proxy_->heal();
      auto direct = once_gate_on(*direct_);
      const auto again = direct.process(key_of(1), request_of(1));
      EXPECT_TRUE(again.status() == Status::processed || again.status() == Status::duplicate)
          << again.reason();
    }
    if (std::string(at.name) == "commit" && wire == Wire::lost_reply) {
      EXPECT_EQ(business_writes_.load(), 1)
          << "the business write ran again after its COMMIT had landed unheard";
    }
    finish_and_check();
  }
};

TEST_P(EveryOnceStatement, KeepsEveryInvariant) {
  run_once_statement();
}

// A stranded row taken over in one transaction keeps this call's token: when that COMMIT's reply
// is lost, the transaction run again finds the row its own and answers processed.
class OnceTakeover : public EveryOnceStatement {};

TEST_F(OnceTakeover, ACommitReplyLostAfterATakeoverIsAnsweredProcessed) {
  seed_stranded(1);
  auto store = proxied_store();
  auto gate = once_gate_on(*store);
  expect_final(1, Final::committed);
  proxy_->arm(Fault::lose_reply, "COMMIT");
  const auto result = gate.process(key_of(1), request_of(1));
  EXPECT_TRUE(proxy_->wait_fired(5s));
  EXPECT_EQ(result.status(), Status::processed) << result.reason();
  EXPECT_TRUE(result.took_over()) << "the landed takeover is still reported as one";
  EXPECT_EQ(business_writes_.load(), 1);
  EXPECT_EQ(direct_->find(key_of(1))->fence, 2);
  finish_and_check();
}

INSTANTIATE_TEST_SUITE_P(
    OneTransaction, EveryOnceStatement,
    ::testing::Combine(::testing::ValuesIn(once_statements),
                       ::testing::Values(Wire::lost_reply, Wire::cut)),
    [](const ::testing::TestParamInfo<std::tuple<OnceStatement, Wire>>& tested) {
      return std::string(std::get<0>(tested.param).name) +
             (std::get<1>(tested.param) == Wire::cut ? "_cut" : "_lost_reply");
    });

// A reservation whose reply was lost runs again on a fresh connection and finds its own row: it
// goes on with a whole lease from then, not with what is left of the first one (after a
// partition, nothing), so no reconciler takes the event over while it works.
TEST_F(WireFaultTest, ReservationRunAgainAfterALostReplyRenewsItsOwnLease) {
  auto store = proxied_store();
  std::string bytes;
  idemgate::codec<SlotRequest>::encode(request_of(1), bytes);
  proxy_->arm(Fault::lose_reply, "idemgate_reserve");
  const auto reservation =
      store->reserve(key_of(1), idemgate::detail::sha256(bytes), bytes, std::chrono::seconds(10));
  ASSERT_TRUE(proxy_->wait_fired(5s));
  ASSERT_EQ(reservation.kind, idemgate::Reservation::Kind::acquired);
  // The first run wrote lease_until = created_at + 10 s in its own transaction; the second run
  // is later, so a renewed lease ends later than that.
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log +
                     " WHERE status = 'in_flight' AND lease_until > created_at + interval '10 s'"),
            1);
}

TEST_F(WireFaultTest, BatchReservationRunAgainAfterALostReplyRenewsItsOwnLeases) {
  auto store = proxied_store();
  std::vector<std::string> bytes(3);
  std::vector<idemgate::ReserveItem> items;
  for (int i = 1; i <= 3; ++i) {
    idemgate::codec<SlotRequest>::encode(request_of(i), bytes[i - 1]);
    items.push_back({key_of(i), idemgate::detail::sha256(bytes[i - 1]), bytes[i - 1]});
  }
  proxy_->arm(Fault::lose_reply, "idemgate_reserve_batch");
  const auto reservations = store->reserve_batch(items, std::chrono::seconds(10));
  ASSERT_TRUE(proxy_->wait_fired(5s));
  for (const auto& r : reservations) EXPECT_EQ(r.kind, idemgate::Reservation::Kind::acquired);
  EXPECT_EQ(pg_count("SELECT count(*) FROM " + log +
                     " WHERE status = 'in_flight' AND lease_until > created_at + interval '10 s'"),
            3);
}

TEST_F(WireFaultTest, BatchWhoseCommitGivesUpReleasesItsReservationsForTheRedelivery) {
  wire_ = Wire::cut;
  auto store = proxied_store();
  auto gate = gate_on(*store, 3s);
  for (int i = 1; i <= 3; ++i) expect_final(i, Final::committed);
  const auto messages = batch_of(3);
  // The batch's COMMIT is cut on every attempt the store makes (three by default): the store
  // finds that nothing landed each time, and gives up on the batch with StoreError.
  for (int attempt = 0; attempt < 3; ++attempt) proxy_->arm(Fault::cut, "COMMIT");
  const auto batch = attempt("Gate::process_batch", [&] { return gate.process_batch(messages); });
  EXPECT_TRUE(proxy_->wait_fired(5s));
  if (batch) {
    EXPECT_EQ(batch->retry_ids().size(), 3u) << "nothing was committed: ack nothing";
  }
  // The redelivery comes at once, well within the 3 s lease.
  const auto again = attempt("the redelivery", [&] { return gate.process_batch(messages); });
  ASSERT_TRUE(again.has_value());
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& result = again->items()[i].result;
    EXPECT_EQ(result.status(), Status::processed)
        << "message " << i << ": the failed batch left its reservation under a live lease ("
        << result.reason() << ")";
    expect_ack_only_if_finished(messages[i].key, result);
  }
  finish_and_check();
}

TEST_F(WireFaultTest, BlackholedServerMakesOpeningTheStoreGiveUpWithStoreError) {
  proxy_->blackhole(1h);
  // libpq's connect_timeout (2 s at least) ends the wait; the store starts anyway and its calls
  // fail until the network is back.
  PostgresStore store(proxy_->uri() + "&connect_timeout=2",
                      idemgate::PostgresOptions{.table = log, .log = {}});
  EXPECT_THROW((void)store.find(key_of(1)), StoreError);
  proxy_->heal();
  EXPECT_FALSE(store.find(key_of(1)).has_value()) << "the store works once the network is back";
}

TEST_F(WireFaultTest, BatchWhoseReservationFailsGivesBackWhatItReserved) {
  wire_ = Wire::cut;
  // Relaxed reservations: a batch meeting another worker's in-flight row flushes the WAL before
  // answering. Cut that flush on the first connection and on the retry's: the batch reservation
  // fails after its statement reserved the other keys.
  auto store = std::make_unique<PostgresStore>(
      proxy_->uri(), idemgate::PostgresOptions{
                         .table = log, .checkout_timeout = 10s, .relaxed_reservations = true});
  auto gate = gate_on(*store, 3s);
  for (int i = 1; i <= 3; ++i) expect_final(i, Final::committed);
  std::string bytes;
  idemgate::codec<SlotRequest>::encode(request_of(1), bytes);
  ASSERT_EQ(direct_->reserve(key_of(1), idemgate::detail::sha256(bytes), bytes, 200ms).kind,
            idemgate::Reservation::Kind::acquired);  // another worker holds event 1 for now
  const auto messages = batch_of(3);
  for (int attempt = 0; attempt < 2; ++attempt) proxy_->arm(Fault::cut, "idemgate_make_durable");
  const auto batch = attempt("Gate::process_batch", [&] { return gate.process_batch(messages); });
  EXPECT_TRUE(proxy_->wait_fired(5s));
  EXPECT_FALSE(batch.has_value()) << "the batch's reservation failed: nothing to ack";
  std::this_thread::sleep_for(250ms);  // the other worker's lease on event 1 ran out
  // The redelivery comes at once, well within the 3 s lease the failed batch had taken.
  const auto again = attempt("the redelivery", [&] { return gate.process_batch(messages); });
  ASSERT_TRUE(again.has_value());
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& result = again->items()[i].result;
    EXPECT_EQ(result.status(), Status::processed)
        << "message " << i << ": the failed batch left its reservation under a live lease ("
        << result.reason() << ")";
    expect_ack_only_if_finished(messages[i].key, result);
  }
  finish_and_check();
}

// --- group commit (GateOptions::coalesce) ---------------------------------------------------

TEST_P(EveryGroupStatement, LostReplyKeepsEveryInvariant) {
  run_group(Wire::lost_reply);
}

TEST_P(EveryGroupStatement, CutMidStatementKeepsEveryInvariant) {
  run_group(Wire::cut);
}

INSTANTIATE_TEST_SUITE_P(Coalesced, EveryGroupStatement, ::testing::ValuesIn(group_statements),
                         [](const ::testing::TestParamInfo<GroupStatement>& tested) {
                           return std::string(tested.param.name);
                         });

TEST_F(CoalescedWireFaultTest, DelayOf200MsPerRoundTripChangesNothing) {
  break_group_at("", 0, Wire::delay);
}

// A member's lease is taken over while its group's transaction runs (the first business write of
// the group expires it and a redelivery on another worker takes the event over and finishes it):
// that member's fenced update finds the new fence and ends lost_lease, undone to its savepoint
// alone, and the others commit.
TEST_F(CoalescedWireFaultTest, AMemberTakenOverWhileItsGroupRunsEndsLostLeaseAndTheOthersCommit) {
  auto store = proxied_store(4);
  auto gate = coalescing_gate_on(*store, 1min);
  for (int n = 1; n <= events; ++n) expect_final(n, Final::committed);
  KeyedGate other = gate_on(*direct_);  // another worker, no group commit
  std::atomic<int> victim{0};
  std::optional<idemgate::Result<std::string>> taken;
  before_ = [&](pqxx::work&, const Key& key) {
    if (victim.load() != 0) return;
    // The first business write of the group: every other member comes later in it, so its row is
    // not locked yet.
    const int first = key == key_of(1) ? 1 : key == key_of(2) ? 2 : 3;
    const int n = first == 3 ? 1 : first + 1;
    victim = n;
    pg_exec("UPDATE " + log + " SET lease_until = now() - interval '1 millisecond' WHERE key = " +
            "decode('" + key_of(n).hex() + "', 'hex')");
    taken = attempt("the other worker's redelivery",
                    [&] { return other.process(key_of(n), request_of(n)); });
  };
  const auto results = deliver_at_once(gate);
  ASSERT_NE(victim.load(), 0) << "no business write ran";
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->status(), Status::processed) << taken->reason();
  EXPECT_TRUE(taken->took_over());
  EXPECT_EQ(gate.coalescing().commit_groups, 1u) << "the three commits were not one group";
  for (int n = 1; n <= events; ++n) {
    const auto& result = results[static_cast<std::size_t>(n - 1)];
    ASSERT_TRUE(result.has_value()) << "event " << n;
    EXPECT_EQ(result->status(), n == victim ? Status::lost_lease : Status::processed)
        << "event " << n << ": " << result->reason();
    expect_ack_only_if_finished(key_of(n), *result);
  }
  const auto row = direct_->find(key_of(victim));
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->fence, 2) << "the victim's row is the taker's";
  EXPECT_EQ(gate.process(key_of(victim), request_of(victim)).status(), Status::duplicate);
  finish_and_check();
}

// A business write that swallows an SQL error (after its booking) breaks the group's transaction:
// the group runs again without that event (which is not acked, its lease given back), and the
// COMMIT of that second run loses its reply: the store asks which events landed and answers each
// once. (A statement sent after the swallowed error, on libpqxx 6.4, runs and commits on its own,
// with or without group commit, as docs/stores.md says: no store can stop it.)
TEST_F(CoalescedWireFaultTest, ASwallowedSqlErrorAndALostCommitReplyInOneGroup) {
  wire_ = Wire::lost_reply;
  auto store = proxied_store(4);
  auto gate = coalescing_gate_on(*store);
  for (int n = 1; n <= events; ++n) expect_final(n, Final::committed);
  std::atomic<bool> breaking{true};
  after_ = [&](pqxx::work& tx, const Key& key) {
    if (key != key_of(2) || !breaking.load()) return;
    try {
      pq::exec(tx, "SELECT 1 / 0");
    } catch (const pqxx::sql_error&) {
      // The defect under test: the error is swallowed and the business write goes on.
    }
  };
  proxy_->arm(Fault::lose_reply, "COMMIT");
  const auto results = deliver_at_once(gate);
  expect_wire_was_broken();
  EXPECT_EQ(gate.coalescing().commit_groups, 1u) << "the three commits were not one group";
  for (int n = 1; n <= events; ++n) {
    const auto& result = results[static_cast<std::size_t>(n - 1)];
    if (n == 2) {
      EXPECT_FALSE(result.has_value()) << "the event whose business write broke the transaction "
                                          "must not be answered (its caller does not ack)";
      continue;
    }
    ASSERT_TRUE(result.has_value()) << "event " << n;
    EXPECT_EQ(result->status(), Status::processed) << "event " << n << ": " << result->reason();
    expect_ack_only_if_finished(key_of(n), *result);
  }
  EXPECT_EQ(direct_->find(key_of(2))->status, RecordStatus::in_flight);
  EXPECT_EQ(bookings_of(key_of(2)), 0);
  breaking = false;  // fixed; its redelivery takes the lease given back over at once
  const auto again =
      attempt("the redelivery", [&] { return gate.process(key_of(2), request_of(2)); });
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->status(), Status::processed) << again->reason();
  finish_and_check();
}

// A business write that ends the group's transaction itself (a ROLLBACK or a COMMIT through its
// transaction) costs only its own event, wherever it is in the group: the statement after it is
// checked, the group runs again without it, and no other event is answered committed unless its
// row and its booking did commit. (The single and batch commits' check is tested in
// test_postgres_store.)
TEST_F(CoalescedWireFaultTest, AMemberWhoseBusinessWriteEndsTheTransactionCostsOnlyItsOwnEvent) {
  for (const char* sql : {"ROLLBACK", "COMMIT"}) {
    for (std::size_t broken = 0; broken < 3; ++broken) {
      SCOPED_TRACE(std::string(sql) + " in the business write of item " + std::to_string(broken));
      std::vector<Key> keys;
      std::vector<idemgate::CommitItem> items;
      for (int i = 0; i < 3; ++i) {
        keys.push_back(
            idemgate::derive_key("ends", sql, std::to_string(broken), std::to_string(i)));
        const auto r = direct_->reserve(keys.back(), idemgate::detail::sha256("r"), "r", 1min);
        ASSERT_EQ(r.kind, idemgate::Reservation::Kind::acquired);
        items.push_back({keys.back(), r.fence, "slot"});
      }
      std::vector<idemgate::ItemCommit> answers;
      try {
        answers = direct_->commit_each(items, [&](pqxx::work& tx, std::size_t i) {
          writer()(tx, keys[i], request_of(static_cast<int>(i)), "slot");
          if (i == broken) pq::exec(tx, sql);
        });
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the whole group failed for one business write: " << type_name(e) << ": "
                      << e.what();
        continue;
      }
      ASSERT_EQ(answers.size(), 3u);
      for (std::size_t i = 0; i < 3; ++i) {
        if (i == broken) {
          ASSERT_TRUE(answers[i].error) << "the business write that ended the transaction was "
                                           "answered as if it had committed";
          try {
            std::rethrow_exception(answers[i].error);
          } catch (const idemgate::BusinessWriteError& e) {
            EXPECT_NE(std::string(e.what()).find(keys[i].hex()), std::string::npos) << e.what();
          } catch (const std::exception& e) {
            ADD_FAILURE() << type_name(e) << ": " << e.what();
          }
          continue;
        }
        EXPECT_FALSE(answers[i].error) << "item " << i << " paid for another's business write";
        EXPECT_EQ(answers[i].status, idemgate::CommitStatus::committed) << "item " << i;
        EXPECT_EQ(direct_->find(keys[i])->status, RecordStatus::committed)
            << "item " << i << " was answered committed";
        EXPECT_EQ(bookings_of(keys[i]), 1) << "item " << i;
      }
    }
  }
}
