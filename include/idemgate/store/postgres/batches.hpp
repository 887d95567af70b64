// SPDX-License-Identifier: MIT
// PostgresStore's batches: many reservations in one statement, many commits in one transaction.
#pragma once

#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "../../record.hpp"
#include "../log/protocol.hpp"
#include "../log/text.hpp"
#include "events.hpp"
#include "failure.hpp"
#include "session.hpp"
#include "sql/batches.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail::postgres {

/// Batches of events: one reservation statement for many keys, one transaction (one WAL flush)
/// for many commits.
class Batches {
 public:
  /// On the handle's scope.
  explicit Batches(Scope scope) noexcept : scope_(scope), s_(scope.session), gate_(scope.gate) {}

  /// See `PostgresStore::reserve_batch`.
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) {
    std::vector<std::string_view> keys, fingerprints, requests, labels;
    std::vector<std::string> stored_labels(items.size());  // only those the log keeps changed
    for (const ReserveItem& item : items) {
      keys.push_back(item.key.view());
      fingerprints.push_back(
          {reinterpret_cast<const char*>(item.fingerprint.data()), item.fingerprint.size()});
      requests.push_back(item.request);
      labels.push_back(detail::stored_view(item.label, stored_labels[labels.size()]));
    }
    const std::int64_t holder = new_holder_token();  // see EventPath::reserve
    const pqxx::result rows = s_.reserving(
        sql::postgres::reserve_batch, gate_, pq::bytea_array_param(keys),
        pq::bytea_array_param(fingerprints), pq::bytea_array_param(requests),
        sql_duration<std::chrono::milliseconds>(lease), holder, pq::text_array_param(labels));
    // Items whose row committed after the statement's snapshot, and expired leases, are left
    // empty here: they fall back to `reserve` one by one below.
    std::vector<std::optional<Reservation>> found(items.size());
    for (const pq::row& row : rows) {
      const auto index = static_cast<std::size_t>(pq::int_field(row[0]) - 1);
      if (index >= items.size() || row[2].is_null()) continue;
      const std::int64_t fence = pq::int_field(row[2]);
      if (pq::bool_field(row[1])) {
        found[index] = Reservation::acquired(fence);
        continue;
      }
      Reservation existing = Reservation::existing(
          fence, parse_record_status(pq::text_field(row[3])), pq::bool_field(row[4]),
          pq::bytea_field(row[6]), pq::text_field(row[7]));
      existing.held = held(existing.status, pq::bool_field(row[5]), pq::bool_field(row[9]));
      switch (met(existing.status, existing.same_request, pq::bool_field(row[5]),
                  pq::bool_field(row[8]))) {
        case Met::own:  // this batch's own row; its reply was lost
          found[index] = Reservation::acquired(fence);
          break;
        case Met::expired:
          break;
        case Met::existing:
          found[index] = std::move(existing);
          break;
      }
    }
    EventPath events(scope_);
    std::vector<Reservation> reservations;
    reservations.reserve(items.size());
    try {
      for (std::size_t i = 0; i < items.size(); ++i)
        if (found[i] && found[i]->kind == Reservation::Kind::existing &&
            found[i]->status == RecordStatus::in_flight) {
          events.make_durable(pq::bytea_param(items[i].key.view()));
          break;  // one synchronous commit flushes the WAL for all of them
        }
      for (std::size_t i = 0; i < items.size(); ++i)
        reservations.push_back(found[i] ? std::move(*found[i])
                                        : events.reserve(items[i].key, items[i].fingerprint,
                                                         items[i].request, lease, items[i].label));
    } catch (...) {
      // The caller gets no reservation at all: give back what this call holds, so that the
      // redeliveries take the events over at once instead of meeting live leases nobody works
      // under (best effort: with the store down, the leases run out and the reconciler takes over).
      for (std::size_t i = 0; i < items.size(); ++i) {
        const Reservation* held =
            i < reservations.size() ? &reservations[i] : (found[i] ? &*found[i] : nullptr);
        if (held == nullptr || held->kind == Reservation::Kind::existing) continue;
        try {
          events.release(items[i].key, held->fence, "the batch reservation failed");
        } catch (...) {
        }
      }
      throw;
    }
    return reservations;
  }

  /// See `PostgresStore::commit_batch`.
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_batch(std::span<const CommitItem> items,
                                                        BusinessWrite&& business) {
    EventPath events(scope_);
    return commit_together(items, [&](Lease&, pqxx::work& tx) {
      // Each business write is followed by its own fenced update, checked like commit's: a
      // business write that breaks the transaction is named, and no later item's write runs
      // outside the transaction.
      for (std::size_t i = 0; i < items.size(); ++i) {
        const CommitItem& item = items[i];
        s_.run_business_write(item.key, [&] { business(tx, i); });
        const std::string update =
            s_.outcome_check() + " " +
            s_.literal_text(sql::postgres::commit,
                            events.commit_literals(item.key, item.fence, item.result));
        if (pq::affected_rows(s_.checked(tx, update, item.key)) == 0) return false;  // moved
      }
      return true;
    });
  }

  /// See `PostgresStore::commit_bulk`.
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_bulk(std::span<const CommitItem> items,
                                                       BusinessWrite&& business) {
    if (items.empty()) return std::vector<CommitStatus>{};
    std::vector<std::string_view> keys, results;
    std::vector<std::int64_t> fences;
    for (const CommitItem& item : items) {
      keys.push_back(item.key.view());
      fences.push_back(item.fence);
      results.push_back(item.result);
    }
    const std::string literals[] = {"'" + gate_ + "'", pq::bytea_array_literal(keys),
                                    "'" + pq::bigint_array_param(fences) + "'::bigint[]",
                                    pq::bytea_array_literal(results)};
    const std::string update =
        s_.outcome_check() + " " + s_.literal_text(sql::postgres::commit_bulk, literals);
    return commit_together(items, [&](Lease&, pqxx::work& tx) {
      s_.run_business_write(items[0].key, [&] { business(tx); });
      // Sent through the checked path like every fenced update after a business write; one row
      // per item, or a fence moved (the keys of a batch are distinct).
      return pq::affected_rows(s_.checked(tx, update, items[0].key)) ==
             static_cast<std::int64_t>(items.size());
    });
  }

 private:
  // One transaction for `commit_batch` and `commit_bulk`: `write(lease, tx)` runs the business
  // writes and fenced updates and says whether every fence held; then one COMMIT. Retried on a
  // fresh connection like `commit`, asking first, after a COMMIT that may have landed unheard,
  // whether the batch did land (one transaction: all of it, or none). A business write that
  // refused or threw answers nullopt (item by item costs only its own event); a `StoreError`
  // (a business write that broke the transaction among them) passes.
  template <class Write>
  std::optional<std::vector<CommitStatus>> commit_together(std::span<const CommitItem> items,
                                                           Write&& write) {
    std::vector<std::string_view> keys;
    std::vector<std::int64_t> fences;
    for (const CommitItem& item : items) {
      keys.push_back(item.key.view());
      fences.push_back(item.fence);
    }
    const std::string key_array = pq::bytea_array_param(keys);
    const std::string fence_array = pq::bigint_array_param(fences);
    bool may_have_landed = false;
    using Answer = std::optional<std::vector<CommitStatus>>;
    return s_.retrying(
        RetriedWork{"batch commit", nullptr, items.size()},
        [&](Lease& c, int) -> Answer {
          if (may_have_landed) {
            pqxx::nontransaction check(c.connection());
            const std::int64_t landed = pq::int_field(s_.exec(c, check, sql::postgres::batch_landed,
                                                              gate_, key_array, fence_array)[0][0]);
            if (landed == static_cast<std::int64_t>(items.size()))
              return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
            if (landed != 0) return std::nullopt;  // fences moved meanwhile: item by item decides
            may_have_landed = false;
          }
          pqxx::work tx(c.connection());
          if (!write(c, tx)) return std::nullopt;  // a fence moved: rolled back with `tx`
          may_have_landed = true;  // from here on, the COMMIT may land whatever we hear back
          tx.commit();
          return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
        },
        [](std::exception_ptr error) -> Answer {
          try {
            std::rethrow_exception(error);
          } catch (const StoreError&) {
            throw;
          } catch (...) {
            return std::nullopt;
          }
        });
  }

  Scope scope_;
  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
