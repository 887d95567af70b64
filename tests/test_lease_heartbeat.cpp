// The gate's heartbeat: a live worker keeps its lease however slow its downstream is; a worker
// whose renewals fail does not ack; a lease given back in a batch or a reconciler pass is not
// renewed again; Gate::stop and StopSignal for a graceful shutdown. The crash of a real worker
// process with the default options is in test_lease_crash.cpp.

#include "support/fake_terminal.hpp"
#include "support/given_back_leases.hpp"
#include "support/memory_bookings.hpp"
#include "support/pausing_store.hpp"
#include "support/slot_request.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::Reconciler;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::MemoryBookings;
using idemgate::test::PausePoint;
using idemgate::test::PausingStore;
using idemgate::test::SlotRequest;
using idemgate::test::Step;
using namespace std::chrono_literals;

namespace {

const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
const auto key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");

// Counts the calls a store wrapper sees at one step, and lets a test wait for more of them.
class StepCounter {
 public:
  void saw() {
    std::lock_guard lock(mutex_);
    ++count_;
    changed_.notify_all();
  }
  int count() const {
    std::lock_guard lock(mutex_);
    return count_;
  }
  // Waits until `n` calls were seen; false after ten seconds.
  bool wait_for(int n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 10s, [&] { return count_ >= n; });
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

// While `gate` works on one call whose downstream takes `slow`, a second worker redelivers the
// event and a reconciler (stale_after 0) runs passes, again and again; returns what they got.
template <class GateType, class OtherGate>
void expect_never_taken_over(GateType& gate, OtherGate& other, FakeTerminal<>& terminal) {
  std::atomic<bool> done{false};
  std::vector<Status> redeliveries;
  std::size_t taken = 0;
  std::thread meanwhile([&] {
    Reconciler reconciler{other, {.stale_after = 0ms}};
    while (!done.load()) {
      std::this_thread::sleep_for(50ms);
      if (done.load()) break;
      redeliveries.push_back(other.process(key, msku).status());
      taken += reconciler.run_once().taken;
    }
  });
  const auto result = gate.process(key, msku);
  done = true;
  meanwhile.join();
  EXPECT_EQ(result.status(), Status::processed);
  EXPECT_FALSE(result.took_over());
  EXPECT_EQ(terminal.calls(), 1) << "the slow call was taken over and claimed a second time";
  EXPECT_EQ(taken, 0u) << "the reconciler took a live worker's row over";
  ASSERT_GT(redeliveries.size(), 10u);
  for (Status s : redeliveries)
    EXPECT_TRUE(s == Status::in_flight || s == Status::duplicate) << to_string(s);
}

}  // namespace

TEST(LeaseHeartbeat, DefaultsRecoverACrashWithinFifteenSecondsAndNeverTakeOverALiveWorker) {
  const idemgate::GateOptions gate;
  const idemgate::ReconcilerOptions reconciler;
  // The worst case of docs/design.md: the last renewal just before the crash, then the lease,
  // then at most one interval until the next pass (its own work comes on top).
  EXPECT_LE(std::max(gate.lease, reconciler.stale_after) + reconciler.interval, 12s);
  EXPECT_LE(reconciler.stale_after, gate.lease);
  EXPECT_TRUE(gate.heartbeat);
}

TEST(LeaseHeartbeat, ASlowCallOnMemoryStoreIsTakenOverByNeitherARedeliveryNorTheReconciler) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  // The call takes five leases.
  terminal.before = [](const SlotRequest&, const Key&) {
    std::this_thread::sleep_for(1500ms);
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 300ms}};
  FakeTerminal<> other_terminal;
  Gate other{"ect.claim_slot", store, other_terminal, bookings.writer(), {.lease = 300ms}};
  expect_never_taken_over(gate, other, terminal);
  EXPECT_EQ(other_terminal.calls(), 0);
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(LeaseHeartbeat, ASlowCallOnSqliteIsTakenOverByNeitherARedeliveryNorTheReconciler) {
  namespace sq = idemgate::test::sqlite;
  sq::Fixture f;
  // Another worker: its own connection to the same file.
  idemgate::SqliteStore second{f.db, idemgate::SqliteOptions{.busy_timeout = 20s}};
  FakeTerminal<> terminal;
  terminal.before = [](const SlotRequest&, const Key&) {
    std::this_thread::sleep_for(1500ms);
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Gate gate{"ect.claim_slot", f.store, terminal, sq::book, {.lease = 300ms}};
  FakeTerminal<> other_terminal;
  Gate other{"ect.claim_slot", second, other_terminal, sq::book, {.lease = 300ms}};
  expect_never_taken_over(gate, other, terminal);
  EXPECT_EQ(other_terminal.calls(), 0);
  EXPECT_EQ(sq::count(f.db, "SELECT count(*) FROM bookings"), 1);
}

TEST(LeaseHeartbeat, WithoutTheHeartbeatASlowCallIsTakenOverOnceItsLeaseRunsOut) {
  // What the heartbeat prevents, shown with it turned off.
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  std::optional<Status> redelivered;
  Gate other{
      "ect.claim_slot", store, terminal, bookings.writer(), {.lease = 100ms, .heartbeat = false}};
  terminal.before = [&](const SlotRequest&, const Key&) {
    if (!redelivered) {
      redelivered = Status::in_flight;
      std::this_thread::sleep_for(300ms);
      redelivered = other.process(key, msku).status();
    }
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Gate gate{
      "ect.claim_slot", store, terminal, bookings.writer(), {.lease = 100ms, .heartbeat = false}};
  (void)gate.process(key, msku);
  EXPECT_EQ(redelivered, Status::processed);
  EXPECT_EQ(terminal.calls(), 2);
}

TEST(LeaseHeartbeat, ARenewalThatFindsTheFenceTakenMakesProcessAnswerRetryNotAck) {
  MemoryStore memory = MemoryStore{}.for_gate("ect.claim_slot");  // the gate's rows
  StepCounter extends;
  PausingStore<MemoryStore> store{memory,
                                  [&](const PausePoint& at) {
                                    if (at.step == Step::extend) extends.saw();
                                  },
                                  false};
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  const auto neighbour = idemgate::derive_key("ect.claim_slot", "CIS-2", "MSKU7000038");
  std::promise<void> neighbour_calling;
  std::promise<void> main_done;
  auto finished = main_done.get_future().share();
  bool renewals_seen = false;
  terminal.before = [&](const SlotRequest&, const Key& k) {
    if (k == neighbour) {
      // A second call in progress keeps the heartbeat renewing after the first lease is lost.
      neighbour_calling.set_value();
      finished.wait();
      return std::optional<idemgate::ClaimResult<std::string>>();
    }
    // Someone takes the event over by force while the call runs.
    auto row = memory.find(k);
    ++row->fence;
    memory.restore(k, row);
    // Every renewal from now on finds the fence gone; the fourth extend call from now starts a
    // renewal after the one that found it (one call for both leases, one each to tell them apart).
    const int now = extends.count();
    renewals_seen = extends.wait_for(now + 4);
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 300ms}};
  auto other = std::async(std::launch::async, [&] {
    return gate.process(neighbour, SlotRequest{"MSKU7000038", "2025-06-09T07:00"});
  });
  neighbour_calling.get_future().wait();
  const auto result = gate.process(key, msku);
  main_done.set_value();
  EXPECT_EQ(other.get().status(), Status::processed);
  ASSERT_TRUE(renewals_seen);
  EXPECT_EQ(result.status(), Status::retry) << result.reason();
  EXPECT_FALSE(result.should_ack());
  EXPECT_NE(result.reason().find("fence gone"), std::string::npos) << result.reason();
  EXPECT_EQ(bookings.for_container(msku.container), 0u);
  EXPECT_EQ(memory.find(key)->status, RecordStatus::in_flight);
  EXPECT_EQ(memory.find(key)->fence, 2);
}

TEST(LeaseHeartbeat, RenewalsThatCannotReachTheStoreForALeaseMakeProcessAnswerRetryNotAck) {
  MemoryStore memory;
  StepCounter failed;
  std::atomic<bool> unreachable{false};
  PausingStore<MemoryStore> store{memory,
                                  [&](const PausePoint& at) {
                                    if (at.step == Step::extend && unreachable.load()) {
                                      failed.saw();
                                      throw idemgate::StoreError("the store is unreachable");
                                    }
                                  },
                                  false};
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate other{"ect.claim_slot", memory, terminal, bookings.writer(), {.lease = 300ms}};
  std::optional<Status> redelivered;
  terminal.before = [&](const SlotRequest&, const Key&) {
    if (redelivered) return std::optional<idemgate::ClaimResult<std::string>>();
    redelivered = Status::in_flight;
    unreachable = true;
    // Renewals fail for longer than the lease: the lease runs out and a redelivery on another
    // worker, which reaches the store, takes the event over and finishes it.
    EXPECT_TRUE(failed.wait_for(5));
    redelivered = other.process(key, msku).status();
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 300ms}};
  const auto result = gate.process(key, msku);
  EXPECT_EQ(redelivered, Status::processed);
  EXPECT_EQ(result.status(), Status::retry) << result.reason();
  EXPECT_FALSE(result.should_ack());
  EXPECT_NE(result.reason().find("unreachable"), std::string::npos) << result.reason();
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(LeaseHeartbeat, ATransientFailureEndsTheLeaseForGoodWhileTheHeartbeatRuns) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  terminal.before = [](const SlotRequest&, const Key&) {
    std::this_thread::sleep_for(150ms);
    return std::optional<idemgate::ClaimResult<std::string>>(idemgate::TransientFailure{"503"});
  };
  // No back-off: the release ends the lease at the epoch, where the heartbeat must leave it.
  Gate gate{
      "ect.claim_slot", store, terminal, bookings.writer(), {.lease = 30ms, .retry_backoff = 0ms}};
  EXPECT_EQ(gate.process(key, msku).status(), Status::retry);
  // The heartbeat has had many chances to renew since: the lease stays ended.
  std::this_thread::sleep_for(100ms);
  EXPECT_LT(gate.store().find(key)->lease_until, std::chrono::system_clock::now() - 1h);
}

// A lease given back inside a batch or a reconciler pass (a transient failure, a failed
// commit) is not renewed by the batch's or the pass's lease keeper as it goes on.
TEST(GivenBackLease, ABatchOnMemoryStoreNoLongerRenewsTheMembersItGaveBack) {
  MemoryStore store;
  MemoryBookings bookings;
  idemgate::test::expect_batch_members_given_back_stay_given_back(
      store, [&bookings](MemoryStore::transaction& tx, const Key&, const SlotRequest& r,
                         const std::string& slot) { bookings.writer()(tx, r, slot); });
  EXPECT_EQ(bookings.size(), 4u);
}

TEST(GivenBackLease, ABatchOnSqliteNoLongerRenewsTheMembersItGaveBack) {
  namespace sq = idemgate::test::sqlite;
  sq::Fixture f;
  idemgate::test::expect_batch_members_given_back_stay_given_back(f.store, sq::book);
  EXPECT_EQ(sq::count(f.db, "SELECT count(*) FROM bookings"), 4);
}

TEST(GivenBackLease, AReconcilerPassOnMemoryStoreNoLongerRenewsTheRowsItGaveBack) {
  MemoryStore store;
  MemoryBookings bookings;
  idemgate::test::expect_pass_rows_given_back_stay_given_back(
      store, [&bookings](MemoryStore::transaction& tx, const Key&, const SlotRequest& r,
                         const std::string& slot) { bookings.writer()(tx, r, slot); });
  EXPECT_EQ(bookings.size(), 4u);
}

TEST(GivenBackLease, AReconcilerPassOnSqliteNoLongerRenewsTheRowsItGaveBack) {
  namespace sq = idemgate::test::sqlite;
  sq::Fixture f;
  idemgate::test::expect_pass_rows_given_back_stay_given_back(f.store, sq::book);
  EXPECT_EQ(sq::count(f.db, "SELECT count(*) FROM bookings"), 4);
}

TEST(GateStop, AfterStopProcessReservesNothingAndAnswersRetry) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  const auto report = gate.stop(1s);
  EXPECT_TRUE(report.clean());
  EXPECT_TRUE(gate.stopping());
  const auto result = gate.process(key, msku);
  EXPECT_EQ(result.status(), Status::retry);
  EXPECT_FALSE(result.should_ack());
  EXPECT_NE(result.reason().find("stopping"), std::string::npos);
  EXPECT_FALSE(gate.store().find(key).has_value());
  EXPECT_EQ(terminal.calls(), 0);
}

TEST(GateStop, ACallInProgressFinishesWithinTheGraceAndIsAcked) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  std::promise<void> calling;
  terminal.before = [&](const SlotRequest&, const Key&) {
    calling.set_value();
    std::this_thread::sleep_for(200ms);
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  auto call = std::async(std::launch::async, [&] { return gate.process(key, msku); });
  calling.get_future().wait();
  const auto report = gate.stop(10s);
  EXPECT_EQ(report.running, 1u);
  EXPECT_TRUE(report.clean());
  EXPECT_EQ(report.given_back, 0u);
  EXPECT_EQ(call.get().status(), Status::processed);
  EXPECT_EQ(gate.store().find(key)->status, RecordStatus::committed);
}

TEST(GateStop, ACallSlowerThanTheGraceHasItsLeaseGivenBackForAnImmediateRedelivery) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  std::promise<void> calling;
  std::promise<void> go_on;
  auto released = go_on.get_future().share();
  terminal.before = [&](const SlotRequest&, const Key&) {
    calling.set_value();
    released.wait();
    return std::optional<idemgate::ClaimResult<std::string>>(idemgate::TransientFailure{"cut off"});
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};  // the default lease: 10 seconds
  auto call = std::async(std::launch::async, [&] { return gate.process(key, msku); });
  calling.get_future().wait();
  const auto report = gate.stop(50ms);
  EXPECT_FALSE(report.clean());
  EXPECT_EQ(report.given_back, 1u);
  // Another consumer's redelivery takes the event over at once, long before the lease's end.
  FakeTerminal<> other_terminal;
  Gate other{"ect.claim_slot", store, other_terminal, bookings.writer()};
  const auto redelivered = other.process(key, msku);
  EXPECT_EQ(redelivered.status(), Status::processed);
  EXPECT_TRUE(redelivered.took_over());
  go_on.set_value();
  EXPECT_FALSE(call.get().should_ack());
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(GateStop, StopGracefullyStopsTheReconcilerAndTheGate) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  Reconciler reconciler{gate, {.interval = 10ms}};
  reconciler.start();
  const auto report = idemgate::stop_gracefully(1s, gate, reconciler);
  EXPECT_TRUE(report.clean());
  EXPECT_TRUE(gate.stopping());
  EXPECT_EQ(gate.process(key, msku).status(), Status::retry);
}

TEST(GateStop, StopGracefullyReturnsWithinTheGraceWhileAReconcilerRowWaitsOnTheDownstream) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 1ms}};
  const SlotRequest r{"MSKU7000001", "w"};
  const Key stranded = idemgate::derive_key("stranded", r.container);
  const std::string bytes = gate.encode_request(r);
  (void)gate.store().reserve(stranded, idemgate::detail::sha256(bytes), bytes, 1ms);
  std::this_thread::sleep_for(5ms);  // its lease has run out: a stranded row
  // The reconciler's claim hangs on the downstream until the test lets it go.
  std::promise<void> in_row;
  std::promise<void> let_go;
  auto released = let_go.get_future().share();
  std::atomic<bool> answered{false};
  terminal.before = [&](const SlotRequest&, const Key&) {
    if (terminal.calls() == 1) {
      in_row.set_value();
      released.wait();
      answered = true;
    }
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Reconciler reconciler{gate, {.interval = 1h, .stale_after = 0ms}};
  reconciler.start();
  in_row.get_future().wait();
  auto stopping = std::async(std::launch::async,
                             [&] { return idemgate::stop_gracefully(100ms, gate, reconciler); });
  // Bounded only so that a broken stop fails instead of hanging the suite.
  const bool returned = stopping.wait_for(20s) == std::future_status::ready;
  const bool downstream_still_hung = !answered.load();
  // The row's lease was given back: a redelivery elsewhere takes the event over at once.
  FakeTerminal<> other_terminal;
  Gate other{"ect.claim_slot", store, other_terminal, bookings.writer()};
  const auto redelivered = other.process(stranded, r);
  let_go.set_value();
  ASSERT_TRUE(returned) << "stop_gracefully waited for the reconciler's downstream";
  const auto report = stopping.get();
  EXPECT_TRUE(downstream_still_hung);
  EXPECT_EQ(report.workers_unfinished, 1u);
  EXPECT_FALSE(report.clean()) << "a worker still in a pass is not a clean stop";
  EXPECT_EQ(redelivered.status(), Status::processed);
  EXPECT_TRUE(redelivered.took_over());
  reconciler.stop();  // the row in progress ends; its commit is fenced out
  EXPECT_EQ(reconciler.total_report().lost, 1u);
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(StopSignal, ASigtermSetsTheFlagAndWakesTheWaiterWithoutKillingTheProcess) {
  idemgate::StopSignal sigterm;
  EXPECT_FALSE(sigterm.requested());
  EXPECT_FALSE(sigterm.wait_for(10ms));
  auto waiter = std::async(std::launch::async, [&] { return sigterm.wait_for(10s); });
  std::raise(SIGTERM);
  EXPECT_TRUE(waiter.get());
  EXPECT_TRUE(sigterm.requested());
  EXPECT_EQ(sigterm.signal(), SIGTERM);
  EXPECT_THROW(idemgate::StopSignal second, std::logic_error);
}

TEST(GateStop, AStoppingReconcilerFinishesTheRowInHandAndGivesTheOthersBack) {
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer(), {.lease = 1ms}};
  std::vector<Key> keys;
  for (int i = 0; i < 3; ++i) {
    const SlotRequest r{"MSKU700000" + std::to_string(i), "w"};
    keys.push_back(idemgate::derive_key("stranded", r.container));
    const std::string bytes = gate.encode_request(r);
    (void)gate.store().reserve(keys.back(), idemgate::detail::sha256(bytes), bytes, 1ms);
  }
  std::this_thread::sleep_for(5ms);  // every lease has run out: three stranded rows
  std::promise<void> in_pass;
  std::atomic<bool> stop_called{false};
  terminal.before = [&](const SlotRequest&, const Key&) {
    if (terminal.calls() == 1) {
      in_pass.set_value();
      while (!stop_called.load()) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(100ms);  // stop() has raised its flag and waits for the pass
    }
    return std::optional<idemgate::ClaimResult<std::string>>();
  };
  Reconciler reconciler{gate, {.interval = 1h, .stale_after = 0ms}};
  reconciler.start();
  in_pass.get_future().wait();
  stop_called = true;
  reconciler.stop();
  EXPECT_EQ(terminal.calls(), 1) << "the pass went on after stop()";
  EXPECT_EQ(reconciler.last_report().deferred, 2u);
  int committed = 0, given_back = 0;
  for (const Key& k : keys) {
    const auto row = gate.store().find(k);
    if (row->status == RecordStatus::committed) ++committed;
    if (row->status == RecordStatus::in_flight &&
        row->lease_until < std::chrono::system_clock::now() - 1h)
      ++given_back;
  }
  EXPECT_EQ(committed, 1);
  EXPECT_EQ(given_back, 2);
}
