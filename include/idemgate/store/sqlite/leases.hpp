// SPDX-License-Identifier: MIT
// SqliteStore's leases: extending the ones held, and taking stranded work over.
#pragma once

#include "../../record.hpp"
#include "../log/row.hpp"
#include "options.hpp"
#include "session.hpp"
#include "sql/leases.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace idemgate::detail::sqlite {

/// The leases of a gate's rows: the heartbeat's extensions and the reconciler's takeovers.
class Leases {
 public:
  /// On the handle's scope.
  explicit Leases(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `SqliteStore::extend`.
  std::size_t extend(std::span<const HeldLease> held, std::chrono::milliseconds lease) {
    if (held.empty()) return 0;
    return s_.run("extending leases", nullptr, [&] {
      s_.begin();
      const std::int64_t until = later(s_.now_micros(), lease);
      std::size_t extended = 0;
      for (const HeldLease& h : held)
        extended += static_cast<std::size_t>(
            s_.change(sql::sqlite::extend, "extending leases", gate_, h.key, h.fence, until));
      s_.end("extending leases");
      return extended;
    });
  }

  /// See `SqliteStore::take_stale`.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    return s_.run("taking stale rows", nullptr, [&] {
      s_.begin();
      const std::int64_t now = s_.now_micros();
      std::vector<Stranded> taken;
      {
        auto& take = s_.statement(sql::sqlite::take_stale);
        ResetGuard guard(take);
        take.bind("taking stale rows", gate_, now, earlier(now, stale_after), later(now, lease),
                  sql_limit(limit));
        while (take.step("taking stale rows"))
          taken.push_back({key_from(take.bytes(0)), take.int64(1), take.bytes(2), take.int64(3),
                           take.is_null(4) ? std::string() : take.bytes(4)});
      }
      s_.end("taking stale rows");
      return taken;
    });
  }

 private:
  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::sqlite
