// The server side from outside: real clients over loopback — curl, and python-requests with
// urllib3's own retry loop — against the claims API on SQLite (support/server_claims.hpp).

#include "support/server_scenarios.hpp"
#include "support/sqlite_files.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace idemgate;
using namespace idemgate::test;

// Everything a program printed, until it exits.
std::string output_of(const std::vector<std::string>& argv) {
  ChildProcess child(argv);
  std::string all, line;
  while (child.read_until_eof(line)) all += line + "\n";
  return all;
}

std::string curl_post(int port, const std::vector<std::string>& headers, const std::string& body) {
  std::vector<std::string> argv{"/usr/bin/curl",
                                "-s",
                                "-i",
                                "-X",
                                "POST",
                                "-H",
                                "X-Client: acme",
                                "-H",
                                "Content-Type: application/json",
                                "--data",
                                body};
  for (const auto& h : headers) {
    argv.push_back("-H");
    argv.push_back(h);
  }
  argv.push_back("http://127.0.0.1:" + std::to_string(port) + "/claims");
  return output_of(argv);
}

std::string requests_retry(int port, const std::string& key, const std::string& body) {
  return output_of({"/usr/bin/python3",
                    std::string(IDEMGATE_SOURCE_DIR) + "/tests/server_clients/requests_retry.py",
                    std::to_string(port), key, body});
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct ServerClients : ::testing::Test {
  sqlite::TempDir dir;
  SqliteClaims claims{dir.file("api.db")};
};

TEST_F(ServerClients, CurlGetsTheReplayAndTheProblems) {
  InProcessClaims<SqliteClaims> api(claims, {});
  const std::string first = curl_post(api.port(), {"Idempotency-Key: \"curl-1\""}, R"({"n":1})");
  EXPECT_TRUE(contains(first, "HTTP/1.1 201")) << first;
  EXPECT_FALSE(contains(first, "Idempotent-Replayed")) << first;
  EXPECT_TRUE(contains(first, R"({"claim":1})")) << first;
  const std::string again =
      curl_post(api.port(), {"Idempotency-Key: \"curl-1\""}, R"({ "n" : 1 })");
  EXPECT_TRUE(contains(again, "HTTP/1.1 201")) << again;
  EXPECT_TRUE(contains(again, "Idempotent-Replayed: true")) << again;
  EXPECT_TRUE(contains(again, "Location: /claims/1")) << again;
  EXPECT_TRUE(contains(again, R"({"claim":1})")) << again;
  const std::string other = curl_post(api.port(), {"Idempotency-Key: \"curl-1\""}, R"({"n":2})");
  EXPECT_TRUE(contains(other, "HTTP/1.1 422")) << other;
  EXPECT_TRUE(contains(other, "Content-Type: application/problem+json")) << other;
  const std::string none = curl_post(api.port(), {}, R"({"n":1})");
  EXPECT_TRUE(contains(none, "HTTP/1.1 400")) << none;
  EXPECT_TRUE(contains(none, "idempotency-key-missing")) << none;
  EXPECT_EQ(api.handler_runs(), 1);
  EXPECT_EQ(claims.count(), 1);
}

// urllib3 retries the 409 of a key whose first request is still held — its server was killed
// inside the handler, and the request's lease has not run out — under the same key, until the
// lease ends and the handler runs, once.
TEST_F(ServerClients, PythonRequestsRetriesThe409UntilTheHandlerRuns) {
  int port = 0;
  auto dying = start_claims_process(claims.path, "idemgate_log", "before-commit", port);
  EXPECT_FALSE(post_claim(port, "\"py-409\"", R"({"n":1})"));
  dying.reset();
  auto serving = start_claims_process(claims.path, "idemgate_log", "none", port);
  const std::string out = requests_retry(port, "\"py-409\"", R"({"n": 1})");
  EXPECT_TRUE(contains(out, R"("status": 201)")) << out;
  EXPECT_TRUE(contains(out, R"("replayed": "")")) << out;
  EXPECT_TRUE(contains(out, R"("body": "{\"claim\":1}")")) << out;
  EXPECT_TRUE(contains(out, R"("statuses": [409)")) << out;
  EXPECT_EQ(claims.count(), 1);
}

// A handler that throws leaves nothing behind: urllib3 retries the 500 under the same key, the
// handler runs again, and the claim is there once.
TEST_F(ServerClients, PythonRequestsRetriesA500AndTheHandlerRunsAgainOnce) {
  std::atomic<int> runs{0};
  InProcessClaims<SqliteClaims> api(claims, {}, [&] {
    if (runs.fetch_add(1) == 0) throw std::runtime_error("a dependency was down");
  });
  const std::string out = requests_retry(api.port(), "\"py-500\"", R"({"n":1})");
  EXPECT_TRUE(contains(out, R"("status": 201)")) << out;
  EXPECT_TRUE(contains(out, R"("replayed": "")")) << out;
  EXPECT_TRUE(contains(out, R"("body": "{\"claim\":1}")")) << out;
  EXPECT_TRUE(contains(out, R"("statuses": [500])")) << out;
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(claims.count(), 1);
}

}  // namespace
