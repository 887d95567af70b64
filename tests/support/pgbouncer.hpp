#pragma once

// The PgBouncer (transaction pooling) that scripts/test starts in front of the test server, and
// the choice of a test run to send its stores through it. With IDEMGATE_TEST_THROUGH=pgbouncer,
// `store_uri` and `store_options` give the stores under test PgBouncer's address and
// `PostgresPooling::transaction`; the tests' own reads and set-ups stay on the server's direct
// address. A run that asks for PgBouncer without IDEMGATE_TEST_PGBOUNCER fails, never skips.

#include "support/postgres.hpp"

#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace idemgate::test {

/// Whether this run sends the stores under test through PgBouncer
/// (`IDEMGATE_TEST_THROUGH=pgbouncer`).
inline bool through_pgbouncer() {
  const char* through = std::getenv("IDEMGATE_TEST_THROUGH");
  return through != nullptr && std::string(through) == "pgbouncer";
}

/// The URI of PgBouncer in transaction pooling mode (database `postgres`); fails the current
/// test when it is not set.
inline std::string pgbouncer_uri() {
  const char* uri = std::getenv("IDEMGATE_TEST_PGBOUNCER");
  if (uri == nullptr || *uri == '\0') {
    ADD_FAILURE() << "IDEMGATE_TEST_PGBOUNCER is not set. Run scripts/test, which starts "
                     "PgBouncer in transaction pooling mode in front of the test server "
                     "(idemgate_start_pgbouncer in scripts/lib/common.sh) and exports its URI.";
    return {};
  }
  return uri;
}

/// `uri` with its database name (the last path segment) replaced by `database`.
inline std::string with_database(const std::string& uri, const std::string& database) {
  return uri.substr(0, uri.rfind('/') + 1) + database;
}

/// The URI a store under test connects to for the database of `direct` (a URI on the test
/// server): `direct` itself, or the same database through PgBouncer. Empty (and the test
/// failed) when PgBouncer is asked for but not there.
inline std::string store_uri(const std::string& direct) {
  if (!through_pgbouncer()) return direct;
  const std::string bouncer = pgbouncer_uri();
  if (bouncer.empty() || direct.empty()) return {};
  return with_database(bouncer, direct.substr(direct.rfind('/') + 1));
}

/// `options` with the pooling this run's stores need.
inline PostgresOptions store_options(PostgresOptions options) {
  if (through_pgbouncer()) options.pooling = PostgresPooling::transaction;
  return options;
}

}  // namespace idemgate::test
