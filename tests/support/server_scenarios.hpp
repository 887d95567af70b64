#pragma once

// What the server side must do on every store, as functions the SQLite and PostgreSQL tests
// call with their claims table (support/server_claims.hpp): over loopback HTTP, concurrent, and
// with the serving process killed by SIGKILL around its commit.

#include "child_process.hpp"
#include "server_claims.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace idemgate::test {

/// The claims API served in this process on 127.0.0.1, through the cpp-httplib adapter.
template <class Claims>
class InProcessClaims {
 public:
  InProcessClaims(const Claims& claims, server::EndpointOptions options,
                  std::function<void()> after_write = {})
      : claims_(claims), store_(claims.open()) {
    store_.migrate();
    claims_.create();
    endpoint_ = std::make_unique<server::Endpoint<typename Claims::Store>>("claims.api", store_,
                                                                           std::move(options));
    http_.new_task_queue = [] { return new httplib::ThreadPool(32); };
    const auto client_of = [](const httplib::Request& r) { return r.get_header_value("X-Client"); };
    server::serve(http_, "POST", "/claims", *endpoint_, client_of,
                  claim_handler(claims_, [this, after_write] {
                    handler_runs_.fetch_add(1);
                    if (after_write) after_write();
                  }));
    server::serve_lookup(http_, "/claims", "idempotency_key", "POST", "/claims", *endpoint_,
                         client_of);
    port_ = http_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { http_.listen_after_bind(); });
    while (!http_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~InProcessClaims() {
    http_.stop();
    thread_.join();
  }
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int handler_runs() const { return handler_runs_.load(); }
  [[nodiscard]] server::Endpoint<typename Claims::Store>& endpoint() { return *endpoint_; }

 private:
  Claims claims_;
  typename Claims::Store store_;
  std::unique_ptr<server::Endpoint<typename Claims::Store>> endpoint_;
  httplib::Server http_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> handler_runs_{0};
};

/// Why the last `post_claim` of this thread got no answer.
inline std::string& last_post_error() {
  thread_local std::string error;
  return error;
}

/// POST /claims on 127.0.0.1:`port` with `key` (sent as is) and `body`, as client "acme".
/// The answer, or nullopt when none came (the connection broke).
inline std::optional<httplib::Response> post_claim(int port, const std::string& key,
                                                   const std::string& body,
                                                   const std::string& client = "acme") {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(10));
  httplib::Headers headers{{"X-Client", client}};
  if (!key.empty()) headers.emplace("Idempotency-Key", key);
  auto result = c.Post("/claims", headers, body, "application/json");
  if (!result) {
    last_post_error() = httplib::to_string(result.error());
    return std::nullopt;
  }
  return *result;
}

/// 16 requests with one key at once: the handler runs once, and every answer is that run's
/// response (replayed) or 409 with Retry-After while it ran.
template <class Claims>
void sixteen_concurrent_requests_run_the_handler_once(const Claims& claims) {
  InProcessClaims<Claims> api(claims, {},
                              [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
  // Each client connects first (a lookup on a kept-alive connection): the 16 requests then
  // arrive at once, not queued behind the server's listen backlog.
  std::vector<std::unique_ptr<httplib::Client>> clients;
  for (int i = 0; i < 16; ++i) {
    clients.push_back(std::make_unique<httplib::Client>("127.0.0.1", api.port()));
    clients.back()->set_keep_alive(true);
    clients.back()->set_read_timeout(std::chrono::seconds(10));
    const auto warm = clients.back()->Get("/claims?idempotency_key=none", {{"X-Client", "acme"}});
    ASSERT_TRUE(warm);
    ASSERT_EQ(warm->status, 404);
  }
  std::vector<std::thread> threads;
  std::vector<std::optional<httplib::Response>> results(16);
  std::vector<std::string> errors(16);
  std::atomic<bool> go{false};
  for (std::size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      auto r =
          clients[i]->Post("/claims", {{"X-Client", "acme"}, {"Idempotency-Key", "\"order-16\""}},
                           R"({"item":"reefer","n":1})", "application/json");
      if (r)
        results[i] = *r;
      else
        errors[i] = httplib::to_string(r.error());
    });
  go = true;
  for (auto& t : threads) t.join();
  int created = 0, replayed = 0, in_progress = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    ASSERT_TRUE(r) << errors[i];
    if (r->status == 201) {
      EXPECT_EQ(r->body, R"({"claim":1})");
      (r->get_header_value("Idempotent-Replayed") == "true" ? replayed : created) += 1;
    } else {
      EXPECT_EQ(r->status, 409) << r->body;
      EXPECT_EQ(r->get_header_value("Retry-After"), "1");
      EXPECT_EQ(r->get_header_value("Content-Type"), "application/problem+json");
      ++in_progress;
    }
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(created + replayed + in_progress, 16);
  EXPECT_EQ(api.handler_runs(), 1);
  EXPECT_EQ(claims.count(), 1);
  const auto after = post_claim(api.port(), "\"order-16\"", R"({"n":1, "item":"reefer"})");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 201);
  EXPECT_EQ(after->body, R"({"claim":1})");
  EXPECT_EQ(after->get_header_value("Idempotent-Replayed"), "true");
}

/// The same key with another request is 422 and runs nothing; the same request with its members
/// in another order and other whitespace is a replay.
template <class Claims>
void a_key_reused_with_another_request_is_refused(const Claims& claims) {
  InProcessClaims<Claims> api(claims, {});
  const auto first = post_claim(api.port(), "\"k-422\"", R"({"item":"reefer","n":1})");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 201);
  const auto other = post_claim(api.port(), "\"k-422\"", R"({"item":"reefer","n":2})");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 422);
  EXPECT_EQ(other->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_NE(other->body.find("\"type\":\"urn:idemgate:problem:idempotency-key-reused\""),
            std::string::npos);
  const auto reordered =
      post_claim(api.port(), "\"k-422\"", "{ \"n\" : 1,\n  \"item\" : \"reefer\" }");
  ASSERT_TRUE(reordered);
  EXPECT_EQ(reordered->status, 201);
  EXPECT_EQ(reordered->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(reordered->body, first->body);
  EXPECT_EQ(api.handler_runs(), 1);
  EXPECT_EQ(claims.count(), 1);
}

/// Starts the claims process in `mode`; returns it with its port.
inline std::unique_ptr<ChildProcess> start_claims_process(const std::string& where,
                                                          const std::string& table,
                                                          const std::string& mode, int& port) {
  auto child = std::make_unique<ChildProcess>(
      std::vector<std::string>{SERVER_CLAIMS_PROCESS_PATH, where, table, mode});
  port = std::stoi(child->read_line());
  return child;
}

/// Killed by SIGKILL after its commit, before its reply: the retry (to a new process) replays
/// the committed response, and the handler's write is there once.
template <class Claims>
void killed_after_commit_replays_on_retry(const Claims& claims, const std::string& where,
                                          const std::string& table) {
  int port = 0;
  auto dying = start_claims_process(where, table, "after-commit", port);
  const auto lost = post_claim(port, "\"crash-after\"", R"({"item":"reefer"})");
  EXPECT_FALSE(lost) << "the process answered instead of dying";
  dying.reset();
  EXPECT_EQ(claims.count(), 1);
  auto serving = start_claims_process(where, table, "none", port);
  const auto retry = post_claim(port, "\"crash-after\"", R"({"item":"reefer"})");
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->status, 201);
  EXPECT_EQ(retry->body, R"({"claim":1})");
  EXPECT_EQ(retry->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry->get_header_value("Location"), "/claims/1");
  EXPECT_EQ(retry->get_header_value("X-Not-Stored"), "");
  EXPECT_EQ(claims.count(), 1);
}

/// Killed by SIGKILL inside the handler, after its write and before the commit: nothing is left
/// behind; the retry answers 409 while the dead request's lease runs, then runs the handler.
template <class Claims>
void killed_before_commit_leaves_nothing(const Claims& claims, const std::string& where,
                                         const std::string& table) {
  int port = 0;
  auto dying = start_claims_process(where, table, "before-commit", port);
  const auto lost = post_claim(port, "\"crash-before\"", R"({"item":"reefer"})");
  EXPECT_FALSE(lost) << "the process answered instead of dying";
  dying.reset();
  EXPECT_EQ(claims.count(), 0);
  auto serving = start_claims_process(where, table, "none", port);
  int conflicts = 0;
  std::optional<httplib::Response> retry;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    retry = post_claim(port, "\"crash-before\"", R"({"item":"reefer"})");
    ASSERT_TRUE(retry);
    if (retry->status != 409 || std::chrono::steady_clock::now() > deadline) break;
    ++conflicts;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(retry->status, 201) << retry->body;
  EXPECT_EQ(retry->body, R"({"claim":1})");
  EXPECT_EQ(retry->get_header_value("Idempotent-Replayed"), "");
  EXPECT_EQ(claims.count(), 1);
}

/// A key answers for `key_lifetime`; after it the same key runs the handler anew. The request
/// deletes its own key's row only; `purge_expired`, off the request path, deletes the others.
template <class Claims>
void keys_expire_and_retention_purges_them(const Claims& claims) {
  server::EndpointOptions options;
  options.key_lifetime = std::chrono::seconds(1);
  InProcessClaims<Claims> api(claims, options);
  const auto first = post_claim(api.port(), "\"k-expiring\"", R"({"n":1})");
  const auto kept = post_claim(api.port(), "\"k-other\"", R"({"n":1})");
  ASSERT_TRUE(first && kept);
  const auto replay = post_claim(api.port(), "\"k-expiring\"", R"({"n":1})");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  const auto lookup_key = api.endpoint().log_key("acme", "POST", "/claims", "k-other");
  ASSERT_TRUE(api.endpoint().store().find(lookup_key));
  const auto again = post_claim(api.port(), "\"k-expiring\"", R"({"n":2})");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 201);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "");
  EXPECT_EQ(again->body, R"({"claim":3})");
  EXPECT_TRUE(api.endpoint().store().find(lookup_key))
      << "a request purged another key's row on its own path";
  EXPECT_EQ(api.endpoint().purge_expired(), 1u) << "k-other's row; k-expiring's is new";
  EXPECT_FALSE(api.endpoint().store().find(lookup_key));
  EXPECT_EQ(api.endpoint().store().purge(std::chrono::seconds(0), 100), 1u);
}

/// A key whose requests never completed (the handler threw) is bound to its request for
/// `key_lifetime` after its last attempt, then free for any request; its row is deleted then by
/// the request that meets it, or by `purge_expired` off the request path. (A live lease is never
/// cut: the stores' conformance suite, `ExpireDeletesAKeysRowOnlyWhenItsLifeIsOver`.)
template <class Claims>
void keys_that_never_completed_free_after_their_lifetime(const Claims& claims) {
  server::EndpointOptions options;
  options.key_lifetime = std::chrono::seconds(1);
  std::atomic<bool> failing{true};
  InProcessClaims<Claims> api(claims, options, [&failing] {
    if (failing.load()) throw std::runtime_error("the ledger is down");
  });
  for (const char* key : {"\"k-failed\"", "\"k-abandoned\""}) {
    const auto failed = post_claim(api.port(), key, R"({"n":1})");
    ASSERT_TRUE(failed);
    ASSERT_EQ(failed->status, 500) << failed->body;
  }
  failing = false;
  const auto bound = post_claim(api.port(), "\"k-failed\"", R"({"n":2})");
  ASSERT_TRUE(bound);
  EXPECT_EQ(bound->status, 422) << "within its lifetime, the key stays bound to its request";
  const auto abandoned = api.endpoint().log_key("acme", "POST", "/claims", "k-abandoned");
  EXPECT_EQ(api.endpoint().purge_expired(), 0u) << "nothing is past its lifetime yet";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));

  const auto freed = post_claim(api.port(), "\"k-failed\"", R"({"n":2})");
  ASSERT_TRUE(freed);
  EXPECT_EQ(freed->status, 201) << "past its lifetime the key is free: " << freed->body;
  EXPECT_EQ(freed->get_header_value("Idempotent-Replayed"), "");
  ASSERT_TRUE(api.endpoint().store().find(abandoned)) << "a request deletes only its own key";
  EXPECT_EQ(api.endpoint().purge_expired(), 1u) << "k-abandoned; k-failed's row is new";
  EXPECT_FALSE(api.endpoint().store().find(abandoned));
  EXPECT_EQ(claims.count(), 1) << "k-failed once, after it was freed";
}

// A handler that throws with bytes PostgreSQL cannot keep in text (the body as it came, not
// UTF-8, with a NUL): the request answers 500 and gives its key back, so the client's retry runs
// the handler again at once instead of meeting 409 for the whole lease; the log keeps the reason,
// shown safely.
template <class Claims>
void a_handler_throwing_unreadable_bytes_gives_its_key_back(const Claims& claims) {
  auto store = claims.open();
  store.migrate();
  claims.create();
  std::vector<std::string> logged;
  server::EndpointOptions options;
  options.log = [&](std::string_view line) { logged.emplace_back(line); };
  server::Endpoint endpoint{"claims.api", store, options};
  const std::string body("{\"n\":\xff\xfe\x00}", 9);
  int runs = 0;
  const auto handler = [&](auto& tx, const server::Request& r) {
    if (++runs == 1) throw std::runtime_error("unreadable input: " + r.body);
    claims.insert(tx, r.client);
    return server::Response{201, {{"Content-Type", "text/plain"}}, "claimed"};
  };
  server::Request request{"POST", "/claims", "\"bytes\"", "application/octet-stream",
                          body,   "acme",    ""};
  const auto failed = endpoint.handle(request, handler);
  EXPECT_EQ(failed.status, 500);
  EXPECT_FALSE(failed.header("Retry-After")) << "told to wait though the key was given back";
  const auto retried = endpoint.handle(request, handler);
  EXPECT_EQ(retried.status, 201) << "the retry met the key still held";
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(claims.count(), 1);
  EXPECT_EQ(endpoint.keys_not_given_back(), 0u);
  EXPECT_TRUE(logged.empty());
  const auto row = endpoint.store().find(endpoint.log_key("acme", "POST", "/claims", "bytes"));
  ASSERT_TRUE(row.has_value());
  ASSERT_FALSE(row->history.empty());
  // (An exception's message ends at its first NUL: what() is a C string.)
  EXPECT_NE(row->history.front().reason.find("unreadable input: {\"n\":\\xff\\xfe"),
            std::string::npos)
      << row->history.front().reason;
}

}  // namespace idemgate::test
