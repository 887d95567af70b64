#include "support/fake_terminal.hpp"
#include "support/memory_bookings.hpp"
#include "support/slot_request.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/testing/clocks.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::MemoryBookings;
using idemgate::test::SlotRequest;
using idemgate::testing::ManualClock;
using namespace std::chrono_literals;

namespace {

const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
const auto key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");

}  // namespace

TEST(Gate, FirstDeliveryClaimsOnceAndBooksOnce) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  auto result = gate.process(key, msku);
  EXPECT_EQ(result.status(), Status::processed);
  EXPECT_EQ(result.outcome(), "slot-1");
  EXPECT_TRUE(result.should_ack());
  EXPECT_EQ(terminal.calls(), 1);
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_EQ(gate.store().find(key)->status, RecordStatus::committed);
}

TEST(Gate, RedeliveryIsDuplicateWithStoredOutcomeAndNoSideEffect) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  (void)gate.process(key, msku);
  for (int i = 0; i < 5; ++i) {
    auto again = gate.process(key, msku);
    EXPECT_EQ(again.status(), Status::duplicate);
    EXPECT_EQ(again.outcome(), "slot-1");
    EXPECT_TRUE(again.should_ack());
  }
  EXPECT_EQ(terminal.calls(), 1);
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(Gate, SameKeyWithDifferentRequestIsConflictAndWritesNothing) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  (void)gate.process(key, msku);
  const auto before = *gate.store().find(key);
  auto clash = gate.process(key, SlotRequest{"MSKU7000037", "2025-06-09T09:00"});
  EXPECT_EQ(clash.status(), Status::conflict);
  EXPECT_FALSE(clash.has_outcome());
  EXPECT_NE(clash.reason().find("different request"), std::string::npos);
  EXPECT_EQ(terminal.calls(), 1);
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_EQ(gate.store().find(key)->fence, before.fence);
  EXPECT_EQ(gate.store().find(key)->result, before.result);
}

TEST(Gate, TransientFailureReleasesTheKeyAndTheNextDeliverySucceeds) {
  MemoryStore store;
  FakeTerminal<> terminal;
  terminal.ignores_keys = true;  // a claim that got through twice would show as two slots
  int failures = 1;
  terminal.before = [&](const SlotRequest&,
                        const idemgate::Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (failures-- > 0) return idemgate::TransientFailure{"503 Service Unavailable"};
    return std::nullopt;
  };
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.retry_backoff = 0ms}};
  auto first = gate.process(key, msku);
  EXPECT_EQ(first.status(), Status::retry);
  EXPECT_FALSE(first.should_ack());
  EXPECT_EQ(first.reason(), "503 Service Unavailable");
  const auto released = gate.store().find(key);
  ASSERT_TRUE(released.has_value());
  EXPECT_EQ(released->status, RecordStatus::in_flight);
  EXPECT_LT(released->lease_until, std::chrono::system_clock::now())
      << "without a back-off, a transient failure gives the key back at once";
  auto second = gate.process(key, msku);
  EXPECT_EQ(second.status(), Status::processed);
  EXPECT_TRUE(second.took_over());
  EXPECT_EQ(gate.store().find(key)->fence, 2) << "the next holder has a higher fence";
  EXPECT_EQ(terminal.calls(), 2) << "the refused claim and the redelivery's";
  EXPECT_EQ(terminal.slots_issued(), 1) << "only the redelivery's claim got through";
  EXPECT_EQ(second.outcome(), "slot-1");
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(Gate, DownstreamExceptionIsTransient) {
  MemoryStore store;
  FakeTerminal<> terminal;
  terminal.before = [](const SlotRequest&,
                       const idemgate::Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    throw std::runtime_error("connection reset");
  };
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.retry_backoff = 500ms}};
  const auto before = std::chrono::system_clock::now();
  auto result = gate.process(key, msku);
  EXPECT_EQ(result.status(), Status::retry);
  EXPECT_NE(result.reason().find("connection reset"), std::string::npos);
  const auto held = gate.store().find(key)->lease_until;
  EXPECT_GE(held, before + 500ms) << "held for the first back-off";
  EXPECT_LT(held, std::chrono::system_clock::now() + 500ms + 10ms);
  const auto held_answer = gate.process(key, msku);
  EXPECT_EQ(held_answer.status(), Status::retry) << "held: no second call, and no ack";
  EXPECT_NE(held_answer.reason().find("back-off"), std::string::npos) << held_answer.reason();
  EXPECT_EQ(terminal.calls(), 1);
}

TEST(Gate, PermanentFailureIsStoredAndEveryDuplicateGetsIt) {
  MemoryStore store;
  FakeTerminal<> terminal;
  terminal.before = [](const SlotRequest&,
                       const idemgate::Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    return idemgate::PermanentFailure{"422 unknown container"};
  };
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  auto first = gate.process(key, msku);
  EXPECT_EQ(first.status(), Status::failed);
  EXPECT_TRUE(first.should_ack());
  for (int i = 0; i < 3; ++i) {
    auto again = gate.process(key, msku);
    EXPECT_EQ(again.status(), Status::failed);
    EXPECT_EQ(again.reason(), "422 unknown container");
  }
  EXPECT_EQ(terminal.calls(), 1);
  EXPECT_EQ(bookings.size(), 0u);
  EXPECT_EQ(gate.store().find(key)->status, RecordStatus::failed);
}

TEST(Gate, BusinessWriteThatThrowsCommitsNothingAndHandsTheEventToTheRedelivery) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  int refusals = 1;
  Gate gate{"ect.claim_slot", store, terminal,
            [&](MemoryStore::transaction& tx, const SlotRequest& r, const std::string& slot) {
              if (refusals-- > 0) throw std::runtime_error("TMS rejected the booking");
              bookings.writer()(tx, r, slot);
            }};
  EXPECT_THROW((void)gate.process(key, msku), std::runtime_error);
  const auto row = gate.store().find(key);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->status, RecordStatus::in_flight);
  EXPECT_FALSE(row->result.has_value());
  EXPECT_EQ(bookings.size(), 0u);
  EXPECT_LT(row->lease_until, std::chrono::system_clock::now())
      << "the lease ends at once, so the redelivery does not meet a live lease and ack";
  const auto again = gate.process(key, msku);
  EXPECT_EQ(again.status(), Status::processed);
  EXPECT_TRUE(again.took_over());
  // The gate cannot know the first claim's slot was never booked: it claims again, and only the
  // repeated key keeps that from becoming a second slot.
  EXPECT_EQ(terminal.keys_claimed(), (std::vector<Key>{key, key}));
  EXPECT_EQ(again.outcome(), "slot-1") << "the terminal returned the first claim's slot";
  EXPECT_EQ(gate.store().find(key)->result, "slot-1");
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(Gate, LiveLeaseGivesInFlightAndExpiredLeaseIsTakenOver) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  int crashes = 1;
  terminal.after = [&](const Key&,
                       const std::string&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (crashes-- > 0) throw idemgate::test::SimulatedCrash{};  // died before the commit
    return std::nullopt;
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 30s}};
  EXPECT_THROW((void)gate.process(key, msku), idemgate::test::SimulatedCrash);
  EXPECT_EQ(gate.process(key, msku).status(), Status::in_flight);
  clock.advance(31s);
  auto taken = gate.process(key, msku);
  EXPECT_EQ(taken.status(), Status::processed);
  EXPECT_TRUE(taken.took_over());
  EXPECT_EQ(taken.outcome(), "slot-1") << "the terminal returns the original slot for the key";
  EXPECT_EQ(terminal.keys_claimed(), (std::vector<Key>{key, key}))
      << "the takeover claims again, under the same key";
  EXPECT_EQ(bookings.size(), 1u);
  EXPECT_EQ(gate.store().find(key)->fence, 2);
}

TEST(Gate, WorkerThatLostItsLeaseCannotCommit) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 30s}};
  bool paused = false;
  terminal.before =
      [&](const SlotRequest& r,
          const idemgate::Key& k) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (paused) return std::nullopt;
    paused = true;
    // This worker stalls past its lease; a redelivery takes the event over and finishes it.
    clock.advance(31s);
    auto other = gate.process(k, r);
    EXPECT_EQ(other.status(), Status::processed);
    EXPECT_TRUE(other.took_over());
    return std::nullopt;
  };
  auto stale = gate.process(key, msku);
  EXPECT_EQ(stale.status(), Status::lost_lease);
  EXPECT_TRUE(stale.should_ack());
  EXPECT_EQ(bookings.size(), 1u) << "no second business row, ever";
  EXPECT_EQ(gate.store().find(key)->status, RecordStatus::committed);
}

TEST(Gate, DownstreamThatIgnoresKeysIsEscalatedNotCalled) {
  MemoryStore store;
  FakeTerminal<false> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal,
            [&](MemoryStore::transaction& tx, const SlotRequest& r, const std::string& slot) {
              bookings.writer()(tx, r, slot);
            }};
  auto result = gate.process(key, msku);
  EXPECT_EQ(result.status(), Status::escalated);
  EXPECT_TRUE(result.should_ack());
  EXPECT_NE(result.reason().find("Idempotency-Key"), std::string::npos);
  EXPECT_EQ(terminal.calls(), 0);
  EXPECT_EQ(gate.store().find(key)->status, RecordStatus::escalated);
  EXPECT_EQ(gate.process(key, msku).status(), Status::escalated);
  EXPECT_EQ(terminal.calls(), 0);
}

TEST(Gate, OversizedRequestIsRefusedBeforeAnythingIsWritten) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.max_request_bytes = 64}};
  try {
    (void)gate.process(key, SlotRequest{std::string(100, 'X'), "w"});
    FAIL() << "an oversized request must be refused";
  } catch (const idemgate::RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("max_request_bytes"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(gate.store().find(key).has_value());
  EXPECT_EQ(terminal.calls(), 0);
}

TEST(Gate, RequestThatFailsToEncodeIsRefusedBeforeAnythingIsWritten) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  try {
    (void)gate.process(key, SlotRequest{"MSKU\n1", "w"});
    FAIL() << "an unencodable request must be refused";
  } catch (const idemgate::RequestError& e) {
    EXPECT_NE(std::string(e.what()).find("could not be encoded"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(gate.store().find(key).has_value());
  EXPECT_EQ(terminal.calls(), 0);
}

TEST(Gate, StoresTheRequestAndItsFingerprintWithTheReservation) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  (void)gate.process(key, msku);
  const auto row = gate.store().find(key);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(gate.decode_request(row->request), msku);
  EXPECT_EQ(row->fingerprint, idemgate::detail::sha256(row->request));
}

TEST(Gate, UnusableLeaseIsRefusedAtConstruction) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  auto make = [&](std::chrono::milliseconds lease) {
    Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = lease}};
    (void)gate;
  };
  EXPECT_THROW(make(0ms), std::invalid_argument);
  EXPECT_THROW(make(-5s), std::invalid_argument);
  EXPECT_THROW(make(std::chrono::hours(24 * 400)), std::invalid_argument);
  EXPECT_NO_THROW(make(2min));
}

TEST(Gate, FailedEventsCanBeRedrivenByKeyAndByTimeRange) {
  ManualClock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  bool credential_expired = true;
  terminal.before = [&](const SlotRequest&,
                        const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (credential_expired) return idemgate::PermanentFailure{"401 token expired"};
    return std::nullopt;
  };
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  std::vector<Key> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(idemgate::derive_key("ect.claim_slot", "CIS-" + std::to_string(i), "C"));
    EXPECT_EQ(gate.process(keys.back(), msku).status(), Status::failed);
    clock.advance(1min);
  }
  credential_expired = false;
  EXPECT_EQ(gate.process(keys[0], msku).status(), Status::failed) << "failed stays failed";
  EXPECT_EQ(gate.store().redrive_failed(keys[0]), 1u);
  EXPECT_EQ(gate.store().redrive_failed(keys[0]), 0u) << "no longer failed";
  auto again = gate.process(keys[0], msku);
  EXPECT_EQ(again.status(), Status::processed);
  EXPECT_TRUE(again.took_over());
  const auto start = gate.store().find(keys[1])->updated_at;
  EXPECT_EQ(gate.store().redrive_failed(start, start + 2min, 10), 2u) << "keys 1 and 2, not 3";
  EXPECT_EQ(gate.store().find(keys[3])->status, RecordStatus::failed);
  EXPECT_EQ(gate.process(keys[1], msku).status(), Status::processed);
  EXPECT_EQ(gate.process(keys[2], msku).status(), Status::processed);
  EXPECT_EQ(gate.store().find(keys[1])->attempts, 3) << "reserved, re-driven, taken over";
  EXPECT_EQ(bookings.size(), 3u);
}

TEST(Gate, ABatchLongerThanItsLeaseKeepsItsLeases) {
  MemoryStore store;
  FakeTerminal<> terminal;
  terminal.set_delay(60ms);  // 12 claims: 720 ms, three times the lease
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 240ms}};
  std::vector<idemgate::BatchMessage<SlotRequest>> batch;
  for (int i = 0; i < 12; ++i) {
    const std::string container = "C" + std::to_string(i);
    batch.push_back({container, idemgate::derive_key("b", container), SlotRequest{container, "w"}});
  }
  std::atomic<int> taken_over{0};
  std::thread redelivery([&] {
    // The last message comes again while the batch is still calling the downstream.
    std::this_thread::sleep_for(500ms);
    const std::string bytes = gate.encode_request(batch.back().request);
    const auto r =
        gate.store().reserve(batch.back().key, idemgate::detail::sha256(bytes), bytes, 240ms);
    if (r.kind != idemgate::Reservation::Kind::existing) ++taken_over;
  });
  const auto result = gate.process_batch(batch);
  redelivery.join();
  EXPECT_EQ(taken_over.load(), 0) << "the batch's own lease was still live";
  for (const auto& item : result.items())
    EXPECT_EQ(item.result.status(), Status::processed) << item.message_id;
  EXPECT_EQ(bookings.size(), 12u);
}

TEST(Gate, EscalatedEventWhoseStoredRequestNoLongerDecodesCanBeResolvedByHand) {
  MemoryStore store;
  FakeTerminal<false> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  // Stored by an older version whose codec wrote something this one cannot read.
  const auto r =
      gate.store().reserve(key, idemgate::detail::sha256("v1:MSKU7000037"), "v1:MSKU7000037", 1min);
  ASSERT_EQ(gate.store().escalate(key, r.fence, "no key support"),
            idemgate::CommitStatus::committed);
  try {
    (void)gate.resolve(key, "slot-by-hand");
    FAIL() << "the stored request does not decode";
  } catch (const idemgate::CodecError& e) {
    EXPECT_NE(std::string(e.what()).find("resolve_stored"), std::string::npos) << e.what();
  }
  std::string seen;
  EXPECT_TRUE(gate.resolve_stored(key, "slot-by-hand",
                                  [&](MemoryStore::transaction& tx, const Key&,
                                      std::string_view stored, const std::string& slot) {
                                    seen = std::string(stored);
                                    tx.on_commit([] {});
                                    (void)slot;
                                  }));
  EXPECT_EQ(seen, "v1:MSKU7000037");
  EXPECT_EQ(gate.store().find(key)->status, RecordStatus::committed);
  EXPECT_EQ(*gate.store().find(key)->result, "slot-by-hand");
  EXPECT_FALSE(gate.resolve_stored(key, "again",
                                   [](auto&, const Key&, std::string_view, const std::string&) {}))
      << "resolved already";
}

TEST(Gate, LabelsAreKeptOnlyWhenAskedAndNeverChangeTheKey) {
  const auto labelled = idemgate::derive_labelled_key("ect.claim_slot", "CIS-1", "MSKU7000037");
  EXPECT_EQ(labelled.key, key) << "the same key as derive_key";
  EXPECT_EQ(labelled.label, "ect.claim_slot CIS-1 MSKU7000037");
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate plain{"ect.claim_slot", store, terminal, bookings.writer()};
  EXPECT_EQ(plain.process(labelled, msku).status(), Status::processed);
  EXPECT_EQ(plain.store().find(key)->label, "") << "off by default";
  Gate keeping{"ect.cancel_slot", store, terminal, bookings.writer(), {.keep_labels = true}};
  EXPECT_EQ(keeping.process(labelled, msku).status(), Status::processed);
  EXPECT_EQ(keeping.store().find(key)->label, "ect.claim_slot CIS-1 MSKU7000037");
  EXPECT_EQ(keeping.store().rows({.label_contains = "CIS-1"}).size(), 1u);
  EXPECT_EQ(keeping.process(labelled, msku).status(), Status::duplicate);
}

TEST(Gate, ABatchKeepsEachMessagesLabelOnlyWhenAsked) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  const auto first = idemgate::derive_labelled_key("ect.claim_slot", "CIS-1", "MSKU7000037");
  const auto second = idemgate::derive_labelled_key("ect.claim_slot", "CIS-2", "MSKU7000038");
  const std::vector<idemgate::BatchMessage<SlotRequest>> batch{
      {"m-1", first.key, msku, first.label}, {"m-2", second.key, msku, second.label}};
  Gate plain{"ect.claim_slot", store, terminal, bookings.writer()};
  for (const auto& item : plain.process_batch(batch).items())
    EXPECT_EQ(item.result.status(), Status::processed);
  EXPECT_EQ(plain.store().find(first.key)->label, "") << "off by default";
  Gate keeping{"ect.cancel_slot", store, terminal, bookings.writer(), {.keep_labels = true}};
  for (const auto& item : keeping.process_batch(batch).items())
    EXPECT_EQ(item.result.status(), Status::processed);
  EXPECT_EQ(keeping.store().find(first.key)->label, first.label);
  EXPECT_EQ(keeping.store().find(second.key)->label, second.label);
}

TEST(Gate, GroupCommitKeepsTheLabelsOfItsReservations) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot",
            store,
            terminal,
            bookings.writer(),
            {.coalesce = {.enabled = true, .window = 5ms, .max_events = 4}, .keep_labels = true}};
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i)
    workers.emplace_back([&, i] {
      const auto k = idemgate::derive_labelled_key("ect.claim_slot", "CIS-" + std::to_string(i),
                                                   "MSKU7000037");
      EXPECT_EQ(gate.process(k, msku).status(), Status::processed);
    });
  for (auto& w : workers) w.join();
  for (int i = 0; i < 4; ++i) {
    const auto k =
        idemgate::derive_key("ect.claim_slot", "CIS-" + std::to_string(i), "MSKU7000037");
    EXPECT_EQ(gate.store().find(k)->label,
              "ect.claim_slot CIS-" + std::to_string(i) + " MSKU7000037");
  }
}
