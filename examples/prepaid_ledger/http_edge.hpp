#pragma once

/// The ledger's HTTP edge: what stands between the network and cpp-httplib's handlers.
///
/// cpp-httplib 0.11.4, as Debian 12 ships it, is compiled into a shared library, and it reads
/// the whole request head before any hook runs: a header line is buffered until its newline
/// however long it is (`CPPHTTPLIB_HEADER_MAX_LENGTH` is checked only once the line is in
/// memory), any number of headers is kept, and header values are percent-decoded. The
/// `CPPHTTPLIB_*` macros cannot bound any of that: defined before including httplib.h they only
/// reach code in the header, not the parser compiled into the library. The pre-routing handler
/// runs after the head and before the body, but `set_payload_max_length` only limits a body with
/// a `Content-Length`: a chunked body, or a POST without a length, is read to its end before a
/// handler sees it. And every connection holds a worker thread for as long as the client keeps
/// it open, since the read timeout is per read and a request has no deadline.
///
/// So the edge takes each connection from the listener at once and receives its requests itself,
/// on one thread that polls every connection: the head up to `max_header_bytes` and
/// `max_header_count` header lines, then exactly `Content-Length` body bytes, all within
/// `request_timeout`. Only a complete request reaches a worker, which hands those bytes to
/// httplib's own parser and router (`Server::process_request`) and restores the header values
/// exactly as they were sent. What does not fit is refused before its body is read:
///
///   400 bad_request         broken framing: a bare LF or CR, obs-fold, a control byte, a bad
///                           or repeated Content-Length
///   408 request_timeout     the request was not complete within `request_timeout`
///   411 length_required     any `Transfer-Encoding` (chunked), or a POST without Content-Length
///   413 payload_too_large   `Content-Length` above `max_body_bytes`
///   417 expectation_failed  an `Expect` other than `100-continue`
///   431 headers_too_large   more than `max_header_bytes`, or more than `max_header_count` headers
///   503 busy                `max_connections` are open and none can make room (Retry-After: 1)
///
/// A connection serves at most `keep_alive_max_requests` requests and waits at most
/// `keep_alive_timeout` for the next one. When `max_connections` are open, the connection whose
/// current request (or wait) began first is dropped for the new one. Slow or idle clients can
/// fill the connection table for `request_timeout` at most, and never hold a worker; memory is
/// bounded by `max_connections` times (`max_header_bytes` + `max_body_bytes`).

#include <idemgate/detail/durations.hpp>
#include <idemgate/webhook/verification.hpp>

#include <httplib.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace prepaid {

/// Bounds on what a request and a connection may take before a handler runs.
struct EdgeLimits {
  /// Bytes of the request line, the headers and the blank line after them.
  std::size_t max_header_bytes = 16 * 1024;
  /// Header lines in one request.
  std::size_t max_header_count = 64;
  /// Largest body, by its `Content-Length`.
  std::size_t max_body_bytes = 64 * 1024;
  /// How long one request may take to arrive whole, from the connection's accept or, on a
  /// kept-alive connection, from the request's first byte.
  std::chrono::milliseconds request_timeout{5000};
  /// How long a kept-alive connection may wait idle for its next request.
  std::chrono::milliseconds keep_alive_timeout{2000};
  /// Requests served on one connection before it is closed.
  std::size_t keep_alive_max_requests = 32;
  /// Connections open at once, wherever they are (arriving, queued or being answered).
  std::size_t max_connections = 256;
  /// Worker threads running handlers; only complete requests reach them.
  std::size_t threads = 16;
  /// How long writing one response may take.
  std::chrono::milliseconds write_timeout{5000};
};

namespace edge {

/// A request refused at the edge, before any handler ran.
struct Refusal {
  /// The HTTP status.
  int status = 400;
  /// The word in the JSON body's `error`.
  std::string error;
  /// What was wrong and what to send instead, in the body's `message`.
  std::string message;
};

/// A complete request head, with the header values exactly as the sender wrote them.
struct RequestHead {
  /// Bytes of the head, blank line included.
  std::size_t size = 0;
  /// The body's length (0 without `Content-Length`).
  std::size_t content_length = 0;
  /// (name, value) in the order sent; values without surrounding spaces and tabs.
  std::vector<std::pair<std::string, std::string>> headers;
  /// Whether the sender waits for `100 Continue` before its body.
  bool expect_continue = false;
  /// Where the `Expect: 100-continue` line starts and ends (CRLF included) in the head.
  std::size_t expect_begin = 0;
  /// See `expect_begin`.
  std::size_t expect_end = 0;
};

/// The methods whose body cpp-httplib reads even without a `Content-Length` (to the end of the
/// connection), so they must carry one.
[[nodiscard]] inline bool method_reads_body(std::string_view method) noexcept {
  return method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE" ||
         method == "PRI";
}

/// Whether `c` may appear in a method or a header name (RFC 9110 `tchar`).
[[nodiscard]] constexpr bool is_token_char(char c) noexcept {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

/**
 * Reads a request head as it arrives, in bounded memory: each call looks only at the bytes that
 * arrived since the previous one, and the head is refused as soon as it breaks a bound.
 *
 * Example:
 *   HeadReader reader;
 *   if (reader.scan(buffer, limits) == HeadReader::State::complete) use(reader.head());
 */
class HeadReader {
 public:
  /// Where the head stands.
  enum class State { incomplete, complete, refused };

  /// Looks at what has arrived; `buffer` must only have grown since the previous call.
  State scan(std::string_view buffer, const EdgeLimits& limits) {
    if (state_ != State::incomplete) return state_;
    for (; scanned_ < buffer.size(); ++scanned_) {
      const char c = buffer[scanned_];
      const bool after_cr = scanned_ > 0 && buffer[scanned_ - 1] == '\r';
      if (c == '\0') return refuse(400, "bad_request", "the request head holds a NUL byte");
      if (c != '\n') {
        if (after_cr)
          return refuse(400, "bad_request",
                        "the request head holds a CR that is not followed by LF; end every line "
                        "with CRLF");
        continue;
      }
      if (!after_cr)
        return refuse(400, "bad_request",
                      "a line of the request head ends in a bare LF; end every line with CRLF");
      const std::size_t length = scanned_ + 1 - line_begin_;
      line_begin_ = scanned_ + 1;
      if (length == 2) {
        if (lines_ == 0) return refuse(400, "bad_request", "the request starts with an empty line");
        ++scanned_;
        return parse(buffer.substr(0, scanned_), limits);
      }
      // The request line, then the header lines.
      if (++lines_ > limits.max_header_count + 1)
        return refuse(431, "headers_too_large",
                      "more than " + std::to_string(limits.max_header_count) +
                          " header lines; send only the headers the endpoint needs");
    }
    if (buffer.size() >= limits.max_header_bytes)
      return refuse(431, "headers_too_large",
                    "the request line and headers exceed " +
                        std::to_string(limits.max_header_bytes) +
                        " bytes without ending in a blank line");
    return State::incomplete;
  }

  /// The head; only after `scan` answered `complete`.
  [[nodiscard]] const RequestHead& head() const noexcept { return head_; }
  /// Why the request was refused; only after `scan` answered `refused`.
  [[nodiscard]] const Refusal& refusal() const noexcept { return refusal_; }

 private:
  State refuse(int status, std::string error, std::string message) {
    refusal_ = Refusal{status, std::move(error), std::move(message)};
    state_ = State::refused;
    return state_;
  }

  State parse(std::string_view head, const EdgeLimits& limits) {
    head_ = RequestHead{};
    head_.size = head.size();
    std::size_t pos = head.find("\r\n");
    const std::string_view request_line = head.substr(0, pos);
    const std::string_view method = request_line.substr(0, request_line.find(' '));
    if (method.empty() || method.size() == request_line.size() ||
        !std::all_of(method.begin(), method.end(), is_token_char))
      return refuse(400, "bad_request", "the request line is not \"METHOD target HTTP/1.1\"");
    bool has_length = false;
    for (pos += 2; pos + 2 < head.size();) {
      const std::size_t end = head.find("\r\n", pos);
      const std::string_view line = head.substr(pos, end - pos);
      if (line.front() == ' ' || line.front() == '\t')
        return refuse(400, "bad_request",
                      "a header line starts with whitespace (obs-fold); send each header on one "
                      "line");
      const std::size_t colon = line.find(':');
      const std::string_view name = line.substr(0, colon);
      if (colon == std::string_view::npos || name.empty() ||
          !std::all_of(name.begin(), name.end(), is_token_char))
        return refuse(400, "bad_request",
                      "a header line is not \"Name: value\" (a name without spaces before the "
                      "colon)");
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
        value.remove_prefix(1);
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t'))
        value.remove_suffix(1);
      for (const char c : value)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
          return refuse(400, "bad_request",
                        "the value of header " + std::string(name) + " holds a control character");
      using idemgate::detail::header_name_equal;
      if (header_name_equal(name, "Transfer-Encoding"))
        return refuse(411, "length_required",
                      "Transfer-Encoding is not accepted; send the body in one piece with a "
                      "Content-Length");
      if (header_name_equal(name, "Content-Length")) {
        if (has_length)
          return refuse(400, "bad_request", "the request has more than one Content-Length");
        if (value.empty() ||
            !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
          return refuse(400, "bad_request", "Content-Length is not a whole number of bytes");
        const std::string_view digits =
            value.substr(std::min(value.find_first_not_of('0'), value.size()));
        std::size_t length = 0;
        for (const char c : digits) {
          if (length > limits.max_body_bytes) break;
          length = length * 10 + static_cast<std::size_t>(c - '0');
        }
        if (digits.size() > 19 || length > limits.max_body_bytes)
          return refuse(
              413, "payload_too_large",
              "the body is larger than " + std::to_string(limits.max_body_bytes) + " bytes");
        has_length = true;
        head_.content_length = length;
      }
      if (header_name_equal(name, "Expect")) {
        if (!header_name_equal(value, "100-continue"))
          return refuse(417, "expectation_failed", "the only Expect accepted is 100-continue");
        // Answered here, so cpp-httplib must not see it and answer again.
        head_.expect_continue = true;
        head_.expect_begin = pos;
        head_.expect_end = end + 2;
      } else {
        head_.headers.emplace_back(name, value);
      }
      pos = end + 2;
    }
    if (!has_length && method_reads_body(method))
      return refuse(411, "length_required",
                    "a " + std::string(method) +
                        " request needs a Content-Length (and no Transfer-Encoding)");
    state_ = State::complete;
    return state_;
  }

  State state_ = State::incomplete;
  std::size_t scanned_ = 0;
  std::size_t line_begin_ = 0;
  std::size_t lines_ = 0;
  RequestHead head_;
  Refusal refusal_;
};

/// The HTTP response for a refusal: JSON, and the connection closes after it.
[[nodiscard]] inline std::string refusal_response(const Refusal& refusal) {
  const char* reason = "Bad Request";
  switch (refusal.status) {
    case 408:
      reason = "Request Timeout";
      break;
    case 411:
      reason = "Length Required";
      break;
    case 413:
      reason = "Payload Too Large";
      break;
    case 417:
      reason = "Expectation Failed";
      break;
    case 431:
      reason = "Request Header Fields Too Large";
      break;
    case 503:
      reason = "Service Unavailable";
      break;
    default:
      break;
  }
  // The messages are fixed text of this file: nothing the client sent is echoed.
  const std::string body =
      "{\"error\":\"" + refusal.error + "\",\"message\":\"" + refusal.message + "\"}";
  return "HTTP/1.1 " + std::to_string(refusal.status) + " " + reason +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         (refusal.status == 503 ? "\r\nRetry-After: 1" : "") + "\r\nConnection: close\r\n\r\n" +
         body;
}

/// One client connection: owned by the reception while a request arrives, by one worker while
/// it is answered.
struct Connection {
  using Clock = std::chrono::steady_clock;

  explicit Connection(int socket) : fd(socket) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() { ::close(fd); }

  /// Bytes of the current request: head and body.
  [[nodiscard]] std::size_t request_size() const noexcept {
    return head ? head->size + head->content_length : 0;
  }

  /// The socket (non-blocking).
  int fd;
  /// What arrived and was not yet handed on; at most one request plus what came with it.
  std::string buffer;
  /// How much of `buffer` the worker's parser has read.
  std::size_t consumed = 0;
  /// The current request's head as it arrives.
  HeadReader reader;
  /// The current request's head, once complete.
  std::optional<RequestHead> head;
  /// When the reception gives up on the current step.
  Clock::time_point deadline;
  /// When the current request (or the wait for it) began: the earliest is dropped first.
  Clock::time_point since;
  /// Kept alive and waiting for the next request, which has not begun.
  bool idle = false;
  /// Refused: what the client still sends is discarded until the connection closes.
  bool lingering = false;
  /// Bytes discarded while lingering.
  std::size_t discarded = 0;
  /// Requests answered on this connection.
  std::size_t served = 0;
};

/// Sends what fits without waiting; the rest is dropped (the connection closes after it).
inline void send_now(int fd, std::string_view bytes) noexcept {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;
    }
  }
}

/// The address of one end of a socket, as text and port.
inline void socket_address(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  auto* generic = reinterpret_cast<sockaddr*>(&address);
  if ((peer ? ::getpeername(fd, generic, &size) : ::getsockname(fd, generic, &size)) != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

/// What cpp-httplib's parser reads from and its response goes to: the received request, then the
/// socket, with a deadline for the whole response.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Connection& connection, Connection::Clock::time_point write_deadline)
      : connection_(connection), write_deadline_(write_deadline) {}

  bool is_readable() const override { return connection_.consumed < connection_.request_size(); }
  bool is_writable() const override { return wait_writable(); }

  // Only the current request's bytes: the parser can never read into a pipelined next one.
  ssize_t read(char* ptr, size_t size) override {
    const std::size_t n = std::min(size, connection_.request_size() - connection_.consumed);
    std::memcpy(ptr, connection_.buffer.data() + connection_.consumed, n);
    connection_.consumed += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    std::size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(connection_.fd, ptr + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_writable()) {
        continue;
      } else {
        return -1;
      }
    }
    return static_cast<ssize_t>(sent);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    socket_address(connection_.fd, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    socket_address(connection_.fd, false, ip, port);
  }
  socket_t socket() const override { return connection_.fd; }

 private:
  bool wait_writable() const {
    for (;;) {
      const auto left = write_deadline_ - Connection::Clock::now();
      if (left <= Connection::Clock::duration::zero()) return false;
      pollfd ready{connection_.fd, POLLOUT, 0};
      const auto wait = idemgate::detail::saturating_millis(left) + 1;
      const int result = ::poll(&ready, 1, static_cast<int>(std::min<std::int64_t>(wait, 60'000)));
      if (result > 0) return (ready.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
      if (result < 0 && errno != EINTR) return false;
    }
  }

  Connection& connection_;
  Connection::Clock::time_point write_deadline_;
};

/// Runs each accepted socket's job on the listener thread: the job only registers the socket
/// with the reception, so the listener never waits on a client.
class AcceptInline final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

/// `limits`, or `std::invalid_argument` naming the bound that is out of range.
[[nodiscard]] inline EdgeLimits checked(EdgeLimits limits) {
  using idemgate::detail::require_in_range;
  using std::chrono::hours;
  using std::chrono::milliseconds;
  require_in_range("EdgeLimits::max_header_bytes", limits.max_header_bytes, 256, 1 << 20,
                   "A request head of a few KiB is normal.");
  require_in_range("EdgeLimits::max_header_count", limits.max_header_count, 4, 10'000,
                   "A webhook delivery has about ten headers.");
  require_in_range("EdgeLimits::max_body_bytes", limits.max_body_bytes, 1, std::size_t{1} << 30,
                   "Bodies are held in memory; keep the bound near the largest event.");
  require_in_range("EdgeLimits::request_timeout", limits.request_timeout, milliseconds(10),
                   hours(1), "A few seconds suits webhook senders.");
  require_in_range("EdgeLimits::keep_alive_timeout", limits.keep_alive_timeout, milliseconds(10),
                   hours(1), "A few seconds keeps idle connections from filling the table.");
  require_in_range("EdgeLimits::keep_alive_max_requests", limits.keep_alive_max_requests, 1,
                   1'000'000, "Use 1 to close every connection after one request.");
  require_in_range("EdgeLimits::max_connections", limits.max_connections, 1, 60'000,
                   "Stay below the process's limit of open files.");
  require_in_range("EdgeLimits::threads", limits.threads, 1, 1024,
                   "A few threads per core; only complete requests reach them.");
  require_in_range("EdgeLimits::write_timeout", limits.write_timeout, milliseconds(10), hours(1),
                   "A few seconds suits small JSON answers.");
  return limits;
}

}  // namespace edge

/**
 * cpp-httplib's server with the edge in front (see the top of this file): register handlers as
 * on `httplib::Server`, then `bind_to_port`, and call `listen()` instead of
 * `listen_after_bind()`.
 *
 * Example:
 *   prepaid::EdgeServer http{prepaid::EdgeLimits{}};
 *   http.Post("/webhooks", handler);
 *   http.bind_to_port("127.0.0.1", 8080);
 *   http.listen();  // until stop()
 */
class EdgeServer : public httplib::Server {
 public:
  using Clock = edge::Connection::Clock;

  /// A server within `limits`; throws `std::invalid_argument` for a bound out of range.
  explicit EdgeServer(EdgeLimits limits = {}) : limits_(edge::checked(limits)) {
    new_task_queue = [] { return new edge::AcceptInline; };
    // What process_request advertises in `Keep-Alive:`; the reception enforces both.
    set_keep_alive_max_count(limits_.keep_alive_max_requests);
    set_keep_alive_timeout(std::max<time_t>(
        1, idemgate::detail::saturating_cast<std::chrono::seconds>(limits_.keep_alive_timeout)
               .count()));
    // Never reached (the reception refused larger bodies), but true.
    set_payload_max_length(limits_.max_body_bytes);
    if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0)
      throw std::system_error(errno, std::generic_category(),
                              "prepaid: cannot create the HTTP edge's wake-up pipe");
  }
  EdgeServer(const EdgeServer&) = delete;
  EdgeServer& operator=(const EdgeServer&) = delete;
  ~EdgeServer() override {
    stop_edge();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  /// Serves until `stop()`: the reception and the workers run while the listener accepts.
  bool listen() {
    // httplib listens with a backlog of 5 (compiled in): a burst of new connections beyond it
    // has its SYNs dropped and waits a second for the retry. Accepting is instant here, so the
    // queue may be as long as the connection table.
    ::listen(svr_sock_, static_cast<int>(limits_.max_connections));
    start_edge();
    const bool ok = listen_after_bind();
    stop_edge();
    return ok;
  }

  /// The bounds in force.
  [[nodiscard]] const EdgeLimits& limits() const noexcept { return limits_; }

 private:
  using ConnectionPtr = std::unique_ptr<edge::Connection>;

  // Called by httplib's listener for every accepted socket (through AcceptInline).
  bool process_and_close_socket(socket_t sock) override {
    auto connection = std::make_unique<edge::Connection>(sock);
    const int flags = ::fcntl(sock, F_GETFL, 0);
    if (flags < 0 || ::fcntl(sock, F_SETFL, flags | O_NONBLOCK) != 0) return false;
    const int on = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    const auto now = Clock::now();
    connection->since = now;
    connection->deadline = idemgate::detail::saturating_add(now, limits_.request_timeout);
    {
      std::lock_guard lock(mutex_);
      if (!running_ || stopping_) return false;
      incoming_.push_back(std::move(connection));
    }
    wake();
    return true;
  }

  void start_edge() {
    std::lock_guard lock(mutex_);
    if (running_) return;
    running_ = true;
    stopping_ = false;
    reception_ = std::thread([this] { receive(); });
    for (std::size_t i = 0; i < limits_.threads; ++i) workers_.emplace_back([this] { work(); });
  }

  void stop_edge() {
    {
      std::lock_guard lock(mutex_);
      if (!running_) return;
      stopping_ = true;
    }
    wake();
    ready_cv_.notify_all();
    reception_.join();
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
    std::lock_guard lock(mutex_);
    incoming_.clear();
    returned_.clear();
    ready_.clear();
    running_ = false;
  }

  void wake() noexcept {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_[1], &byte, 1);
  }

  // --- the reception: one thread, every connection that is not with a worker -------------------

  void receive() {
    std::vector<ConnectionPtr> connections;
    std::vector<pollfd> polled;
    for (;;) {
      std::vector<ConnectionPtr> arrived;
      std::vector<ConnectionPtr> back;
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        arrived.swap(incoming_);
        back.swap(returned_);
      }
      auto now = Clock::now();
      for (ConnectionPtr& connection : back) {
        prepare_next_request(*connection, now);
        connections.push_back(std::move(connection));
        advance(connections.back(), now);
      }
      std::erase(connections, nullptr);
      for (ConnectionPtr& connection : arrived) admit(connections, std::move(connection));

      polled.assign(1, pollfd{wake_[0], POLLIN, 0});
      auto next = now + std::chrono::seconds(1);
      for (const ConnectionPtr& connection : connections) {
        polled.push_back(pollfd{connection->fd, POLLIN, 0});
        next = std::min(next, connection->deadline);
      }
      const auto wait =
          std::max<std::int64_t>(0, idemgate::detail::saturating_millis(next - now) + 1);
      const int ready = ::poll(polled.data(), polled.size(), static_cast<int>(wait));
      if (ready < 0 && errno != EINTR) {
        // Out of resources for a moment: try again shortly instead of spinning.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      char drain[64];
      while (::read(wake_[0], drain, sizeof drain) > 0) {
      }
      now = Clock::now();
      for (std::size_t i = 0; i < connections.size(); ++i)
        if (ready > 0 && polled[i + 1].revents != 0) readable(connections[i], now);
      for (ConnectionPtr& connection : connections)
        if (connection && now >= connection->deadline) expired(connection, now);
      std::erase(connections, nullptr);
    }
  }

  // A new connection: at the limit, the one whose current business began first makes room.
  void admit(std::vector<ConnectionPtr>& connections, ConnectionPtr connection) {
    if (connections.size() + busy_.load() >= limits_.max_connections) {
      ConnectionPtr* oldest = nullptr;
      for (ConnectionPtr& candidate : connections)
        if (candidate && (oldest == nullptr || candidate->since < (*oldest)->since))
          oldest = &candidate;
      if (oldest == nullptr) {
        edge::send_now(
            connection->fd,
            edge::refusal_response({503, "busy", "every connection is taken; retry in a moment"}));
        return;
      }
      if (!(*oldest)->lingering && !(*oldest)->buffer.empty())
        edge::send_now((*oldest)->fd,
                       edge::refusal_response(
                           {503, "busy", "dropped to make room for another connection; retry"}));
      oldest->reset();
      std::erase(connections, nullptr);
    }
    connections.push_back(std::move(connection));
  }

  void readable(ConnectionPtr& slot, Clock::time_point now) {
    edge::Connection& connection = *slot;
    char chunk[16 * 1024];
    if (connection.lingering) {
      for (;;) {
        const ssize_t n = ::recv(connection.fd, chunk, sizeof chunk, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) break;
        connection.discarded += static_cast<std::size_t>(n);
        if (connection.discarded > linger_bytes) break;
      }
      slot.reset();
      return;
    }
    for (;;) {
      const std::size_t cap =
          connection.head ? connection.request_size() : limits_.max_header_bytes;
      if (connection.buffer.size() >= cap) break;
      const ssize_t n =
          ::recv(connection.fd, chunk, std::min(sizeof chunk, cap - connection.buffer.size()), 0);
      if (n > 0) {
        if (connection.idle) {
          connection.idle = false;
          connection.since = now;
          connection.deadline = idemgate::detail::saturating_add(now, limits_.request_timeout);
        }
        connection.buffer.append(chunk, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // The client closed or the socket failed: nobody is left to answer.
      slot.reset();
      return;
    }
    advance(slot, now);
  }

  // Checks what arrived; a complete request goes to a worker.
  void advance(ConnectionPtr& slot, Clock::time_point now) {
    edge::Connection& connection = *slot;
    if (!connection.head) {
      switch (connection.reader.scan(connection.buffer, limits_)) {
        case edge::HeadReader::State::incomplete:
          return;
        case edge::HeadReader::State::refused:
          refuse(connection, connection.reader.refusal(), now);
          return;
        case edge::HeadReader::State::complete:
          break;
      }
      edge::RequestHead head = connection.reader.head();
      if (head.expect_continue) {
        const std::size_t line = head.expect_end - head.expect_begin;
        connection.buffer.erase(head.expect_begin, line);
        head.size -= line;
        if (connection.buffer.size() < head.size + head.content_length)
          edge::send_now(connection.fd, "HTTP/1.1 100 Continue\r\n\r\n");
      }
      connection.head = std::move(head);
    }
    if (connection.buffer.size() < connection.request_size()) return;
    ++busy_;
    {
      std::lock_guard lock(mutex_);
      ready_.push_back(std::move(slot));
    }
    ready_cv_.notify_one();
  }

  void expired(ConnectionPtr& slot, Clock::time_point now) {
    edge::Connection& connection = *slot;
    if (connection.lingering || connection.buffer.empty()) {
      slot.reset();
      return;
    }
    refuse(connection,
           {408, "request_timeout",
            "the request did not arrive whole within " +
                idemgate::detail::describe(limits_.request_timeout) + "; send it in one go"},
           now);
  }

  // Answers, stops sending, and discards what the client still sends for a moment, so that it
  // reads the answer instead of a reset.
  void refuse(edge::Connection& connection, const edge::Refusal& refusal, Clock::time_point now) {
    edge::send_now(connection.fd, edge::refusal_response(refusal));
    ::shutdown(connection.fd, SHUT_WR);
    connection.lingering = true;
    connection.discarded = 0;
    connection.head.reset();
    std::string().swap(connection.buffer);
    connection.deadline = idemgate::detail::saturating_add(
        now, std::min<std::chrono::milliseconds>(limits_.request_timeout, linger_time));
  }

  void prepare_next_request(edge::Connection& connection, Clock::time_point now) {
    connection.buffer.erase(0, connection.consumed);
    if (connection.buffer.empty()) std::string().swap(connection.buffer);
    connection.consumed = 0;
    connection.head.reset();
    connection.reader = edge::HeadReader{};
    connection.since = now;
    connection.idle = connection.buffer.empty();
    connection.deadline = idemgate::detail::saturating_add(
        now, connection.idle ? limits_.keep_alive_timeout : limits_.request_timeout);
  }

  // --- the workers: complete requests only ------------------------------------------------------

  void work() {
    for (;;) {
      ConnectionPtr connection;
      {
        std::unique_lock lock(mutex_);
        ready_cv_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
        if (stopping_) return;
        connection = std::move(ready_.front());
        ready_.pop_front();
      }
      bool keep = false;
      try {
        keep = answer(*connection);
      } catch (const std::exception&) {
        keep = false;
      }
      if (keep) {
        {
          std::lock_guard lock(mutex_);
          if (!stopping_) returned_.push_back(std::move(connection));
        }
        wake();
      }
      connection.reset();
      --busy_;
    }
  }

  // One request through httplib's parser, router and response writer; whether the connection
  // stays open for another.
  bool answer(edge::Connection& connection) {
    edge::ConnectionStream stream(
        connection, idemgate::detail::saturating_add(Clock::now(), limits_.write_timeout));
    const bool last = connection.served + 1 >= limits_.keep_alive_max_requests;
    bool closed = false;
    const edge::RequestHead& head = *connection.head;
    const bool ok = process_request(stream, last, closed, [&head](httplib::Request& request) {
      restore_raw_headers(request, head.headers);
    });
    ++connection.served;
    // A parser that read more or less than the request framed here (e.g. a GET with a body)
    // would misread the next one: close instead.
    const bool framed = connection.consumed == connection.request_size();
    return ok && !closed && !last && framed;
  }

  // httplib percent-decodes header values ("a%41" arrives as "aA"); handlers get the bytes sent.
  static void restore_raw_headers(httplib::Request& request,
                                  const std::vector<std::pair<std::string, std::string>>& raw) {
    for (const auto& [name, value] : raw) request.headers.erase(name);
    for (const auto& [name, value] : raw) request.headers.emplace(name, value);
    // httplib's own entries, which a client could otherwise have spoofed or removed.
    for (const char* name : {"REMOTE_ADDR", "REMOTE_PORT", "LOCAL_ADDR", "LOCAL_PORT"})
      request.headers.erase(name);
    request.headers.emplace("REMOTE_ADDR", request.remote_addr);
    request.headers.emplace("REMOTE_PORT", std::to_string(request.remote_port));
    request.headers.emplace("LOCAL_ADDR", request.local_addr);
    request.headers.emplace("LOCAL_PORT", std::to_string(request.local_port));
  }

  // After a refusal, at most this much is read and dropped, for at most this long.
  static constexpr std::size_t linger_bytes = 256 * 1024;
  static constexpr std::chrono::milliseconds linger_time{1000};

  EdgeLimits limits_;
  int wake_[2] = {-1, -1};
  std::mutex mutex_;
  std::condition_variable ready_cv_;
  bool running_ = false;
  bool stopping_ = false;
  std::vector<ConnectionPtr> incoming_;
  std::vector<ConnectionPtr> returned_;
  std::deque<ConnectionPtr> ready_;
  std::atomic<std::size_t> busy_{0};
  std::thread reception_;
  std::vector<std::thread> workers_;
};

}  // namespace prepaid
