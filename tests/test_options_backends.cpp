// The options of the PostgreSQL store and of the HTTP downstream at their extremes, and the
// PostgreSQL store given hostile durations: each is refused with its range, or honoured
// exactly; none overflows PostgreSQL's interval arithmetic. The PostgreSQL half needs
// IDEMGATE_TEST_PG (scripts/test starts a server).

#include "support/fake_terminal.hpp"
#include "support/option_samples.hpp"
#include "support/slot_request.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/retention.hpp>

#if IDEMGATE_TEST_OPTIONS_POSTGRES
#include "support/pg_bookings.hpp"
#include "support/postgres.hpp"

#include <idemgate/store/postgres.hpp>
#endif
#if IDEMGATE_TEST_OPTIONS_HTTP
#include <idemgate/downstream/http.hpp>
#endif

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

using idemgate::Key;
using idemgate::RecordStatus;
using idemgate::Reservation;
using idemgate::Status;
using idemgate::test::expect_refused;
using idemgate::test::extremes;
using idemgate::test::Sample;
using idemgate::test::size_extremes;
using namespace std::chrono_literals;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

const Key key = idemgate::derive_key("options", "first");
const Key other_key = idemgate::derive_key("options", "second");
const auto fingerprint = idemgate::detail::sha256("request");

}  // namespace

#if IDEMGATE_TEST_OPTIONS_POSTGRES

using idemgate::PostgresOptions;
using idemgate::PostgresStore;
using idemgate::test::pg_count;
using idemgate::test::pg_exec;

namespace {

class PostgresOptionsTest : public idemgate::test::PgBookingsTest {
 protected:
  std::unique_ptr<PostgresStore> make_store() {
    auto store = std::make_unique<PostgresStore>(uri, PostgresOptions{.table = log});
    store->migrate();
    return store;
  }

  /// Moves every timestamp of the log `years` into the past.
  void age_rows(int years) {
    const std::string by = std::to_string(years) + " years'";
    pg_exec("UPDATE " + log + " SET created_at = created_at - interval '" + by +
            ", updated_at = updated_at - interval '" + by +
            ", lease_until = lease_until - interval '" + by);
  }

  std::int64_t rows() { return pg_count("SELECT count(*) FROM " + log); }
};

// The options are checked before anything connects: an unreachable server still gets the
// range error, not a connection error.
constexpr const char* nowhere = "postgresql://nobody@127.0.0.1:1/nothing";

}  // namespace

TEST_F(PostgresOptionsTest, PoolSizeOutsideOneToAThousandIsRefused) {
  for (const auto& [value, label] : std::vector<Sample<std::size_t>>{
           {0, "0"}, {1001, "1001"}, {std::numeric_limits<std::size_t>::max(), "max()"}})
    expect_refused([&] { PostgresStore store(nowhere, {.pool_size = value}); },
                   "PostgresOptions::pool_size", "between 1 and 1000", label);
  EXPECT_NO_THROW((PostgresStore(uri, {.table = log, .pool_size = 1000})));
}

TEST_F(PostgresOptionsTest, CheckoutTimeoutOutsideOneMillisecondToAnHourIsRefused) {
  auto samples = extremes<milliseconds>();
  samples.push_back({1h + 1ms, "an hour and 1 ms"});
  for (const auto& [value, label] : samples)
    expect_refused([&] { PostgresStore store(nowhere, {.checkout_timeout = value}); },
                   "PostgresOptions::checkout_timeout", "between 1 ms and 1 h", label);
  EXPECT_NO_THROW((PostgresStore(uri, {.table = log, .checkout_timeout = 1ms})));
  EXPECT_NO_THROW((PostgresStore(uri, {.table = log, .checkout_timeout = 1h})));
}

TEST_F(PostgresOptionsTest, CommitAttemptsOutsideOneToAHundredIsRefused) {
  for (const auto& [value, label] :
       std::vector<Sample<int>>{{0, "0"},
                                {-1, "-1"},
                                {101, "101"},
                                {std::numeric_limits<int>::min(), "min()"},
                                {std::numeric_limits<int>::max(), "max()"}})
    expect_refused([&] { PostgresStore store(nowhere, {.commit_attempts = value}); },
                   "PostgresOptions::commit_attempts", "between 1 and 100", label);
  EXPECT_NO_THROW((PostgresStore(uri, {.table = log, .commit_attempts = 1})));
  EXPECT_NO_THROW((PostgresStore(uri, {.table = log, .commit_attempts = 100})));
}

// Relaxed reservations and relaxed outcomes each keep one of an event's two commits durable;
// both together would ack an event that a database crash can erase without a trace.
TEST_F(PostgresOptionsTest, RelaxedReservationsAndRelaxedOutcomesTogetherAreRefused) {
  expect_refused(
      [&] {
        PostgresStore store(nowhere, {.relaxed_reservations = true, .relaxed_outcomes = true});
      },
      "PostgresOptions::relaxed_reservations and relaxed_outcomes", "turn one of them off",
      "both on");
  EXPECT_TRUE(
      PostgresStore(uri, {.table = log, .relaxed_reservations = true}).relaxed_reservations());
  EXPECT_TRUE(PostgresStore(uri, {.table = log, .relaxed_outcomes = true}).relaxed_outcomes());
}

TEST_F(PostgresOptionsTest, PurgeOlderThanMaxDeletesNothing) {
  auto store = make_store();
  const Reservation r = store->reserve(key, fingerprint, "request", 1min);
  ASSERT_EQ(store->commit(key, r.fence, "slot-1", [](pqxx::work&) {}),
            idemgate::CommitStatus::committed);
  age_rows(500);
  EXPECT_EQ(store->purge(seconds::max(), 10), 0u);
  EXPECT_EQ(rows(), 1);
  EXPECT_EQ(store->purge(std::chrono::days(365 * 100), 10), 1u) << "the row was old enough";
}

TEST_F(PostgresOptionsTest, PurgeOlderThanMinDoesNotOverflowAndKeepsInFlightRows) {
  auto store = make_store();
  const Reservation r = store->reserve(key, fingerprint, "request", 1min);
  (void)store->commit(key, r.fence, "slot-1", [](pqxx::work&) {});
  (void)store->reserve(other_key, fingerprint, "request", 1min);
  EXPECT_EQ(store->purge(seconds::min(), 10), 1u)
      << "older than a negative age: every finished row";
  EXPECT_EQ(rows(), 1);
  EXPECT_EQ(store->find(other_key)->status, RecordStatus::in_flight);
}

TEST_F(PostgresOptionsTest, RetentionKeepingForeverLeavesARedeliveryADuplicate) {
  auto store = make_store();
  idemgate::test::FakeTerminal<> terminal;
  idemgate::Gate gate{"ect.claim_slot", *store, terminal,
                      [](pqxx::work&, const idemgate::test::SlotRequest&, const std::string&) {}};
  const idemgate::test::SlotRequest request{"MSKU7000037", "2025-06-09T07:00"};
  ASSERT_EQ(gate.process(key, request).status(), Status::processed);
  age_rows(500);
  idemgate::Retention retention{gate.store(), {.keep = seconds::max()}};
  EXPECT_EQ(retention.run_once(), 0u);
  EXPECT_EQ(gate.process(key, request).status(), Status::duplicate);
  EXPECT_EQ(terminal.calls(), 1) << "the downstream was called once";
}

TEST_F(PostgresOptionsTest, StaleAfterMaxTakesNothing) {
  auto store = make_store();
  (void)store->reserve(key, fingerprint, "request", 1ms);
  age_rows(500);
  EXPECT_TRUE(store->take_stale(10, milliseconds::max(), 1min).empty());
  EXPECT_EQ(store->take_stale(10, 0ms, 1min).size(), 1u) << "the row was stranded";
}

TEST_F(PostgresOptionsTest, LeaseOfMaxIsNeverTakenOver) {
  auto store = make_store();
  ASSERT_EQ(store->reserve(key, fingerprint, "request", milliseconds::max()).kind,
            Reservation::Kind::acquired);
  EXPECT_EQ(
      pg_count("SELECT count(*) FROM " + log + " WHERE lease_until > now() + interval '999 years'"),
      1);
  const Reservation again = store->reserve(key, fingerprint, "request", 1min);
  EXPECT_EQ(again.kind, Reservation::Kind::existing);
  EXPECT_EQ(again.status, RecordStatus::in_flight);
  EXPECT_TRUE(store->take_stale(10, 0ms, 1min).empty());

  const idemgate::ReserveItem item{other_key, fingerprint, "request"};
  const auto batch = store->reserve_batch({&item, 1}, milliseconds::max());
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].kind, Reservation::Kind::acquired);
  EXPECT_EQ(
      pg_count("SELECT count(*) FROM " + log + " WHERE lease_until > now() + interval '999 years'"),
      2);
}

TEST_F(PostgresOptionsTest, LeaseOfMaxGrantedByTakeStaleIsNeverTakenOver) {
  auto store = make_store();
  (void)store->reserve(key, fingerprint, "request", 1ms);
  age_rows(1);
  ASSERT_EQ(store->take_stale(10, 0ms, milliseconds::max()).size(), 1u);
  EXPECT_TRUE(store->take_stale(10, 0ms, 1min).empty());
  EXPECT_EQ(store->reserve(key, fingerprint, "request", 1min).kind, Reservation::Kind::existing);
}

TEST_F(PostgresOptionsTest, LeaseOfMinHasAlreadyExpired) {
  auto store = make_store();
  ASSERT_EQ(store->reserve(key, fingerprint, "request", milliseconds::min()).kind,
            Reservation::Kind::acquired);
  EXPECT_EQ(store->reserve(key, fingerprint, "request", 1min).kind, Reservation::Kind::taken_over);
}

TEST_F(PostgresOptionsTest, SignalsOverTheLongestWindowCountEverything) {
  auto store = make_store();
  (void)store->reserve(key, fingerprint, "request", 1min);
  (void)store->reserve(key, fingerprint, "request", 1min);
  age_rows(500);
  const idemgate::StoreSignals all = store->signals(seconds::max());
  EXPECT_EQ(all.events, 2);
  EXPECT_EQ(all.duplicates, 1);
  EXPECT_EQ(store->signals(seconds::min()).events, 0);
}

#endif  // IDEMGATE_TEST_OPTIONS_POSTGRES

#if IDEMGATE_TEST_OPTIONS_HTTP

namespace {

using PlainDownstream = idemgate::HttpDownstream<idemgate::detail::PlainTextMapping>;

/// A downstream at `url` with default options but `field` set to `value`.
template <class T>
PlainDownstream with(const std::string& url, T idemgate::HttpOptions::*field, T value) {
  idemgate::HttpOptions options;
  options.*field = value;
  return PlainDownstream(url, std::move(options));
}

/// A loopback server that answers every POST with `status` and `body`.
class Answering {
 public:
  Answering(int status, std::string body) {
    server_.Post("/", [status, body](const httplib::Request&, httplib::Response& res) {
      res.status = status;
      res.set_content(body, "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) throw std::runtime_error("cannot bind 127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~Answering() {
    server_.stop();
    thread_.join();
  }
  Answering(const Answering&) = delete;
  Answering& operator=(const Answering&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace

TEST(HttpOptionsRange, TimeoutsOutsideOneMillisecondToADayAreRefused) {
  using idemgate::HttpOptions;
  auto samples = extremes<milliseconds>();
  samples.push_back({24h + 1ms, "a day and 1 ms"});
  for (const auto& [field, option] :
       std::vector<std::pair<milliseconds HttpOptions::*, std::string>>{
           {&HttpOptions::connect_timeout, "HttpOptions::connect_timeout"},
           {&HttpOptions::read_timeout, "HttpOptions::read_timeout"},
           {&HttpOptions::write_timeout, "HttpOptions::write_timeout"}})
    for (const auto& [value, label] : samples)
      expect_refused([&] { (void)with("http://127.0.0.1:1", field, value); }, option,
                     "between 1 ms and 24 h", label);
}

TEST(HttpOptionsRange, TimeoutsOfADayAreHonoured) {
  Answering server(200, "slot-1");
  idemgate::HttpOptions options;
  options.connect_timeout = options.read_timeout = options.write_timeout = 24h;
  const PlainDownstream patient(server.url(), options);
  const auto answer = patient.claim("claim", key);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer.outcome(), "slot-1");
}

TEST(HttpOptionsRange, ReasonExcerptBytesAboveSixtyFourKiBIsRefusedAndZeroQuotesNothing) {
  const auto field = &idemgate::HttpOptions::reason_excerpt_bytes;
  for (const auto& [value, label] : std::vector<Sample<std::size_t>>{
           {64 * 1024 + 1, "64 KiB + 1"}, {std::numeric_limits<std::size_t>::max(), "max()"}})
    expect_refused([&] { (void)with("http://127.0.0.1:1", field, value); },
                   "HttpOptions::reason_excerpt_bytes", "between 0 and 65536", label);

  Answering server(422, "card declined: insufficient funds");
  const auto silent = with(server.url(), field, std::size_t{0}).claim("c", key);
  ASSERT_TRUE(silent.permanent());
  EXPECT_EQ(silent.reason().find("card declined"), std::string::npos) << silent.reason();
  const auto full = with(server.url(), field, std::size_t{64 * 1024}).claim("c", key);
  ASSERT_TRUE(full.permanent());
  EXPECT_NE(full.reason().find("card declined: insufficient funds"), std::string::npos)
      << full.reason();
}

TEST(HttpOptionsRange, ConfigurationStatusesOutsideFourHundredsAreRefused) {
  const auto field = &idemgate::HttpOptions::configuration_statuses;
  for (const auto& [value, label] :
       std::vector<Sample<std::vector<int>>>{{{500}, "500"},
                                             {{-1}, "-1"},
                                             {{399}, "399"},
                                             {{std::numeric_limits<int>::max()}, "max()"}})
    expect_refused([&] { (void)with("http://127.0.0.1:1", field, value); },
                   "HttpOptions::configuration_statuses", "between 400 and 499", label);
  Answering server(404, "no such route");
  EXPECT_TRUE(with(server.url(), field, std::vector<int>{}).claim("c", key).permanent())
      << "an empty list stores every 4xx as permanent";
  EXPECT_TRUE(with(server.url(), field, std::vector<int>{404}).claim("c", key).transient());
}

TEST(HttpOptionsRange, ConnectionPoolOutsideItsRangesIsRefused) {
  using idemgate::HttpOptions;
  for (const auto& [value, label] : std::vector<Sample<std::size_t>>{
           {0, "0"}, {1025, "1025"}, {std::numeric_limits<std::size_t>::max(), "max()"}})
    expect_refused([&] { (void)with("http://127.0.0.1:1", &HttpOptions::max_connections, value); },
                   "HttpOptions::max_connections", "between 1 and 1024", label);
  auto samples = extremes<milliseconds>();
  samples.push_back({24h + 1ms, "a day and 1 ms"});
  for (const auto& [value, label] : samples)
    expect_refused([&] { (void)with("http://127.0.0.1:1", &HttpOptions::idle_timeout, value); },
                   "HttpOptions::idle_timeout", "between 1 ms and 24 h", label);
}

TEST(HttpOptionsRange, ConnectionPoolAtItsExtremesIsHonoured) {
  Answering server(200, "slot-1");
  idemgate::HttpOptions options;
  options.max_connections = 1;
  options.idle_timeout = 1ms;
  EXPECT_TRUE(PlainDownstream(server.url(), options).claim("c", key).ok());
  options.max_connections = idemgate::HttpOptions::max_connections_limit;
  options.idle_timeout = 24h;
  const PlainDownstream wide(server.url(), options);
  EXPECT_TRUE(wide.claim("c", key).ok());
  EXPECT_TRUE(wide.claim("c", key).ok());
}

#endif  // IDEMGATE_TEST_OPTIONS_HTTP
