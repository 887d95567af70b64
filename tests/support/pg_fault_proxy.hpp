#pragma once

// A TCP proxy in front of the test's PostgreSQL that knows where the v3 protocol's messages begin
// and end, so a test can break the wire at an exact statement: lose the answer to a statement the
// server ran, cut a connection in the middle of a statement, delay every message, or swallow
// everything for a while.
//
// One thread serves every connection with poll(); the test's thread only arms faults and reads
// what happened, through one mutex.

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace idemgate::test {

/// What an armed fault does to the client message that triggers it.
enum class Fault {
  /// The message goes through and the server runs it; everything the server answers, up to and
  /// including its next ReadyForQuery, is swallowed; then both sides are closed. The statement
  /// happened and the client never learns so.
  lose_reply,
  /// Only the first half of the message goes through, then both sides are closed: the server
  /// never runs the statement.
  cut,
  /// The message goes through and the server runs it; everything the server answers from then
  /// on is swallowed, and the connection stays open: the client waits for an answer that never
  /// comes (a reply lost in a partition that TCP does not notice), until its own timeouts give
  /// up or the proxy goes away. It has fired once the server finished the statement.
  hang_reply,
};

/**
 * A fault-injecting proxy for PostgreSQL on 127.0.0.1, one upstream connection per client
 * connection.
 *
 * A fault is armed for one statement and fires once. A pattern names the statement: it matches a
 * Bind ('B') of the prepared statement of exactly that name, and a simple Query ('Q') or a Parse
 * ('P') whose SQL text contains it (case-sensitive, so `COMMIT` is libpqxx's commit and not the
 * word `committed` in the store's SQL).
 *
 * Example:
 *   PgFaultProxy proxy{pg_uri()};
 *   PostgresStore store{proxy.uri(), {.table = log}};
 *   proxy.arm(Fault::lose_reply, "idemgate_reserve");
 *   auto result = gate.process(key, request);  // the reservation lands; its answer never comes
 *   EXPECT_TRUE(proxy.fired());
 */
class PgFaultProxy {
 public:
  using Clock = std::chrono::steady_clock;

  /// A proxy for the server of `upstream_uri` (`postgresql://user@host:port/db`), listening on an
  /// ephemeral port of 127.0.0.1; its thread runs until destruction.
  explicit PgFaultProxy(const std::string& upstream_uri) {
    const UriParts parts = split_uri(upstream_uri);
    upstream_ = resolve(parts.host, parts.port, upstream_length_);
    listen_ = listen_on_loopback(port_);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) fail("pipe2");
    wake_read_ = Fd(pipe_fds[0]);
    wake_write_ = Fd(pipe_fds[1]);
    // No TLS or GSS negotiation: the proxy reads the protocol in the clear. It also answers an
    // SSLRequest with 'N' itself, for clients that ask anyway.
    uri_ = parts.prefix + "127.0.0.1:" + std::to_string(port_) + parts.rest +
           (parts.rest.find('?') == std::string::npos ? "?" : "&") +
           "sslmode=disable&gssencmode=disable";
    thread_ = std::thread([this] { run(); });
  }

  PgFaultProxy(const PgFaultProxy&) = delete;
  PgFaultProxy& operator=(const PgFaultProxy&) = delete;

  /// Stops the thread and closes every connection, client and server side.
  ~PgFaultProxy() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake();
    thread_.join();
  }

  /// The upstream URI pointed at the proxy, with TLS and GSS encryption turned off.
  [[nodiscard]] const std::string& uri() const noexcept { return uri_; }

  /// The proxy's port on 127.0.0.1.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  /// Arms `fault` for the first client message matching `pattern` after `skip` matching ones.
  /// Several faults may be armed at once; a message triggers at most one of them, looked at in
  /// the order they were armed.
  void arm(Fault fault, std::string pattern, int skip = 0) {
    std::lock_guard lock(mutex_);
    faults_.push_back({fault, std::move(pattern), skip, false, false});
  }

  /// Cancels every armed fault that has not been triggered yet (it then counts as fired).
  void disarm() {
    std::lock_guard lock(mutex_);
    for (Armed& armed : faults_)
      if (!armed.triggered) armed.triggered = armed.fired = true;
    fired_changed_.notify_all();
  }

  /// Whether every armed fault has fired: its connection is closed and the client did not read
  /// the answer (lose_reply) or the server did not get the whole statement (cut), or the server
  /// ran the statement whose answer hangs (hang_reply).
  [[nodiscard]] bool fired() const {
    std::lock_guard lock(mutex_);
    return all_fired();
  }

  /// How many armed faults have fired.
  [[nodiscard]] std::size_t fired_count() const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(
        std::count_if(faults_.begin(), faults_.end(), [](const Armed& f) { return f.fired; }));
  }

  /// Waits until every armed fault has fired; false after `timeout`.
  bool wait_fired(std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mutex_);
    return fired_changed_.wait_for(lock, timeout, [&] { return all_fired(); });
  }

  /// Holds every message, both ways, for `each` before passing it on (order is kept); zero ends
  /// the delay for messages that arrive from now on.
  void delay(std::chrono::milliseconds each) {
    {
      std::lock_guard lock(mutex_);
      delay_ = each;
    }
    wake();
  }

  /// For `length` from now, reads every byte and forwards none, like a network that went dark.
  /// When it ends, the connections that lost bytes are closed (their streams are torn); the
  /// others carry on.
  void blackhole(std::chrono::milliseconds length) {
    {
      std::lock_guard lock(mutex_);
      dark_until_ = Clock::now() + length;
    }
    wake();
  }

  /// Ends a blackhole now.
  void heal() {
    {
      std::lock_guard lock(mutex_);
      dark_until_ = Clock::time_point::min();
    }
    wake();
  }

  /// Client connections accepted so far.
  [[nodiscard]] std::size_t connections() const noexcept { return connections_.load(); }

  /// Messages that were held by a delay.
  [[nodiscard]] std::size_t delayed_messages() const noexcept { return delayed_.load(); }

  /// Bytes swallowed: the server's answers a lose_reply fault hid, and what a blackhole ate.
  [[nodiscard]] std::size_t swallowed_bytes() const noexcept { return swallowed_.load(); }

 private:
  /// A file descriptor that closes itself.
  class Fd {
   public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    Fd& operator=(Fd&& other) noexcept {
      if (this != &other) {
        reset();
        fd_ = std::exchange(other.fd_, -1);
      }
      return *this;
    }
    ~Fd() { reset(); }
    [[nodiscard]] int get() const noexcept { return fd_; }
    void reset() {
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
    }

   private:
    int fd_ = -1;
  };

  struct Armed {
    Fault fault;
    std::string pattern;
    int skip;
    bool triggered;
    bool fired;
  };

  static constexpr std::size_t no_fault = std::numeric_limits<std::size_t>::max();

  /// One direction of one connection: bytes that are not a whole message yet, whole messages
  /// waiting for their time, and bytes ready to send.
  struct Stream {
    std::string partial;
    std::deque<std::pair<Clock::time_point, std::string>> held;
    std::string out;
    bool closed = false;  // the sender closed during a blackhole: stop polling it
  };

  /// A client connection and its own upstream connection.
  struct Session {
    Fd client;
    Fd server;
    Stream up;                // client to server
    Stream down;              // server to client
    bool startup = true;      // the client's next message is an untyped startup packet
    bool swallowing = false;  // a lose_reply fault: drop answers up to and including 'Z'
    bool hanging = false;     // a hang_reply fault: drop every answer, keep the connection
    bool cutting = false;     // a cut fault: close once the half message is sent
    bool tainted = false;     // lost bytes in a blackhole: close when it ends
    bool done = false;
    std::size_t fault = no_fault;
  };

  struct UriParts {
    std::string prefix;  // scheme and user: "postgresql://user@"
    std::string host;
    std::string port;
    std::string rest;  // database and parameters: "/db?x=y"
  };

  static UriParts split_uri(const std::string& uri) {
    const auto scheme = uri.find("://");
    if (scheme == std::string::npos)
      throw std::invalid_argument("PgFaultProxy: \"" + uri +
                                  "\" is not a URI; pass postgresql://user@host:port/db");
    const auto begin = scheme + 3;
    const auto end = std::min(uri.find_first_of("/?", begin), uri.size());
    const std::string authority = uri.substr(begin, end - begin);
    const auto at = authority.rfind('@');
    const std::string host_port = at == std::string::npos ? authority : authority.substr(at + 1);
    UriParts parts;
    parts.prefix = uri.substr(0, at == std::string::npos ? begin : begin + at + 1);
    const auto colon = host_port.rfind(':');
    parts.host = host_port.substr(0, colon);
    parts.port = colon == std::string::npos ? "5432" : host_port.substr(colon + 1);
    parts.rest = uri.substr(end);
    if (parts.host.empty())
      throw std::invalid_argument("PgFaultProxy: \"" + uri +
                                  "\" names no TCP host; the proxy needs host:port");
    return parts;
  }

  static sockaddr_storage resolve(const std::string& host, const std::string& port,
                                  socklen_t& length) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr)
      throw std::runtime_error("PgFaultProxy: cannot resolve " + host + ":" + port);
    sockaddr_storage address{};
    std::memcpy(&address, found->ai_addr, found->ai_addrlen);
    length = found->ai_addrlen;
    ::freeaddrinfo(found);
    return address;
  }

  static Fd listen_on_loopback(std::uint16_t& port) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) fail("socket");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) fail("bind");
    if (::listen(fd.get(), 64) != 0) fail("listen");
    socklen_t length = sizeof address;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
      fail("getsockname");
    port = ntohs(address.sin_port);
    return fd;
  }

  [[noreturn]] static void fail(const char* call) {
    throw std::runtime_error(std::string("PgFaultProxy: ") + call +
                             " failed: " + std::strerror(errno));
  }

  static std::uint32_t read_u32(std::string_view bytes, std::size_t at) {
    std::uint32_t value = 0;
    for (std::size_t i = 0; i < 4; ++i)
      value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
    return value;
  }

  /// The NUL-terminated string at `at`, and moves `at` past it.
  static std::string_view read_cstring(std::string_view bytes, std::size_t& at) {
    const auto end = bytes.find('\0', at);
    if (end == std::string_view::npos) {
      at = bytes.size();
      return {};
    }
    const std::string_view text = bytes.substr(at, end - at);
    at = end + 1;
    return text;
  }

  static bool matches(std::string_view message, const std::string& pattern) {
    std::size_t at = 5;  // type byte and length
    switch (message[0]) {
      case 'Q':
        return read_cstring(message, at).find(pattern) != std::string_view::npos;
      case 'P':
        (void)read_cstring(message, at);  // statement name
        return read_cstring(message, at).find(pattern) != std::string_view::npos;
      case 'B':
        (void)read_cstring(message, at);  // portal name
        return read_cstring(message, at) == pattern;
      default:
        return false;
    }
  }

  bool all_fired() const {
    return !faults_.empty() &&
           std::all_of(faults_.begin(), faults_.end(), [](const Armed& f) { return f.fired; });
  }

  void wake() {
    const char byte = 1;
    // A full pipe already holds a wake-up: nothing to do on EAGAIN.
    [[maybe_unused]] const auto ignored = ::write(wake_write_.get(), &byte, 1);
  }

  // --- the proxy's thread: nothing below runs on the test's thread ---------------------------

  void run() {
    std::vector<pollfd> polls;
    std::vector<std::pair<Session*, bool>> owners;  // the session and side of each poll entry
    for (;;) {
      Clock::time_point dark_until;
      {
        std::lock_guard lock(mutex_);
        if (stopping_) break;
        dark_until = dark_until_;
      }
      const auto now = Clock::now();
      const bool dark = now < dark_until;
      for (Session& s : sessions_) {
        if (!dark && s.tainted) s.done = true;
        if (dark || s.done) continue;
        release(s.up, now);
        release(s.down, now);
        flush(s);
        if (s.cutting && s.up.held.empty() && s.up.out.empty()) s.done = true;
      }
      reap();

      polls.clear();
      owners.clear();
      polls.push_back({listen_.get(), POLLIN, 0});
      polls.push_back({wake_read_.get(), POLLIN, 0});
      owners.emplace_back(nullptr, false);
      owners.emplace_back(nullptr, false);
      Clock::time_point deadline = dark ? dark_until : Clock::time_point::max();
      for (Session& s : sessions_) {
        add_poll(polls, owners, s, true, !dark && !s.down.out.empty());
        add_poll(polls, owners, s, false, !dark && !s.up.out.empty());
        if (dark) continue;
        if (!s.up.held.empty()) deadline = std::min(deadline, s.up.held.front().first);
        if (!s.down.held.empty()) deadline = std::min(deadline, s.down.held.front().first);
      }
      int timeout = -1;
      if (deadline != Clock::time_point::max())
        timeout = static_cast<int>(std::max<std::int64_t>(
            0, std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count()));
      if (::poll(polls.data(), polls.size(), timeout) < 0 && errno != EINTR) fail("poll");

      if (polls[1].revents != 0) drain_wake_pipe();
      if (polls[0].revents != 0) accept_all();
      for (std::size_t i = 2; i < polls.size(); ++i) {
        auto [session, client_side] = owners[i];
        if (session->done || (polls[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        read_from(*session, client_side);
      }
    }
    sessions_.clear();
  }

  static void add_poll(std::vector<pollfd>& polls, std::vector<std::pair<Session*, bool>>& owners,
                       Session& s, bool client_side, bool want_write) {
    const Stream& incoming = client_side ? s.up : s.down;
    short events = incoming.closed ? 0 : POLLIN;
    if (want_write) events |= POLLOUT;
    // A socket whose peer closed in a blackhole would report POLLHUP forever: leave it out.
    const int fd = events == 0 ? -1 : (client_side ? s.client.get() : s.server.get());
    polls.push_back({fd, events, 0});
    owners.emplace_back(&s, client_side);
  }

  void drain_wake_pipe() {
    char bytes[64];
    while (::read(wake_read_.get(), bytes, sizeof bytes) > 0) {
    }
  }

  void accept_all() {
    for (;;) {
      Fd client(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (client.get() < 0) return;
      ++connections_;
      Fd server(::socket(upstream_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      // Loopback: a blocking connect is immediate, or refused at once.
      if (server.get() < 0 ||
          ::connect(server.get(), reinterpret_cast<sockaddr*>(&upstream_), upstream_length_) != 0)
        continue;  // the client sees its connection closed
      ::fcntl(server.get(), F_SETFL, ::fcntl(server.get(), F_GETFL) | O_NONBLOCK);
      const int on = 1;
      ::setsockopt(client.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      ::setsockopt(server.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      Session& s = sessions_.emplace_back();
      s.client = std::move(client);
      s.server = std::move(server);
    }
  }

  void read_from(Session& s, bool client_side) {
    char bytes[64 * 1024];
    const int fd = client_side ? s.client.get() : s.server.get();
    ssize_t n = ::recv(fd, bytes, sizeof bytes, 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      n = 0;  // reset by the peer: the same as a close
    }
    Stream& stream = client_side ? s.up : s.down;
    bool dark;
    {
      // Read now, not once per turn of the loop: bytes read after blackhole() returned are lost.
      std::lock_guard lock(mutex_);
      dark = Clock::now() < dark_until_;
    }
    if (dark) {
      swallowed_ += static_cast<std::size_t>(n);
      s.tainted = true;
      if (n == 0) stream.closed = true;
      return;
    }
    if (n == 0) {
      close_after_flushing(s);
      return;
    }
    stream.partial.append(bytes, static_cast<std::size_t>(n));
    if (client_side)
      split_client_messages(s);
    else
      split_server_messages(s);
  }

  // One side closed: pass on what is already on its way to the other side, then close both.
  void close_after_flushing(Session& s) {
    release(s.up, Clock::time_point::max());
    release(s.down, Clock::time_point::max());
    flush(s);
    s.done = true;
  }

  void split_client_messages(Session& s) {
    std::string_view bytes = s.up.partial;
    std::size_t used = 0;
    while (!s.done) {
      const std::string_view rest = bytes.substr(used);
      std::size_t length;
      if (s.startup) {  // untyped: int32 length (itself included), then the payload
        if (rest.size() < 4) break;
        length = read_u32(rest, 0);
        if (length < 8 || length > (1u << 20)) {
          s.done = true;  // not PostgreSQL
          break;
        }
      } else {  // type byte, int32 length (itself included), payload
        if (rest.size() < 5) break;
        length = 1 + static_cast<std::size_t>(read_u32(rest, 1));
        if (length < 5) {
          s.done = true;
          break;
        }
      }
      if (rest.size() < length) break;
      on_client_message(s, std::string(rest.substr(0, length)));
      used += length;
    }
    s.up.partial.erase(0, used);
  }

  void split_server_messages(Session& s) {
    std::string_view bytes = s.down.partial;
    std::size_t used = 0;
    while (!s.done) {
      const std::string_view rest = bytes.substr(used);
      if (rest.size() < 5) break;
      const std::size_t length = 1 + static_cast<std::size_t>(read_u32(rest, 1));
      if (length < 5) {
        s.done = true;
        break;
      }
      if (rest.size() < length) break;
      on_server_message(s, std::string(rest.substr(0, length)));
      used += length;
    }
    s.down.partial.erase(0, used);
  }

  void on_client_message(Session& s, std::string message) {
    if (s.cutting) return;  // nothing after a cut reaches the server
    if (s.startup) {
      constexpr std::uint32_t ssl_request = 80877103, gss_request = 80877104;
      const std::uint32_t code = read_u32(message, 4);
      if (message.size() == 8 && (code == ssl_request || code == gss_request)) {
        hold(s.down, "N");  // no encryption here; the client goes on in the clear
        return;
      }
      s.startup = false;
      hold(s.up, std::move(message));
      return;
    }
    const auto [index, fault] = trigger(message);
    if (index == no_fault) {
      hold(s.up, std::move(message));
      return;
    }
    s.fault = index;
    if (fault == Fault::lose_reply || fault == Fault::hang_reply) {
      s.swallowing = true;
      s.hanging = fault == Fault::hang_reply;
      hold(s.up, std::move(message));
    } else {
      s.cutting = true;
      message.resize(message.size() / 2);
      hold(s.up, std::move(message));
    }
  }

  void on_server_message(Session& s, std::string message) {
    if (!s.swallowing) {
      hold(s.down, std::move(message));
      return;
    }
    swallowed_ += message.size();
    if (message[0] != 'Z') return;  // the statement is over on the server
    if (!s.hanging) {
      s.done = true;
      return;
    }
    if (s.fault != no_fault) {
      std::lock_guard lock(mutex_);
      faults_[std::exchange(s.fault, no_fault)].fired = true;
      fired_changed_.notify_all();
    }
  }

  // The fault this message triggers, if any.
  std::pair<std::size_t, Fault> trigger(std::string_view message) {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < faults_.size(); ++i) {
      Armed& armed = faults_[i];
      if (armed.triggered || !matches(message, armed.pattern)) continue;
      if (armed.skip > 0) {
        --armed.skip;
        continue;
      }
      armed.triggered = true;
      return {i, armed.fault};
    }
    return {no_fault, Fault::cut};
  }

  void hold(Stream& stream, std::string bytes) {
    std::chrono::milliseconds delay;
    {
      std::lock_guard lock(mutex_);
      delay = delay_;
    }
    auto due = Clock::now() + delay;
    if (delay.count() > 0) ++delayed_;
    if (!stream.held.empty()) due = std::max(due, stream.held.back().first);
    stream.held.emplace_back(due, std::move(bytes));
  }

  static void release(Stream& stream, Clock::time_point now) {
    while (!stream.held.empty() && stream.held.front().first <= now) {
      stream.out += stream.held.front().second;
      stream.held.pop_front();
    }
  }

  static void flush(Session& s) {
    if (!send_some(s.server.get(), s.up.out) || !send_some(s.client.get(), s.down.out))
      s.done = true;
  }

  // Sends what the socket takes now; false when the peer is gone.
  static bool send_some(int fd, std::string& out) {
    while (!out.empty()) {
      const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
    return true;
  }

  // Closes finished sessions; a fault they carried has fired.
  void reap() {
    bool fired_one = false;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      if (it->fault != no_fault) {
        std::lock_guard lock(mutex_);
        faults_[it->fault].fired = true;
        fired_one = true;
      }
      it = sessions_.erase(it);  // closes both sockets
    }
    if (fired_one) fired_changed_.notify_all();
  }

  std::string uri_;
  std::uint16_t port_ = 0;
  sockaddr_storage upstream_{};
  socklen_t upstream_length_ = 0;
  Fd listen_;
  Fd wake_read_;
  Fd wake_write_;

  mutable std::mutex mutex_;
  mutable std::condition_variable fired_changed_;
  std::vector<Armed> faults_;
  std::chrono::milliseconds delay_{0};
  Clock::time_point dark_until_ = Clock::time_point::min();
  bool stopping_ = false;

  std::atomic<std::size_t> connections_{0};
  std::atomic<std::size_t> delayed_{0};
  std::atomic<std::size_t> swallowed_{0};

  // Owned by the proxy's thread.
  std::list<Session> sessions_;

  std::thread thread_;
};

}  // namespace idemgate::test
