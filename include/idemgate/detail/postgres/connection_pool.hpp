// SPDX-License-Identifier: MIT
// The PostgreSQL connection pool under PostgresStore, and connection-string redaction.
#pragma once

#include "../../errors.hpp"
#include "pqxx_compat.hpp"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
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

/// A fixed-size pool of PostgreSQL connections; thread-safe checkout, broken ones replaced.
///
/// The first connection opens at construction, so a bad URI fails there. Each other connection
/// is opened on first need and reopened after it broke; `prepared(n)` tells the owner whether it
/// has prepared its statement number `n` on the connection since it opened.
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

  /// A pool of `size` connections to `uri`; `session_sql` (e.g. `SET synchronous_commit = off`)
  /// runs once on every connection it opens.
  ConnectionPool(std::string uri, std::size_t size, std::chrono::milliseconds checkout_timeout,
                 std::string session_sql = {})
      : uri_(std::move(uri)),
        session_sql_(std::move(session_sql)),
        checkout_timeout_(checkout_timeout),
        slots_(size == 0 ? 1 : size) {
    for (std::size_t i = 0; i < slots_.size(); ++i) free_.push_back(i);
    slots_[0].connection = open();
  }

  /// Checks a connection out, waiting for one to be free; reopens it if it was broken.
  Lease acquire() {
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
      slot.connection.reset();
      slot.broken = false;
      slot.prepared = 0;
      slot.connection = open();
    }
    return lease;
  }

  /// Number of connections in the pool.
  [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }

  /// The URI with its password hidden, for messages.
  [[nodiscard]] std::string redacted_uri() const { return redact_uri(uri_); }

  /// Closes every idle connection so that the next checkout opens a fresh one.
  void reset_idle() {
    std::lock_guard lock(mutex_);
    for (std::size_t index : free_) slots_[index].broken = true;
  }

 private:
  struct Slot {
    std::unique_ptr<pqxx::connection> connection;
    bool broken = false;
    std::uint64_t prepared = 0;  // one bit per statement the owner prepared on it
  };

  std::unique_ptr<pqxx::connection> open() {
    std::unique_ptr<pqxx::connection> connection;
    try {
      connection = std::make_unique<pqxx::connection>(uri_);
    } catch (const std::exception& e) {
      throw StoreError("idemgate: cannot connect to PostgreSQL at " + redacted_uri() + ": " +
                       trim(e.what()) +
                       ". Check the URI (postgresql://user@host:port/dbname) and "
                       "that the server is up.");
    }
    if (!session_sql_.empty()) {
      pqxx::nontransaction tx(*connection);
      pq::exec(tx, session_sql_);
    }
    return connection;
  }

  static std::string trim(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }

  void give_back(std::size_t index) {
    {
      std::lock_guard lock(mutex_);
      free_.push_back(index);
    }
    available_.notify_one();
  }

  std::string uri_;
  std::string session_sql_;
  std::chrono::milliseconds checkout_timeout_;
  std::vector<Slot> slots_;
  std::vector<std::size_t> free_;
  std::mutex mutex_;
  std::condition_variable available_;
};

}  // namespace idemgate::detail
