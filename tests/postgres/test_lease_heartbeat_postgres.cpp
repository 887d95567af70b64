// The gate's heartbeat on PostgreSQL: a slow call several leases long is taken over by neither a
// redelivery on another worker nor the reconciler, a worker whose renewal finds its fence taken
// answers retry (not acked) instead of lost_lease, as does one whose renewal never got an
// answer, a renewal never waits behind a commit group's locked rows, and a lease given back in a
// batch or a reconciler pass is not renewed again.

#include "support/fake_terminal.hpp"
#include "support/given_back_leases.hpp"
#include "support/pausing_store.hpp"
#include "support/pg_bookings.hpp"
#include "support/pg_fault_proxy.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::PostgresStore;
using idemgate::Reconciler;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::PausePoint;
using idemgate::test::PausingStore;
using idemgate::test::SlotRequest;
using idemgate::test::Step;
using namespace std::chrono_literals;

namespace {

const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
const auto key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");
using Answer = std::optional<idemgate::ClaimResult<std::string>>;

class PostgresHeartbeat : public idemgate::test::PgBookingsTest {};

}  // namespace

TEST_F(PostgresHeartbeat, ASlowCallIsTakenOverByNeitherARedeliveryNorTheReconciler) {
  PostgresStore store(uri, {.table = log});
  store.migrate();
  PostgresStore second(uri, {.table = log});  // another worker's store
  FakeTerminal<> terminal;
  terminal.before = [](const SlotRequest&, const Key&) {
    std::this_thread::sleep_for(1500ms);  // five leases
    return Answer();
  };
  Gate gate{"ect.claim_slot", store, terminal, booking_writer(), {.lease = 300ms}};
  FakeTerminal<> other_terminal;
  Gate other{"ect.claim_slot", second, other_terminal, booking_writer(), {.lease = 300ms}};
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
  EXPECT_EQ(terminal.calls(), 1);
  EXPECT_EQ(other_terminal.calls(), 0);
  EXPECT_EQ(taken, 0u) << "the reconciler took a live worker's row over";
  ASSERT_GT(redeliveries.size(), 10u);
  for (Status s : redeliveries)
    EXPECT_TRUE(s == Status::in_flight || s == Status::duplicate) << to_string(s);
  EXPECT_EQ(gate.store().find(key)->fence, 1);
  EXPECT_EQ(booking_count(), 1);
  expect_no_half_state();
}

TEST_F(PostgresHeartbeat, ARenewalThatFindsTheFenceTakenMakesProcessAnswerRetryNotAck) {
  PostgresStore inner(uri, {.table = log});
  inner.migrate();
  std::mutex mutex;
  std::condition_variable changed;
  int extends = 0;
  PausingStore<PostgresStore> store{inner,
                                    [&](const PausePoint& at) {
                                      if (at.step != Step::extend) return;
                                      std::lock_guard lock(mutex);
                                      ++extends;
                                      changed.notify_all();
                                    },
                                    false};
  FakeTerminal<> terminal;
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
      return Answer();
    }
    // Another attempt takes the event over by force while the call runs.
    idemgate::test::pg_exec("UPDATE " + log + " SET fence = fence + 1 WHERE key = '\\x" + k.hex() +
                            "'");
    std::unique_lock lock(mutex);
    const int now = extends;
    renewals_seen = changed.wait_for(lock, 10s, [&] { return extends >= now + 4; });
    return Answer();
  };
  Gate gate{"ect.claim_slot", store, terminal, booking_writer(), {.lease = 300ms}};
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
  EXPECT_EQ(gate.store().find(key)->status, RecordStatus::in_flight);
  EXPECT_EQ(gate.store().find(key)->fence, 2);
  EXPECT_EQ(booking_count(), 1) << "only the neighbour's booking";
}

TEST_F(PostgresHeartbeat, RenewalsCutOffByANetworkThatWentDarkMakeProcessAnswerRetryNotAck) {
  // The worker reaches PostgreSQL through a proxy whose network goes dark while the downstream
  // call runs; another worker, on a direct connection, still reaches it.
  idemgate::test::PgFaultProxy proxy{uri};
  PostgresStore direct(uri, {.table = log});
  direct.migrate();
  PostgresStore inner(proxy.uri(), {.table = log});
  std::mutex mutex;
  std::condition_variable changed;
  int extends = 0;
  PausingStore<PostgresStore> store{inner,
                                    [&](const PausePoint& at) {
                                      if (at.step != Step::extend) return;
                                      std::lock_guard lock(mutex);
                                      ++extends;
                                      changed.notify_all();
                                    },
                                    false};
  FakeTerminal<> terminal;
  Gate other{"ect.claim_slot", direct, terminal, booking_writer(), {.lease = 300ms}};
  std::optional<Status> redelivered;
  terminal.before = [&](const SlotRequest& r, const Key& k) {
    if (redelivered) return Answer();
    redelivered = Status::in_flight;
    proxy.blackhole(1500ms);  // five leases without a renewal reaching the server
    std::this_thread::sleep_for(700ms);
    redelivered = other.process(k, r).status();  // the lease ran out: taken over, committed
    std::this_thread::sleep_for(1000ms);         // the network comes back
    // The dark renewal ended when the network came back (its connection torn: it failed, or it
    // was repeated and found the fence gone). A renewal after it, if the lease is still tried,
    // shows it was recorded; none comes once the heartbeat knows the fence is gone.
    std::unique_lock lock(mutex);
    const int now = extends;
    (void)changed.wait_for(lock, 2s, [&] { return extends > now; });
    return Answer();
  };
  Gate gate{"ect.claim_slot", store, terminal, booking_writer(), {.lease = 300ms}};
  const auto result = gate.process(key, msku);
  EXPECT_EQ(redelivered, Status::processed);
  EXPECT_EQ(result.status(), Status::retry) << result.reason();
  EXPECT_FALSE(result.should_ack());
  EXPECT_EQ(other.store().find(key)->status, RecordStatus::committed);
  EXPECT_EQ(other.store().find(key)->fence, 2);
  EXPECT_EQ(booking_count(), 1);
  expect_no_half_state();
}

TEST_F(PostgresHeartbeat, ALongCommitGroupHoldsUpTheRenewalOfNoOtherLease) {
  // Group commit: two events commit in one group, and the second's business write takes several
  // leases, so the first's row stays locked by its fenced update until the group's COMMIT. A
  // third call's downstream is slow meanwhile. One renewal renews every lease of the gate: it
  // must not wait behind the locked row, or the third lease runs out under a live worker.
  PostgresStore store(uri, {.table = log, .pool_size = 4});
  store.migrate();
  PostgresStore second(uri, {.table = log});
  constexpr auto lease = 600ms;
  const auto slow = idemgate::derive_key("ect.claim_slot", "CIS-3", "MSKU7000039");
  const SlotRequest slow_request{"MSKU7000039", "2025-06-09T07:00"};
  std::promise<void> group_locked;
  std::promise<void> let_slow_finish;
  auto slow_may_finish = let_slow_finish.get_future().share();
  FakeTerminal<> terminal;
  terminal.before = [&](const SlotRequest&, const Key& k) {
    if (k == slow) slow_may_finish.wait();
    return Answer();
  };
  std::atomic<int> writes{0};
  struct SlowSecondWrite {
    idemgate::test::PgBookingWriter inner;
    std::atomic<int>* writes;
    std::promise<void>* group_locked;
    void operator()(pqxx::work& tx, const Key& k, const SlotRequest& r,
                    const std::string& slot) const {
      inner(tx, k, r, slot);
      if (writes->fetch_add(1) != 1) return;
      group_locked->set_value();  // the first member's row is locked until COMMIT
      std::this_thread::sleep_for(2000ms);
    }
  };
  Gate gate{"ect.claim_slot",
            store,
            terminal,
            SlowSecondWrite{booking_writer(), &writes, &group_locked},
            {.lease = lease, .coalesce = {.enabled = true, .window = 200ms}}};
  FakeTerminal<> other_terminal;
  Gate other{"ect.claim_slot", second, other_terminal, booking_writer(), {.lease = lease}};

  auto slow_call = std::async(std::launch::async, [&] { return gate.process(slow, slow_request); });
  std::this_thread::sleep_for(100ms);  // the slow call holds its lease
  const auto first = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");
  const auto then = idemgate::derive_key("ect.claim_slot", "CIS-2", "MSKU7000038");
  auto first_call = std::async(std::launch::async, [&] { return gate.process(first, msku); });
  auto then_call = std::async(std::launch::async, [&] {
    return gate.process(then, SlotRequest{"MSKU7000038", "2025-06-09T07:00"});
  });
  ASSERT_EQ(group_locked.get_future().wait_for(10s), std::future_status::ready);
  std::this_thread::sleep_for(2 * lease);  // two leases into the group's long write
  const bool live = idemgate::test::pg_count("SELECT count(*) FROM " + log + " WHERE key = '\\x" +
                                             slow.hex() + "' AND lease_until > now()") == 1;
  const auto redelivery = other.process(slow, slow_request);
  let_slow_finish.set_value();
  EXPECT_TRUE(live) << "the slow call's lease ran out while its heartbeat waited on the group";
  EXPECT_EQ(redelivery.status(), Status::in_flight) << redelivery.reason();
  EXPECT_EQ(first_call.get().status(), Status::processed);
  EXPECT_EQ(then_call.get().status(), Status::processed);
  const auto result = slow_call.get();
  EXPECT_EQ(result.status(), Status::processed) << result.reason();
  EXPECT_FALSE(result.took_over());
  EXPECT_EQ(other_terminal.calls(), 0);
  const auto grouped = gate.coalescing();
  EXPECT_EQ(grouped.commits, 3u);
  EXPECT_EQ(grouped.commit_groups, 2u) << "the two quick events did not commit in one group";
  EXPECT_EQ(gate.store().find(slow)->fence, 1);
  EXPECT_EQ(booking_count(), 3);
  expect_no_half_state();
}

TEST_F(PostgresHeartbeat, ARenewalWhoseAnswerNeverComesMakesProcessAnswerRetryNotAck) {
  // The heartbeat's renewal runs on the server, and its answer is lost on the way back without
  // the connection breaking (a partition TCP does not notice): the renewal thread waits on it,
  // and renews nothing more. The lease runs out under the working worker; a redelivery on
  // another worker takes the event over and commits it. The first worker's commit is refused,
  // and since no renewal of its lease is known to have landed within a lease, it must not ack.
  idemgate::test::PgFaultProxy proxy{uri};
  PostgresStore direct(uri, {.table = log});
  direct.migrate();
  PostgresStore store(proxy.uri(), {.table = log, .statement_timeout = 2s, .reply_timeout = 3s});
  FakeTerminal<> terminal;
  Gate other{"ect.claim_slot", direct, terminal, booking_writer(), {.lease = 300ms}};
  std::optional<Status> redelivered;
  bool renewal_ran = false;
  proxy.arm(idemgate::test::Fault::hang_reply, "idemgate_extend");
  terminal.before = [&](const SlotRequest& r, const Key& k) {
    if (redelivered) return Answer();  // the redelivery's own call
    redelivered = Status::in_flight;
    renewal_ran = proxy.wait_fired(5s);          // the first renewal ran; its answer hangs
    std::this_thread::sleep_for(700ms);          // the lease it extended ran out
    redelivered = other.process(k, r).status();  // taken over, committed
    return Answer();
  };
  Gate gate{"ect.claim_slot", store, terminal, booking_writer(), {.lease = 300ms}};
  const auto result = gate.process(key, msku);
  ASSERT_TRUE(renewal_ran);
  EXPECT_EQ(redelivered, Status::processed);
  EXPECT_EQ(result.status(), Status::retry) << result.reason();
  EXPECT_FALSE(result.should_ack());
  EXPECT_NE(result.reason().find("still waiting for an answer"), std::string::npos)
      << result.reason();
  EXPECT_EQ(other.store().find(key)->status, RecordStatus::committed);
  EXPECT_EQ(other.store().find(key)->fence, 2);
  EXPECT_EQ(booking_count(), 1);
  expect_no_half_state();
}

TEST_F(PostgresHeartbeat, ABatchNoLongerRenewsTheMembersItGaveBack) {
  PostgresStore store(uri, {.table = log});
  store.migrate();
  idemgate::test::expect_batch_members_given_back_stay_given_back(store, booking_writer());
  EXPECT_EQ(booking_count(), 4);
  expect_no_half_state();
}

TEST_F(PostgresHeartbeat, AReconcilerPassNoLongerRenewsTheRowsItGaveBack) {
  PostgresStore store(uri, {.table = log});
  store.migrate();
  idemgate::test::expect_pass_rows_given_back_stay_given_back(store, booking_writer());
  EXPECT_EQ(booking_count(), 4);
  expect_no_half_state();
}
