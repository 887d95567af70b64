// Every option of the core types at its extremes (0, -1, the type's min() and max()): each is
// either refused at construction with std::invalid_argument naming the option and its range, or
// honoured exactly. Plus the memory store and the periodic loop given hostile durations.

#include "support/fake_terminal.hpp"
#include "support/memory_bookings.hpp"
#include "support/option_samples.hpp"
#include "support/slot_request.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/detail/periodic.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/retention.hpp>
#include <idemgate/signals.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/testing/clocks.hpp>
#include <idemgate/webhook/standard.hpp>
#include <idemgate/webhook/stripe.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

using idemgate::Gate;
using idemgate::GateOptions;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::Reconciler;
using idemgate::ReconcilerOptions;
using idemgate::RecordStatus;
using idemgate::Reservation;
using idemgate::Retention;
using idemgate::RetentionOptions;
using idemgate::SignalThresholds;
using idemgate::Status;
using idemgate::StoreSignals;
using idemgate::WebhookOptions;
using idemgate::test::expect_refused;
using idemgate::test::extremes;
using idemgate::test::FakeTerminal;
using idemgate::test::MemoryBookings;
using idemgate::test::Sample;
using idemgate::test::SimulatedCrash;
using idemgate::test::size_extremes;
using idemgate::test::SlotRequest;
using idemgate::testing::ManualClock;
using namespace std::chrono_literals;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
const Key key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");
const Key other_key = idemgate::derive_key("ect.claim_slot", "CIS-2", "MSKU7000037");
const auto fingerprint = idemgate::detail::sha256("request");

/// About as far as the system clock can be moved from today without overflowing.
constexpr std::chrono::days two_centuries{73'050};

/// A gate over a memory store on a hand-moved clock, and what it calls.
struct World {
  ManualClock clock;
  /// The log, seen as the world's gates see it (their rows only).
  MemoryStore store = MemoryStore{clock.fn()}.for_gate("ect.claim_slot");
  FakeTerminal<> terminal;
  MemoryBookings bookings;

  auto gate(GateOptions options = {}) {
    return Gate{"ect.claim_slot", store, terminal, bookings.writer(), options};
  }

  /// Leaves `k` in flight, as a worker that died after the claim would.
  template <class G>
  void strand(G& gate, const Key& k) {
    terminal.after = [](const Key&,
                        const std::string&) -> std::optional<idemgate::ClaimResult<std::string>> {
      throw SimulatedCrash{};
    };
    EXPECT_THROW((void)gate.process(k, msku), SimulatedCrash);
    terminal.after = nullptr;
    ASSERT_EQ(store.find(k)->status, RecordStatus::in_flight);
  }
};

}  // namespace

// --- GateOptions --------------------------------------------------------------------------------

TEST(GateOptionsRange, LeaseOutsideOneMillisecondToAYearIsRefused) {
  World w;
  auto make = [&](milliseconds lease) { (void)w.gate({.lease = lease}); };
  for (const auto& [value, label] : extremes<milliseconds>())
    expect_refused([&] { make(value); }, "GateOptions::lease", "between 1 ms and 365 d", label);
  expect_refused([&] { make(std::chrono::days(365) + 1ms); }, "GateOptions::lease",
                 "between 1 ms and 365 d", "a year and 1 ms");
  EXPECT_NO_THROW(make(1ms));
  EXPECT_NO_THROW(make(std::chrono::days(365)));
}

TEST(GateOptionsRange, LeaseOfAYearIsHonoured) {
  World w;
  auto gate = w.gate({.lease = std::chrono::days(365)});
  w.strand(gate, key);
  w.clock.advance(std::chrono::days(364));
  EXPECT_EQ(gate.process(key, msku).status(), Status::in_flight) << "the lease is still live";
  Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  EXPECT_EQ(reconciler.run_once().taken, 0u);
  w.clock.advance(std::chrono::days(2));
  EXPECT_EQ(gate.process(key, msku).status(), Status::processed) << "the lease has expired";
}

TEST(GateOptionsRange, MaxRequestBytesOutsideOneTo64MiBIsRefused) {
  World w;
  auto make = [&](std::size_t bytes) { (void)w.gate({.max_request_bytes = bytes}); };
  for (const auto& [value, label] : size_extremes())
    expect_refused([&] { make(value); }, "GateOptions::max_request_bytes", "between 1 and 67108864",
                   label);
  expect_refused([&] { make((std::size_t{64} << 20) + 1); }, "GateOptions::max_request_bytes",
                 "between 1 and 67108864", "64 MiB + 1");
  EXPECT_NO_THROW(make(std::size_t{64} << 20));
  auto tiny = w.gate({.max_request_bytes = 1});
  EXPECT_THROW((void)tiny.process(key, msku), idemgate::RequestError) << "1 byte is honoured";
  EXPECT_EQ(w.terminal.calls(), 0);
}

TEST(GateOptionsRange, CacheCapacityAboveTenMillionIsRefused) {
  World w;
  auto make = [&](std::size_t capacity) { (void)w.gate({.cache_capacity = capacity}); };
  expect_refused([&] { make(std::numeric_limits<std::size_t>::max()); },
                 "GateOptions::cache_capacity", "between 0 and 10000000", "max()");
  expect_refused([&] { make(10'000'001); }, "GateOptions::cache_capacity", "between 0 and 10000000",
                 "10000001");
  EXPECT_NO_THROW(make(10'000'000));
  auto uncached = w.gate({.cache_capacity = 0});
  (void)uncached.process(key, msku);
  EXPECT_EQ(uncached.process(key, msku).status(), Status::duplicate);
  EXPECT_EQ(w.store.find(key)->duplicates, 1) << "0 is honoured: the duplicate reached the store";
}

TEST(GateOptionsRange, MaxAttemptsOutsideOneToAMillionIsRefusedAndIsKeptAtTheDoor) {
  World w;
  auto make = [&](std::size_t attempts) { (void)w.gate({.max_attempts = attempts}); };
  for (const auto& [value, label] : size_extremes())
    expect_refused([&] { make(value); }, "GateOptions::max_attempts", "between 1 and 1000000",
                   label);
  expect_refused([&] { make(1'000'001); }, "GateOptions::max_attempts", "between 1 and 1000000",
                 "1000001");
  EXPECT_NO_THROW(make(1'000'000));
  // A sender that resends at once, to a downstream that always fails for now: three attempts
  // call it, the fourth reservation calls nothing and escalates with the last error.
  w.terminal.before = [](const SlotRequest&, const Key&) {
    return std::optional<idemgate::ClaimResult<std::string>>(
        idemgate::TransientFailure{"the terminal answered 503"});
  };
  auto gate = w.gate({.max_attempts = 3, .retry_backoff = 0ms});
  for (int delivery = 1; delivery <= 3; ++delivery)
    EXPECT_EQ(gate.process(key, msku).status(), Status::retry) << delivery;
  const auto fourth = gate.process(key, msku);
  EXPECT_EQ(fourth.status(), Status::escalated);
  EXPECT_EQ(fourth.reason(),
            "gave up after 3 attempts (GateOptions::max_attempts = 3); the last one said: the "
            "terminal answered 503");
  for (int delivery = 5; delivery <= 12; ++delivery)
    EXPECT_EQ(gate.process(key, msku).status(), Status::escalated) << delivery;
  EXPECT_EQ(w.terminal.calls(), 3) << "max_attempts bounds every attempt, not the reconciler's";
  EXPECT_EQ(w.store.find(key)->status, RecordStatus::escalated);
  EXPECT_EQ(w.store.escalated(10).size(), 1u) << "the operator sees it in the manual queue";
  // One attempt: the first delivery was it.
  auto once = w.gate({.max_attempts = 1, .retry_backoff = 0ms});
  EXPECT_EQ(once.process(other_key, msku).status(), Status::retry);
  EXPECT_EQ(once.process(other_key, msku).status(), Status::escalated);
  EXPECT_EQ(w.terminal.calls(), 4);
  // A batch's takeovers are bounded the same way.
  const Key batched = idemgate::derive_key("ect.claim_slot", "CIS-3", "MSKU7000037");
  const std::vector<idemgate::BatchMessage<SlotRequest>> batch{{"m-1", batched, msku, {}}};
  auto twice = w.gate({.max_attempts = 2, .retry_backoff = 0ms});
  for (int delivery = 1; delivery <= 2; ++delivery)
    EXPECT_EQ(twice.process_batch(batch).items().at(0).result.status(), Status::retry);
  EXPECT_EQ(twice.process_batch(batch).items().at(0).result.status(), Status::escalated);
  EXPECT_EQ(w.terminal.calls(), 6);
}

TEST(GateOptionsRange, RetryBackoffOutsideZeroToItsMostIsRefusedAndHoldsTheKeyDoubling) {
  World w;
  auto make = [&](milliseconds first, milliseconds most) {
    (void)w.gate({.retry_backoff = first, .max_retry_backoff = most});
  };
  expect_refused([&] { make(0ms, std::chrono::days(1) + 1ms); }, "GateOptions::max_retry_backoff",
                 "between 0 ms and 1 d", "a day and 1 ms");
  expect_refused([&] { make(0ms, -1ms); }, "GateOptions::max_retry_backoff", "between 0 ms and 1 d",
                 "-1 ms");
  expect_refused([&] { make(2s, 1s); }, "GateOptions::retry_backoff", "between 0 ms and 1000 ms",
                 "above its most");
  expect_refused([&] { make(-1ms, 1s); }, "GateOptions::retry_backoff", "between 0 ms", "-1 ms");
  EXPECT_NO_THROW(make(0ms, 0ms));
  EXPECT_NO_THROW(make(std::chrono::days(1), std::chrono::days(1)));
  w.terminal.before = [](const SlotRequest&, const Key&) {
    return std::optional<idemgate::ClaimResult<std::string>>(
        idemgate::TransientFailure{"the terminal answered 503"});
  };
  auto gate =
      w.gate({.lease = 30s, .heartbeat = false, .retry_backoff = 1s, .max_retry_backoff = 3s});
  // Each step: the answer, and how many times the terminal was called by then.
  const auto attempt = [&] {
    const Status status = gate.process(key, msku).status();
    return std::pair{status, w.terminal.calls()};
  };
  using Step = std::pair<Status, int>;
  EXPECT_EQ(attempt(), (Step{Status::retry, 1}));  // attempt 1; held 1 s
  const auto during = gate.process(key, msku);
  EXPECT_EQ(during.status(), Status::retry) << "held: no downstream call, and no ack";
  EXPECT_NE(during.reason().find("back-off"), std::string::npos) << during.reason();
  w.clock.advance(999ms);
  EXPECT_EQ(attempt(), (Step{Status::retry, 1})) << "still held";
  w.clock.advance(2ms);
  EXPECT_EQ(attempt(), (Step{Status::retry, 2}));  // attempt 2; held 2 s
  w.clock.advance(1999ms);
  EXPECT_EQ(attempt(), (Step{Status::retry, 2})) << "the hold doubled";
  w.clock.advance(2ms);
  EXPECT_EQ(attempt(), (Step{Status::retry, 3}));  // attempt 3; held 4 s, at most 3 s
  w.clock.advance(2999ms);
  EXPECT_EQ(attempt(), (Step{Status::retry, 3}));
  w.clock.advance(2ms);
  EXPECT_EQ(attempt(), (Step{Status::retry, 4})) << "max_retry_backoff caps the hold";
  const auto history = w.store.find(key)->history;
  for (const auto& entry : history)
    EXPECT_NE(entry.outcome, "taken_over") << "a hold that ended is no lease that ran out";
  // 0 turns it off: the next delivery takes the event over at once.
  auto eager = w.gate({.retry_backoff = 0ms});
  EXPECT_EQ(eager.process(other_key, msku).status(), Status::retry);
  EXPECT_EQ(eager.process(other_key, msku).status(), Status::retry);
  EXPECT_EQ(w.terminal.calls(), 6);
}

// --- RetentionOptions ---------------------------------------------------------------------------

TEST(RetentionOptionsRange, KeepBelowOneSecondIsRefused) {
  MemoryStore store = MemoryStore{}.for_gate("ect.claim_slot");
  for (const auto& [value, label] : extremes<seconds>()) {
    if (value == seconds::max()) continue;  // forever: honoured, below
    expect_refused(
        [&] {
          Retention retention{store, {.keep = value}};
        },
        "RetentionOptions::keep", "between 1 s and forever", label);
  }
  EXPECT_NO_THROW((Retention{store, {.keep = 1s}}));
}

TEST(RetentionOptionsRange, KeepForeverPurgesNothingAndARedeliveryStaysADuplicate) {
  World w;
  auto gate = w.gate();
  ASSERT_EQ(gate.process(key, msku).status(), Status::processed);
  Retention retention{w.store, {.keep = seconds::max()}};
  w.clock.advance(two_centuries);
  EXPECT_EQ(retention.run_once(), 0u);
  ASSERT_TRUE(w.store.find(key).has_value()) << "the finished row survived";
  EXPECT_EQ(gate.process(key, msku).status(), Status::duplicate);
  EXPECT_EQ(w.terminal.calls(), 1) << "the downstream was called once";
  EXPECT_EQ(w.bookings.size(), 1u);
}

TEST(RetentionOptionsRange, IntervalOutsideOneMillisecondToSevenDaysIsRefused) {
  MemoryStore store = MemoryStore{}.for_gate("ect.claim_slot");
  for (const auto& [value, label] : extremes<milliseconds>())
    expect_refused(
        [&] {
          Retention retention{store, {.interval = value}};
        },
        "RetentionOptions::interval", "between 1 ms and 7 d", label);
  expect_refused(
      [&] {
        Retention retention{store, {.interval = std::chrono::days(7) + 1ms}};
      },
      "RetentionOptions::interval", "between 1 ms and 7 d", "7 days and 1 ms");
  EXPECT_NO_THROW((Retention{store, {.interval = 1ms}}));
  EXPECT_NO_THROW((Retention{store, {.interval = std::chrono::days(7)}}));
}

TEST(RetentionOptionsRange, AHandleOfNoGateIsRefusedNotSilentlyBlind) {
  MemoryStore root;
  try {
    Retention retention{root};
    ADD_FAILURE() << "a Retention over the store as constructed was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gate.store()"), std::string::npos) << what;
    EXPECT_NE(what.find("idemgate purge --all-gates"), std::string::npos) << what;
  }
  MemoryStore scoped = root.for_gate("ect.claim_slot");
  EXPECT_NO_THROW((Retention{scoped}));
}

TEST(RetentionOptionsRange, BatchOutsideOneToAMillionIsRefusedAndOneIsHonoured) {
  World w;
  for (const auto& [value, label] : size_extremes())
    expect_refused(
        [&] {
          Retention retention{w.store, {.batch = value}};
        },
        "RetentionOptions::batch", "between 1 and 1000000", label);
  expect_refused(
      [&] {
        Retention retention{w.store, {.batch = 1'000'001}};
      },
      "RetentionOptions::batch", "between 1 and 1000000", "1000001");
  EXPECT_NO_THROW((Retention{w.store, {.batch = 1'000'000}}));

  auto gate = w.gate();
  (void)gate.process(key, msku);
  (void)gate.process(other_key, msku);
  w.clock.advance(std::chrono::days(8));
  Retention one_by_one{w.store, {.keep = std::chrono::days(7), .batch = 1}};
  EXPECT_EQ(one_by_one.run_once(), 2u) << "batches of one still delete every old row";
  EXPECT_TRUE(w.store.records().empty());
}

TEST(RetentionOptionsRange, AbandonedAfterBelowOneSecondIsRefused) {
  MemoryStore store = MemoryStore{}.for_gate("orders.api");
  for (const auto& [value, label] : extremes<seconds>()) {
    if (value == seconds::max()) continue;  // forever: honoured, below
    expect_refused(
        [&] {
          Retention retention{store, {.abandoned_after = value}};
        },
        "RetentionOptions::abandoned_after", "between 1 s and forever", label);
  }
  EXPECT_NO_THROW((Retention{store, {.abandoned_after = 1s}}));
  EXPECT_NO_THROW((Retention{store, {.abandoned_after = seconds::max()}}));
}

// --- ReconcilerOptions --------------------------------------------------------------------------

TEST(ReconcilerOptionsRange, IntervalOutsideOneMillisecondToADayIsRefused) {
  World w;
  auto gate = w.gate();
  for (const auto& [value, label] : extremes<milliseconds>())
    expect_refused(
        [&] {
          Reconciler reconciler{gate, {.interval = value}};
        },
        "ReconcilerOptions::interval", "between 1 ms and 1 d", label);
  expect_refused(
      [&] {
        Reconciler reconciler{gate, {.interval = std::chrono::days(1) + 1ms}};
      },
      "ReconcilerOptions::interval", "between 1 ms and 1 d", "a day and 1 ms");
  EXPECT_NO_THROW((Reconciler{gate, {.interval = 1ms}}));
  EXPECT_NO_THROW((Reconciler{gate, {.interval = std::chrono::days(1)}}));
}

TEST(ReconcilerOptionsRange, StaleAfterOutsideZeroToAYearIsRefused) {
  World w;
  auto gate = w.gate();
  for (const auto& [value, label] : extremes<milliseconds>()) {
    if (value == 0ms) continue;  // as soon as the lease expired: honoured, below
    expect_refused(
        [&] {
          Reconciler reconciler{gate, {.stale_after = value}};
        },
        "ReconcilerOptions::stale_after", "between 0 ms and 365 d", label);
  }
  expect_refused(
      [&] {
        Reconciler reconciler{gate, {.stale_after = std::chrono::days(365) + 1ms}};
      },
      "ReconcilerOptions::stale_after", "between 0 ms and 365 d", "a year and 1 ms");
  EXPECT_NO_THROW((Reconciler{gate, {.stale_after = std::chrono::days(365)}}));
}

TEST(ReconcilerOptionsRange, StaleAfterZeroTakesARowOverAsSoonAsItsLeaseExpired) {
  World w;
  auto gate = w.gate({.lease = 30s});
  w.strand(gate, key);
  Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  w.clock.advance(30s);
  EXPECT_EQ(reconciler.run_once().taken, 0u) << "the lease ends at 30 s, not before";
  w.clock.advance(1ms);
  const auto report = reconciler.run_once();
  EXPECT_EQ(report.taken, 1u);
  EXPECT_EQ(w.store.find(key)->status, RecordStatus::committed);
}

TEST(ReconcilerOptionsRange, MaxAttemptsAboveAMillionIsRefusedZeroTakesTheGatesAndOneIsHonoured) {
  World w;
  auto gate = w.gate({.lease = 30s});
  expect_refused(
      [&] {
        Reconciler reconciler{gate, {.max_attempts = std::numeric_limits<std::size_t>::max()}};
      },
      "ReconcilerOptions::max_attempts", "between 0 and 1000000", "max()");
  EXPECT_NO_THROW((Reconciler{gate, {.max_attempts = 1'000'000}}));
  EXPECT_NO_THROW((Reconciler{gate, {.max_attempts = 0}}));
  {
    // 0, the default, takes the gate's bound: one attempt, which the first delivery was.
    World strict;
    auto bounded = strict.gate({.lease = 30s, .max_attempts = 1});
    strict.strand(bounded, key);
    strict.clock.advance(31s);
    Reconciler follows{bounded, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
    EXPECT_EQ(follows.run_once().given_up, 1u);
    const auto row = strict.store.find(key);
    EXPECT_EQ(row->status, RecordStatus::escalated);
    EXPECT_NE(row->reason.find("gave up after 1 attempt (GateOptions::max_attempts = 1)"),
              std::string::npos)
        << row->reason;
  }
  // One attempt: the first delivery was it, so the first pass escalates the stranded row.
  w.strand(gate, key);
  w.clock.advance(31s);
  Reconciler once{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10, .max_attempts = 1}};
  EXPECT_EQ(once.run_once().given_up, 1u);
  EXPECT_EQ(w.store.find(key)->status, RecordStatus::escalated);
}

TEST(ReconcilerOptionsRange, BatchOutsideOneToTenThousandIsRefusedAndOneIsHonoured) {
  World w;
  auto gate = w.gate({.lease = 30s});
  for (const auto& [value, label] : size_extremes())
    expect_refused(
        [&] {
          Reconciler reconciler{gate, {.batch = value}};
        },
        "ReconcilerOptions::batch", "between 1 and 10000", label);
  expect_refused(
      [&] {
        Reconciler reconciler{gate, {.batch = 10'001}};
      },
      "ReconcilerOptions::batch", "between 1 and 10000", "10001");
  EXPECT_NO_THROW((Reconciler{gate, {.batch = 10'000}}));

  w.strand(gate, key);
  w.strand(gate, other_key);
  w.clock.advance(31s);
  Reconciler one{gate, {.interval = 1min, .stale_after = 0ms, .batch = 1}};
  EXPECT_EQ(one.run_once().taken, 1u);
  EXPECT_EQ(one.run_once().taken, 1u);
  EXPECT_EQ(one.run_once().taken, 0u);
}

// --- MemoryStore: durations at their extremes --------------------------------------------------

TEST(MemoryStoreHostileDurations, PurgeOlderThanMaxDeletesNothing) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  const auto r = store.reserve(key, fingerprint, "request", 1min);
  ASSERT_EQ(store.commit(key, r.fence, "slot-1", [](MemoryStore::transaction&) {}),
            idemgate::CommitStatus::committed);
  clock.advance(two_centuries);
  EXPECT_EQ(store.purge(seconds::max(), 10), 0u);
  EXPECT_TRUE(store.find(key).has_value());
  EXPECT_EQ(store.purge(std::chrono::days(365 * 100), 10), 1u) << "the row was old enough";
}

TEST(MemoryStoreHostileDurations, PurgeOlderThanMinDoesNotWrapAndKeepsInFlightRows) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  const auto r = store.reserve(key, fingerprint, "request", 1min);
  (void)store.commit(key, r.fence, "slot-1", [](MemoryStore::transaction&) {});
  (void)store.reserve(other_key, fingerprint, "request", 1min);
  // Older than a negative age: every finished row, even one finished this instant.
  EXPECT_EQ(store.purge(seconds::min(), 10), 1u);
  EXPECT_FALSE(store.find(key).has_value());
  EXPECT_TRUE(store.find(other_key).has_value());
}

TEST(MemoryStoreHostileDurations, StaleAfterMaxTakesNothing) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  (void)store.reserve(key, fingerprint, "request", 1ms);
  clock.advance(two_centuries);
  EXPECT_TRUE(store.take_stale(10, milliseconds::max(), 1min).empty());
  EXPECT_EQ(store.take_stale(10, 0ms, 1min).size(), 1u) << "the row was stranded";
}

TEST(MemoryStoreHostileDurations, LeaseOfMaxIsNeverTakenOver) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  ASSERT_EQ(store.reserve(key, fingerprint, "request", milliseconds::max()).kind,
            Reservation::Kind::acquired);
  clock.advance(two_centuries);
  const Reservation again = store.reserve(key, fingerprint, "request", 1min);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.status, RecordStatus::in_flight);
  EXPECT_TRUE(store.take_stale(10, 0ms, 1min).empty());
}

TEST(MemoryStoreHostileDurations, LeaseOfMaxGrantedByTakeStaleIsNeverTakenOver) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  (void)store.reserve(key, fingerprint, "request", 1ms);
  clock.advance(1s);
  ASSERT_EQ(store.take_stale(10, 0ms, milliseconds::max()).size(), 1u);
  clock.advance(two_centuries);
  EXPECT_TRUE(store.take_stale(10, 0ms, 1min).empty());
  EXPECT_EQ(store.reserve(key, fingerprint, "request", 1min).kind, Reservation::Kind::existing);
}

TEST(MemoryStoreHostileDurations, LeaseOfMinHasAlreadyExpired) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  ASSERT_EQ(store.reserve(key, fingerprint, "request", milliseconds::min()).kind,
            Reservation::Kind::acquired);
  EXPECT_EQ(store.reserve(key, fingerprint, "request", 1min).kind, Reservation::Kind::taken_over);
}

TEST(MemoryStoreHostileDurations, SignalsOverTheLongestWindowCountEverything) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  (void)store.reserve(key, fingerprint, "request", 1min);
  (void)store.reserve(key, fingerprint, "request", 1min);
  store.record_mismatch(key, "slot-1", "slot-2", "test");
  clock.advance(std::chrono::days(365));
  const StoreSignals all = store.signals(seconds::max());
  EXPECT_EQ(all.events, 2);
  EXPECT_EQ(all.duplicates, 1);
  EXPECT_EQ(all.mismatched_keys, 1);
  const StoreSignals none = store.signals(seconds::min());
  EXPECT_EQ(none.events, 0);
  EXPECT_EQ(none.mismatched_keys, 0);
}

// --- the background loop -----------------------------------------------------------------------

TEST(PeriodicWorker, IntervalOfMaxSleepsUntilStopped) {
  std::atomic<int> passes{0};
  idemgate::detail::PeriodicWorker worker;
  worker.start(milliseconds::max(), [&] { ++passes; });
  for (int i = 0; i < 500 && passes.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_GE(passes.load(), 1);
  std::this_thread::sleep_for(100ms);
  worker.stop();
  EXPECT_EQ(passes.load(), 1) << "one pass now, the next one never";
}

// --- WebhookOptions -----------------------------------------------------------------------------

namespace {
constexpr std::string_view standard_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr std::string_view stripe_secret = "whsec_test_secret";
constexpr std::int64_t now_s = 1'700'000'000;
constexpr std::string_view body = R"({"id":"evt_1"})";

WebhookOptions at_now(seconds tolerance) {
  return WebhookOptions{tolerance, [] { return now_s; }};
}
}  // namespace

TEST(WebhookOptionsRange, ToleranceOutsideZeroToADayIsRefusedByEveryVerifier) {
  std::vector<Sample<seconds>> refused;
  for (const auto& sample : extremes<seconds>())
    if (sample.value != 0s) refused.push_back(sample);  // 0: honoured, below
  refused.push_back({std::chrono::hours(24) + 1s, "a day and 1 s"});
  for (const auto& [value, label] : refused) {
    expect_refused(
        [&] { idemgate::StandardWebhookVerifier verifier(standard_secret, at_now(value)); },
        "WebhookOptions::tolerance", "between 0 s and 24 h", label);
    expect_refused([&] { idemgate::StripeWebhookVerifier verifier(stripe_secret, at_now(value)); },
                   "WebhookOptions::tolerance", "between 0 s and 24 h", label);
    expect_refused(
        [&] {
          (void)idemgate::verify_stripe_webhook(stripe_secret, "t=1,v1=00", body, at_now(value));
        },
        "WebhookOptions::tolerance", "between 0 s and 24 h", label);
  }
}

TEST(WebhookOptionsRange, ToleranceOfZeroAndOfADayAreHonoured) {
  const idemgate::StandardWebhookVerifier exact(standard_secret, at_now(0s));
  EXPECT_TRUE(
      exact.verify("msg_1", std::to_string(now_s), exact.sign("msg_1", now_s, body), body).ok());
  EXPECT_FALSE(
      exact.verify("msg_1", std::to_string(now_s - 1), exact.sign("msg_1", now_s - 1, body), body)
          .ok());

  const idemgate::StripeWebhookVerifier day(stripe_secret, at_now(std::chrono::hours(24)));
  const std::int64_t edge = now_s - 24 * 3600;
  EXPECT_TRUE(day.verify(day.sign(edge, body), body).ok());
  const auto late = day.verify(day.sign(edge - 1, body), body);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.rejection(), idemgate::WebhookRejection::stale);
}

// --- SignalThresholds ---------------------------------------------------------------------------

namespace {
StoreSignals traffic(std::int64_t events, std::int64_t duplicates) {
  StoreSignals s;
  s.events = events;
  s.duplicates = duplicates;
  return s;
}
}  // namespace

TEST(SignalThresholdsRange, MinEventsBelowOneIsRefusedAndMaxTurnsTheAlarmOff) {
  const std::string range =
      "between 1 and " + std::to_string(std::numeric_limits<std::int64_t>::max());
  for (const auto& [value, label] : std::vector<Sample<std::int64_t>>{
           {0, "0"}, {-1, "-1"}, {std::numeric_limits<std::int64_t>::min(), "min()"}})
    expect_refused(
        [&] { (void)idemgate::evaluate(traffic(0, 0), {.min_events_for_zero_ratio = value}); },
        "SignalThresholds::min_events_for_zero_ratio", range, label);
  const SignalThresholds off{.min_events_for_zero_ratio = std::numeric_limits<std::int64_t>::max()};
  EXPECT_FALSE(idemgate::evaluate(traffic(1'000'000'000, 0), off).key_derivation_suspect);
  EXPECT_TRUE(
      idemgate::evaluate(traffic(1, 0), {.min_events_for_zero_ratio = 1}).key_derivation_suspect);
}

TEST(SignalThresholdsRange, DuplicateRatioOutsideZeroToOneIsRefused) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& [value, label] :
       std::vector<Sample<double>>{{-0.01, "-0.01"},
                                   {1.01, "1.01"},
                                   {-inf, "-inf"},
                                   {inf, "inf"},
                                   {std::numeric_limits<double>::quiet_NaN(), "NaN"},
                                   {std::numeric_limits<double>::lowest(), "lowest()"},
                                   {std::numeric_limits<double>::max(), "max()"}})
    expect_refused(
        [&] { (void)idemgate::evaluate(traffic(10, 1), {.high_duplicate_ratio = value}); },
        "SignalThresholds::high_duplicate_ratio", "between 0 and 1", label);
  EXPECT_TRUE(
      idemgate::evaluate(traffic(100, 1), {.high_duplicate_ratio = 0.0}).upstream_misbehaving);
  EXPECT_FALSE(
      idemgate::evaluate(traffic(100, 100), {.high_duplicate_ratio = 1.0}).upstream_misbehaving);
}

TEST(SignalThresholdsRange, NegativeStrandedAfterIsRefusedAndMaxTurnsTheAlarmOff) {
  StoreSignals s;
  s.in_flight = 1;
  s.oldest_in_flight = seconds::max() - 1s;
  for (const auto& [value, label] : extremes<seconds>()) {
    if (value >= 0s) continue;  // 0 and max(): honoured, below
    expect_refused([&] { (void)idemgate::evaluate(s, {.stranded_after = value}); },
                   "SignalThresholds::stranded_after", "between 0 s and forever", label);
  }
  EXPECT_FALSE(idemgate::evaluate(s, {.stranded_after = seconds::max()}).stranded_work);
  s.oldest_in_flight = 1s;
  EXPECT_TRUE(idemgate::evaluate(s, {.stranded_after = 0s}).stranded_work);
}

TEST(SignalThresholdsRange, NegativeOldSnapshotAfterIsRefusedAndMaxTurnsTheAlarmOff) {
  StoreSignals s;
  s.oldest_snapshot = seconds::max() - 1s;
  for (const auto& [value, label] : extremes<seconds>()) {
    if (value >= 0s) continue;  // 0 and max(): honoured, below
    expect_refused([&] { (void)idemgate::evaluate(s, {.old_snapshot_after = value}); },
                   "SignalThresholds::old_snapshot_after", "between 0 s and forever", label);
  }
  EXPECT_FALSE(idemgate::evaluate(s, {.old_snapshot_after = seconds::max()}).old_snapshot);
  s.oldest_snapshot = 1s;
  EXPECT_TRUE(idemgate::evaluate(s, {.old_snapshot_after = 0s}).old_snapshot);
}
