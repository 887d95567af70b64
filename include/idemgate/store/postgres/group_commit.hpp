// SPDX-License-Identifier: MIT
// PostgresStore's group commit: concurrent single events committed in one transaction, each
// under its own savepoint.
#pragma once

#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "../../record.hpp"
#include "events.hpp"
#include "failure.hpp"
#include "session.hpp"
#include "sql/batches.hpp"
#include "sql/events.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace idemgate::detail::postgres {

/// The group commit of `Gate` (`GateOptions::coalesce`): many events' commits in one transaction,
/// one WAL flush, where one event's failure costs only that event.
class GroupCommit {
 public:
  /// On the handle's scope.
  explicit GroupCommit(Scope scope) noexcept
      : scope_(scope), s_(scope.session), gate_(scope.gate) {}

  /// See `PostgresStore::commit_each`.
  template <class BusinessWrite>
  std::vector<ItemCommit> commit_each(std::span<const CommitItem> items, BusinessWrite&& business) {
    std::vector<ItemCommit> answers(items.size());
    std::vector<std::size_t> open(items.size());  // the items still to commit
    for (std::size_t i = 0; i < items.size(); ++i) open[i] = i;
    std::vector<std::string> key_params;
    key_params.reserve(items.size());
    for (const CommitItem& item : items) key_params.push_back(pq::bytea_param(item.key.view()));
    // The items the last attempt's COMMIT carried, when it may have landed unheard.
    std::vector<std::size_t> in_doubt;
    std::size_t restarts = 0;
    const EventPath events(scope_);
    return s_.retrying(
        RetriedWork{"group commit", nullptr, items.size()},
        [&](Lease& lease, int) -> std::vector<ItemCommit> {
          if (!in_doubt.empty()) {
            // One transaction: all of it landed, or none. Ask each item's row.
            pqxx::nontransaction check(lease.connection());
            std::vector<std::optional<CommitStatus>> settled;
            bool landed = false;
            for (std::size_t i : in_doubt) {
              settled.push_back(s_.settled(lease, check, gate_, key_params[i], items[i].fence,
                                           RecordStatus::committed));
              landed = landed || settled.back() == CommitStatus::committed;
            }
            if (landed) {
              for (std::size_t k = 0; k < in_doubt.size(); ++k)
                answers[in_doubt[k]].status = settled[k].value_or(CommitStatus::lost_lease);
              for (std::size_t i : open)  // refused by that attempt
                if (std::find(in_doubt.begin(), in_doubt.end(), i) == in_doubt.end())
                  answers[i].status = s_.settled_earlier(lease, check, gate_, key_params[i],
                                                         items[i].fence, RecordStatus::committed);
              return answers;
            }
            in_doubt.clear();
          }
          for (;;) {
            std::vector<std::size_t> included, refused;
            if (!run_group(lease, items, business, events, open, answers, included, refused,
                           in_doubt)) {
              // An item broke the transaction: nothing of this run committed; start again
              // without it.
              if (++restarts > items.size())
                throw StoreError("idemgate: the group commit of " + std::to_string(items.size()) +
                                 " events could not keep its transaction open; nothing was "
                                 "committed. Do not ack: the redelivery or the reconciler "
                                 "finishes them.");
              continue;
            }
            for (std::size_t i : included) answers[i].status = CommitStatus::committed;
            if (!refused.empty()) {
              // Zero rows: this fence's own earlier attempt may have committed (a retried commit).
              pqxx::nontransaction check(lease.connection());
              for (std::size_t i : refused)
                answers[i].status = s_.settled_earlier(lease, check, gate_, key_params[i],
                                                       items[i].fence, RecordStatus::committed);
            }
            return answers;
          }
        });
  }

 private:
  // One transaction over the `open` items: per item one round trip for its savepoint and fenced
  // update (the savepoint ends the previous item's, and is sent through libpqxx's checked path:
  // a previous business write that broke the transaction is caught there), one or more for its
  // business write. An item whose fence moved is `refused` (its business write is not run); one
  // whose business write threw is answered with what it threw and leaves `open`. False when an
  // item broke the whole transaction (it is answered and left out too): nothing committed.
  template <class BusinessWrite>
  bool run_group(Lease& lease, std::span<const CommitItem> items, BusinessWrite& business,
                 const EventPath& events, std::vector<std::size_t>& open,
                 std::vector<ItemCommit>& answers, std::vector<std::size_t>& included,
                 std::vector<std::size_t>& refused, std::vector<std::size_t>& in_doubt) {
    const std::string savepoint(sql::postgres::item_savepoint.text);
    const std::string release(sql::postgres::release_item_savepoint.text);
    const std::string relax =
        s_.relaxed_outcomes() ? std::string(sql::postgres::relax_outcome.text) + " " : "";
    pqxx::work tx(lease.connection());
    std::optional<std::size_t> last;  // the item whose business write ran last
    for (std::size_t k = 0; k < open.size();) {
      const std::size_t i = open[k];
      const CommitItem& item = items[i];
      // With relaxed outcomes the first statement also turns the flush off, outside every
      // item's savepoint, so that no item's rollback takes it back.
      const std::string sql =
          (k == 0 ? relax + savepoint : release + "; " + savepoint) + "; " +
          s_.literal_text(sql::postgres::commit,
                          events.commit_literals(item.key, item.fence, item.result));
      pqxx::result updated;
      try {
        updated = s_.checked(tx, sql, last ? items[*last].key : item.key);
      } catch (const BusinessWriteError&) {
        if (!last) throw;
        answers[*last].error = std::current_exception();
        std::erase(open, *last);
        return false;
      }
      if (pq::affected_rows(updated) == 0) {
        refused.push_back(i);  // its business write is not run
        last.reset();
        ++k;
        continue;
      }
      try {
        s_.run_business_write(item.key, [&] { business(tx, i); });
        included.push_back(i);
        last = i;
        ++k;
        continue;
      } catch (const BusinessWriteError&) {
        answers[i].error = std::current_exception();
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
        return false;
      } catch (...) {
        // A lost connection fails the whole attempt (`retrying` decides); an error of the log's
        // schema throws from kind_of; anything else is this item's own.
        if (kind_of(std::current_exception(), s_.errors()).kind == Failure::connection) throw;
        answers[i].error = std::current_exception();
      }
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
      last.reset();
      if (!rolled_back_to_savepoint(tx)) return false;  // libpqxx ended it with the statement
    }
    if (last) {
      // The last business write is checked like the others: by a statement after it.
      try {
        s_.checked(tx, release, items[*last].key);
      } catch (const BusinessWriteError&) {
        answers[*last].error = std::current_exception();
        std::erase(open, *last);
        return false;
      }
    }
    in_doubt = included;  // from here on, the COMMIT may land whatever we hear back
    tx.commit();
    in_doubt.clear();
    return true;
  }

  // Undoes the current item of a group commit; false when the transaction is gone (libpqxx 6.4
  // ends it with a failed statement), so the group must start again.
  static bool rolled_back_to_savepoint(pqxx::work& tx) {
    try {
      pq::exec(tx, std::string(sql::postgres::rollback_item_savepoint.text));
      return true;
    } catch (const pqxx::broken_connection&) {
      throw;
    } catch (const std::exception&) {
      return false;
    }
  }

  Scope scope_;
  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
