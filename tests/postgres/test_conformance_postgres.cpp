// The store conformance suite over PostgresStore, the SQL suite included. Needs the server in
// IDEMGATE_TEST_PG (scripts/test starts one); fails without it. With
// IDEMGATE_TEST_THROUGH=pgbouncer (a second ctest run), the store goes through the PgBouncer in
// IDEMGATE_TEST_PGBOUNCER in transaction pooling mode, with PostgresPooling::transaction.

#include "support/pgbouncer.hpp"
#include "support/postgres.hpp"

#include <idemgate/store/postgres.hpp>
#include <idemgate/testing/sql_store_conformance.hpp>
#include <idemgate/testing/store_conformance.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

using namespace std::chrono_literals;

/// PostgresStore: unique tables on the server in IDEMGATE_TEST_PG (the suite fails without it);
/// time passes by moving the stored timestamps back (the log's and the mismatches').
struct PostgresTraits {
  using Store = idemgate::PostgresStore;

  void set_up() {
    namespace t = idemgate::test;
    uri = t::pg_uri();
    ASSERT_FALSE(uri.empty()) << "the conformance suite needs PostgreSQL: set IDEMGATE_TEST_PG";
    log = t::unique_table("clog");
    bookings = t::unique_table("cbiz");
    t::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
    t::pg_exec("CREATE TABLE " + bookings +
               " (id bigserial PRIMARY KEY, source_event bytea NOT NULL, note text NOT NULL)");
    // Eight connections: the concurrency tests run eight threads that really race.
    const std::string store_uri = t::store_uri(uri);
    ASSERT_FALSE(store_uri.empty());
    store = std::make_unique<Store>(
        store_uri, t::store_options({.table = log, .pool_size = 8, .checkout_timeout = 5s}));
    store->migrate();
  }
  void tear_down() {
    store.reset();
    if (!uri.empty())
      idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " +
                              bookings);
  }

  void write_business(Store::transaction& tx, const idemgate::Key& key) {
    namespace pq = idemgate::detail::pq;
    pq::exec_params(tx, "INSERT INTO " + bookings + " (source_event, note) VALUES ($1::bytea, $2)",
                    pq::bytea_param(key.view()), std::string("booked"));
  }

  /// Runs a statement that fails, which ends a libpqxx transaction; the business write catches
  /// its error.
  void break_transaction(Store::transaction& tx) {
    try {
      idemgate::detail::pq::exec(tx, "SELECT 1 / 0");
    } catch (const std::exception&) {
      // swallowed, as a careless business write would
    }
  }
  std::int64_t business_rows() {
    return idemgate::test::pg_count("SELECT count(*) FROM " + bookings);
  }
  std::int64_t business_rows_for(const idemgate::Key& key) {
    return idemgate::test::pg_count("SELECT count(*) FROM " + bookings + " WHERE source_event = '" +
                                    idemgate::detail::pq::bytea_param(key.view()) + "'::bytea");
  }
  std::int64_t distinct_business_events() {
    return idemgate::test::pg_count("SELECT count(DISTINCT source_event) FROM " + bookings);
  }
  void advance(std::chrono::milliseconds by) {
    const std::string shift = std::to_string(by.count()) + " * interval '1 millisecond'";
    idemgate::test::pg_exec("UPDATE " + log + " SET lease_until = lease_until - " + shift +
                            ", updated_at = updated_at - " + shift +
                            ", created_at = created_at - " + shift);
    idemgate::test::pg_exec("UPDATE " + log + "_mismatches SET at = at - " + shift);
  }

  std::string uri, log, bookings;
  std::unique_ptr<Store> store;
};

/// PostgresStore on a log of generations (`PostgresOptions::partitioned_log`): every move of the
/// clock also starts the next generation, so each key a test meets again after time passed is
/// found in an older generation than the one reservations write into.
struct PartitionedPostgresTraits : PostgresTraits {
  void set_up() {
    PostgresTraits::set_up();
    if (::testing::Test::HasFatalFailure()) return;
    namespace t = idemgate::test;
    store = std::make_unique<Store>(
        t::store_uri(uri),
        t::store_options(
            {.table = log, .pool_size = 8, .checkout_timeout = 5s, .partitioned_log = true}));
    store->migrate();
  }
  void tear_down() {
    PostgresTraits::tear_down();
    if (!uri.empty())
      idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + "_generations, " + log +
                              "_migrations");
  }
  void advance(std::chrono::milliseconds by) {
    PostgresTraits::advance(by);
    store->start_generation();
  }
};

namespace idemgate::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(Postgres, StoreConformance, PostgresTraits);
INSTANTIATE_TYPED_TEST_SUITE_P(Postgres, SqlStoreConformance, PostgresTraits);
INSTANTIATE_TYPED_TEST_SUITE_P(PartitionedPostgres, StoreConformance, PartitionedPostgresTraits);
INSTANTIATE_TYPED_TEST_SUITE_P(PartitionedPostgres, SqlStoreConformance, PartitionedPostgresTraits);
}  // namespace idemgate::testing
