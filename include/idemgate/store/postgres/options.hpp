// SPDX-License-Identifier: MIT
// PostgresStore's options: what lies between it and the server, its pools, and its guards against
// dead connections.
#pragma once

#include "../../detail/durations.hpp"

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate {

/// What lies between a `PostgresStore` and the server (`PostgresOptions::pooling`).
enum class PostgresPooling {
  /// Each connection is a server session of its own: the server directly, or PgBouncer with
  /// `pool_mode = session`. The store prepares its statements once per connection.
  session,
  /// A pooler hands each transaction whichever server connection is free: PgBouncer with
  /// `pool_mode = transaction`. The store keeps no state in the session: no named prepared
  /// statements (each statement goes with its text and parameters, unnamed), no session-level
  /// `SET`. Your business write must keep none either (docs/stores.md).
  transaction,
};

/// Tuning of a `PostgresStore`.
struct PostgresOptions {
  /// The idempotency log's table, optionally schema-qualified (`ops.idemgate_log`).
  std::string table = "idemgate_log";
  /// Connections in the store's pool. Worker threads share them; each call checks one out.
  /// Lease renewals (the gate's heartbeat, the reconciler) have one connection of their own
  /// beside the pool, opened at the first renewal, so they neither wait for the workers nor
  /// keep a worker waiting when the database stops answering.
  std::size_t pool_size = 1;
  /// How long a call waits for a free connection before it throws `StoreError`.
  std::chrono::milliseconds checkout_timeout = std::chrono::seconds(30);
  /// How often a commit whose connection broke is tried again on a fresh connection. Safe:
  /// the fence makes a repeated commit a no-op once one attempt landed.
  int commit_attempts = 3;
  /// Reservations commit without waiting for the WAL flush (`synchronous_commit = off` on a
  /// second pool of `pool_size` connections, so no round trip is added); commits stay durable.
  /// Exclusion between concurrent deliveries is unchanged, but a database crash may lose
  /// reservations made in the last moments before it: a redelivery then claims again, and only
  /// the downstream's idempotency key prevents a double effect. Off by default; a `Gate` refuses
  /// it with a downstream that does not honour keys.
  bool relaxed_reservations = false;
  /// A `Gate`'s outcomes commit without waiting for the WAL flush (`SET LOCAL synchronous_commit
  /// = off`, sent with the fenced update: no round trip added); reservations stay durable. A
  /// database crash may lose the outcomes committed in its last moments, after their callers
  /// acked them: each of those rows is back in flight under its durable reservation, as if its
  /// worker had died before the commit, and the reconciler finishes it under the original key
  /// (the downstream's stored outcome and the business write again), so run one. The business
  /// rows of those events are missing from the crash until the reconciler's pass. A later
  /// durable commit on the server flushes every earlier one. `TransactionGate`'s commits and a
  /// server endpoint's responses, the only record of their events, stay durable whatever this
  /// says. Off by default; refused together with `relaxed_reservations` (then nothing would
  /// record an acked event durably).
  bool relaxed_outcomes = false;
  /// The log is a table partitioned by generation, so that its space goes back by dropping
  /// whole generations rather than by vacuum, which a snapshot held open anywhere in the
  /// database stops: `purge` starts a new generation once the current one is older than its
  /// window, and drops each older generation its purges left empty. `migrate()` turns an
  /// existing log into one online (its rows become generation 0). A reservation reads the
  /// current generation in its statement and finds a key's row in any generation; starting a
  /// generation waits for the statements in flight on the log (a lock, given up after 5 s until
  /// the next purge). Every process of the log must set it alike: one without it fails on the
  /// partitioned log rather than write past its generations. Off by default.
  bool partitioned_log = false;
  /// What lies between the store and the server. Behind PgBouncer in transaction pooling mode,
  /// use `PostgresPooling::transaction`: a named statement prepared in one transaction is not
  /// there in the next, which may run on another server connection. It costs the server a parse
  /// and plan of every statement (see docs/stores.md for the measured cost); with relaxed
  /// reservations, each reservation also becomes a transaction of its own that sets
  /// `synchronous_commit` locally (three round trips more).
  PostgresPooling pooling = PostgresPooling::session;
  /// Your business write's statements, as {name, SQL}: the store prepares each on a connection
  /// right before the first commit that runs there (again after a reconnect), so the business
  /// write runs it with `idemgate::exec_prepared(tx, name, args...)` and the server neither
  /// parses nor plans it again per event. At most `max_business_statements`; not with
  /// `PostgresPooling::transaction` (nothing stays prepared there).
  std::vector<std::pair<std::string, std::string>> business_statements = {};
  /// Most entries of `business_statements`.
  static constexpr std::size_t max_business_statements = 16;

  // --- Dead connections. Each guard below goes into every connection the store opens unless
  // the connection string sets it itself (a keyword in the URI or key=value string, or a
  // `statement_timeout` in its `options` or in PGOPTIONS): the user's own value always wins. A
  // zero leaves the setting to libpq or the server. With the defaults, a call that meets a
  // partition (the database gone without a FIN or RST) fails within about 20 s, a commit (which
  // reconnects up to `commit_attempts` times) within about 40 s, and is not acked; the calls
  // after the partition heals open fresh connections. ---

  /// libpq `connect_timeout`: how long opening one connection may take, per host of a
  /// multi-host URI. Without it, a connect into a partition waits for the kernel (minutes).
  std::chrono::seconds connect_timeout = std::chrono::seconds(5);
  /// libpq `keepalives_idle`: a connection silent this long gets a TCP keepalive probe.
  std::chrono::seconds keepalives_idle = std::chrono::seconds(10);
  /// libpq `keepalives_interval`: the time between unanswered probes.
  std::chrono::seconds keepalives_interval = std::chrono::seconds(3);
  /// libpq `keepalives_count`: unanswered probes after which the kernel drops the connection.
  /// With the defaults, a call waiting on a peer that vanished fails after 10 + 3 × 3 = 19 s.
  std::size_t keepalives_count = 3;
  /// libpq `tcp_user_timeout`: how long sent data may stay unacknowledged before the kernel
  /// drops the connection (a statement sent into a partition).
  std::chrono::milliseconds tcp_user_timeout = std::chrono::seconds(15);
  /// Server `statement_timeout`, set once on every connection with `SET` (a startup option
  /// would be refused by PgBouncer; behind PgBouncer in transaction mode, set it on the role
  /// instead; with `PostgresPooling::transaction` the store does not set it): the server ends a
  /// statement that runs longer, the business write's included.
  std::chrono::milliseconds statement_timeout = std::chrono::seconds(15);
  /// A checked-out connection that sent a statement and received nothing at all for this long
  /// is taken for dead: the store shuts its socket down, and the call fails like any lost
  /// connection. It catches what keepalives cannot: a proxy, pooler or load balancer between the
  /// store and the database that keeps the TCP connection alive while the database behind it is
  /// gone. Must exceed `statement_timeout` (the server answers by then); zero turns it off.
  std::chrono::milliseconds reply_timeout = std::chrono::seconds(20);
  /// The first pause between two commit attempts (`commit_attempts`); it doubles after each
  /// attempt, up to 5 s, with jitter. It lets a failover finish between attempts.
  std::chrono::milliseconds retry_backoff = std::chrono::milliseconds(250);
  /// How long `migrate()` waits for an unreachable server, trying again with backoff, before it
  /// throws `StoreError`. Other calls never wait for it: they throw at once, so the event is not
  /// acked and comes back.
  std::chrono::milliseconds startup_wait = std::chrono::minutes(2);
  /// Where the store reports what no call returns: a lazy start while the server is down, a
  /// lease release that failed, a commit tried again, a silent connection cut. Standard error by
  /// default; an empty function silences it.
  std::function<void(std::string_view)> log = [](std::string_view line) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  };
};

namespace detail::postgres {

/// `options` checked; throws `std::invalid_argument` saying which option is out of range and what
/// it means.
[[nodiscard]] inline PostgresOptions checked_options(PostgresOptions options) {
  using std::chrono::milliseconds;
  detail::require_in_range("PostgresOptions::pool_size", options.pool_size, std::size_t{1},
                           std::size_t{1000},
                           "It is the connections this store opens (default 1).");
  detail::require_in_range("PostgresOptions::checkout_timeout", options.checkout_timeout,
                           milliseconds(1), std::chrono::hours(1),
                           "It is how long a call waits for a free connection (default "
                           "30 s).");
  if (options.commit_attempts < 1 || options.commit_attempts > 100)
    throw std::invalid_argument("idemgate: PostgresOptions::commit_attempts is " +
                                std::to_string(options.commit_attempts) +
                                "; it must be between 1 and 100. It is how often a commit "
                                "whose connection broke is tried (default 3).");
  using std::chrono::hours;
  using std::chrono::seconds;
  detail::require_in_range("PostgresOptions::connect_timeout", options.connect_timeout, seconds(0),
                           hours(1),
                           "It bounds opening a connection (default 5 s; 0: libpq's "
                           "own, no bound).");
  detail::require_in_range("PostgresOptions::keepalives_idle", options.keepalives_idle, seconds(0),
                           hours(1), "It is the silence before a keepalive probe (default 10 s).");
  detail::require_in_range("PostgresOptions::keepalives_interval", options.keepalives_interval,
                           seconds(0), hours(1),
                           "It is the time between keepalive probes (default 3 s).");
  detail::require_in_range("PostgresOptions::keepalives_count", options.keepalives_count,
                           std::size_t{0}, std::size_t{1000},
                           "It is how many unanswered probes drop a connection "
                           "(default 3).");
  detail::require_in_range("PostgresOptions::tcp_user_timeout", options.tcp_user_timeout,
                           milliseconds(0), hours(1),
                           "It bounds unacknowledged sent data (default 15 s).");
  detail::require_in_range("PostgresOptions::statement_timeout", options.statement_timeout,
                           milliseconds(0), hours(24),
                           "It is the server's limit per statement (default 15 s).");
  detail::require_in_range("PostgresOptions::reply_timeout", options.reply_timeout, milliseconds(0),
                           hours(24),
                           "It is how long a statement may go unanswered (default 20 s).");
  if (options.reply_timeout.count() > 0 && options.statement_timeout.count() > 0 &&
      options.reply_timeout <= options.statement_timeout)
    throw std::invalid_argument(
        "idemgate: PostgresOptions::reply_timeout (" + detail::describe(options.reply_timeout) +
        ") must exceed PostgresOptions::statement_timeout (" +
        detail::describe(options.statement_timeout) +
        "), or statements the server would still finish are cut; raise it, or set it to "
        "0 to turn the reply watchdog off.");
  detail::require_in_range("PostgresOptions::retry_backoff", options.retry_backoff, milliseconds(0),
                           std::chrono::minutes(1),
                           "It is the first pause between commit attempts (default "
                           "250 ms).");
  detail::require_in_range("PostgresOptions::startup_wait", options.startup_wait, milliseconds(0),
                           hours(24),
                           "It is how long migrate() waits for the server (default "
                           "2 min).");
  if (options.relaxed_reservations && options.relaxed_outcomes)
    throw std::invalid_argument(
        "idemgate: PostgresOptions::relaxed_reservations and relaxed_outcomes are both on: an "
        "event would be acked with neither its reservation nor its outcome flushed, and a "
        "database crash would leave no record of it for anyone to finish; turn one of them off "
        "(relaxed_outcomes keeps the reservation durable, relaxed_reservations the outcome).");
  if (options.business_statements.size() > PostgresOptions::max_business_statements)
    throw std::invalid_argument(
        "idemgate: PostgresOptions::business_statements holds " +
        std::to_string(options.business_statements.size()) + " statements, more than " +
        std::to_string(PostgresOptions::max_business_statements) +
        "; prepare the ones every event runs, and send the others unprepared.");
  if (!options.business_statements.empty() && options.pooling == PostgresPooling::transaction)
    throw std::invalid_argument(
        "idemgate: PostgresOptions::business_statements cannot be prepared behind a "
        "transaction pooler (PostgresPooling::transaction): a statement prepared in one "
        "transaction is not there in the next. Send them with idemgate::exec_params instead.");
  for (const auto& [name, sql] : options.business_statements)
    if (name.empty() || name.starts_with("idemgate_") || sql.empty())
      throw std::invalid_argument(
          "idemgate: PostgresOptions::business_statements needs a name and an SQL text for "
          "each statement, and names that do not start with idemgate_ (the store's own); got "
          "'" +
          name + "'.");
  return options;
}

}  // namespace detail::postgres

}  // namespace idemgate
