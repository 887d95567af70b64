// The graceful_stop example run as a deployment stops it: SIGTERM in the middle of a message.
// A call that finishes within the grace period is committed and acked, and the process exits
// well within the lease; a call slower than the grace period has its lease given back, so the
// redelivery on another consumer takes the event over at once instead of after the lease.

#include "graceful_stop/consumer.hpp"
#include "support/child_process.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

namespace sq = idemgate::test::sqlite;
using namespace std::chrono_literals;

namespace {

// Every line the child prints until it exits.
std::vector<std::string> rest_of(idemgate::test::ChildProcess& child) {
  std::vector<std::string> lines;
  for (std::string line; child.read_until_eof(line);) lines.push_back(line);
  return lines;
}

bool has(const std::vector<std::string>& lines, const std::string& wanted) {
  for (const auto& l : lines)
    if (l == wanted) return true;
  return false;
}

}  // namespace

TEST(GracefulStop, SigtermMidMessageFinishesTheEventOnceAndExitsWellWithinTheLease) {
  sq::TempDir dir;
  const std::string db = dir.file("consumer.db");
  idemgate::test::ChildProcess consumer(
      {GRACEFUL_STOP_PATH, "--db", db, "--events", "1", "--call-ms", "1000", "--grace-ms", "8000"});
  ASSERT_EQ(consumer.read_line(), "calling " + graceful_stop::container_of(1));
  consumer.send(SIGTERM);
  const auto sent = std::chrono::steady_clock::now();
  const auto lines = rest_of(consumer);
  const int code = consumer.wait();
  const auto took = std::chrono::steady_clock::now() - sent;
  std::cout << "stopped " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
            << " ms after SIGTERM\n";
  EXPECT_EQ(code, 0);
  EXPECT_TRUE(has(lines, "acked 1 processed"));
  EXPECT_TRUE(has(lines, "stopped clean"));
  EXPECT_EQ(sq::committed_status(db, graceful_stop::key_of(1)), "committed");
  EXPECT_EQ(sq::count(db, "SELECT count(*) FROM bookings"), 1);
  // It waited for its call, not for a lease: the default lease is 10 seconds.
  EXPECT_LT(took, idemgate::GateOptions{}.lease);
}

TEST(GracefulStop, ACallSlowerThanTheGraceIsHandedToTheRedeliveryAtOnce) {
  sq::TempDir dir;
  const std::string db = dir.file("consumer.db");
  idemgate::test::ChildProcess consumer(
      {GRACEFUL_STOP_PATH, "--db", db, "--events", "1", "--call-ms", "60000", "--grace-ms", "200"});
  ASSERT_EQ(consumer.read_line(), "calling " + graceful_stop::container_of(1));
  consumer.send(SIGTERM);
  const auto lines = rest_of(consumer);
  EXPECT_EQ(consumer.wait(), 0);
  EXPECT_TRUE(has(lines, "stopped unclean given_back=1"));
  EXPECT_FALSE(has(lines, "acked 1 processed"));
  // The redelivery on another consumer (default options: a 10-second lease) takes the event over
  // at once: the stopped consumer's lease was ended, not left to run out.
  idemgate::SqliteStore store{db};
  graceful_stop::SlowTerminal terminal{0ms};
  idemgate::Gate gate{"ect.claim_slot", store, terminal, graceful_stop::book};
  const auto result = gate.process(graceful_stop::key_of(1), graceful_stop::container_of(1));
  EXPECT_EQ(result.status(), idemgate::Status::processed) << result.reason();
  EXPECT_TRUE(result.took_over());
  EXPECT_EQ(sq::count(db, "SELECT count(*) FROM bookings"), 1);
}
