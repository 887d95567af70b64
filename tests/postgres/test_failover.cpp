// A failover behind a multi-host URI: a primary with a synchronous streaming standby; the
// primary is killed (immediate shutdown) in the middle of a commit and the standby promoted. The
// gate, on `postgresql://primary,standby/…?target_session_attrs=read-write` and the store's
// default connection guards, keeps processing without a restart: the commit in progress is tried
// again (PostgresOptions::commit_attempts) until the new primary takes it, and every event is
// booked exactly once on the new primary, with no half state.

#include "support/fake_terminal.hpp"
#include "support/log_lines.hpp"
#include "support/pg_bookings.hpp"
#include "support/pg_cluster.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::PostgresOptions;
using idemgate::PostgresStore;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::PgCluster;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

using idemgate::test::LogLines;

namespace {

/// The bookings writer with a hook that runs inside the transaction, before the booking.
struct HookedWriter {
  idemgate::test::PgBookingWriter bookings;
  std::function<void(const Key&)>* hook;

  void operator()(pqxx::work& tx, const Key& key, const SlotRequest& request,
                  const std::string& slot) const {
    if (*hook) (*hook)(key);
    bookings(tx, key, request, slot);
  }
};

Key key_of(int n) {
  return idemgate::derive_key("failover", std::to_string(n));
}
SlotRequest request_of(int n) {
  return {"MSKU900" + std::to_string(n), "w"};
}

}  // namespace

TEST(Failover, GateOnAMultiHostUriFollowsAPromotedStandbyWithoutARestart) {
  PgCluster primary;
  std::unique_ptr<PgCluster> standby = primary.add_synchronous_standby();
  const std::string uri = "postgresql://postgres@127.0.0.1:" + std::to_string(primary.port()) +
                          ",127.0.0.1:" + std::to_string(standby->port()) +
                          "/postgres?target_session_attrs=read-write";
  const std::string log = "failover_log";
  const std::string bookings = "failover_bookings";
  idemgate::test::pg_exec_on(uri, idemgate::test::bookings_ddl(bookings));

  LogLines lines;
  std::atomic<int> runs{0};
  std::function<void(const Key&)> hook;
  // The connection guards are the defaults; only the attempts are raised, so that the commit
  // under way outlasts the promotion whatever the machine's speed.
  PostgresStore store(
      uri,
      PostgresOptions{.table = log, .pool_size = 2, .commit_attempts = 12, .log = lines.sink()});
  store.migrate();
  FakeTerminal<> terminal;
  Gate gate("ect.claim_slot", store, terminal, HookedWriter{{bookings, &runs}, &hook},
            {.lease = 30s});

  constexpr int events = 12;
  constexpr int failing = 5;
  std::thread promotion;
  std::atomic<bool> failed_over{false};
  std::chrono::steady_clock::time_point crashed_at{};
  hook = [&](const Key& key) {
    if (key != key_of(failing) || failed_over.exchange(true)) return;
    // The business write of event 5 is under way: the primary dies, and the standby is promoted
    // a moment later, while the commit keeps trying.
    crashed_at = std::chrono::steady_clock::now();
    primary.crash();
    promotion = std::thread([&] { standby->promote(); });
  };

  for (int i = 1; i <= events; ++i) {
    Status status = Status::retry;
    std::string error;
    try {
      status = gate.process(key_of(i), request_of(i)).status();
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_EQ(status, Status::processed) << "event " << i << ": " << error;
    if (i == failing)
      std::printf(
          "failover: the commit under way landed on the new primary %lld ms after the "
          "old one was killed\n",
          static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now() - crashed_at)
                                     .count()));
  }
  if (promotion.joinable()) promotion.join();
  ASSERT_TRUE(failed_over.load());

  // The commit in progress failed at least once and was tried again on the new primary.
  EXPECT_GE(lines.count("commit attempt 1 of 12"), 1U);
  EXPECT_EQ(lines.count("could not be confirmed"), 0U);
  // Every redelivery is a duplicate now: nothing runs twice.
  const int runs_before = runs.load();
  for (int i = 1; i <= events; ++i) {
    const auto result = gate.process(key_of(i), request_of(i));
    EXPECT_EQ(result.status(), Status::duplicate) << "event " << i << ": " << result.reason();
  }
  EXPECT_EQ(runs.load(), runs_before);

  // On the new primary: one booking per event, every event committed, no half state.
  const std::string promoted = standby->uri();
  EXPECT_EQ(idemgate::test::pg_count_on(promoted, "SELECT count(*) FROM " + bookings), events);
  EXPECT_EQ(idemgate::test::pg_count_on(
                promoted, "SELECT count(*) FROM " + log + " WHERE status = 'committed'"),
            events);
  idemgate::test::expect_no_half_state(promoted, log, bookings);
}
