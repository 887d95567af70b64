// The server side (server/) over PostgreSQL through the cpp-httplib adapter, on loopback: the
// same scenarios as over SQLite, and a handler taken over after its lease.

#include "support/pg_cluster.hpp"
#include "support/postgres.hpp"
#include "support/server_scenarios.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

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

TEST_F(PostgresServer, KeysThatNeverCompletedFreeAfterTheirLifetime) {
  keys_that_never_completed_free_after_their_lifetime(claims);
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

// A give-back the server refuses (a trigger rejects every release of the log: the lease set to
// the epoch) is not swallowed: tried three times, then logged and counted, and the answer says
// when the key is free (Retry-After: the lease). A retry before then meets the held key (409);
// after the lease ran out it runs the handler.
TEST_F(PostgresServer, AGiveBackTheServerRefusesIsLoggedCountedAndAnsweredWithTheLease) {
  auto store = claims.open();
  store.migrate();
  claims.create();
  pg_exec("CREATE FUNCTION " + claims.table +
          "_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
          "'releases refused'; END $$");
  pg_exec("CREATE TRIGGER refuse_release BEFORE UPDATE ON " + claims.table +
          " FOR EACH ROW WHEN (NEW.lease_until = 'epoch') EXECUTE FUNCTION " + claims.table +
          "_refuse()");
  std::vector<std::string> logged;
  server::EndpointOptions options;
  options.lease = std::chrono::milliseconds(1500);
  options.log = [&](std::string_view line) { logged.emplace_back(line); };
  server::Endpoint endpoint{"claims.api", store, options};
  int runs = 0;
  const auto handler = [&](pqxx::work& tx, const server::Request& r) {
    if (++runs == 1) throw std::runtime_error("the handler broke");
    claims.insert(tx, r.client);
    return server::Response{201, {{"Content-Type", "text/plain"}}, "claimed"};
  };
  const server::Request request{"POST", "/claims", "\"held\"", "text/plain", "body", "acme", ""};
  const auto failed = endpoint.handle(request, handler);
  EXPECT_EQ(failed.status, 500);
  EXPECT_EQ(failed.header("Retry-After"), "2") << "the lease, in whole seconds rounded up";
  EXPECT_EQ(endpoint.keys_not_given_back(), 1u);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("could not give back key"), std::string::npos) << logged[0];
  EXPECT_NE(logged[0].find("releases refused"), std::string::npos) << logged[0];

  pg_exec("DROP TRIGGER refuse_release ON " + claims.table);
  pg_exec("DROP FUNCTION " + claims.table + "_refuse()");
  EXPECT_EQ(endpoint.handle(request, handler).status, 409) << "the key is held until its lease";
  EXPECT_EQ(runs, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));
  EXPECT_EQ(endpoint.handle(request, handler).status, 201);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(claims.count(), 1);
}

// A response commits with its handler's writes and is their only record: the client holds its
// 2xx and nothing would run the handler again. It waits for its flush even on a store with
// relaxed outcomes, and a database crash right after it keeps the response and the writes.
TEST(PostgresServerCrash, AResponseCommitStaysDurableWithRelaxedOutcomes) {
  // The WAL writer waits 10 s and the background writer writes no pages, so a commit that did
  // not wait for its flush is still in the WAL buffers when the server crashes.
  PgCluster cluster("-c wal_writer_delay=10s -c bgwriter_lru_maxpages=0");
  const PgClaims claims{cluster.uri(), "srv_claims"};
  {
    PostgresOptions options;
    options.table = claims.table;
    options.relaxed_outcomes = true;
    PostgresStore store{cluster.uri(), options};
    store.migrate();
    claims.create();
    server::Endpoint endpoint{"claims.api", store};
    const server::Request request{"POST", "/claims", "\"durable\"", "text/plain", "body",
                                  "acme", ""};
    const auto response = endpoint.handle(request, [&](pqxx::work& tx, const server::Request& r) {
      claims.insert(tx, r.client);
      return server::Response{201, {{"Content-Type", "text/plain"}}, "claimed"};
    });
    ASSERT_EQ(response.status, 201);
  }
  cluster.crash();
  cluster.start();
  EXPECT_EQ(claims.count(), 1) << "the crash lost the writes of a response the client holds";
  EXPECT_EQ(pg_count_on(cluster.uri(),
                        "SELECT count(*) FROM " + claims.table + " WHERE status = 'committed'"),
            1);
}

}  // namespace
