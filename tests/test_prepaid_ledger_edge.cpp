// The prepaid ledger's HTTP edge under attack, as an attacker without the secret meets it: real
// sockets on 127.0.0.1 against the example's server (on a real SQLite ledger, in this process so
// that its resident memory can be read). Hostile uploads are refused before their body is read,
// with memory bounded; idle and slow clients hold no worker; the request head parser refuses
// each malformed framing.

#include <prepaid_ledger/server.hpp>
#include <prepaid_ledger/sqlite_ledger.hpp>

#include <idemgate/webhook/standard.hpp>

#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using prepaid::edge::HeadReader;

constexpr const char* secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr std::size_t mib = 1024 * 1024;

std::int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// --- the head parser, byte by byte ---------------------------------------------------------------

struct Scanned {
  HeadReader::State state;
  HeadReader reader;
};

// Feeds `text` one byte at a time, as a slow client would, until the reader decides.
Scanned scan_bytewise(std::string_view text, const prepaid::EdgeLimits& limits = {}) {
  Scanned out{HeadReader::State::incomplete, {}};
  for (std::size_t i = 1; i <= text.size(); ++i) {
    out.state = out.reader.scan(text.substr(0, i), limits);
    if (out.state != HeadReader::State::incomplete) break;
  }
  return out;
}

int refused_status(std::string_view text, const prepaid::EdgeLimits& limits = {}) {
  const Scanned scanned = scan_bytewise(text, limits);
  if (scanned.state != HeadReader::State::refused) return 0;
  EXPECT_FALSE(scanned.reader.refusal().message.empty());
  return scanned.reader.refusal().status;
}

TEST(EdgeHeadReader, CompleteHeadKeepsHeaderValuesExactlyAsSent) {
  const std::string head =
      "POST /webhooks HTTP/1.1\r\nHost: x\r\nwebhook-id:  msg%5Fone%41 \r\n"
      "Content-Length: 0042\r\n\r\n";
  const Scanned scanned = scan_bytewise(head + "{\"rest\":\"is the body\"}");
  ASSERT_EQ(scanned.state, HeadReader::State::complete);
  const prepaid::edge::RequestHead& parsed = scanned.reader.head();
  EXPECT_EQ(parsed.size, head.size());
  EXPECT_EQ(parsed.content_length, 42u);
  ASSERT_EQ(parsed.headers.size(), 3u);
  EXPECT_EQ(parsed.headers[1].first, "webhook-id");
  EXPECT_EQ(parsed.headers[1].second, "msg%5Fone%41");
}

TEST(EdgeHeadReader, ChunkedOrLengthlessBodiesAreRefusedWith411) {
  EXPECT_EQ(refused_status("POST /webhooks HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), 411);
  EXPECT_EQ(
      refused_status(
          "POST /webhooks HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
      411);
  EXPECT_EQ(refused_status("POST /webhooks HTTP/1.1\r\nHost: x\r\n\r\n"), 411);
  EXPECT_EQ(refused_status("PUT /webhooks HTTP/1.1\r\n\r\n"), 411);
  // A GET has no body unless it says so.
  EXPECT_EQ(scan_bytewise("GET /stats HTTP/1.1\r\nHost: x\r\n\r\n").state,
            HeadReader::State::complete);
}

TEST(EdgeHeadReader, ContentLengthMustBeOneWholeNumberWithinTheBound) {
  prepaid::EdgeLimits limits;
  limits.max_body_bytes = 1000;
  const auto with_length = [](std::string_view lengths) {
    return "POST /webhooks HTTP/1.1\r\n" + std::string(lengths) + "\r\n";
  };
  EXPECT_EQ(refused_status(with_length("Content-Length: 1001\r\n"), limits), 413);
  EXPECT_EQ(refused_status(with_length("Content-Length: 99999999999999999999999\r\n"), limits),
            413);
  EXPECT_EQ(refused_status(with_length("Content-Length: 1000\r\n"), limits), 0);
  EXPECT_EQ(refused_status(with_length("Content-Length: 00000000000000000000001000\r\n"), limits),
            0);
  EXPECT_EQ(refused_status(with_length("Content-Length: -1\r\n"), limits), 400);
  EXPECT_EQ(refused_status(with_length("Content-Length: 1e3\r\n"), limits), 400);
  EXPECT_EQ(refused_status(with_length("Content-Length:\r\n"), limits), 400);
  EXPECT_EQ(refused_status(with_length("Content-Length: 5\r\nContent-Length: 5\r\n"), limits), 400);
}

TEST(EdgeHeadReader, HeadsBeyondTheirBoundsAreRefusedWith431AsSoonAsTheyCross) {
  prepaid::EdgeLimits limits;
  // The 65th header line is refused while it arrives, long before any blank line.
  std::string many = "POST /webhooks HTTP/1.1\r\n";
  for (int i = 0; i < 65; ++i) many += "X-Filler: v\r\n";
  const Scanned too_many = scan_bytewise(many, limits);
  ASSERT_EQ(too_many.state, HeadReader::State::refused);
  EXPECT_EQ(too_many.reader.refusal().status, 431);
  EXPECT_EQ(too_many.reader.refusal().error, "headers_too_large");
  // A line without an end is refused once the head reaches its byte bound.
  const std::string endless = "POST /webhooks HTTP/1.1\r\nX-Long: " + std::string(20'000, 'a');
  EXPECT_EQ(refused_status(endless, limits), 431);
  // 64 headers within 16 KiB pass.
  std::string enough = "POST /webhooks HTTP/1.1\r\nContent-Length: 0\r\n";
  for (int i = 0; i < 63; ++i) enough += "X-Filler: v\r\n";
  EXPECT_EQ(scan_bytewise(enough + "\r\n", limits).state, HeadReader::State::complete);
}

TEST(EdgeHeadReader, BrokenFramingIsRefusedWith400) {
  const std::string lf_only = "POST /webhooks HTTP/1.1\nContent-Length: 0\n\n";
  EXPECT_EQ(refused_status(lf_only), 400);
  EXPECT_EQ(refused_status("POST /webhooks HTTP/1.1\r\nX-A: 1\rX-B: 2\r\n\r\n"), 400);
  EXPECT_EQ(refused_status("POST /webhooks HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(refused_status("POST /webhooks HTTP/1.1\r\nX-A : 1\r\n\r\n"), 400);
  EXPECT_EQ(refused_status("POST /webhooks HTTP/1.1\r\nno colon\r\n\r\n"), 400);
  EXPECT_EQ(refused_status(std::string("POST /webhooks HTTP/1.1\r\nX-A: a\0b\r\n\r\n", 40)), 400);
  EXPECT_EQ(refused_status("POST /webhooks HTTP/1.1\r\nX-A: a\x01z\r\n\r\n"), 400);
  EXPECT_EQ(refused_status("\r\nPOST /webhooks HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refused_status("POST\r\n\r\n"), 400);
}

TEST(EdgeHeadReader, OnlyExpect100ContinueIsAccepted) {
  const std::string head =
      "POST /webhooks HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  const Scanned scanned = scan_bytewise(head);
  ASSERT_EQ(scanned.state, HeadReader::State::complete);
  EXPECT_TRUE(scanned.reader.head().expect_continue);
  EXPECT_EQ(head.substr(scanned.reader.head().expect_begin,
                        scanned.reader.head().expect_end - scanned.reader.head().expect_begin),
            "Expect: 100-continue\r\n");
  EXPECT_EQ(
      refused_status("POST /webhooks HTTP/1.1\r\nExpect: teapot\r\nContent-Length: 2\r\n\r\n"),
      417);
}

TEST(EdgeLimits, OutOfRangeBoundsAreRefused) {
  prepaid::EdgeLimits limits;
  limits.threads = 0;
  EXPECT_THROW((void)prepaid::edge::checked(limits), std::invalid_argument);
  limits = {};
  limits.request_timeout = 0ms;
  EXPECT_THROW((void)prepaid::edge::checked(limits), std::invalid_argument);
  EXPECT_NO_THROW((void)prepaid::edge::checked(prepaid::EdgeLimits{}));
}

// --- over real sockets --------------------------------------------------------------------------

/// Resident memory of this process, from /proc/self/status.
std::size_t status_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.starts_with(field + ":")) return std::stoul(line.substr(field.size() + 1));
  ADD_FAILURE() << field << " not found in /proc/self/status";
  return 0;
}

/// Resets the peak resident size (VmHWM) to the current one.
void reset_peak_memory() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.close();
  ASSERT_TRUE(clear) << "cannot reset VmHWM through /proc/self/clear_refs";
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

/// What arrives on `fd` until the peer closes or `limit` passes.
std::string read_until_closed(int fd, Clock::duration limit) {
  std::string out;
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) return out;
    pollfd ready{fd, POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(left.count()) + 1) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return out + (n == 0 ? "<closed>" : "<reset>");
    out.append(chunk, static_cast<std::size_t>(n));
  }
}

/// One whole response (head and Content-Length body) from `fd`, or what came before `limit`.
std::string read_response(int fd, Clock::duration limit) {
  std::string out;
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const std::size_t end = out.find("\r\n\r\n");
    if (end != std::string::npos) {
      const std::size_t length_at = out.find("Content-Length: ");
      const std::size_t length =
          length_at < end ? std::stoul(out.substr(length_at + 16)) : std::size_t{0};
      if (out.size() >= end + 4 + length) return out;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) return out;
    pollfd ready{fd, POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(left.count()) + 1) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return out;
    out.append(chunk, static_cast<std::size_t>(n));
  }
}

int status_of(const std::string& response) {
  if (!response.starts_with("HTTP/1.1 ") || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

/// One hostile upload: what the server answered and how many bytes it let the client send.
struct Pushed {
  int status = 0;
  std::size_t bytes_accepted = 0;
  std::string answer;
};

/// Sends `head`, then pieces from `next` up to `total` bytes, as fast as the server takes them,
/// while reading what the server answers; stops when the server cuts the connection, when all
/// is sent, or after `limit`.
Pushed push(int port, const std::string& head, const std::function<std::string_view()>& next,
            std::size_t total, Clock::duration limit = 10s) {
  Pushed out;
  const int fd = connect_to(port);
  if (fd < 0) return out;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  std::string_view pending = head;
  bool readable = true;
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    const std::size_t body_sent =
        out.bytes_accepted > head.size() ? out.bytes_accepted - head.size() : 0;
    const bool more = !pending.empty() || body_sent < total;
    if (!more && !readable) break;
    pollfd ready{fd, static_cast<short>((readable ? POLLIN : 0) | (more ? POLLOUT : 0)), 0};
    if (::poll(&ready, 1, 50) <= 0) continue;
    if ((ready.revents & (POLLIN | POLLHUP | POLLERR)) != 0 && readable) {
      char chunk[4096];
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n > 0) out.answer.append(chunk, static_cast<std::size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN)) readable = false;
    }
    if ((ready.revents & POLLOUT) != 0 && more) {
      if (pending.empty()) pending = next().substr(0, total - body_sent);
      const ssize_t n = ::send(fd, pending.data(), pending.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        out.bytes_accepted += static_cast<std::size_t>(n);
        pending.remove_prefix(static_cast<std::size_t>(n));
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        // Reset by the server: it stopped taking the upload.
        total = body_sent;
        pending = {};
      }
    } else if ((ready.revents & (POLLERR | POLLHUP)) != 0 && !readable) {
      break;
    }
  }
  ::close(fd);
  out.status = status_of(out.answer);
  return out;
}

/// The same bytes over and over: a 64 KiB piece of an endless upload, allocated once.
std::function<std::string_view()> repeat(std::string piece) {
  auto shared = std::make_shared<const std::string>(std::move(piece));
  return [shared]() -> std::string_view { return *shared; };
}

/// What several hostile uploads at once did to the server.
struct Attack {
  std::vector<Pushed> pushed;
  std::size_t peak_growth_kib = 0;
  double seconds = 0;
};

Attack attack(int parallel, int port, const std::string& head,
              const std::function<std::string_view()>& next, std::size_t total) {
  Attack out;
  out.pushed.resize(static_cast<std::size_t>(parallel));
  reset_peak_memory();
  const std::size_t before = status_kib("VmRSS");
  const auto started = Clock::now();
  std::vector<std::thread> clients;
  for (int i = 0; i < parallel; ++i)
    clients.emplace_back(
        [&, i] { out.pushed[static_cast<std::size_t>(i)] = push(port, head, next, total); });
  for (std::thread& client : clients) client.join();
  out.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const std::size_t peak = status_kib("VmHWM");
  out.peak_growth_kib = peak > before ? peak - before : 0;
  return out;
}

/// The example's server on a real SQLite ledger in a scratch directory, on an ephemeral port.
class EdgeTest : public ::testing::Test {
 protected:
  void start(prepaid::ServerOptions options = {}) {
    char pattern[] = "/tmp/prepaid_edge.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    directory_ = pattern;
    const std::string path = directory_ + "/ledger.db";
    store_ = std::make_unique<idemgate::SqliteStore>(path);
    store_->migrate();
    ledger_ = std::make_unique<prepaid::SqliteLedger>(path);
    ledger_->migrate();
    service_ = std::make_unique<prepaid::PrepaidLedger<prepaid::SqliteLedger>>(*store_, *ledger_);
    verifier_ = std::make_unique<idemgate::StandardWebhookVerifier>(secret);
    server_ = std::make_unique<prepaid::Server<prepaid::PrepaidLedger<prepaid::SqliteLedger>>>(
        *service_, *verifier_, std::move(options));
    port_ = server_->bind(0);
    listener_ = std::thread([this] { server_->listen(); });
  }

  void TearDown() override {
    if (server_) {
      server_->stop();
      listener_.join();
    }
    server_.reset();
    service_.reset();
    ledger_.reset();
    store_.reset();
    if (!directory_.empty()) std::filesystem::remove_all(directory_);
  }

  /// A signed delivery over a new connection: the status and how long the answer took.
  std::pair<int, Clock::duration> deliver(const std::string& id, const std::string& body) {
    httplib::Client client("127.0.0.1", port_);
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    const std::int64_t at = now_seconds();
    const auto started = Clock::now();
    const auto res = client.Post("/webhooks",
                                 {{"webhook-id", id},
                                  {"webhook-timestamp", std::to_string(at)},
                                  {"webhook-signature", verifier_->sign(id, at, body)}},
                                 body, "application/json");
    return {res ? res->status : 0, Clock::now() - started};
  }

  int port_ = 0;

 private:
  std::string directory_;
  std::unique_ptr<idemgate::SqliteStore> store_;
  std::unique_ptr<prepaid::SqliteLedger> ledger_;
  std::unique_ptr<prepaid::PrepaidLedger<prepaid::SqliteLedger>> service_;
  std::unique_ptr<idemgate::StandardWebhookVerifier> verifier_;
  std::unique_ptr<prepaid::Server<prepaid::PrepaidLedger<prepaid::SqliteLedger>>> server_;
  std::thread listener_;
};

std::string sent_body(const std::string& message_id) {
  return R"({"type":"message.sent","data":{"account":"acc_1","message_id":")" + message_id +
         R"(","cost_cents":3}})";
}

// Each hostile upload is refused right after its head, at most a few MiB of it ever reach the
// server's socket (against 64 MiB sent), and the server's peak memory grows by far less than
// one upload. Without the edge, cpp-httplib buffers every byte before the signature is checked.
void expect_refused_early(const Attack& attack, int status, const char* what) {
  std::size_t most_accepted = 0;
  for (const Pushed& pushed : attack.pushed) {
    EXPECT_EQ(pushed.status, status) << what << ": " << pushed.answer.substr(0, 200);
    most_accepted = std::max(most_accepted, pushed.bytes_accepted);
  }
  EXPECT_LT(most_accepted, 24 * mib) << what << ": the server kept taking the upload";
  EXPECT_LT(attack.peak_growth_kib, 32u * 1024) << what << ": the server buffered the uploads";
  std::printf(
      "[ edge     ] %s: %zu x %d refused in %.2f s; at most %.1f MiB taken by the "
      "socket; peak resident +%.1f MiB\n",
      what, attack.pushed.size(), status, attack.seconds, static_cast<double>(most_accepted) / mib,
      static_cast<double>(attack.peak_growth_kib) / 1024);
}

std::string chunk_of(std::size_t size, char fill) {
  char line[32];
  std::snprintf(line, sizeof line, "%zx\r\n", size);
  return line + std::string(size, fill) + "\r\n";
}

TEST_F(EdgeTest, EightParallelChunkedUploadsOf64MiBAreRefusedWith411BeforeTheirBody) {
  start();
  const Attack result =
      attack(8, port_, "POST /webhooks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
             repeat(chunk_of(64 * 1024, 'c')), 64 * mib);
  expect_refused_early(result, 411, "chunked 64 MiB");
}

TEST_F(EdgeTest, UploadWithoutLengthIsRefusedWith411BeforeItsBody) {
  start();
  const Attack result = attack(
      8, port_, "POST /webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n",
      repeat(std::string(64 * 1024, 'b')), 64 * mib);
  expect_refused_early(result, 411, "no length, 64 MiB");
}

TEST_F(EdgeTest, UploadWithTooLargeContentLengthIsRefusedWith413BeforeItsBody) {
  start();
  const Attack result =
      attack(8, port_,
             "POST /webhooks HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(64 * mib) +
                 "\r\n\r\n",
             repeat(std::string(64 * 1024, 'b')), 64 * mib);
  expect_refused_early(result, 413, "Content-Length 64 MiB");
}

TEST_F(EdgeTest, HeaderLineWithoutCrlfIsRefusedWith431AtTheHeadBound) {
  start();
  const Attack result = attack(8, port_, "POST /webhooks HTTP/1.1\r\nHost: x\r\nX-Long: ",
                               repeat(std::string(64 * 1024, 'h')), 64 * mib);
  expect_refused_early(result, 431, "one 64 MiB header line");
}

TEST_F(EdgeTest, FiveHundredThousandHeadersAreRefusedWith431AtTheCountBound) {
  start();
  std::string lines;
  while (lines.size() < 64 * 1024) lines += "X-Filler-Header: v\r\n";
  const std::size_t line_size = std::string_view("X-Filler-Header: v\r\n").size();
  const Attack result = attack(8, port_, "POST /webhooks HTTP/1.1\r\nHost: x\r\n", repeat(lines),
                               500'000 * line_size);
  expect_refused_early(result, 431, "500,000 headers");
}

TEST_F(EdgeTest, ExpectContinueGetsOneInterimAnswerAndTheBodyIsThenRead) {
  start();
  const int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  const std::string body = sent_body("m_expect");
  ASSERT_TRUE(send_all(fd,
                       "POST /webhooks HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                       "Content-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n"));
  const std::string interim = read_response(fd, 2s);
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(send_all(fd, body));
  const std::string final_answer = read_response(fd, 2s);
  EXPECT_EQ(status_of(final_answer), 401) << final_answer;
  EXPECT_NE(final_answer.find("missing_header"), std::string::npos) << final_answer;
  ::close(fd);
}

// The worker exhaustion of the issue: 64 fresh idle sockets, 64 kept-alive idle ones and 64
// slow-loris heads trickling in, all open while genuine deliveries arrive on new connections.
TEST_F(EdgeTest, GenuineDeliveryIsAnsweredWithinASecondWhileIdleAndSlowClientsHoldSockets) {
  start();
  std::vector<int> held;
  for (int i = 0; i < 64; ++i) held.push_back(connect_to(port_));
  for (int i = 0; i < 64; ++i) {
    const int fd = connect_to(port_);
    const std::string unsigned_post =
        "POST /webhooks HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    ASSERT_TRUE(send_all(fd, unsigned_post));
    EXPECT_EQ(status_of(read_response(fd, 2s)), 401);
    held.push_back(fd);
  }
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(connect_to(port_));
    ASSERT_TRUE(send_all(slow.back(), "POST /webhooks HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  }
  for (const int fd : held) ASSERT_GE(fd, 0);
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done) {
      for (const int fd : slow) ::send(fd, "z", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(100ms);
    }
  });

  Clock::duration slowest{};
  for (int i = 0; i < 5; ++i) {
    const auto [status, took] =
        deliver("evt_busy_" + std::to_string(i), sent_body("m_busy_" + std::to_string(i)));
    EXPECT_EQ(status, 200);
    slowest = std::max(slowest, took);
  }
  done = true;
  trickle.join();
  std::printf(
      "[ edge     ] with 192 idle or slow sockets open: slowest of 5 genuine deliveries "
      "answered in %.1f ms\n",
      std::chrono::duration<double, std::milli>(slowest).count());
  // A functional bound: before the edge, such a delivery waited for a worker for 12 s and more.
  EXPECT_LT(slowest, 1s);
  for (const int fd : held) ::close(fd);
  for (const int fd : slow) ::close(fd);
}

TEST_F(EdgeTest, SlowLorisRequestIsCutAtItsDeadlineEvenThoughBytesKeepComing) {
  prepaid::ServerOptions options;
  options.edge.request_timeout = 400ms;
  start(options);
  const int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "POST /webhooks HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  const auto started = Clock::now();
  std::string seen;
  // One byte every 50 ms: every single read is quick, but the request never ends.
  while (Clock::now() - started < 3s && seen.empty()) {
    ::send(fd, "z", 1, MSG_NOSIGNAL);
    pollfd ready{fd, POLLIN, 0};
    if (::poll(&ready, 1, 50) > 0) seen = read_response(fd, 1s);
  }
  const auto took = Clock::now() - started;
  EXPECT_EQ(status_of(seen), 408) << seen;
  EXPECT_NE(seen.find("request_timeout"), std::string::npos) << seen;
  EXPECT_LT(took, 3s);
  ::close(fd);

  // A connection that never sends a byte is closed after the same deadline.
  const int idle = connect_to(port_);
  EXPECT_EQ(read_until_closed(idle, 3s), "<closed>");
  ::close(idle);
}

TEST_F(EdgeTest, KeptAliveConnectionServesAtMostItsCountAndIdlesAtMostItsTimeout) {
  prepaid::ServerOptions options;
  options.edge.keep_alive_max_requests = 3;
  options.edge.keep_alive_timeout = 300ms;
  start(options);
  const std::string request = "POST /webhooks HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  const int fd = connect_to(port_);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(send_all(fd, request));
    const std::string answer = read_response(fd, 2s);
    EXPECT_EQ(status_of(answer), 401) << answer;
    EXPECT_EQ(answer.find("Connection: close") != std::string::npos, i == 2) << answer;
  }
  EXPECT_EQ(read_until_closed(fd, 2s), "<closed>");
  ::close(fd);

  // Pipelined: both answered on one connection, which then idles out.
  const int idle = connect_to(port_);
  ASSERT_TRUE(send_all(idle, request + request));
  const auto started = Clock::now();
  const std::string answers = read_until_closed(idle, 3s);
  EXPECT_LT(Clock::now() - started, 3s);
  EXPECT_TRUE(answers.starts_with("HTTP/1.1 401")) << answers;
  EXPECT_NE(answers.find("HTTP/1.1 401", 1), std::string::npos) << answers;
  EXPECT_TRUE(answers.ends_with("<closed>")) << answers;
  ::close(idle);
}

TEST_F(EdgeTest, AtTheConnectionLimitTheOldestIdleConnectionMakesRoom) {
  prepaid::ServerOptions options;
  options.edge.max_connections = 8;
  start(options);
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(connect_to(port_));
    std::this_thread::sleep_for(5ms);
  }
  const auto [status, took] = deliver("evt_room", sent_body("m_room"));
  EXPECT_EQ(status, 200);
  EXPECT_LT(took, 1s);
  // The first one opened was dropped for it.
  EXPECT_EQ(read_until_closed(idle.front(), 2s), "<closed>");
  for (const int fd : idle) ::close(fd);
}

}  // namespace
