#pragma once

// The TMS of the PostgreSQL tests: a bookings table written by the gate's business write, the
// checks every scenario ends with, and a fixture that gives each test its own log and bookings
// table on the test server.

#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/batch.hpp>
#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/key.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::test {

/// Creates (or re-creates) the bookings table `table`: one row per booked event.
inline std::string bookings_ddl(const std::string& table) {
  return "DROP TABLE IF EXISTS " + table + "; CREATE TABLE " + table +
         " (id bigserial PRIMARY KEY, container text NOT NULL, slot_id text NOT NULL,"
         " source_event bytea NOT NULL)";
}

/// The business write: one booking per event in `table`, in the gate's transaction; counts its
/// runs in `runs` when given.
struct PgBookingWriter {
  std::string table;
  std::atomic<int>* runs = nullptr;

  void operator()(pqxx::work& tx, const Key& key, const SlotRequest& request,
                  const std::string& slot) const {
    if (runs != nullptr) runs->fetch_add(1);
    detail::pq::exec_params(
        tx,
        "INSERT INTO " + table + " (container, slot_id, source_event) VALUES ($1, $2, $3::bytea)",
        request.container, slot, detail::pq::bytea_param(key.view()));
  }
};

/// The same bookings written by a bulk business write: one multi-row INSERT for all the events
/// it is given. Counts its calls in `calls` and the events it was given in `runs`, when given;
/// `after`, when set, runs after the INSERT (a test's fault).
struct PgBulkBookingWriter {
  std::string table;
  std::atomic<int>* runs = nullptr;
  std::atomic<int>* calls = nullptr;
  std::function<void(pqxx::work&, std::span<const CommittedEvent<SlotRequest, std::string>>)>
      after = {};

  void operator()(pqxx::work& tx,
                  std::span<const CommittedEvent<SlotRequest, std::string>> events) const {
    if (calls != nullptr) calls->fetch_add(1);
    if (runs != nullptr) runs->fetch_add(static_cast<int>(events.size()));
    std::vector<std::string> containers, slots;
    std::vector<std::string_view> keys;
    for (const auto& event : events) {
      containers.push_back(event.request.container);
      slots.push_back(event.outcome);
      keys.push_back(event.key.view());
    }
    detail::pq::exec_params(tx,
                            "INSERT INTO " + table +
                                " (container, slot_id, source_event) SELECT * FROM "
                                "unnest($1::text[], $2::text[], $3::bytea[])",
                            detail::pq::text_array_param(containers),
                            detail::pq::text_array_param(slots),
                            detail::pq::bytea_array_param(keys));
    if (after) after(tx, events);
  }
};

/// No committed status without its booking, no booking without its committed status, and no
/// event booked twice, in the log `log` and bookings `bookings` on the server at `uri`.
inline void expect_no_half_state(const std::string& uri, const std::string& log,
                                 const std::string& bookings) {
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM " + log +
                                 " l WHERE status = 'committed' AND NOT EXISTS (SELECT 1 FROM " +
                                 bookings + " b WHERE b.source_event = l.key)"),
            0)
      << "a committed status without its booking";
  EXPECT_EQ(
      pg_count_on(uri, "SELECT count(*) FROM " + bookings + " b WHERE NOT EXISTS (SELECT 1 FROM " +
                           log + " l WHERE l.key = b.source_event AND l.status = 'committed')"),
      0)
      << "a booking without its committed status";
  EXPECT_EQ(pg_count_on(uri, "SELECT count(*) FROM (SELECT source_event FROM " + bookings +
                                 " GROUP BY source_event HAVING count(*) > 1) d"),
            0)
      << "an event booked twice";
}

/// A test with its own log table name and an empty bookings table on the test server, both
/// dropped before and after the test.
class PgBookingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    uri = pg_uri();
    ASSERT_FALSE(uri.empty());
    log = unique_table("log");
    bookings = unique_table("book");
    pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches");
    pg_exec(bookings_ddl(bookings));
  }
  void TearDown() override {
    if (!uri.empty())
      pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
  }

  /// The business write into this test's bookings table.
  PgBookingWriter booking_writer(std::atomic<int>* runs = nullptr) const {
    return {bookings, runs};
  }
  /// Bookings so far.
  std::int64_t booking_count() const {
    return pg_count_on(uri, "SELECT count(*) FROM " + bookings);
  }
  /// The three checks of `idemgate::test::expect_no_half_state` on this test's tables.
  void expect_no_half_state() const { test::expect_no_half_state(uri, log, bookings); }

  std::string uri, log, bookings;
};

}  // namespace idemgate::test
