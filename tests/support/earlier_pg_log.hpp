#pragma once

// The PostgreSQL log as the version before gates created it: keyed by key alone, no gate column.
// For the tests and the measurement of migrate() on a log of that shape.

#include <string>

namespace idemgate::test {

/// The earlier log `t`, its indexes and its mismatches table.
inline std::string earlier_pg_log_schema(const std::string& t) {
  return "CREATE TABLE " + t +
         " (key bytea PRIMARY KEY CHECK (octet_length(key) = 32), status text NOT NULL CHECK"
         " (status IN ('in_flight', 'committed', 'failed', 'escalated')), fence bigint NOT NULL"
         " DEFAULT 1 CHECK (fence > 0), lease_until timestamptz NOT NULL, fingerprint bytea NOT"
         " NULL CHECK (octet_length(fingerprint) = 32), request bytea NOT NULL, result bytea,"
         " reason text, duplicates bigint NOT NULL DEFAULT 0, holder bigint NOT NULL DEFAULT 0,"
         " attempts bigint NOT NULL DEFAULT 1, created_at timestamptz NOT NULL DEFAULT now(),"
         " updated_at timestamptz NOT NULL DEFAULT now(),"
         " CHECK (status <> 'committed' OR result IS NOT NULL));"
         "CREATE INDEX " +
         t + "_in_flight ON " + t + " (lease_until) WHERE status = 'in_flight';" + "CREATE INDEX " +
         t + "_escalated ON " + t + " (updated_at) WHERE status = 'escalated';" + "CREATE INDEX " +
         t + "_created ON " + t + " USING brin (created_at);" + "CREATE TABLE " + t +
         "_mismatches (key bytea NOT NULL, stored bytea NOT NULL, observed bytea NOT NULL,"
         " source text NOT NULL, at timestamptz NOT NULL DEFAULT now());";
}

}  // namespace idemgate::test
