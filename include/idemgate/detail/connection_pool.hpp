#pragma once

#include "../record.hpp"
#include "pqxx_compat.hpp"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace idemgate::detail {

/// Hides the password of a connection string in messages.
inline std::string redact_uri(std::string uri) {
  const auto scheme = uri.find("://");
  if (scheme != std::string::npos) {
    const auto at = uri.find('@', scheme + 3);
    const auto colon = uri.find(':', scheme + 3);
    if (at != std::string::npos && colon != std::string::npos && colon < at)
      uri.replace(colon + 1, at - colon - 1, "***");
  }
  const auto password = uri.find("password=");
  if (password != std::string::npos) {
    const auto end = uri.find_first_of(" &", password);
    uri.replace(password + 9, end == std::string::npos ? std::string::npos : end - password - 9,
                "***");
  }
  return uri;
}

/// A fixed-size pool of PostgreSQL connections; thread-safe checkout, broken ones replaced.
///
/// The first connection opens at construction, so a bad URI fails there. Each other connection
/// is opened on first need and reopened after it broke; `ready()` tells the
/// owner whether it has prepared its statements on the connection since it opened.
class ConnectionPool {
 public:
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
    /// Whether the owner has set this connection up (prepared its statements) since it opened.
    [[nodiscard]] bool ready() const { return pool_->slots_[index_].ready; }
    /// Records that the owner has set this connection up.
    void set_ready() { pool_->slots_[index_].ready = true; }

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
      slot.ready = false;
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
    bool ready = false;
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
