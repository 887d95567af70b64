// HttpDownstream over a real socket on 127.0.0.1, against the fake ECT Delta slot API.

#include "support/memory_bookings.hpp"
#include "support/monday.hpp"
#include "support/self_signed.hpp"
#include "support/slot_request.hpp"

#include <ect_delta/slot_api.hpp>
#include <ect_delta/terminal_server.hpp>
#include <idemgate/downstream/http.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/memory.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::HttpDownstream;
using idemgate::HttpOptions;
using idemgate::KeyHeaderForm;
using idemgate::MemoryStore;
using idemgate::Status;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

using idemgate::test::MemoryBookings;

namespace {

/// The string member `name` of the JSON object in `body`.
std::optional<std::string> slot_field(std::string_view body, std::string_view name) {
  const auto document = ect_delta::json::parse(body);
  return document ? ect_delta::json::string_member(*document, name) : std::nullopt;
}

/// The slot API's mapping: JSON claim, slot id as the outcome, lookup by key.
struct SlotApi {
  using request_type = SlotRequest;
  using outcome_type = std::string;
  idemgate::HttpCall claim_call(const SlotRequest& r) const {
    return {"POST", "/slots",
            ect_delta::json::Json{{"container", r.container}, {"window", r.window}}.dump()};
  }
  idemgate::HttpCall lookup_call(const idemgate::Key& key) const {
    return {"GET", "/slots?idempotency_key=" + key.hex()};
  }
  std::optional<std::string> parse_outcome(std::string_view body) const {
    return slot_field(body, "slot");
  }
};

/// Reads a field the API never sends, so every 2xx body fails to parse.
struct MisreadingSlotApi : SlotApi {
  std::optional<std::string> parse_outcome(std::string_view body) const {
    return slot_field(body, "slot_id");
  }
};

static_assert(idemgate::downstream<HttpDownstream<SlotApi>>);
static_assert(idemgate::lookup_downstream<HttpDownstream<SlotApi>>);
static_assert(HttpDownstream<SlotApi>::honours_idempotency_key);
static_assert(!HttpDownstream<SlotApi, false>::honours_idempotency_key);

/// Short timeouts; the key header form stays the default unless given.
HttpOptions fast(std::optional<KeyHeaderForm> form = std::nullopt) {
  HttpOptions options;
  options.connect_timeout = 500ms;
  options.read_timeout = 2s;
  options.write_timeout = 500ms;
  if (form) options.key_header_form = *form;
  return options;
}

/// A started terminal; stopped when the test ends.
struct Terminal : ect_delta::TerminalServer {
  Terminal() { start(); }
};

/// A port on 127.0.0.1 that is bound but not listening: connecting to it is refused, and no
/// other process can take it while this object lives.
class RefusingPort {
 public:
  RefusingPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (fd_ < 0) throw std::runtime_error("socket() failed");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      throw std::runtime_error("bind() failed");
    port_ = ntohs(address.sin_port);
  }
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;
  ~RefusingPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

/// A slot API on 127.0.0.1 that answers the first request on each connection (201, a new slot)
/// and keeps the connection open, then reads the next request on it and closes it unanswered:
/// as a server does that closes an idle connection just as a request arrives on it. It serves one
/// connection at a time and records every request it reads.
class ClosingOnReuse {
 public:
  ClosingOnReuse() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (fd_ < 0) throw std::runtime_error("socket() failed");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
        ::listen(fd_, 16) != 0)
      throw std::runtime_error("bind() or listen() failed");
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ClosingOnReuse(const ClosingOnReuse&) = delete;
  ClosingOnReuse& operator=(const ClosingOnReuse&) = delete;
  ~ClosingOnReuse() {
    ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
    thread_.join();
    ::close(fd_);
  }

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// Connections accepted.
  int connections() const { return connections_.load(); }
  /// The head (request line and headers) of every request read, in order.
  std::vector<std::string> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  // One request's head and body; false when the connection ended first.
  bool read_request(int fd) {
    std::string data;
    char buffer[4096];
    std::size_t head_end = std::string::npos;
    std::size_t body_size = 0;
    for (;;) {
      if (head_end == std::string::npos &&
          (head_end = data.find("\r\n\r\n")) != std::string::npos) {
        const auto at = data.find("Content-Length: ");
        if (at != std::string::npos && at < head_end) body_size = std::stoul(data.substr(at + 16));
      }
      if (head_end != std::string::npos && data.size() >= head_end + 4 + body_size) break;
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return false;
      data.append(buffer, static_cast<std::size_t>(n));
    }
    std::lock_guard lock(mutex_);
    requests_.push_back(data.substr(0, head_end));
    return true;
  }

  void serve() {
    for (int slot = 1;; ++slot) {
      const int connection = ::accept(fd_, nullptr, nullptr);
      if (connection < 0) return;
      connections_.fetch_add(1);
      if (read_request(connection)) {
        const std::string body = "{\"slot\":\"S-" + std::to_string(slot) + "\"}";
        const std::string answer =
            "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            "Content-Length: " +
            std::to_string(body.size()) + "\r\nConnection: keep-alive\r\n\r\n" + body;
        (void)::send(connection, answer.data(), answer.size(), MSG_NOSIGNAL);
        read_request(connection);  // then closed unanswered
      }
      ::close(connection);
    }
  }

  int fd_;
  int port_ = 0;
  std::atomic<int> connections_{0};
  mutable std::mutex mutex_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

/// An HTTPS server on 127.0.0.1 with a self-signed certificate, answering every claim with 201
/// and a new slot id, and counting the connections that carried a request.
class HttpsSlots {
 public:
  HttpsSlots()
      : server_(identity_.cert, identity_.key),
        ca_file_(::testing::TempDir() + "idemgate-https-slots-" + std::to_string(::getpid()) +
                 ".pem") {
    identity_.write_pem(ca_file_);
    server_.set_tcp_nodelay(true);
    server_.set_keep_alive_max_count(100);  // cpp-httplib closes after 5 requests by default
    server_.Post("/slots", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lock(mutex_);
      ports_.insert(req.remote_port);
      res.status = 201;
      res.set_content("{\"slot\":\"TLS-" + std::to_string(++issued_) + "\"}", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) throw std::runtime_error("cannot bind 127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  HttpsSlots(const HttpsSlots&) = delete;
  HttpsSlots& operator=(const HttpsSlots&) = delete;
  ~HttpsSlots() {
    server_.stop();
    thread_.join();
    std::filesystem::remove(ca_file_);
  }

  std::string base_url() const { return "https://127.0.0.1:" + std::to_string(port_); }
  /// The PEM file a client trusts.
  const std::string& ca_file() const { return ca_file_; }
  std::size_t connections_used() const {
    std::lock_guard lock(mutex_);
    return ports_.size();
  }

 private:
  idemgate::test::SelfSigned identity_;
  httplib::SSLServer server_;
  std::string ca_file_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::set<int> ports_;
  int issued_ = 0;
};

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
const auto key = idemgate::derive_key("ect.claim_slot", "CIS-2025-06-09-1001", "MSKU7000037");

}  // namespace

// --- the header ---------------------------------------------------------------------------------

TEST(HttpDownstream, SendsKeyAsQuotedStructuredFieldStringByDefault) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url()};
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  ASSERT_EQ(terminal.key_headers_received().size(), 1u);
  EXPECT_EQ(terminal.key_headers_received()[0], '"' + key.hex() + '"');
}

TEST(HttpDownstream, SendsBareKeyWhenConfigured) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast(KeyHeaderForm::bare)};
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  ASSERT_EQ(terminal.key_headers_received().size(), 1u);
  EXPECT_EQ(terminal.key_headers_received()[0], key.hex());
}

// --- answers ------------------------------------------------------------------------------------

TEST(HttpDownstream, CreatedAnswerIsTheOutcome) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url() + "/", fast()};
  const auto result = downstream.claim(msku, key);
  ASSERT_TRUE(result.ok()) << result.reason();
  const auto held = terminal.slot_for_key(key.hex());
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(result.outcome(), held->id);
  EXPECT_EQ(held->container, msku.container);
  EXPECT_EQ(held->window, msku.window);
}

TEST(HttpDownstream, RepeatedClaimWithSameKeyReturnsSameSlot) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto first = downstream.claim(msku, key);
  const auto second = downstream.claim(msku, key);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first.outcome(), second.outcome());
  EXPECT_EQ(terminal.claims_received(), 2);
  EXPECT_EQ(terminal.slots_issued(), 1);
}

TEST(HttpDownstream, TerminalForgetsKeyAfterItsRetention) {
  ect_delta::TerminalServer terminal{{.key_retention = 1s}};
  terminal.start();
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto first = downstream.claim(msku, key);
  std::this_thread::sleep_for(1100ms);
  EXPECT_TRUE(downstream.lookup(key).not_found());
  const auto second = downstream.claim(msku, key);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first.outcome(), second.outcome());
  EXPECT_EQ(terminal.slots_issued(), 2);
}

TEST(HttpDownstream, BadRequestIsPermanentWithStatusAndBodyExcerpt) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto result = downstream.claim(SlotRequest{"", "2025-06-09T07:00"}, key);
  ASSERT_TRUE(result.permanent()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "400")) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "non-empty string fields container")) << result.reason();
  EXPECT_EQ(terminal.slots_issued(), 0);
}

TEST(HttpDownstream, SameKeyWithDifferentBodyIsPermanent) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  const auto result = downstream.claim(SlotRequest{msku.container, "2025-06-09T19:00"}, key);
  ASSERT_TRUE(result.permanent()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "422")) << result.reason();
  EXPECT_EQ(terminal.slots_issued(), 1);
}

TEST(HttpDownstream, OtherClientErrorIsPermanent) {
  Terminal terminal;
  terminal.fail_next_claims(1, 410);
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto result = downstream.claim(msku, key);
  ASSERT_TRUE(result.permanent()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "410")) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "injected failure")) << result.reason();
}

TEST(HttpDownstream, ConfigurationErrorsAreTransientSoTheyFailNoEventForGood) {
  for (int status : {401, 403, 404, 405, 407, 421}) {
    Terminal terminal;
    terminal.fail_next_claims(1, status);
    HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
    const auto result = downstream.claim(msku, key);
    EXPECT_TRUE(result.transient()) << status << ": " << result.reason();
    EXPECT_TRUE(contains(result.reason(), std::to_string(status))) << result.reason();
    EXPECT_TRUE(contains(result.reason(), "set-up")) << result.reason();
    EXPECT_TRUE(downstream.claim(msku, key).ok()) << "fixed: the next claim goes through";
  }
}

TEST(HttpDownstream, ConfigurationStatusesCanBeMadePermanent) {
  Terminal terminal;
  terminal.fail_next_claims(1, 404);
  HttpOptions options = fast();
  options.configuration_statuses = {401, 403};
  HttpDownstream<SlotApi> downstream{terminal.base_url(), options};
  EXPECT_TRUE(downstream.claim(msku, key).permanent());
}

TEST(HttpDownstream, ConflictWhileSameKeyIsInProgressIsTransient) {
  ect_delta::TerminalServer terminal{{.keep_alive_timeout = 0s}};  // so that stop() is quick
  terminal.start();
  terminal.set_latency(10s);  // cut short by stop() below
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  HttpOptions patient = fast();
  patient.read_timeout = 15s;
  HttpDownstream<SlotApi> first_caller{terminal.base_url(), patient};
  std::optional<idemgate::ClaimResult<std::string>> first;
  std::thread worker([&] { first = first_caller.claim(msku, key); });
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (terminal.claims_in_progress() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(terminal.claims_in_progress(), 1);

  const auto second = downstream.claim(msku, key);
  terminal.stop();
  worker.join();

  ASSERT_TRUE(second.transient()) << second.reason();
  EXPECT_TRUE(contains(second.reason(), "409")) << second.reason();
  EXPECT_TRUE(contains(second.reason(), "in progress")) << second.reason();
  ASSERT_TRUE(first.has_value() && first->ok());
  EXPECT_EQ(terminal.slots_issued(), 1);
}

TEST(HttpDownstream, RequestTimeoutIsTransient) {
  Terminal terminal;
  terminal.fail_next_claims(1, 408);
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto result = downstream.claim(msku, key);
  ASSERT_TRUE(result.transient()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "408")) << result.reason();
}

TEST(HttpDownstream, TooManyRequestsIsTransientAndNamesRetryAfter) {
  Terminal terminal;
  terminal.fail_next_claims(1, 429);
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto result = downstream.claim(msku, key);
  ASSERT_TRUE(result.transient()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "429")) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "Retry-After: 1")) << result.reason();
}

TEST(HttpDownstream, ServiceUnavailableIsTransientAndClaimsNothing) {
  Terminal terminal;
  terminal.fail_next_claims(2);
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  for (int i = 0; i < 2; ++i) {
    const auto result = downstream.claim(msku, key);
    ASSERT_TRUE(result.transient()) << result.reason();
    EXPECT_TRUE(contains(result.reason(), "503")) << result.reason();
  }
  EXPECT_EQ(terminal.slots_issued(), 0);
  EXPECT_TRUE(downstream.claim(msku, key).ok());
  EXPECT_EQ(terminal.slots_issued(), 1);
}

TEST(HttpDownstream, SuccessBodyThatDoesNotParseIsTransient) {
  Terminal terminal;
  HttpDownstream<MisreadingSlotApi> downstream{terminal.base_url(), fast()};
  const auto result = downstream.claim(msku, key);
  ASSERT_TRUE(result.transient()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "201")) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "not an outcome")) << result.reason();
  EXPECT_EQ(terminal.slots_issued(), 1);
}

// --- transport failures -------------------------------------------------------------------------

TEST(HttpDownstream, ConnectionRefusedIsTransientWithClearReason) {
  RefusingPort refusing;
  HttpDownstream<SlotApi> downstream{"http://127.0.0.1:" + std::to_string(refusing.port()), fast()};
  const auto result = downstream.claim(msku, key);
  ASSERT_TRUE(result.transient()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "could not connect")) << result.reason();
  EXPECT_TRUE(contains(result.reason(), std::to_string(refusing.port()))) << result.reason();
}

TEST(HttpDownstream, ReadTimeoutIsTransient) {
  Terminal terminal;
  terminal.set_latency(10s);  // cut short when the terminal stops
  HttpOptions options = fast();
  options.read_timeout = 150ms;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), options};
  const auto started = std::chrono::steady_clock::now();
  const auto result = downstream.claim(msku, key);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  ASSERT_TRUE(result.transient()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "read timed out")) << result.reason();
}

TEST(HttpDownstream, LostResponseIsTransientAndLookupFindsTheCommittedSlot) {
  Terminal terminal;
  terminal.drop_next_responses(1);
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto claimed = downstream.claim(msku, key);
  ASSERT_TRUE(claimed.transient()) << claimed.reason();
  EXPECT_TRUE(contains(claimed.reason(), "closed or reset")) << claimed.reason();
  ASSERT_EQ(terminal.slots_issued(), 1);

  const auto found = downstream.lookup(key);
  ASSERT_TRUE(found.found()) << found.reason();
  EXPECT_EQ(found.outcome(), terminal.slot_for_key(key.hex())->id);

  const auto retried = downstream.claim(msku, key);
  ASSERT_TRUE(retried.ok()) << retried.reason();
  EXPECT_EQ(retried.outcome(), found.outcome());
  // The retry reached the terminal again; what kept it from a second slot is the key it sent.
  EXPECT_EQ(terminal.claims_received(), 2);
  EXPECT_EQ(terminal.key_headers_received(), std::vector<std::string>(2, '"' + key.hex() + '"'));
}

TEST(HttpDownstream, LookupOfUnknownKeyIsNotFound) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto result = downstream.lookup(key);
  EXPECT_TRUE(result.not_found()) << result.reason();
  EXPECT_EQ(terminal.lookups_received(), 1);
}

TEST(HttpDownstream, LookupAgainstUnreachableTerminalIsTransient) {
  RefusingPort refusing;
  HttpDownstream<SlotApi> downstream{"http://127.0.0.1:" + std::to_string(refusing.port()), fast()};
  const auto result = downstream.lookup(key);
  ASSERT_TRUE(result.transient());
  EXPECT_TRUE(contains(result.reason(), "could not connect")) << result.reason();
}

// --- kept-alive connections ----------------------------------------------------------------------

TEST(HttpDownstream, SequentialClaimsShareOneConnection) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  for (int i = 0; i < 20; ++i) {
    const auto event = idemgate::derive_key("ect.claim_slot", "sequential", std::to_string(i));
    ASSERT_TRUE(downstream.claim(msku, event).ok()) << i;
  }
  ASSERT_TRUE(downstream.lookup(key).not_found());
  EXPECT_EQ(terminal.claims_received(), 20);
  EXPECT_EQ(terminal.connections_used(), 1u);
}

TEST(HttpDownstream, WithoutKeepAliveEveryClaimOpensItsOwnConnection) {
  Terminal terminal;
  HttpOptions options = fast();
  options.keep_alive = false;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), options};
  for (int i = 0; i < 5; ++i) {
    const auto event = idemgate::derive_key("ect.claim_slot", "one-off", std::to_string(i));
    ASSERT_TRUE(downstream.claim(msku, event).ok()) << i;
  }
  EXPECT_EQ(terminal.connections_used(), 5u);
}

TEST(HttpDownstream, ConcurrentClaimsFromManyThreadsUseAtMostMaxConnections) {
  Terminal terminal;
  terminal.set_latency(5ms);  // so that the threads' calls overlap
  HttpOptions options = fast();
  options.max_connections = 3;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), options};
  constexpr int threads_count = 8;
  constexpr int claims_each = 5;
  std::mutex mutex;
  std::vector<std::string> failures;
  std::latch go(threads_count);
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_count; ++t)
    threads.emplace_back([&, t] {
      go.arrive_and_wait();
      for (int i = 0; i < claims_each; ++i) {
        const auto event =
            idemgate::derive_key("ect.claim_slot", std::to_string(t), std::to_string(i));
        const auto result = downstream.claim(msku, event);
        std::lock_guard lock(mutex);
        if (!result.ok()) failures.emplace_back(result.reason());
      }
    });
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, the first: " << failures.front();
  EXPECT_EQ(terminal.claims_received(), threads_count * claims_each);
  EXPECT_LE(terminal.connections_used(), 3u);
  EXPECT_GE(terminal.connections_used(), 2u) << "the calls did overlap";
}

TEST(HttpDownstream, ClaimWaitingLongerThanConnectTimeoutForABusyConnectionIsTransient) {
  ect_delta::TerminalServer terminal{{.keep_alive_timeout = 0s}};  // so that stop() is quick
  terminal.start();
  terminal.set_latency(10s);  // cut short by stop() below
  HttpOptions options = fast();
  options.max_connections = 1;
  options.connect_timeout = 100ms;
  options.read_timeout = 15s;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), options};
  std::optional<idemgate::ClaimResult<std::string>> first;
  std::thread worker([&] { first = downstream.claim(msku, key); });
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (terminal.claims_in_progress() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(terminal.claims_in_progress(), 1);

  const auto other = idemgate::derive_key("ect.claim_slot", "waiting", "MSKU7000037");
  const auto second = downstream.claim(msku, other);
  terminal.stop();
  worker.join();
  ASSERT_TRUE(second.transient()) << second.reason();
  EXPECT_TRUE(contains(second.reason(), "all 1 connections")) << second.reason();
  EXPECT_TRUE(contains(second.reason(), "nothing was sent")) << second.reason();
  EXPECT_TRUE(contains(second.reason(), "max_connections")) << second.reason();
  EXPECT_EQ(terminal.claims_received(), 1);
  ASSERT_TRUE(first.has_value() && first->ok()) << first->reason();
}

TEST(HttpDownstream, ConnectionIdleLongerThanIdleTimeoutIsNotReused) {
  Terminal terminal;
  HttpOptions options = fast();
  options.idle_timeout = 300ms;  // under the terminal's own 1 s
  HttpDownstream<SlotApi> downstream{terminal.base_url(), options};
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  EXPECT_EQ(terminal.connections_used(), 1u) << "reused within the idle timeout";
  std::this_thread::sleep_for(450ms);
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  EXPECT_EQ(terminal.connections_used(), 2u) << "closed after the idle timeout, a new one opened";
}

TEST(HttpDownstream, ServerClosingIdleConnectionsFailsNoClaim) {
  // The terminal closes a connection about 10 ms after its last answer.
  ect_delta::TerminalServer terminal{{.keep_alive_timeout = 0s}};
  terminal.start();
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  for (int i = 0; i < 5; ++i) {
    const auto event = idemgate::derive_key("ect.claim_slot", "idle-closed", std::to_string(i));
    const auto result = downstream.claim(msku, event);
    ASSERT_TRUE(result.ok()) << i << ": " << result.reason();
    std::this_thread::sleep_for(60ms);
  }
  EXPECT_EQ(terminal.claims_received(), 5);
  // Each pause is six times the terminal's idle limit, yet on a loaded machine a close may come
  // late: what matters is that closes happened and no claim failed.
  EXPECT_GE(terminal.connections_used(), 2u) << "the terminal closed idle connections";
}

TEST(HttpDownstream, ClaimOnAConnectionClosedAsItIsReusedIsResentOnceUnderTheSameKey) {
  ClosingOnReuse server;
  HttpDownstream<SlotApi> downstream{server.base_url(), fast()};
  const auto first = downstream.claim(msku, key);
  ASSERT_TRUE(first.ok()) << first.reason();
  const auto other = idemgate::derive_key("ect.claim_slot", "reused", "MSKU7000037");
  const auto second = downstream.claim(msku, other);
  ASSERT_TRUE(second.ok()) << second.reason();
  EXPECT_EQ(second.outcome(), "S-2") << "answered on a new connection";
  EXPECT_EQ(server.connections(), 2);
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 3u) << "the second claim was read twice: once unanswered";
  EXPECT_TRUE(contains(requests[1], "Idempotency-Key: \"" + other.hex() + '"')) << requests[1];
  EXPECT_TRUE(contains(requests[2], "Idempotency-Key: \"" + other.hex() + '"')) << requests[2];
}

TEST(HttpDownstream, LookupOnAConnectionClosedAsItIsReusedIsResent) {
  ClosingOnReuse server;
  HttpDownstream<SlotApi> downstream{server.base_url(), fast()};
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  const auto found = downstream.lookup(key);
  ASSERT_TRUE(found.found()) << found.reason();
  EXPECT_EQ(server.requests().size(), 3u);
}

TEST(HttpDownstream, ClaimToAFarSideIgnoringKeysIsNeverResent) {
  ClosingOnReuse server;
  HttpDownstream<SlotApi, false> downstream{server.base_url(), fast()};
  ASSERT_TRUE(downstream.claim(msku, key).ok());
  const auto other = idemgate::derive_key("ect.claim_slot", "not-resent", "MSKU7000037");
  const auto second = downstream.claim(msku, other);
  ASSERT_TRUE(second.transient()) << second.reason();
  EXPECT_TRUE(contains(second.reason(), "may have been processed")) << second.reason();
  EXPECT_EQ(server.requests().size(), 2u) << "resending could have claimed a second slot";
  EXPECT_EQ(server.connections(), 1);
}

TEST(HttpDownstream, SequentialHttpsClaimsShareOneTlsConnection) {
  HttpsSlots server;
  HttpOptions options = fast();
  options.ca_cert_file = server.ca_file();
  HttpDownstream<SlotApi> downstream{server.base_url(), options};
  for (int i = 0; i < 10; ++i) {
    const auto event = idemgate::derive_key("ect.claim_slot", "tls", std::to_string(i));
    const auto result = downstream.claim(msku, event);
    ASSERT_TRUE(result.ok()) << i << ": " << result.reason();
    EXPECT_EQ(result.outcome(), "TLS-" + std::to_string(i + 1));
  }
  EXPECT_EQ(server.connections_used(), 1u);
}

TEST(HttpDownstream, CopiesShareTheirConnections) {
  Terminal terminal;
  const HttpDownstream<SlotApi> original{terminal.base_url(), fast()};
  const HttpDownstream<SlotApi> copy = original;
  ASSERT_TRUE(original.claim(msku, key).ok());
  ASSERT_TRUE(copy.claim(msku, key).ok());
  EXPECT_EQ(terminal.connections_used(), 1u);
}

// --- the example's slot claim codec
// ---------------------------------------------------------------

TEST(EctDeltaSlotCodec, EncodesTheTwoFieldsCanonicallyAndReadsThemBack) {
  const ect_delta::SlotRequest request{"MSKU7000037", "2025-06-09T07:00 \"late\" \xc3\xa9"};
  std::string bytes;
  idemgate::codec<ect_delta::SlotRequest>::encode(request, bytes);
  // The bytes the examples' stores have always held for a request: fixed order, no spaces.
  EXPECT_EQ(bytes, R"({"container":"MSKU7000037","window":"2025-06-09T07:00 \"late\" )"
                   "\xc3\xa9\"}");
  EXPECT_EQ(idemgate::codec<ect_delta::SlotRequest>::decode(bytes), request);
}

TEST(EctDeltaSlotCodec, RefusesWhatCannotBeAContainerOrAWindow) {
  std::string bytes;
  for (const ect_delta::SlotRequest& bad : {ect_delta::SlotRequest{"MSKU\n7000037", "w"},
                                            ect_delta::SlotRequest{"MSKU7000037", "\xff\xfe"}})
    EXPECT_THROW(idemgate::codec<ect_delta::SlotRequest>::encode(bad, bytes), idemgate::CodecError);
  for (const char* stored : {"", R"({"container":"a"})", R"({"container":"a","window":1})",
                             R"({"container":"a","window":"w","window":"v"})"})
    EXPECT_THROW((void)idemgate::codec<ect_delta::SlotRequest>::decode(stored),
                 idemgate::CodecError)
        << stored;
}

// --- base URLs ----------------------------------------------------------------------------------

TEST(HttpDownstream, HttpsBaseUrlIsAccepted) {
  const HttpDownstream<SlotApi> downstream{"https://slots.ectdelta.example/v1/", fast()};
  EXPECT_EQ(downstream.base_url().scheme, "https");
  EXPECT_EQ(downstream.base_url().host, "slots.ectdelta.example");
  EXPECT_EQ(downstream.base_url().port, 443);
  EXPECT_EQ(downstream.base_url().path, "/v1");
  EXPECT_EQ(downstream.base_url().origin(), "https://slots.ectdelta.example:443");
}

TEST(HttpDownstream, HttpsAgainstPlainHttpServerIsTransientTlsFailure) {
  Terminal terminal;
  HttpDownstream<SlotApi> downstream{"https://127.0.0.1:" + std::to_string(terminal.port()),
                                     fast()};
  const auto result = downstream.claim(msku, key);
  ASSERT_TRUE(result.transient()) << result.reason();
  EXPECT_TRUE(contains(result.reason(), "TLS")) << result.reason();
  EXPECT_EQ(terminal.slots_issued(), 0);
}

TEST(HttpDownstream, MalformedBaseUrlThrowsClearError) {
  const std::pair<const char*, const char*> cases[] = {
      {"127.0.0.1:8080", "has no scheme"},
      {"ftp://127.0.0.1", "neither http nor https"},
      {"http://", "has no host"},
      {"http://127.0.0.1:99999", "not a number from 1 to 65535"},
      {"http://127.0.0.1:80a", "not a number from 1 to 65535"},
      {"http://127.0.0.1:", "not a number from 1 to 65535"},
      {"http://user:secret@127.0.0.1", "credentials"},
      {"http://127.0.0.1/slots?x=1", "query"},
      {"http://slot api", "cannot hold"},
  };
  for (const auto& [url, message] : cases) {
    try {
      HttpDownstream<SlotApi> downstream{url};
      ADD_FAILURE() << url << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), message)) << url << ": " << e.what();
      EXPECT_TRUE(contains(e.what(), url)) << e.what();
    }
  }
}

// --- the seed's terminal, which ignores keys -----------------------------------------------------

TEST(HttpDownstream, TerminalIgnoringKeysIssuesNewSlotOnEveryCall) {
  Terminal terminal;
  terminal.set_honours_keys(false);
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const auto first = downstream.claim(msku, key);
  const auto second = downstream.claim(msku, key);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first.outcome(), second.outcome());
  EXPECT_EQ(terminal.distinct_slots_for_key(key.hex()), 2u);
  EXPECT_EQ(terminal.slots_for(msku.container), 2u);
  EXPECT_TRUE(downstream.lookup(key).not_found());
}

// --- the gate in front of HTTP ------------------------------------------------------------------

TEST(GatedHttpDownstream, SixteenThreadsDeliveringSameEventClaimOneSlot) {
  Terminal terminal;
  terminal.set_latency(100ms);
  MemoryStore store;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, downstream, bookings.writer()};

  constexpr int workers = 16;
  std::latch go(workers);
  std::vector<Status> statuses(workers);
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i)
    threads.emplace_back([&, i] {
      go.arrive_and_wait();
      statuses[static_cast<std::size_t>(i)] = gate.process(key, msku).status();
    });
  for (auto& thread : threads) thread.join();

  int processed = 0;
  for (const Status status : statuses) {
    processed += status == Status::processed;
    EXPECT_TRUE(status == Status::processed || status == Status::in_flight ||
                status == Status::duplicate)
        << idemgate::to_string(status);
  }
  EXPECT_EQ(processed, 1);
  EXPECT_EQ(terminal.claims_received(), 1);
  EXPECT_EQ(terminal.slots_issued(), 1);
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(GatedHttpDownstream, MondaysEightySevenDeliveriesFromFourThreadsClaimThirtyNineSlots) {
  Terminal terminal;
  MemoryStore store;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, downstream, bookings.writer()};
  const auto deliveries = idemgate::test::monday_deliveries();
  ASSERT_EQ(deliveries.size(), 87u);

  constexpr std::size_t workers = 4;
  std::atomic<int> not_acked{0};
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      for (std::size_t i = w; i < deliveries.size(); i += workers) {
        const auto& n = deliveries[i];
        const auto event_key =
            idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number);
        const auto result =
            gate.process(event_key, SlotRequest{n.equipment_number, n.preferred_window});
        if (!result.should_ack()) not_acked.fetch_add(1);
      }
    });
  for (auto& thread : threads) thread.join();

  EXPECT_EQ(not_acked.load(), 0);
  EXPECT_EQ(terminal.slots_issued(), 39);
  EXPECT_EQ(terminal.claims_received(), 39);
  EXPECT_EQ(terminal.max_distinct_slots_per_key(), 1u);
  EXPECT_EQ(bookings.size(), 39u);
  for (const auto& n : idemgate::test::monday_notifications())
    EXPECT_EQ(terminal.slots_for(n.equipment_number), 1u) << n.equipment_number;
}

TEST(GatedHttpDownstream, LostAckThenRedeliveryBooksTheOriginalSlotOnce) {
  Terminal terminal;
  terminal.drop_next_responses(1);
  MemoryStore store;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, downstream, bookings.writer(), {.retry_backoff = 0ms}};

  const auto lost = gate.process(key, msku);
  EXPECT_EQ(lost.status(), Status::retry) << lost.reason();
  EXPECT_FALSE(lost.should_ack());
  const auto redelivered = gate.process(key, msku);
  ASSERT_EQ(redelivered.status(), Status::processed) << redelivered.reason();
  EXPECT_EQ(redelivered.outcome(), terminal.slot_for_key(key.hex())->id);
  // The gate never saw the first answer, so the redelivery claims again: under the same key,
  // which is all that keeps the terminal from handing out a second slot.
  EXPECT_EQ(terminal.claims_received(), 2);
  EXPECT_EQ(terminal.key_headers_received(), std::vector<std::string>(2, '"' + key.hex() + '"'));
  EXPECT_EQ(bookings.size(), 1u);
}

TEST(GatedHttpDownstream, TerminalThatIgnoresKeysIsEscalatedAndNeverCalled) {
  Terminal terminal;
  MemoryStore store;
  HttpDownstream<SlotApi, false> downstream{terminal.base_url(), fast()};
  MemoryBookings bookings;
  Gate gate{"ect.claim_slot", store, downstream, bookings.writer()};
  const auto result = gate.process(key, msku);
  EXPECT_EQ(result.status(), Status::escalated);
  EXPECT_TRUE(result.should_ack());
  EXPECT_EQ(terminal.claims_received(), 0);
  EXPECT_EQ(bookings.size(), 0u);
}

// A webhook sender that resends at once on every 503, to a receiver whose gate calls a terminal
// that answers 503 to every claim. Without a back-off every resend takes the event over, and
// the reservation after the third attempt calls nothing: it escalates, and the receiver acks.
// With one, a resend during a hold is told to retry and calls nothing, so the attempts are
// spaced 100, 200 and 400 ms apart. Either way the terminal is called `max_attempts` times, and
// the event waits in the manual queue with an honest count.
TEST(HttpDownstream, ARetryStormMeetsAtMostMaxAttemptsDownstreamCalls) {
  Terminal terminal;
  terminal.fail_next_claims(1000);
  MemoryStore store;
  MemoryBookings bookings;
  HttpDownstream<SlotApi> downstream{terminal.base_url(), fast()};
  const SlotRequest request{"MSKU7000037", "2025-06-09T07:00"};
  using StormGate = decltype(Gate{"ect.claim_slot", store, downstream, bookings.writer()});
  StormGate eager{"ect.claim_slot",
                  store,
                  downstream,
                  bookings.writer(),
                  {.max_attempts = 3, .retry_backoff = 0ms}};
  StormGate spaced{"ect.claim_slot",
                   store,
                   downstream,
                   bookings.writer(),
                   {.max_attempts = 3, .retry_backoff = 100ms, .max_retry_backoff = 1s}};
  StormGate* receiving = &eager;
  httplib::Server receiver;
  receiver.Post("/webhooks", [&](const httplib::Request& req, httplib::Response& res) {
    const auto result = receiving->process(
        idemgate::derive_key("portbase", req.get_header_value("webhook-id")), request);
    res.status = result.should_ack() ? 200 : 503;
    res.set_content(std::string(idemgate::to_string(result.status())), "text/plain");
  });
  const int port = receiver.bind_to_any_port("127.0.0.1");
  std::thread listening([&] { receiver.listen_after_bind(); });
  while (!receiver.is_running()) std::this_thread::sleep_for(1ms);
  httplib::Client sender("127.0.0.1", port);
  // Resends every 10 ms until a 2xx; the answers it got, in order.
  const auto storm = [&](const std::string& id) {
    std::vector<std::string> answers;
    const auto started = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - started < 10s) {
      const auto answer = sender.Post("/webhooks", {{"webhook-id", id}}, "{}", "application/json");
      answers.push_back(answer ? std::to_string(answer->status) + " " + answer->body : "no answer");
      if (answer && answer->status == 200) break;
      std::this_thread::sleep_for(10ms);
    }
    return answers;
  };
  const auto escalated_with_an_honest_count = [&](const std::string& id) {
    const auto row = eager.store().find(idemgate::derive_key("portbase", id));
    ASSERT_TRUE(row.has_value());
    EXPECT_EQ(row->status, idemgate::RecordStatus::escalated);
    EXPECT_EQ(row->reason.rfind("gave up after 3 attempts (GateOptions::max_attempts = 3); the "
                                "last one said: POST ",
                                0),
              0u)
        << row->reason;
    EXPECT_NE(row->reason.find("answered 503"), std::string::npos) << row->reason;
  };

  const std::vector<std::string> at_the_door = storm("msg_storm_1");
  EXPECT_EQ(at_the_door,
            (std::vector<std::string>{"503 retry", "503 retry", "503 retry", "200 escalated"}));
  EXPECT_EQ(terminal.claims_received(), 3);
  escalated_with_an_honest_count("msg_storm_1");

  receiving = &spaced;
  const auto started = std::chrono::steady_clock::now();
  const std::vector<std::string> held = storm("msg_storm_2");
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(held.empty());
  EXPECT_EQ(held.back(), "200 escalated");
  EXPECT_EQ(std::count(held.begin(), held.end(), "503 retry") + 1,
            static_cast<std::ptrdiff_t>(held.size()))
      << "every resend before the escalation was told to retry, none acked";
  EXPECT_GT(held.size(), 10u) << "the sender resent at once";
  EXPECT_EQ(terminal.claims_received(), 6) << "three more: the holds turned the rest away";
  EXPECT_GE(took, 700ms) << "attempts 2, 3 and the escalation waited 100, 200 and 400 ms";
  escalated_with_an_honest_count("msg_storm_2");
  EXPECT_EQ(storm("msg_storm_2"), (std::vector<std::string>{"200 escalated"}));
  EXPECT_EQ(terminal.claims_received(), 6);

  receiver.stop();
  listening.join();
  EXPECT_EQ(spaced.escalated(10).size(), 2u);
  EXPECT_EQ(bookings.size(), 0u);
}

/// Claims at "/slots/<container>?window=<window>": a path that holds the event's own values,
/// named by its route.
struct SlotPathApi {
  using request_type = SlotRequest;
  using outcome_type = std::string;
  bool routed = true;
  idemgate::HttpCall claim_call(const SlotRequest& r) const {
    idemgate::HttpCall call{"POST", "/slots/" + r.container + "?window=" + r.window, "{}"};
    if (routed) call.route = "/slots/{container}";
    return call;
  }
  std::optional<std::string> parse_outcome(std::string_view body) const {
    return slot_field(body, "slot");
  }
};

TEST(HttpDownstream, FailuresOfOneKindShareACauseAndKeepTheirDetails) {
  // The far side refuses unannounced containers with one problem type and a detail of their
  // own, nested members and a brace inside a string included; a reefer with another type.
  httplib::Server far_side;
  far_side.Post(R"(/slots/([A-Z0-9]+))", [](const httplib::Request& req, httplib::Response& res) {
    const std::string container = req.matches[1];
    const bool reefer = container.rfind("RFRU", 0) == 0;
    res.status = 422;
    res.set_content(
        std::string(R"({"status": 422, "errors": [{"at": "}{", "n": [1, {"type": "inner"}]}],)") +
            R"( "type": "https://terminal.example/problems/)" +
            (reefer ? "reefer-not-plugged" : "container-not-announced") +
            R"(", "title": "Refused", "detail": "container )" + container + " at " +
            req.get_param_value("window") + R"( was refused"})",
        "application/problem+json");
  });
  const int port = far_side.bind_to_any_port("127.0.0.1");
  std::jthread listening([&] { far_side.listen_after_bind(); });
  const std::unique_ptr<httplib::Server, void (*)(httplib::Server*)> stopping(
      &far_side, [](httplib::Server* server) { server->stop(); });
  while (!far_side.is_running()) std::this_thread::sleep_for(1ms);
  const std::string base = "http://127.0.0.1:" + std::to_string(port);

  MemoryStore store;
  MemoryBookings bookings;
  HttpOptions whole_bodies = fast();
  whole_bodies.reason_excerpt_bytes = 1024;
  HttpDownstream<SlotPathApi> downstream{base, whole_bodies};
  Gate gate{"ect.claim_slot", store, downstream, bookings.writer()};
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(gate.process(idemgate::derive_key("n", std::to_string(i)),
                           SlotRequest{"BADU000000" + std::to_string(i), "2025-06-09T07:00"})
                  .status(),
              Status::failed);
  for (int i = 5; i < 7; ++i)
    EXPECT_EQ(gate.process(idemgate::derive_key("n", std::to_string(i)),
                           SlotRequest{"RFRU000000" + std::to_string(i), "2025-06-09T08:00"})
                  .status(),
              Status::failed);

  const std::string unannounced = "POST " + base +
                                  "/slots/{container} answered 422 "
                                  "(https://terminal.example/problems/container-not-announced)";
  const auto causes = gate.store().causes(10);
  ASSERT_EQ(causes.size(), 2u) << "one cause per problem type, whatever the containers";
  EXPECT_EQ(causes[0].reason, unannounced);
  EXPECT_EQ(causes[0].rows, 5);
  EXPECT_EQ(causes[1].rows, 2);
  EXPECT_NE(causes[1].reason.find("reefer-not-plugged"), std::string::npos) << causes[1].reason;
  EXPECT_NE(causes[0].id(), causes[1].id());
  EXPECT_EQ(causes[0].id().size(), 12u);

  // The row keeps the details: its own target and the far side's words.
  const auto row = gate.store().find(idemgate::derive_key("n", "3"));
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(idemgate::cause_of(row->reason), unannounced);
  EXPECT_NE(row->reason.find("\nPOST " + base + "/slots/BADU0000003?window=2025-06-09T07:00"),
            std::string::npos)
      << row->reason;
  EXPECT_NE(row->reason.find("container BADU0000003 at 2025-06-09T07:00 was refused"),
            std::string::npos)
      << row->reason;

  // What `causes` printed re-drives the whole group, and only it.
  idemgate::RowQuery by_cause;
  by_cause.reason = unannounced;
  EXPECT_EQ(gate.store().count(by_cause), 5);
  EXPECT_EQ(gate.store().redrive_cause(unannounced, 100), 5u);
  EXPECT_EQ(gate.store().causes(10).size(), 1u);

  // Without a route, the path without its query names the cause, so each container is its own.
  MemoryStore unrouted_store;
  HttpDownstream<SlotPathApi> unrouted{base, fast(), SlotPathApi{.routed = false}};
  Gate unrouted_gate{"ect.claim_slot", unrouted_store, unrouted, bookings.writer()};
  for (int i = 0; i < 2; ++i)
    unrouted_gate.process(idemgate::derive_key("n", std::to_string(i)),
                          SlotRequest{"BADU000000" + std::to_string(i), "2025-06-09T07:00"});
  ASSERT_EQ(unrouted_gate.store().causes(10).size(), 2u);
  EXPECT_EQ(unrouted_gate.store().causes(10)[0].reason.find('?'), std::string::npos)
      << "the query is a detail, never part of the cause";

  // A user's extractor names the cause instead.
  MemoryStore own_store;
  HttpOptions own = fast();
  own.cause = [](const idemgate::HttpCall& call, const httplib::Response& response) {
    return call.method + " slot refused (" + std::to_string(response.status) + ")";
  };
  HttpDownstream<SlotPathApi> extracting{base, own};
  Gate own_gate{"ect.claim_slot", own_store, extracting, bookings.writer()};
  own_gate.process(idemgate::derive_key("n", "1"), SlotRequest{"BADU0000001", "w"});
  own_gate.process(idemgate::derive_key("n", "6"), SlotRequest{"RFRU0000006", "w"});
  ASSERT_EQ(own_gate.store().causes(10).size(), 1u);
  EXPECT_EQ(own_gate.store().causes(10)[0].reason, "POST slot refused (422)");

  EXPECT_EQ(bookings.size(), 0u);
}
