// SPDX-License-Identifier: MIT
// The PostgreSQL connection pool under PostgresStore, and connection-string redaction.
#pragma once

#include "../../errors.hpp"
#include "../durations.hpp"
#include "pqxx_compat.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace idemgate::detail {

/// Hides every password in a libpq connection string, for messages and logs.
///
/// In a URI (`scheme://…`): the password of the user info (`postgresql://user:secret@host`,
/// even when it holds a raw `@`, `/`, `:` or `?`), and the value of every `password` or
/// `sslpassword` query parameter, whose name may be percent-encoded. In a keyword/value string:
/// the value of every `password` or `sslpassword` keyword, plain, single-quoted or with
/// backslash escapes, with or without spaces around `=`. Whatever follows text that libpq could
/// not parse is hidden too, since it may be the rest of a password.
inline std::string redact_uri(std::string uri) {
  const std::string hidden = "***";
  const auto is_secret_name = [](const std::string& name) {
    return name == "password" || name == "sslpassword";
  };
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };

  const std::size_t scheme = uri.find("://");
  const bool is_uri =
      scheme != std::string::npos && scheme > 0 && uri.find_first_of(" \t\n\r='") > scheme;
  if (is_uri) {
    const std::size_t authority = scheme + 3;
    // The user info ends at the last `@` before the query: a password may hold a raw `@`, and a
    // raw `?` or `/` in a password comes before the first `@`. A colon followed by digits and
    // then `/`, `?`, `,` or the end is a port, not a password (`postgresql://db:5432/x?a=b@c`).
    const std::size_t first_at = uri.find('@', authority);
    const std::size_t colon = uri.find(':', authority);
    if (first_at != std::string::npos && colon < first_at) {
      std::size_t digits_end = colon + 1;
      while (digits_end < uri.size() && uri[digits_end] >= '0' && uri[digits_end] <= '9')
        ++digits_end;
      const bool is_port =
          digits_end > colon + 1 && (digits_end == uri.size() || uri[digits_end] == '/' ||
                                     uri[digits_end] == '?' || uri[digits_end] == ',');
      if (!is_port) {
        const std::size_t query = uri.find('?', first_at);
        const std::size_t at =
            query == std::string::npos ? uri.rfind('@') : uri.rfind('@', query - 1);
        uri.replace(colon + 1, at - colon - 1, hidden);
      }
    }
    const std::size_t host = uri.find('@', authority);
    const std::size_t query = uri.find('?', host == std::string::npos ? authority : host);
    if (query == std::string::npos) return uri;
    const auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    for (std::size_t begin = query + 1; begin <= uri.size();) {
      std::size_t end = uri.find('&', begin);
      if (end == std::string::npos) end = uri.size();
      const std::size_t equals = uri.find('=', begin);
      if (equals < end) {
        std::string name;
        for (std::size_t i = begin; i < equals; ++i) {
          if (uri[i] == '%' && i + 2 < equals && hex(uri[i + 1]) >= 0 && hex(uri[i + 2]) >= 0) {
            name += static_cast<char>(hex(uri[i + 1]) * 16 + hex(uri[i + 2]));
            i += 2;
          } else if (!is_space(uri[i])) {
            name += uri[i];
          }
        }
        if (is_secret_name(name)) {
          uri.replace(equals + 1, end - equals - 1, hidden);
          end = equals + 1 + hidden.size();
        }
      }
      begin = end + 1;
    }
    return uri;
  }

  // Keyword/value: `keyword = value` pairs separated by spaces; a value is single-quoted (with
  // `\'` and `\\` escapes) or runs to the next space (with backslash escapes), as libpq reads it.
  if (uri.find('=') == std::string::npos) return uri;
  std::size_t i = 0;
  const auto skip_spaces = [&] {
    while (i < uri.size() && is_space(uri[i])) ++i;
  };
  for (;;) {
    skip_spaces();
    if (i >= uri.size()) return uri;
    const std::size_t name_begin = i;
    while (i < uri.size() && uri[i] != '=' && !is_space(uri[i])) ++i;
    const std::string name = uri.substr(name_begin, i - name_begin);
    skip_spaces();
    if (i >= uri.size() || uri[i] != '=') {
      uri.replace(name_begin, std::string::npos, hidden);
      return uri;
    }
    ++i;
    skip_spaces();
    const std::size_t value_begin = i;
    if (i < uri.size() && uri[i] == '\'') {
      for (++i; i < uri.size() && uri[i] != '\''; ++i)
        if (uri[i] == '\\' && i + 1 < uri.size()) ++i;
      if (i >= uri.size()) {
        // An unterminated quote: libpq refuses the string; hide all of it from here.
        uri.replace(value_begin, std::string::npos, hidden);
        return uri;
      }
      ++i;
    } else {
      for (; i < uri.size() && !is_space(uri[i]); ++i)
        if (uri[i] == '\\' && i + 1 < uri.size()) ++i;
    }
    if (is_secret_name(name)) {
      uri.replace(value_begin, i - value_begin, hidden);
      i = value_begin + hidden.size();
    }
  }
}

/// Thrown when no connection to PostgreSQL could be opened (the server is down, unreachable, or
/// refuses the login): a `StoreError`, so callers that do not tell it apart see no change.
class ConnectionUnavailable : public StoreError {
 public:
  using StoreError::StoreError;
};

/// How the pool's connections guard against dead peers: the libpq and server settings it adds
/// to every connection unless the connection string sets them itself, and the pool's own reply
/// watchdog. A zero duration or count leaves that setting to libpq or the server.
struct ConnectionSettings {
  /// libpq `connect_timeout`: how long opening one connection may take, per host.
  std::chrono::seconds connect_timeout{5};
  /// libpq `keepalives_idle`: idle time before the first TCP keepalive probe.
  std::chrono::seconds keepalives_idle{10};
  /// libpq `keepalives_interval`: time between unanswered probes.
  std::chrono::seconds keepalives_interval{3};
  /// libpq `keepalives_count`: unanswered probes before the connection is dropped.
  int keepalives_count = 3;
  /// libpq `tcp_user_timeout`: how long sent data may stay unacknowledged.
  std::chrono::milliseconds tcp_user_timeout{15000};
  /// Server `statement_timeout`, set on every connection the pool opens.
  std::chrono::milliseconds statement_timeout{15000};
  /// How long a checked-out connection may wait for the first byte of an answer (see
  /// `PostgresOptions::reply_timeout`).
  std::chrono::milliseconds reply_timeout{20000};
  /// More SQL run once on every connection the pool opens (e.g. `SET synchronous_commit = off`).
  std::string session_sql;
  /// Where the pool reports what it does on its own (lazy connects, dead connections); may be
  /// empty.
  std::function<void(std::string_view)> log;
};

/// A connection string with the guards of `settings` that it does not set itself, in libpq's
/// keyword/value form (which every libpq accepts, whatever form `uri` had), and the SQL each new
/// connection runs. A user's own value always wins: a keyword present in `uri`, and a
/// `statement_timeout` in its `options` or in the `PGOPTIONS` environment variable.
struct GuardedConnectionString {
  /// What the pool connects with.
  std::string conninfo;
  /// What each new connection runs first (may be empty).
  std::string session_sql;
};

/// Builds the connection string the pool connects with; throws `StoreError` when libpq cannot
/// parse `uri` (the message hides its passwords).
inline GuardedConnectionString guarded_connection_string(const std::string& uri,
                                                         const ConnectionSettings& settings) {
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(uri.c_str(), &error);
  if (parsed == nullptr) {
    std::string why = error != nullptr ? error : "out of memory";
    if (error != nullptr) PQfreemem(error);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    throw StoreError("idemgate: cannot read the PostgreSQL connection string " + redact_uri(uri) +
                     ": " + why +
                     ". Use a URI (postgresql://user@host:port/dbname) or key=value pairs.");
  }
  const auto quoted = [](const char* value) {
    std::string out = "'";
    for (const char* c = value; *c != '\0'; ++c) {
      if (*c == '\'' || *c == '\\') out += '\\';
      out += *c;
    }
    return out + "'";
  };
  GuardedConnectionString out;
  std::vector<std::string> present;
  std::string options;
  for (const PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    present.emplace_back(o->keyword);
    if (std::string_view(o->keyword) == "options") options = o->val;
    out.conninfo += std::string(o->keyword) + "=" + quoted(o->val) + " ";
  }
  PQconninfoFree(parsed);
  const auto add = [&](const std::string& keyword, long long value) {
    if (value <= 0) return;
    for (const std::string& p : present)
      if (p == keyword) return;
    out.conninfo += keyword + "=" + std::to_string(value) + " ";
  };
  if (settings.keepalives_idle.count() > 0 || settings.keepalives_interval.count() > 0 ||
      settings.keepalives_count > 0 || settings.tcp_user_timeout.count() > 0)
    add("keepalives", 1);
  add("connect_timeout", settings.connect_timeout.count());
  add("keepalives_idle", settings.keepalives_idle.count());
  add("keepalives_interval", settings.keepalives_interval.count());
  add("keepalives_count", settings.keepalives_count);
  add("tcp_user_timeout", saturating_millis(settings.tcp_user_timeout));
  if (!out.conninfo.empty()) out.conninfo.pop_back();
  const char* env_options = std::getenv("PGOPTIONS");
  const bool user_timeout =
      options.find("statement_timeout") != std::string::npos ||
      (env_options != nullptr &&
       std::string_view(env_options).find("statement_timeout") != std::string_view::npos);
  if (!user_timeout && settings.statement_timeout.count() > 0)
    out.session_sql =
        "SET statement_timeout = " + std::to_string(saturating_millis(settings.statement_timeout)) +
        ";";
  if (!settings.session_sql.empty()) out.session_sql += settings.session_sql;
  return out;
}

/// A fixed-size pool of PostgreSQL connections; thread-safe checkout, broken ones replaced.
///
/// Nothing connects at construction unless asked (`try_connect_first`): a connection string
/// libpq cannot parse throws there, an unreachable server does not — each connection is opened
/// on first need and reopened after it broke, so a pool made during an outage starts working
/// when the server comes back. `prepared(n)` tells the owner whether it has prepared its
/// statement number `n` on the connection since it opened.
///
/// A watchdog thread shuts down the socket of a checked-out connection that sent a statement and
/// heard nothing back for `ConnectionSettings::reply_timeout`: the waiting call then fails with
/// `pqxx::broken_connection` instead of waiting for an answer that will never come.
class ConnectionPool {
 public:
  /// How many prepared statements a connection's bookkeeping holds.
  static constexpr std::size_t max_prepared = 64;

  /// A connection checked out of the pool; returned when destroyed.
  class Lease {
   public:
    Lease(ConnectionPool& pool, std::size_t index) : pool_(&pool), index_(index) {}
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)), index_(other.index_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->give_back(index_);
    }
    /// The connection.
    pqxx::connection& connection() { return *pool_->slots_[index_].connection; }
    /// Marks the connection broken: it is closed and reopened on its next checkout.
    void mark_broken() { pool_->slots_[index_].broken = true; }
    /// Whether the owner has prepared its statement number `statement` (below
    /// `max_prepared`) on this connection since it opened.
    [[nodiscard]] bool prepared(std::size_t statement) const {
      return (pool_->slots_[index_].prepared >> statement & 1U) != 0;
    }
    /// Records that the owner has prepared its statement number `statement` on this connection.
    void set_prepared(std::size_t statement) {
      pool_->slots_[index_].prepared |= std::uint64_t{1} << statement;
    }

   private:
    ConnectionPool* pool_;
    std::size_t index_;
  };

  /// A pool of `size` connections to `uri`, guarded as `settings` say. With
  /// `try_connect_first`, the first connection is tried at once; when the server cannot be
  /// reached the pool logs so and connects later, on first need.
  ConnectionPool(std::string uri, std::size_t size, std::chrono::milliseconds checkout_timeout,
                 ConnectionSettings settings = {}, bool try_connect_first = true)
      : uri_(std::move(uri)),
        guarded_(guarded_connection_string(uri_, settings)),
        settings_(std::move(settings)),
        checkout_timeout_(checkout_timeout),
        slots_(size == 0 ? 1 : size) {
    for (std::size_t i = 0; i < slots_.size(); ++i) free_.push_back(i);
    if (try_connect_first) {
      try {
        std::unique_ptr<pqxx::connection> first = open();
        const int watch = watch_fd(*first);
        std::lock_guard lock(mutex_);
        slots_[0].connection = std::move(first);
        slots_[0].watch = watch;
      } catch (const ConnectionUnavailable& e) {
        note(std::string(e.what()) +
             " Starting anyway: each call connects on first need, and calls fail with "
             "StoreError until the server is back.");
      }
    }
    if (settings_.reply_timeout.count() > 0) {
      owner_pid_ = ::getpid();
      watchdog_ = std::make_unique<std::thread>([this] { watch_replies(); });
    }
  }

  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  ~ConnectionPool() {
    if (watchdog_ != nullptr) {
      if (owner_pid_ != ::getpid()) {
        (void)watchdog_.release();  // a forked child: the thread is its parent's, not ours
      } else {
        {
          std::lock_guard lock(mutex_);
          stopping_ = true;
        }
        stop_.notify_all();
        watchdog_->join();
      }
    }
    for (Slot& slot : slots_)
      if (slot.watch >= 0) ::close(slot.watch);
  }

  /// Checks a connection out, waiting for one to be free; reopens it if it was broken. Throws
  /// `ConnectionUnavailable` when it must open one and cannot. A `watched` connection is cut by
  /// the reply watchdog when a statement goes unanswered; pass false for work whose pauses the
  /// pool cannot judge (a caller's own use of the connection).
  Lease acquire(bool watched = true) {
    std::size_t index = 0;
    {
      std::unique_lock lock(mutex_);
      if (!available_.wait_for(lock, checkout_timeout_, [&] { return !free_.empty(); }))
        throw StoreError(
            "idemgate: no PostgreSQL connection was free within the checkout timeout; raise "
            "PostgresOptions::pool_size or lower the number of worker threads");
      index = free_.back();
      free_.pop_back();
    }
    Lease lease(*this, index);
    Slot& slot = slots_[index];
    if (slot.broken || slot.connection == nullptr || !slot.connection->is_open()) {
      forget(slot);
      slot.connection.reset();
      slot.broken = false;
      slot.prepared = 0;
      std::unique_ptr<pqxx::connection> fresh = open();
      const int watch = watch_fd(*fresh);
      slot.connection = std::move(fresh);
      std::lock_guard lock(mutex_);
      slot.watch = watch;
    }
    {
      std::lock_guard lock(mutex_);
      slot.out = watched;
    }
    return lease;
  }

  /// Number of connections in the pool.
  [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }

  /// The URI with its password hidden, for messages.
  [[nodiscard]] std::string redacted_uri() const { return redact_uri(uri_); }

  /// The connection string the pool connects with: the URI and the guards it does not set
  /// itself (see `guarded_connection_string`). Holds the password: never log it.
  [[nodiscard]] const std::string& conninfo() const noexcept { return guarded_.conninfo; }

  /// Closes every idle connection so that the next checkout opens a fresh one.
  void reset_idle() {
    std::lock_guard lock(mutex_);
    for (std::size_t index : free_) slots_[index].broken = true;
  }

  /// Connections whose socket the watchdog shut down because no answer came.
  [[nodiscard]] std::size_t silent_connections_cut() const noexcept { return cut_.load(); }

 private:
  struct Slot {
    std::unique_ptr<pqxx::connection> connection;
    std::atomic<bool> broken = false;  // set by the lease's holder or by the watchdog
    std::uint64_t prepared = 0;        // one bit per statement the owner prepared on it
    int watch = -1;                    // the pool's own descriptor of the socket (under mutex_)
    bool out = false;                  // checked out and watched (under mutex_)
  };

  // Reports through the settings' log, if any.
  void note(const std::string& message) const noexcept {
    if (!settings_.log) return;
    try {
      settings_.log(message);
    } catch (...) {
    }
  }

  std::unique_ptr<pqxx::connection> open() {
    std::unique_ptr<pqxx::connection> connection;
    try {
      connection = std::make_unique<pqxx::connection>(guarded_.conninfo);
    } catch (const std::exception& e) {
      throw ConnectionUnavailable("idemgate: cannot connect to PostgreSQL at " + redacted_uri() +
                                  ": " + trim(e.what()) +
                                  ". Check the URI (postgresql://user@host:port/dbname) and "
                                  "that the server is up.");
    }
    if (!guarded_.session_sql.empty()) {
      try {
        pqxx::nontransaction tx(*connection);
        pq::exec(tx, guarded_.session_sql);
      } catch (const pqxx::broken_connection& e) {
        throw ConnectionUnavailable("idemgate: lost the new connection to PostgreSQL at " +
                                    redacted_uri() + ": " + trim(e.what()) +
                                    ". The server went away; calls fail until it is back.");
      }
    }
    return connection;
  }

  // A descriptor of the connection's socket that the pool owns: the watchdog may shut the
  // socket down through it even if libpq closed its own descriptor meanwhile (whose number could
  // then already name another file).
  static int watch_fd(const pqxx::connection& connection) {
    const int fd = connection.sock();
    return fd < 0 ? -1 : ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  }

  // Stops watching a slot's socket and lets it close (called by the slot's holder).
  void forget(Slot& slot) {
    int watch = -1;
    {
      std::lock_guard lock(mutex_);
      watch = std::exchange(slot.watch, -1);
    }
    if (watch >= 0) ::close(watch);
  }

  static std::string trim(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }

  void give_back(std::size_t index) {
    Slot& slot = slots_[index];
    // A connection libpq found dead closes at once: the pool's own descriptor would keep the
    // socket open until the slot is reused.
    if (slot.broken || slot.connection == nullptr || !slot.connection->is_open()) {
      forget(slot);
      slot.broken = true;
    }
    {
      std::lock_guard lock(mutex_);
      slot.out = false;
      free_.push_back(index);
    }
    available_.notify_one();
  }

  // The watchdog: every quarter of the reply timeout (at most every second), looks at each
  // checked-out connection's TCP state; one that sent data after the last data it received, and
  // that long ago, is waiting for an answer that does not come — its socket is shut down.
  void watch_replies() {
    const auto limit = static_cast<std::uint32_t>(
        std::min<std::int64_t>(saturating_millis(settings_.reply_timeout), 0xFFFFFFFFLL));
    const auto period = std::clamp(settings_.reply_timeout / 4, std::chrono::milliseconds(50),
                                   std::chrono::milliseconds(1000));
    std::vector<std::uint32_t> silent;
    std::unique_lock lock(mutex_);
    while (!stop_.wait_for(lock, period, [&] { return stopping_; })) {
      for (Slot& slot : slots_) {
        if (!slot.out || slot.watch < 0) continue;
        tcp_info info{};
        socklen_t length = sizeof info;
        if (::getsockopt(slot.watch, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) continue;
        // The kernel keeps both times in clock ticks (1 to 10 ms): a statement sent right after
        // the previous answer arrived shows the same age for both. Equal counts as waiting;
        // an answer that came within the tick of its statement, followed by a holder idle for
        // the whole reply timeout inside one of the owner's calls, is cut too, which is safe
        // (the call fails like on any lost connection and is tried again).
        const bool waiting = info.tcpi_last_data_sent <= info.tcpi_last_data_recv;
        if (!waiting || info.tcpi_last_data_sent < limit) continue;
        ::shutdown(slot.watch, SHUT_RDWR);
        slot.broken = true;
        cut_.fetch_add(1);
        silent.push_back(info.tcpi_last_data_sent);
      }
      if (silent.empty()) continue;
      lock.unlock();  // the log may take its time, or call into the store
      for (const std::uint32_t ms : silent)
        note("idemgate: PostgreSQL at " + redacted_uri() + " sent nothing for " +
             std::to_string(ms) +
             " ms after a statement (PostgresOptions::reply_timeout); the connection is taken for "
             "dead and closed, and the call fails as on any lost connection.");
      silent.clear();
      lock.lock();
    }
  }

  std::string uri_;
  GuardedConnectionString guarded_;
  ConnectionSettings settings_;
  std::chrono::milliseconds checkout_timeout_;
  std::vector<Slot> slots_;
  std::vector<std::size_t> free_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::atomic<std::size_t> cut_{0};
  pid_t owner_pid_ = 0;
  std::unique_ptr<std::thread> watchdog_;
};

}  // namespace idemgate::detail
