// SPDX-License-Identifier: MIT
// PostgresStore's leases: renewing the ones held, and taking stranded work over.
#pragma once

#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "../../record.hpp"
#include "../log/row.hpp"
#include "session.hpp"
#include "sql/leases.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail::postgres {

/// The leases of a gate's rows: the heartbeat's renewals and the reconciler's takeovers.
class Leases {
 public:
  /// On the handle's scope.
  explicit Leases(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `PostgresStore::renew`.
  std::vector<LeaseRenewal> renew(std::span<const HeldLease> held,
                                  std::chrono::milliseconds lease) {
    if (held.empty()) return {};
    std::vector<std::string_view> keys;
    std::vector<std::int64_t> fences;
    for (const HeldLease& h : held) {
      keys.push_back(h.key.view());
      fences.push_back(h.fence);
    }
    const std::string key_array = pq::bytea_array_param(keys);
    const std::string fence_array = pq::bigint_array_param(fences);
    const std::int64_t lease_ms = sql_duration<std::chrono::milliseconds>(lease);
    return s_.run_on(s_.renewal_pool(), [&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      const pqxx::result rows =
          s_.exec(c, tx, sql::postgres::extend, gate_, key_array, fence_array, lease_ms);
      std::vector<LeaseRenewal> renewed;
      renewed.reserve(held.size());
      for (const auto& row : rows) {
        const char state = row[0].c_str()[0];
        renewed.push_back(state == 'e'   ? LeaseRenewal::extended
                          : state == 'b' ? LeaseRenewal::busy
                                         : LeaseRenewal::gone);
      }
      if (renewed.size() != held.size())
        throw StoreError("idemgate: renewing " + std::to_string(held.size()) + " leases answered " +
                         std::to_string(renewed.size()) +
                         " rows; is the log's table what this version expects? (run migrate())");
      return renewed;
    });
  }

  /// See `PostgresStore::take_stale`.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    // When the reply is lost and the statement runs again on a new connection, the rows this
    // pass already took come back too (they carry its token), instead of staying in flight
    // under a live lease that nobody works on.
    const std::int64_t holder = new_holder_token();
    const pqxx::result rows = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::take_stale, gate_,
                     sql_duration<std::chrono::milliseconds>(stale_after), sql_limit(limit),
                     sql_duration<std::chrono::milliseconds>(lease), holder);
    });
    std::vector<Stranded> taken;
    taken.reserve(rows.size());
    for (const pq::row& row : rows)
      taken.push_back({key_from(pq::bytea_field(row[0])), pq::int_field(row[1]),
                       pq::bytea_field(row[2]), pq::int_field(row[3]), pq::text_field(row[4])});
    return taken;
  }

 private:
  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
