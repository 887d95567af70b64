// Dead connections: the guards PostgresStore puts on every connection (keepalives, TCP user
// timeout, statement timeout; a user's own values win), a partition that blackholes the
// database, a store started while the server is down, and a commit whose retry must reconnect.
// Faults are real: a relay that swallows every byte, a server stopped and started again.

#include "support/fake_terminal.hpp"
#include "support/log_lines.hpp"
#include "support/pg_bookings.hpp"
#include "support/pg_cluster.hpp"
#include "support/pg_fault_proxy.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::PostgresOptions;
using idemgate::PostgresStore;
using idemgate::Status;
using idemgate::StoreError;
using idemgate::test::FakeTerminal;
using idemgate::test::PgCluster;
using idemgate::test::PgFaultProxy;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using idemgate::test::LogLines;

namespace {

/// The bookings writer with a hook that runs inside the transaction, before the booking.
struct HookedWriter {
  idemgate::test::PgBookingWriter bookings;
  std::function<void(pqxx::work&, const Key&)>* hook;

  void operator()(pqxx::work& tx, const Key& key, const SlotRequest& request,
                  const std::string& slot) const {
    if (*hook) (*hook)(tx, key);
    bookings(tx, key, request, slot);
  }
};

Key key_of(int n) {
  return idemgate::derive_key("dead", std::to_string(n));
}
SlotRequest request_of(int n) {
  return {"MSKU800" + std::to_string(n), "w"};
}

/// A socket option of the store's connection, as the kernel holds it.
int socket_option(PostgresStore& store, int level, int name) {
  auto lease = store.connection();
  int value = -1;
  socklen_t length = sizeof value;
  EXPECT_EQ(::getsockopt(lease.connection().sock(), level, name, &value, &length), 0);
  return value;
}

std::string show(PostgresStore& store, const std::string& setting) {
  auto lease = store.connection();
  pqxx::nontransaction tx(lease.connection());
  return idemgate::detail::pq::exec(tx, "SHOW " + setting)[0][0].c_str();
}

class DeadConnections : public idemgate::test::PgBookingsTest {};

}  // namespace

TEST_F(DeadConnections, EveryConnectionIsGuardedByDefault) {
  PostgresStore store(uri, PostgresOptions{.table = log});
  EXPECT_EQ(socket_option(store, SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPIDLE), 10);
  EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPINTVL), 3);
  EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPCNT), 3);
  EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_USER_TIMEOUT), 15000);
  EXPECT_EQ(show(store, "statement_timeout"), "15s");
}

TEST_F(DeadConnections, OptionsOverrideTheGuardsAndTheConnectionStringOverridesBoth) {
  const PostgresOptions tuned{.table = log,
                              .keepalives_idle = 7s,
                              .keepalives_interval = 2s,
                              .keepalives_count = 4,
                              .tcp_user_timeout = 9s,
                              .statement_timeout = 8s,
                              .reply_timeout = 12s};
  {
    PostgresStore store(uri, tuned);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPIDLE), 7);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPINTVL), 2);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPCNT), 4);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_USER_TIMEOUT), 9000);
    EXPECT_EQ(show(store, "statement_timeout"), "8s");
  }
  // The user's own values in a URI win over the options.
  const std::string separator = uri.find('?') == std::string::npos ? "?" : "&";
  {
    PostgresStore store(uri + separator +
                            "keepalives_idle=42&tcp_user_timeout=4321&options=-c%20statement_"
                            "timeout%3D3s",
                        tuned);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPIDLE), 42);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPINTVL), 2);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_USER_TIMEOUT), 4321);
    EXPECT_EQ(show(store, "statement_timeout"), "3s");
  }
  // And in a key=value string.
  const std::size_t colon = uri.rfind(':');
  const std::string port = uri.substr(colon + 1, uri.find('/', colon) - colon - 1);
  const std::string kv = "host=127.0.0.1 port=" + port +
                         " user=postgres dbname=postgres keepalives_count=6 "
                         "options='-c statement_timeout=4s'";
  {
    PostgresStore store(kv, tuned);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPIDLE), 7);
    EXPECT_EQ(socket_option(store, IPPROTO_TCP, TCP_KEEPCNT), 6);
    EXPECT_EQ(show(store, "statement_timeout"), "4s");
  }
  // A reply timeout that would cut statements the server still runs is refused.
  EXPECT_THROW(PostgresStore(uri, {.table = log, .statement_timeout = 5s, .reply_timeout = 5s}),
               std::invalid_argument);
}

// A partition that blackholes the database for 10 s, between the gate and the database: the
// relay acknowledges every byte and forwards none, so TCP keepalives and the TCP user timeout
// see a healthy link; the reply watchdog (here 2 s, above a 1 s statement timeout) frees the
// worker. Once the partition heals, the same gate answers again.
TEST_F(DeadConnections, BlackholedWorkerIsFreedBeforeThePartitionHealsAndTheGateAnswersAfter) {
  {
    PostgresStore direct(uri, PostgresOptions{.table = log});
    direct.migrate();
  }
  PgFaultProxy proxy(uri);
  LogLines lines;
  PostgresStore store(proxy.uri(), PostgresOptions{.table = log,
                                                   .commit_attempts = 2,
                                                   .connect_timeout = 2s,
                                                   .statement_timeout = 1s,
                                                   .reply_timeout = 2s,
                                                   .log = lines.sink()});
  FakeTerminal<> terminal;
  std::atomic<int> runs{0};
  std::function<void(pqxx::work&, const Key&)> hook;
  Gate gate("ect.claim_slot", store, terminal, HookedWriter{{bookings, &runs}, &hook},
            {.lease = 1s});

  constexpr auto partition = 10s;
  Clock::time_point cut_at{};
  hook = [&](pqxx::work& tx, const Key&) {
    if (cut_at != Clock::time_point{}) return;
    // The worker is in a statement (a business write of 600 ms) when the network goes dark.
    std::thread dark([&] {
      std::this_thread::sleep_for(100ms);
      proxy.blackhole(partition);
    });
    cut_at = Clock::now();
    try {
      idemgate::detail::pq::exec(tx, "SELECT pg_sleep(0.6)");
    } catch (...) {
      dark.join();
      throw;
    }
    dark.join();
  };
  EXPECT_THROW((void)gate.process(key_of(1), request_of(1)), StoreError);
  const auto freed = Clock::now() - cut_at;
  EXPECT_LT(freed, partition) << "the worker waited for the partition to heal";
  EXPECT_GE(store.connections_cut(), 1U) << lines.all();
  // The gate gave the lease back on its way out; that failed too, and the store said so.
  EXPECT_GE(lines.count("could not release the lease"), 1U) << lines.all();

  // Redeliveries until one is processed, once the partition is over.
  const auto heals_at = cut_at + 100ms + partition;
  std::this_thread::sleep_until(heals_at);
  Status status = Status::retry;
  Clock::time_point answered{};
  while (Clock::now() - heals_at < 30s) {
    try {
      status = gate.process(key_of(1), request_of(1)).status();
      if (status == Status::processed) {
        answered = Clock::now();
        break;
      }
    } catch (const StoreError&) {
    }
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_EQ(status, Status::processed) << lines.all();
  std::printf(
      "blackhole: worker freed after %lld ms of a %lld ms partition; processed again %lld "
      "ms after it healed\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(freed).count()),
      static_cast<long long>(std::chrono::milliseconds(partition).count()),
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(answered - heals_at).count()));
  EXPECT_EQ(booking_count(), 1);
  expect_no_half_state();
}

// The outage tests stop and start a server of their own, shared by the suite (one initdb).
class DeadConnectionsOutage : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = std::make_unique<PgCluster>(); }
  static void TearDownTestSuite() { cluster_.reset(); }
  void SetUp() override {
    try {
      cluster_->start();  // an earlier test may have left it stopped
    } catch (const std::exception&) {
    }
  }
  static PgCluster& cluster() { return *cluster_; }

 private:
  static inline std::unique_ptr<PgCluster> cluster_;
};

// A store made while its server is down starts anyway and says so; its calls fail with
// StoreError meanwhile; migrate() waits for the server (up to PostgresOptions::startup_wait) and
// the store works once it is up.
TEST_F(DeadConnectionsOutage, StoreMadeDuringAnOutageWorksOnceTheServerIsUp) {
  cluster().stop();
  PostgresStore impatient(cluster().uri(),
                          PostgresOptions{.table = "outage_log", .startup_wait = 300ms, .log = {}});
  EXPECT_THROW(impatient.migrate(), StoreError) << "migrate() gives up after startup_wait";

  LogLines lines;
  PostgresStore store(cluster().uri(), PostgresOptions{.table = "outage_log", .log = lines.sink()});
  EXPECT_EQ(lines.count("Starting anyway"), 1U) << lines.all();
  EXPECT_THROW((void)store.find(key_of(1)), StoreError);

  auto migrated = std::async(std::launch::async, [&] { store.migrate(); });
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(migrated.wait_for(0s), std::future_status::timeout) << "migrate() did not wait";
  cluster().start();
  migrated.get();
  EXPECT_GE(lines.count("migrate() tries again"), 1U) << lines.all();
  EXPECT_EQ(lines.count("PostgreSQL is back"), 1U) << lines.all();
  EXPECT_FALSE(store.find(key_of(1)).has_value());
}

// A commit whose connection breaks, and whose next attempt finds the server still down: the
// reconnect is part of the retry, which waits (backoff) and tries again until the server is
// back, within PostgresOptions::commit_attempts. The business write runs again on the fresh
// connection, and the event is booked once.
TEST_F(DeadConnectionsOutage, CommitRetriesAcrossAReconnectUntilTheServerIsBack) {
  const std::string log = "retry_log";
  const std::string bookings = "retry_bookings";
  idemgate::test::pg_exec_on(cluster().uri(), idemgate::test::bookings_ddl(bookings));
  LogLines lines;
  PostgresStore store(cluster().uri(),
                      PostgresOptions{.table = log, .commit_attempts = 10, .log = lines.sink()});
  store.migrate();
  FakeTerminal<> terminal;
  std::atomic<int> runs{0};
  std::function<void(pqxx::work&, const Key&)> hook;
  Gate gate("ect.claim_slot", store, terminal, HookedWriter{{bookings, &runs}, &hook},
            {.lease = 30s});

  std::thread restart;
  hook = [&](pqxx::work&, const Key&) {
    if (restart.joinable()) return;
    // The server dies in the middle of the business write and is back about a second later.
    cluster().crash();
    restart = std::thread([&] {
      std::this_thread::sleep_for(1s);
      cluster().start();
    });
  };
  Status status = Status::retry;
  std::string error;
  try {
    status = gate.process(key_of(1), request_of(1)).status();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (restart.joinable()) restart.join();
  EXPECT_EQ(status, Status::processed) << error << "\n" << lines.all();
  EXPECT_GE(lines.count("cannot connect to PostgreSQL"), 1U)
      << "no attempt met the server down: the test proves nothing\n"
      << lines.all();
  EXPECT_EQ(runs.load(), 2) << "the business write runs again, once, on the fresh connection";
  EXPECT_EQ(idemgate::test::pg_count_on(cluster().uri(), "SELECT count(*) FROM " + bookings), 1);
  idemgate::test::expect_no_half_state(cluster().uri(), log, bookings);
}

// A worker died holding an event (its lease still running) and the queue redelivers it. The
// gate answers `in_flight`; either the consumer acks that (the default: the reconciler finishes
// the event once the lease ran out and the row is stale) or it does not (the queue brings the
// message back until a redelivery meets the expired lease and takes the event over). Both finish
// the event exactly once; the test prints how long each took, at 1/60 of the default timings
// (lease and stale_after 2 s, reconciler interval 1 s) and a redelivery every 500 ms.
TEST_F(DeadConnections, InFlightAckedOrNotBothFinishTheEventOfADeadWorker) {
  PostgresStore store(uri, PostgresOptions{.table = log, .pool_size = 2});
  store.migrate();
  FakeTerminal<> terminal;
  std::function<void(pqxx::work&, const Key&)> hook;
  Gate gate("ect.claim_slot", store, terminal, HookedWriter{{bookings, nullptr}, &hook},
            {.lease = 2s});
  const auto dead_worker_reserves = [&](int n) {
    std::string bytes;
    idemgate::codec<SlotRequest>::encode(request_of(n), bytes);
    ASSERT_EQ(gate.store().reserve(key_of(n), idemgate::detail::sha256(bytes), bytes, 2s).kind,
              idemgate::Reservation::Kind::acquired);
  };
  const auto committed = [&](int n) {
    const auto row = gate.store().find(key_of(n));
    return row && row->status == idemgate::RecordStatus::committed;
  };
  const auto ms = [](Clock::duration d) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };

  // Acked: the one redelivery is answered in flight and dropped; the reconciler finishes.
  dead_worker_reserves(1);
  const auto acked_from = Clock::now();
  EXPECT_EQ(gate.process(key_of(1), request_of(1)).status(), Status::in_flight);
  idemgate::Reconciler reconciler{gate, {.interval = 1s, .stale_after = 2s, .batch = 100}};
  while (!committed(1) && Clock::now() - acked_from < 30s) {
    std::this_thread::sleep_for(1s);
    (void)reconciler.run_once();
  }
  ASSERT_TRUE(committed(1));
  const auto acked = Clock::now() - acked_from;

  // Not acked: the queue redelivers every 500 ms until the gate processes it.
  dead_worker_reserves(2);
  const auto nacked_from = Clock::now();
  Status status = Status::in_flight;
  int deliveries = 0;
  while (status == Status::in_flight && Clock::now() - nacked_from < 30s) {
    status = gate.process(key_of(2), request_of(2)).status();
    ++deliveries;
    if (status == Status::in_flight) std::this_thread::sleep_for(500ms);
  }
  ASSERT_EQ(status, Status::processed);
  const auto nacked = Clock::now() - nacked_from;
  std::printf(
      "in_flight acked: finished by the reconciler after %lld ms; not acked: taken over "
      "by delivery %d after %lld ms\n",
      ms(acked), deliveries, ms(nacked));
  EXPECT_EQ(booking_count(), 2);
  expect_no_half_state();
}
