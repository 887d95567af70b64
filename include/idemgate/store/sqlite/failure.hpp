// SPDX-License-Identifier: MIT
// SqliteStore's one home for failure: what a failed unit of work was (busy, a COMMIT that could
// not be confirmed, a business write that broke the store's transaction, anything else) and the
// errors that say what to do.
#pragma once

#include "../../detail/sqlite/statement.hpp"
#include "../../errors.hpp"
#include "../../key.hpp"

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate::detail::sqlite {

/// Who holds the store's lock, as a call that waits for it last saw.
struct Holder {
  /// What it was doing (nullptr: nobody).
  const char* doing = nullptr;
  /// Whether it was inside its business write.
  bool business = false;
  /// Since when (steady clock ticks).
  std::int64_t since = 0;
};

/// The errors of one SQLite log file, naming it and saying what to do.
class Failures {
 public:
  /// For the database at `path`, whose calls wait at most `busy_timeout`.
  Failures(const std::string& path, std::chrono::milliseconds busy_timeout)
      : path_(path), busy_timeout_(busy_timeout) {}

  /// Whether a unit of work that failed with `e` may run again before its deadline: SQLite could
  /// not wait for another connection (a WAL recovery in another process), and nothing of the unit
  /// committed. Never once the business write ran: it is never run twice.
  [[nodiscard]] static bool may_run_again(const Error& e, bool business_ran) noexcept {
    return e.busy() && !business_ran;
  }

  /// A COMMIT that failed leaves its outcome unknown to the caller, as with any database: the
  /// error says so (unless SQLite was merely busy: then the unit decides).
  void throw_unconfirmed(const Error& e, const std::string& what) const {
    if (e.busy()) throw;
    throw StoreError(std::string(e.what()) + " The " + what +
                     " could not be confirmed. Do not ack: the rows stay in flight and a "
                     "redelivery after their lease, or the reconciler, finishes them.");
  }

  /// The store was called from inside its own business write.
  [[nodiscard]] std::logic_error reentered(const char* doing) const {
    return std::logic_error(std::string("idemgate: the store was called (") + doing +
                            ") from inside its own business write on " + path_ +
                            "; that call could never get the store. Do not call the store from "
                            "inside the business write: write through its transaction only.");
  }

  /// Another call in this process held the store past the deadline.
  [[nodiscard]] StoreError held_in_process(const char* doing, const Key* key,
                                           const Holder& last) const {
    const auto held = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now().time_since_epoch() -
        std::chrono::steady_clock::duration(last.since));
    const std::string for_how_long =
        " has held the store for " + std::to_string(held.count()) + " ms";
    std::string who;
    if (last.business)
      who = "a business write in this process" + for_how_long + " (" +
            (last.doing != nullptr ? last.doing : "committing") + ")";
    else if (last.doing != nullptr)
      who = "another call in this process (" + std::string(last.doing) + ")" + for_how_long;
    else
      who = "other calls in this process kept the store busy";
    return StoreError(
        "idemgate: " + who + "; " + doing + of(key) + " on " + path_ +
        " gave up at the busy timeout (" + std::to_string(busy_timeout_.count()) +
        " ms); nothing was written. Do not ack: the redelivery will try again. " +
        (last.business
             ? "A business write must not wait on anything slow (a network call, a lock, a "
               "queue): do that before the commit, or raise SqliteOptions::busy_timeout."
             : "Threads share one store's connection one at a time: give busy threads "
               "stores of their own, or raise SqliteOptions::busy_timeout."));
  }

  /// Another connection or process held the write lock past the deadline.
  [[nodiscard]] StoreError locked(const char* doing, const Key* key) const {
    return StoreError(
        "idemgate: another connection or process held the write lock on " + path_ +
        " for the whole busy timeout (" + std::to_string(busy_timeout_.count()) + " ms) while " +
        doing + of(key) +
        "; nothing was written. Do not ack: the redelivery will try again. If it persists, find "
        "the connection that keeps a write transaction open (a business write waiting on "
        "something, a tool with an open transaction), or raise SqliteOptions::busy_timeout.");
  }

  /// The business write broke the store's transaction: `cause` says how.
  [[nodiscard]] BusinessWriteError broken_transaction(const Key& key,
                                                      const std::string& cause) const {
    return BusinessWriteError(
        "idemgate: the business write for key " + key.hex() + " on " + path_ +
        " broke the store's transaction: " + cause +
        ". Nothing was committed: the row stays in flight and none of the business write's rows "
        "were written. Do not ack; fix the business write: let SQL errors propagate (SQLite "
        "rolls the whole transaction back after a trigger's RAISE(ROLLBACK), ON CONFLICT "
        "ROLLBACK, an interrupt, a full disk, an I/O error or out of memory), never BEGIN, "
        "COMMIT or ROLLBACK through tx.db(), and reset or finalize every statement it prepares.");
  }

  /// The business write released or rolled back past the store's savepoint of a group commit.
  [[nodiscard]] BusinessWriteError lost_savepoint(const Key& key, const Error& e) const {
    return BusinessWriteError(
        "idemgate: the business write for key " + key.hex() + " on " + path_ +
        " broke the store's transaction: the store's savepoint for it is gone (" + e.what() +
        "). Nothing of it was committed: the row stays in flight. Do not ack; fix the "
        "business write: never RELEASE or ROLLBACK TO a savepoint it did not make.");
  }

 private:
  static std::string of(const Key* key) {
    return key != nullptr ? std::string(1, ' ').append(key->hex()) : std::string();
  }

  const std::string& path_;
  std::chrono::milliseconds busy_timeout_;
};

}  // namespace idemgate::detail::sqlite
