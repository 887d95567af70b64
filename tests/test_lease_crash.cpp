// A worker process killed with SIGKILL in the middle of its downstream call, with the library's
// DEFAULT options (GateOptions, ReconcilerOptions): its event is finished by the reconciler
// within 15 seconds of the kill. The kill comes just after a lease renewal, the worst moment.

#include "support/child_process.hpp"
#include "support/fake_terminal.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>

namespace sq = idemgate::test::sqlite;
using namespace std::chrono_literals;

TEST(LeaseCrash, AWorkerKilledMidCallWithDefaultOptionsHasItsEventFinishedWithinFifteenSeconds) {
  sq::Fixture f;
  const std::string container = "MSKU7000037";
  const auto key = idemgate::derive_key("ect.claim_slot", container);
  idemgate::test::ChildProcess worker({LEASE_CRASH_CONSUMER_PATH, f.db, container});
  ASSERT_EQ(worker.read_line(), "calling");
  // Wait for the heartbeat's first renewal, then kill at once: the lease then runs a whole
  // lease after the kill, the worst case.
  auto lease_until = [&] {
    return sq::count(f.db, "SELECT lease_until FROM idemgate_log WHERE key = X'" + key.hex() + "'");
  };
  const std::int64_t granted = lease_until();
  const auto waited = std::chrono::steady_clock::now();
  while (lease_until() == granted && std::chrono::steady_clock::now() - waited < 20s)
    std::this_thread::sleep_for(5ms);
  ASSERT_NE(lease_until(), granted) << "the worker's heartbeat never renewed its lease";
  worker.kill_now();
  const auto killed = std::chrono::steady_clock::now();

  // Another consumer's reconciler, with the default options.
  idemgate::SqliteStore store{f.db};
  idemgate::test::FakeTerminal<> terminal;
  idemgate::Gate gate{"ect.claim_slot", store, terminal, sq::book};
  idemgate::Reconciler reconciler{gate};
  reconciler.start();
  while (sq::committed_status(f.db, key) != "committed" &&
         std::chrono::steady_clock::now() - killed < 60s)
    std::this_thread::sleep_for(20ms);
  const auto recovered = std::chrono::steady_clock::now() - killed;
  reconciler.stop();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(recovered).count();
  std::cout << "recovered " << ms << " ms after the SIGKILL (default options)\n";
  RecordProperty("recovery_ms", static_cast<int>(ms));
  EXPECT_EQ(sq::committed_status(f.db, key), "committed");
  EXPECT_LE(recovered, 15s);
  EXPECT_EQ(sq::count(f.db, "SELECT count(*) FROM bookings"), 1);
  EXPECT_EQ(terminal.calls(), 1);
}
