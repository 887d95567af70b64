// SPDX-License-Identifier: MIT
// SqliteStore's batches: many reservations in one write transaction, the group commit of
// concurrent events, and a bulk business write's commit.
#pragma once

#include "../../errors.hpp"
#include "../../record.hpp"
#include "events.hpp"
#include "options.hpp"
#include "session.hpp"
#include "sql/batches.hpp"
#include "sql/events.hpp"
#include "transaction.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace idemgate::detail::sqlite {

/// Batches of events, each in one write transaction (one sync of the log).
class Batches {
 public:
  /// On the handle's scope.
  explicit Batches(Scope scope) noexcept : scope_(scope), s_(scope.session), gate_(scope.gate) {}

  /// See `SqliteStore::reserve_batch`.
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) {
    EventPath events(scope_);
    return s_.run("reserving keys", nullptr, [&] {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      std::vector<Reservation> reservations;
      reservations.reserve(items.size());
      for (const ReserveItem& item : items)
        reservations.push_back(
            events.reserve_row(item.key, item.fingerprint, item.request, now, lease, item.label));
      s_.end("reserving keys");
      return reservations;
    });
  }

  /// See `SqliteStore::commit_each`.
  template <class BusinessWrite>
  std::vector<ItemCommit> commit_each(std::span<const CommitItem> items, BusinessWrite&& business) {
    std::vector<ItemCommit> answers(items.size());
    std::vector<std::size_t> open(items.size());  // the items still to commit
    for (std::size_t i = 0; i < items.size(); ++i) open[i] = i;
    return s_.run("committing a group", nullptr, [&] {
      for (std::size_t restarts = 0;; ++restarts) {
        s_.begin();
        const std::int64_t now = s_.now_micros();
        std::vector<std::size_t> included;
        bool broke = false;  // an item ended the transaction: start again without it
        for (std::size_t k = 0; k < open.size();) {
          const std::size_t i = open[k];
          const CommitItem& item = items[i];
          s_.simple(sql::sqlite::item_savepoint, "committing a group");
          try {
            if (s_.change(sql::sqlite::commit, "committing", gate_, item.key, item.fence,
                          SqliteBlob{item.result}, now) == 0) {
              answers[i].status =
                  s_.settled_earlier(gate_, item.key, item.fence, RecordStatus::committed);
            } else {
              auto write = [&](SqliteTransaction& tx) { business(tx, i); };
              s_.run_business(gate_, std::span<const CommitItem>(&item, 1), now, write);
              release_item_savepoint(item.key);
              included.push_back(i);
              ++k;
              continue;
            }
          } catch (const Error& e) {
            if (e.busy()) throw;  // the whole unit: run() decides
            answers[i].error = std::current_exception();
          } catch (...) {
            answers[i].error = std::current_exception();
          }
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));  // settled on its own
          if (!rolled_back_to_savepoint()) {
            broke = true;
            break;
          }
        }
        if (!broke) {
          try {
            s_.end("committing a group");
          } catch (const Error& e) {
            s_.failures().throw_unconfirmed(
                e, "group commit of " + std::to_string(included.size()) + " events");
          }
          for (std::size_t i : included) answers[i].status = CommitStatus::committed;
          return answers;
        }
        s_.rollback();
        if (restarts >= items.size())
          throw StoreError("idemgate: the group commit of " + std::to_string(items.size()) +
                           " events on " + s_.path() +
                           " could not keep its transaction open; nothing was committed. Do "
                           "not ack: the redelivery or the reconciler finishes them.");
      }
    });
  }

  /// See `SqliteStore::commit_bulk`.
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_bulk(std::span<const CommitItem> items,
                                                       BusinessWrite&& business) {
    if (items.empty()) return std::vector<CommitStatus>{};
    return s_.run("committing a batch", nullptr, [&]() -> std::optional<std::vector<CommitStatus>> {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      for (const CommitItem& item : items)
        if (s_.change(sql::sqlite::commit, "committing a batch", gate_, item.key, item.fence,
                      SqliteBlob{item.result}, now) == 0) {
          s_.rollback();  // a fence moved, or an earlier attempt committed it: item by item decides
          return std::nullopt;
        }
      try {
        auto write = [&](SqliteTransaction& tx) { business(tx); };
        s_.run_business(gate_, items, now, write);
      } catch (const BusinessWriteError&) {
        throw;
      } catch (const std::exception&) {
        s_.rollback_quietly();  // the write refused: item by item costs only its own event
        return std::nullopt;
      }
      try {
        s_.end("committing a batch");
      } catch (const Error& e) {
        s_.failures().throw_unconfirmed(
            e, "batch commit of " + std::to_string(items.size()) + " events");
      }
      return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
    });
  }

 private:
  // Ends the current item's savepoint of a group commit, after its business write: gone only if
  // the business write released it or rolled back past it.
  void release_item_savepoint(const Key& key) {
    try {
      s_.simple(sql::sqlite::release_item_savepoint, "committing a group");
    } catch (const Error& e) {
      if (e.busy()) throw;
      throw s_.failures().lost_savepoint(key, e);
    }
  }

  // Undoes the current item of a group commit; false when the transaction is gone.
  bool rolled_back_to_savepoint() {
    if (sqlite3_get_autocommit(s_.db()) != 0) return false;
    try {
      s_.simple(sql::sqlite::rollback_item_savepoint, "committing a group");
      s_.simple(sql::sqlite::release_item_savepoint, "committing a group");
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  Scope scope_;
  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::sqlite
