// The server side (server/) over PostgreSQL through the cpp-httplib adapter, on loopback: the
// same scenarios as over SQLite, and a handler taken over after its lease.

#include "support/postgres.hpp"
#include "support/server_scenarios.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace {

using namespace idemgate;
using namespace idemgate::test;

static_assert(server::answering_store<PostgresStore>);

struct PostgresServer : ::testing::Test {
  PgClaims claims{pg_uri(), unique_table("srv")};
  PostgresServer() { claims.drop(); }
  ~PostgresServer() override { claims.drop(); }
};

TEST_F(PostgresServer, SixteenConcurrentRequestsRunTheHandlerOnce) {
  sixteen_concurrent_requests_run_the_handler_once(claims);
}

TEST_F(PostgresServer, AKeyReusedWithAnotherRequestIsRefused) {
  a_key_reused_with_another_request_is_refused(claims);
}

TEST_F(PostgresServer, KilledAfterCommitReplaysOnRetry) {
  killed_after_commit_replays_on_retry(claims, claims.uri, claims.table);
}

TEST_F(PostgresServer, KilledBeforeCommitLeavesNothing) {
  killed_before_commit_leaves_nothing(claims, claims.uri, claims.table);
}

TEST_F(PostgresServer, AHandlerThrowingUnreadableBytesGivesItsKeyBack) {
  a_handler_throwing_unreadable_bytes_gives_its_key_back(claims);
}

TEST_F(PostgresServer, KeysExpireAndRetentionPurgesThem) {
  keys_expire_and_retention_purges_them(claims);
}

// The handler runs in the transaction that stores its response, so a handler that outlived its
// lease and was taken over by a retry commits none of its writes: the claim is there once, and
// the slow request answers 409 (its retry gets the response that was stored).
TEST_F(PostgresServer, AHandlerTakenOverAfterItsLeaseCommitsNoneOfItsWrites) {
  server::EndpointOptions options;
  options.lease = std::chrono::milliseconds(200);
  std::atomic<int> runs{0};
  InProcessClaims<PgClaims> api(claims, options, [&] {
    if (runs.fetch_add(1) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(800));
  });
  std::optional<httplib::Response> slow;
  std::thread first([&] { slow = post_claim(api.port(), "\"slow\"", R"({"n":1})"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto retry = post_claim(api.port(), "\"slow\"", R"({"n":1})");
  first.join();
  ASSERT_TRUE(retry && slow);
  EXPECT_EQ(retry->status, 201);
  EXPECT_EQ(retry->body, R"({"claim":1})");
  EXPECT_EQ(slow->status, 409);
  EXPECT_EQ(slow->get_header_value("Retry-After"), "1");
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(claims.count(), 1);
  const auto again = post_claim(api.port(), "\"slow\"", R"({"n":1})");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->body, R"({"claim":1})");
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
}

}  // namespace
