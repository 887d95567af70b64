// The reconciler over MemoryStore on a hand-moved clock: stranded events finished by lookup or
// by a claim under the same key, never a blind claim; escalation, poison rows and stale workers.

#include "support/fake_terminal.hpp"
#include "support/memory_bookings.hpp"
#include "support/slot_request.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/testing/clocks.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using idemgate::ClaimResult;
using idemgate::Gate;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::Reconciler;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::MemoryBookings;
using idemgate::test::SimulatedCrash;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

namespace {

const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
const Key key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");
const idemgate::ReconcilerOptions fast{.interval = 10ms, .stale_after = 0ms, .batch = 100};

/// A store on a clock the test moves, a terminal, and the bookings the gate writes; and the ways
/// a worker dies mid-event.
class ReconcilerTest : public ::testing::Test {
 protected:
  /// A gate over `downstream` (the terminal unless given) writing this test's bookings.
  template <class Downstream>
  auto gate_over(Downstream& downstream, std::chrono::milliseconds lease = 30s) {
    return Gate{"ect.claim_slot", store, downstream, bookings.writer(), {.lease = lease}};
  }

  /// Delivers the event once; its worker dies right after the terminal took the claim.
  template <class G>
  void crash_after_claim(G& gate) {
    terminal.after = [](const Key&, const std::string&) -> std::optional<ClaimResult<std::string>> {
      throw SimulatedCrash{};
    };
    EXPECT_THROW((void)gate.process(key, msku), SimulatedCrash);
    terminal.after = nullptr;
  }

  /// Delivers the event once; its worker dies right before its claim.
  template <class G>
  void crash_before_claim(G& gate) {
    terminal.before = [](const SlotRequest&,
                         const Key&) -> std::optional<ClaimResult<std::string>> {
      throw SimulatedCrash{};
    };
    EXPECT_THROW((void)gate.process(key, msku), SimulatedCrash);
    terminal.before = nullptr;
  }

  /// A worker that reserved `event` for `request` under a lease of `lease` and died.
  template <class G>
  void strand(G& gate, const Key& event, const SlotRequest& request,
              std::chrono::milliseconds lease = 30s) {
    const std::string bytes = gate.encode_request(request);
    (void)store.reserve(event, idemgate::detail::sha256(bytes), bytes, lease);
  }

  idemgate::testing::ManualClock clock;
  /// The log, seen as the gates of these tests see it (their rows only).
  MemoryStore store = MemoryStore{clock.fn()}.for_gate("ect.claim_slot");
  FakeTerminal<> terminal;
  MemoryBookings bookings;
};

}  // namespace

TEST_F(ReconcilerTest, FinishesWithTheOutcomeTheDownstreamHoldsAndNeverClaimsAnew) {
  auto gate = gate_over(terminal);
  crash_after_claim(gate);
  ASSERT_EQ(store.find(key)->status, RecordStatus::in_flight);
  ASSERT_EQ(terminal.calls(), 1);
  EXPECT_EQ(bookings.size(), 0u);

  Reconciler reconciler{gate, fast};
  EXPECT_EQ(reconciler.run_once().taken, 0u) << "the lease is still live";
  clock.advance(31s);
  const auto report = reconciler.run_once();
  EXPECT_EQ(report.taken, 1u);
  EXPECT_EQ(report.found, 1u);
  EXPECT_EQ(terminal.calls(), 1) << "a key the terminal holds is never claimed again";
  EXPECT_EQ(terminal.lookups(), 1);
  EXPECT_EQ(bookings.size(), 1u);
  const auto row = store.find(key);
  EXPECT_EQ(row->status, RecordStatus::committed);
  EXPECT_EQ(row->result, "slot-1");
  EXPECT_EQ(gate.process(key, msku).status(), Status::duplicate);
}

TEST_F(ReconcilerTest, ClaimsUnderTheSameKeyWhenTheDownstreamHoldsNothing) {
  terminal.ignores_keys = true;  // a claim that got through twice would show as two slots
  auto gate = gate_over(terminal);
  crash_before_claim(gate);
  clock.advance(31s);
  Reconciler reconciler{gate, fast};
  const auto report = reconciler.run_once();
  EXPECT_EQ(report.reclaimed, 1u);
  EXPECT_EQ(terminal.lookups(), 1) << "it looked first";
  EXPECT_EQ(terminal.keys_claimed(), (std::vector<Key>{key, key}))
      << "the crashed claim and the reconciler's, under the event's key";
  EXPECT_EQ(terminal.slots_issued(), 1) << "only the reconciler's claim got through";
  EXPECT_EQ(store.find(key)->result, "slot-1");
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_EQ(store.find(key)->status, RecordStatus::committed);
}

TEST_F(ReconcilerTest, ClaimsAgainWithoutLookupOnlyBecauseTheDownstreamHonoursKeys) {
  idemgate::test::WithoutLookup<FakeTerminal<>> no_lookup{terminal};
  auto gate = gate_over(no_lookup);
  crash_after_claim(gate);
  clock.advance(31s);
  Reconciler reconciler{gate, fast};
  EXPECT_EQ(reconciler.run_once().reclaimed, 1u);
  EXPECT_EQ(terminal.keys_claimed(), (std::vector<Key>{key, key}))
      << "claimed again, under the same key";
  EXPECT_EQ(store.find(key)->result, "slot-1") << "the same key got the original slot back";
  EXPECT_EQ(bookings.size(), 1u);
}

TEST_F(ReconcilerTest, EscalatesWhenTheDownstreamNeitherHonoursKeysNorLooksUp) {
  FakeTerminal<false> keyless;
  idemgate::test::WithoutLookup<FakeTerminal<false>> blind{keyless};
  auto gate = gate_over(blind);
  strand(gate, key, msku);
  clock.advance(31s);
  Reconciler reconciler{gate, fast};
  const auto report = reconciler.run_once();
  EXPECT_EQ(report.escalated, 1u);
  EXPECT_EQ(keyless.calls(), 0) << "never a blind retry";
  const auto parked = gate.escalated();
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_EQ(parked[0].key, key);
  EXPECT_NE(parked[0].reason.find("Idempotency-Key"), std::string::npos);
}

TEST_F(ReconcilerTest, FailingLookupFallsBackToAClaimUnderTheSameKey) {
  auto gate = gate_over(terminal);
  crash_after_claim(gate);
  terminal.lookup_down = true;  // e.g. 401/403/405/410 from a lookup endpoint, for ever
  clock.advance(31s);
  Reconciler reconciler{gate, fast};
  const auto report = reconciler.run_once();
  EXPECT_EQ(report.reclaimed, 1u) << "a downstream that honours keys is safe to claim again";
  EXPECT_EQ(store.find(key)->status, RecordStatus::committed);
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_EQ(terminal.keys_claimed(), (std::vector<Key>{key, key}))
      << "claimed again, under the same key";
  EXPECT_EQ(store.find(key)->result, "slot-1") << "the repeated claim returned the original slot";
}

TEST_F(ReconcilerTest, LookupThatKeepsFailingIsEscalatedWithItsReasonAfterMaxAttempts) {
  FakeTerminal<false> keyless;  // cannot take keys: only its lookup may finish the event
  auto gate = gate_over(keyless);
  strand(gate, key, msku, 500ms);
  keyless.lookup_down = true;
  Reconciler reconciler{gate,
                        {.interval = 10ms, .stale_after = 0ms, .batch = 10, .max_attempts = 3}};
  std::size_t deferred = 0;
  for (int pass = 0; pass < 10 && store.find(key)->status == RecordStatus::in_flight; ++pass) {
    clock.advance(1s);
    deferred += reconciler.run_once().deferred;
  }
  EXPECT_EQ(deferred, 2u) << "attempts 2 and 3 tried the lookup; attempt 4 gave up";
  const auto row = store.find(key);
  EXPECT_EQ(row->status, RecordStatus::escalated);
  EXPECT_NE(row->reason.find("lookup endpoint unavailable"), std::string::npos) << row->reason;
  EXPECT_NE(row->reason.find("gave up after 3 attempts"), std::string::npos) << row->reason;
  EXPECT_EQ(keyless.calls(), 0) << "never claimed: the downstream cannot take keys";
  EXPECT_EQ(bookings.size(), 0u);
}

TEST_F(ReconcilerTest, AReasonCountsOneAttemptInTheSingular) {
  FakeTerminal<false> keyless;
  auto gate = gate_over(keyless);
  strand(gate, key, msku, 500ms);
  keyless.lookup_down = true;
  Reconciler reconciler{gate,
                        {.interval = 10ms, .stale_after = 0ms, .batch = 10, .max_attempts = 1}};
  for (int pass = 0; pass < 10 && store.find(key)->status == RecordStatus::in_flight; ++pass) {
    clock.advance(1s);
    (void)reconciler.run_once();
  }
  const auto row = store.find(key);
  EXPECT_EQ(row->status, RecordStatus::escalated);
  EXPECT_NE(row->reason.find("gave up after 1 attempt ("), std::string::npos) << row->reason;
}

TEST_F(ReconcilerTest, PoisonRowIsEscalatedWithTheLastErrorInsteadOfRetakenForever) {
  int writes = 0;
  Gate gate{"ect.claim_slot",
            store,
            terminal,
            [&](MemoryStore::transaction&, const SlotRequest&, const std::string&) {
              ++writes;
              throw std::runtime_error("tms_bookings: column \"slot\" is too short");
            },
            {.lease = 30s}};
  EXPECT_THROW((void)gate.process(key, msku), std::runtime_error);
  Reconciler reconciler{gate,
                        {.interval = 10ms, .stale_after = 0ms, .batch = 10, .max_attempts = 4}};
  std::size_t given_up = 0;
  for (int pass = 0; pass < 20; ++pass) {
    clock.advance(1s);
    given_up += reconciler.run_once().given_up;
  }
  EXPECT_EQ(given_up, 1u);
  EXPECT_EQ(writes, 4) << "the first delivery and three reconciler attempts, then no more";
  const auto row = store.find(key);
  EXPECT_EQ(row->status, RecordStatus::escalated);
  EXPECT_EQ(row->attempts, 5);
  EXPECT_NE(row->reason.find("is too short"), std::string::npos) << row->reason;
  EXPECT_EQ(store.signals(1h).retrying, 0) << "escalated, so no longer in flight";
}

TEST_F(ReconcilerTest, RetryingRowsAreCounted) {
  const auto fingerprint = idemgate::detail::sha256("r");
  (void)store.reserve(key, fingerprint, "r", 1s);
  EXPECT_EQ(store.signals(1h).retrying, 0);
  clock.advance(2s);
  EXPECT_EQ(store.take_stale(10, 0ms, 1s).at(0).attempts, 2);
  EXPECT_EQ(store.signals(1h).retrying, 1);
}

TEST_F(ReconcilerTest, StoresAPermanentFailureFromTheReclaim) {
  auto gate = gate_over(terminal);
  strand(gate, key, msku);
  terminal.before = [](const SlotRequest&, const Key&) -> std::optional<ClaimResult<std::string>> {
    return idemgate::PermanentFailure{"422 container unknown"};
  };
  clock.advance(31s);
  Reconciler reconciler{gate, fast};
  EXPECT_EQ(reconciler.run_once().failed, 1u);
  EXPECT_EQ(store.find(key)->status, RecordStatus::failed);
  EXPECT_EQ(gate.process(key, msku).status(), Status::failed);
}

TEST_F(ReconcilerTest, AStaleWorkerThatResumesAfterTheReconcilerCannotCommit) {
  terminal.ignores_keys = true;  // a second claim would show as a second slot
  auto gate = gate_over(terminal);
  Reconciler reconciler{gate, fast};
  bool stalled = false;
  terminal.after = [&](const Key&, const std::string&) -> std::optional<ClaimResult<std::string>> {
    if (std::exchange(stalled, true)) return std::nullopt;
    // The worker stalls past its lease; the reconciler finishes the event meanwhile.
    clock.advance(31s);
    EXPECT_EQ(reconciler.run_once().found, 1u);
    return std::nullopt;
  };
  EXPECT_EQ(gate.process(key, msku).status(), Status::lost_lease);
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_EQ(terminal.calls(), 1) << "the reconciler found the worker's slot by lookup";
  EXPECT_EQ(terminal.slots_issued(), 1);
  EXPECT_EQ(store.find(key)->result, "slot-1");
}

TEST_F(ReconcilerTest, BatchBoundsOnePass) {
  auto gate = gate_over(terminal);
  for (int i = 0; i < 25; ++i) {
    const SlotRequest r{"C" + std::to_string(i), "w"};
    strand(gate, idemgate::derive_key("s", r.container), r);
  }
  clock.advance(31s);
  Reconciler reconciler{gate, {.interval = 10ms, .stale_after = 0ms, .batch = 10}};
  EXPECT_EQ(reconciler.run_once().taken, 10u);
  EXPECT_EQ(reconciler.run_once().taken, 10u);
  EXPECT_EQ(reconciler.run_once().taken, 5u);
  EXPECT_EQ(bookings.size(), 25u);
}

TEST_F(ReconcilerTest, StaleAfterWaitsBeyondTheLease) {
  auto gate = gate_over(terminal, 10s);
  strand(gate, key, msku, 10s);
  Reconciler reconciler{gate, {.interval = 1min, .stale_after = 2min, .batch = 10}};
  clock.advance(11s);
  EXPECT_EQ(reconciler.run_once().taken, 0u) << "expired lease, but not stale for 2 minutes";
  clock.advance(2min);
  EXPECT_EQ(reconciler.run_once().taken, 1u);
}

TEST_F(ReconcilerTest, BackgroundLoopFinishesStrandedRowsUntilStopped) {
  auto gate = gate_over(terminal);
  strand(gate, key, msku);
  clock.advance(31s);
  Reconciler reconciler{gate, fast};
  reconciler.start();
  for (int i = 0; i < 500 && bookings.size() == 0; ++i) std::this_thread::sleep_for(10ms);
  reconciler.stop();
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_EQ(store.find(key)->status, RecordStatus::committed);
  reconciler.stop();  // stopping twice is harmless
}

TEST_F(ReconcilerTest, TotalReportKeepsWhatEveryPassDidAfterAnIdlePass) {
  auto gate = gate_over(terminal);
  for (int i = 0; i < 3; ++i) {
    const SlotRequest r{"C" + std::to_string(i), "w"};
    strand(gate, idemgate::derive_key("s", r.container), r);
  }
  clock.advance(31s);
  Reconciler reconciler{gate, fast};
  reconciler.start();
  // Wait for the pass that finished the rows to be reported, then for a later pass that found
  // nothing (one pass takes all three: the batch is 100).
  for (int i = 0;
       i < 500 && (reconciler.total_report().taken < 3 || reconciler.last_report().taken != 0); ++i)
    std::this_thread::sleep_for(10ms);
  reconciler.stop();
  ASSERT_EQ(bookings.size(), 3u);
  EXPECT_EQ(reconciler.last_report().taken, 0u) << "the latest pass was idle";
  EXPECT_EQ(reconciler.last_report().reclaimed, 0u);
  auto total = reconciler.total_report();
  EXPECT_EQ(total.taken, 3u) << "the idle pass did not wipe out what earlier passes did";
  EXPECT_EQ(total.reclaimed, 3u);
  EXPECT_EQ(total.errors, 0u);

  // run_once() adds to the same total.
  strand(gate, key, msku);
  clock.advance(31s);
  EXPECT_EQ(reconciler.run_once().reclaimed, 1u);
  total = reconciler.total_report();
  EXPECT_EQ(total.taken, 4u);
  EXPECT_EQ(total.reclaimed, 4u);
}

TEST_F(ReconcilerTest, EscalatedEventsAreListedAndResolvedWithTheBusinessWrite) {
  FakeTerminal<false> keyless;
  auto gate = gate_over(keyless);
  ASSERT_EQ(gate.process(key, msku).status(), Status::escalated);
  ASSERT_EQ(gate.escalated().size(), 1u);
  EXPECT_FALSE(gate.resolve(idemgate::derive_key("s", "unknown"), "slot-x"));
  EXPECT_TRUE(gate.resolve(key, "slot-by-hand"));
  EXPECT_FALSE(gate.resolve(key, "slot-again")) << "a resolved event is not resolved twice";
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_TRUE(gate.escalated().empty());
  auto again = gate.process(key, msku);
  EXPECT_EQ(again.status(), Status::duplicate);
  EXPECT_EQ(again.outcome(), "slot-by-hand");
}

TEST(Reconciler, APassLongerThanTheLeaseKeepsTheRowsItHasNotReachedYet) {
  MemoryStore store;  // the real clock: the pass really takes longer than the lease
  FakeTerminal<> terminal;
  idemgate::test::WithoutLookup<FakeTerminal<>> downstream{terminal};
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, downstream, bookings.writer(), {.lease = 240ms}};
  std::vector<Key> keys;
  for (int i = 0; i < 10; ++i) {
    keys.push_back(idemgate::derive_key("ect.claim_slot", "CIS-pass", std::to_string(i)));
    const std::string bytes = gate.encode_request(msku);
    (void)gate.store().reserve(keys.back(), idemgate::detail::sha256(bytes), bytes, 1ms);
  }
  std::this_thread::sleep_for(5ms);
  terminal.set_delay(60ms);  // 10 claims: 600 ms, more than twice the lease
  Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  std::atomic<int> taken_over{0};
  std::thread redelivery([&] {
    std::this_thread::sleep_for(450ms);
    const std::string bytes = gate.encode_request(msku);
    const auto r = gate.store().reserve(keys.back(), idemgate::detail::sha256(bytes), bytes, 240ms);
    if (r.kind != idemgate::Reservation::Kind::existing) ++taken_over;
  });
  const auto report = reconciler.run_once();
  redelivery.join();
  EXPECT_EQ(taken_over.load(), 0) << "the pass's lease on the last row was still live";
  EXPECT_EQ(report.reclaimed, 10u);
  EXPECT_EQ(report.lost, 0u);
  EXPECT_EQ(bookings.size(), 10u);
}
