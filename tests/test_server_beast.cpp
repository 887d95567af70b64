// The server side on Boost.Beast (server/beast.hpp): a small synchronous Beast server on
// 127.0.0.1 serving the claims API over SQLite, driven by an HTTP client.

#include "support/server_claims.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/server/beast.hpp>

#include <gtest/gtest.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace idemgate;
using namespace idemgate::test;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// POST /claims through the endpoint, GET /claims?idempotency_key= through its lookup; one
// thread per connection.
class BeastClaims {
 public:
  explicit BeastClaims(const SqliteClaims& claims) : claims_(claims), store_(claims.open()) {
    store_.migrate();
    claims_.create();
    endpoint_.emplace("claims.api", store_);
    accepting_ = std::thread([this] { accept_loop(); });
  }
  ~BeastClaims() {
    stopping_ = true;
    asio::io_context wake;
    tcp::socket s(wake);
    boost::system::error_code ec;
    s.connect({asio::ip::make_address("127.0.0.1"), port()}, ec);
    accepting_.join();
    std::lock_guard lock(mutex_);
    for (auto& t : sessions_) t.join();
  }
  [[nodiscard]] unsigned short port() const { return acceptor_.local_endpoint().port(); }
  [[nodiscard]] int handler_runs() const { return runs_.load(); }

 private:
  void accept_loop() {
    for (;;) {
      tcp::socket socket(ioc_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec || stopping_) return;
      std::lock_guard lock(mutex_);
      sessions_.emplace_back([this, s = std::move(socket)]() mutable { session(std::move(s)); });
    }
  }

  void session(tcp::socket socket) {
    beast::flat_buffer buffer;
    auto handler = claim_handler(claims_, [this] {
      runs_.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    });
    for (;;) {
      server::BeastRequest req;
      beast::error_code ec;
      http::read(socket, buffer, req, ec);
      if (ec) break;
      const std::string client(req["X-Client"].data(), req["X-Client"].size());
      server::BeastResponse res =
          req.method() == http::verb::get
              ? server::answer_lookup(*endpoint_, req, "idempotency_key", "POST", "/claims", client)
              : server::answer(*endpoint_, req, client, handler);
      http::write(socket, res, ec);
      if (ec || !res.keep_alive()) break;
    }
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
  }

  SqliteClaims claims_;
  SqliteStore store_;
  std::optional<server::Endpoint<SqliteStore>> endpoint_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_{ioc_, {asio::ip::make_address("127.0.0.1"), 0}};
  std::atomic<bool> stopping_{false};
  std::atomic<int> runs_{0};
  std::mutex mutex_;
  std::vector<std::thread> sessions_;
  std::thread accepting_;
};

// One request with Beast's own client; `key` empty sends none.
server::BeastResponse send(unsigned short port, http::verb verb, const std::string& target,
                           const std::string& key, const std::string& body) {
  asio::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  server::BeastRequest req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.set("X-Client", "acme");
  if (!key.empty()) req.set("Idempotency-Key", key);
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::write(socket, req);
  beast::flat_buffer buffer;
  server::BeastResponse res;
  http::read(socket, buffer, res);
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  return res;
}

std::string header(const server::BeastResponse& res, const char* name) {
  const auto value = res[name];
  return std::string(value.data(), value.size());
}

struct BeastServer : ::testing::Test {
  sqlite::TempDir dir;
  SqliteClaims claims{dir.file("api.db")};
};

TEST(BeastAdapter, HandsOnThePathAsTargetAndTheQueryAsSent) {
  server::BeastRequest req{http::verb::post, "/claims?b=2&a=%41", 11};
  const server::Request out = server::to_request(req, "acme");
  EXPECT_EQ(out.target, "/claims");
  EXPECT_EQ(out.query, "b=2&a=%41");
  EXPECT_EQ(server::to_request(server::BeastRequest{http::verb::post, "/claims", 11}, "").query,
            "");
}

TEST_F(BeastServer, ARepeatedKeyIsReplayedAndAnotherRequestRefused) {
  BeastClaims api(claims);
  const auto first = send(api.port(), http::verb::post, "/claims", "\"b-1\"", R"({"n":1})");
  EXPECT_EQ(first.result_int(), 201u);
  EXPECT_EQ(first.body(), R"({"claim":1})");
  EXPECT_EQ(header(first, "X-Not-Stored"), "first-answer-only");
  const auto replay = send(api.port(), http::verb::post, "/claims", "\"b-1\"", R"({ "n": 1 })");
  EXPECT_EQ(replay.result_int(), 201u);
  EXPECT_EQ(replay.body(), R"({"claim":1})");
  EXPECT_EQ(header(replay, "Idempotent-Replayed"), "true");
  EXPECT_EQ(header(replay, "Location"), "/claims/1");
  EXPECT_EQ(header(replay, "X-Not-Stored"), "");
  const auto other = send(api.port(), http::verb::post, "/claims", "\"b-1\"", R"({"n":2})");
  EXPECT_EQ(other.result_int(), 422u);
  EXPECT_EQ(header(other, "Content-Type"), "application/problem+json");
  const auto none = send(api.port(), http::verb::post, "/claims", "", R"({"n":1})");
  EXPECT_EQ(none.result_int(), 400u);
  EXPECT_EQ(api.handler_runs(), 1);
  EXPECT_EQ(claims.count(), 1);
}

TEST_F(BeastServer, TheLookupFindsTheStoredResponseByKey) {
  BeastClaims api(claims);
  EXPECT_EQ(send(api.port(), http::verb::get, "/claims?idempotency_key=b-2", "", "").result_int(),
            404u);
  ASSERT_EQ(send(api.port(), http::verb::post, "/claims", "\"b-2\"", "{}").result_int(), 201u);
  const auto found = send(api.port(), http::verb::get, "/claims?x=1&idempotency_key=b%2D2", "", "");
  EXPECT_EQ(found.result_int(), 201u);
  EXPECT_EQ(found.body(), R"({"claim":1})");
  EXPECT_EQ(header(found, "Idempotent-Replayed"), "true");
  EXPECT_EQ(send(api.port(), http::verb::get, "/claims", "", "").result_int(), 400u);
}

TEST_F(BeastServer, SixteenConcurrentRequestsRunTheHandlerOnce) {
  BeastClaims api(claims);
  std::vector<std::thread> threads;
  std::vector<server::BeastResponse> answers(16);
  std::atomic<bool> go{false};
  for (std::size_t i = 0; i < answers.size(); ++i)
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      answers[i] = send(api.port(), http::verb::post, "/claims", "\"b-16\"", R"({"n":16})");
    });
  go = true;
  for (auto& t : threads) t.join();
  int created = 0;
  for (const auto& a : answers) {
    if (a.result_int() == 409) {
      EXPECT_EQ(header(a, "Retry-After"), "1");
      continue;
    }
    EXPECT_EQ(a.result_int(), 201u);
    EXPECT_EQ(a.body(), R"({"claim":1})");
    if (header(a, "Idempotent-Replayed").empty()) ++created;
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(api.handler_runs(), 1);
  EXPECT_EQ(claims.count(), 1);
}

}  // namespace

// A request written byte for byte, for header lines a client library would not send: the status
// and body of the answer.
static std::string send_raw(unsigned short port, const std::string& request) {
  asio::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(socket, asio::buffer(request));
  beast::flat_buffer buffer;
  server::BeastResponse res;
  http::read(socket, buffer, res);
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  return std::to_string(res.result_int()) + " " + res.body();
}

// Beast hands the endpoint the header lines as they were sent: a second, empty
// `Idempotency-Key` line is seen (and refused), and a key is never percent-decoded, so two
// distinct sf-strings never name one key (docs/server-side.md, the conformance table).
TEST_F(BeastServer, KeyLinesAreReadAsSentNeitherDecodedNorDropped) {
  BeastClaims api(claims);
  const auto post = [&](const std::string& key_lines, const std::string& body) {
    return send_raw(api.port(),
                    "POST /claims HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Client: acme\r\n" + key_lines +
                        "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  };
  const std::string two_lines = post("Idempotency-Key: \"b-3\"\r\nIdempotency-Key: \r\n", "{}");
  EXPECT_EQ(two_lines.substr(0, 4), "400 ") << two_lines;
  EXPECT_NE(two_lines.find("idempotency-key-malformed"), std::string::npos) << two_lines;
  EXPECT_EQ(post("Idempotency-Key: \"X-%41\"\r\n", R"({"n":1})"), "201 {\"claim\":1}");
  EXPECT_EQ(post("Idempotency-Key: \"X-A\"\r\n", R"({"n":2})"), "201 {\"claim\":2}")
      << "\"X-%41\" and \"X-A\" are two keys";
  EXPECT_EQ(post("Idempotency-Key: \"q-%22\"\r\n", R"({"n":3})"), "201 {\"claim\":3}")
      << "a valid sf-string holding %22 is taken";
  EXPECT_EQ(api.handler_runs(), 3);
  EXPECT_EQ(claims.count(), 3);
}
