// PostgresStore behind PgBouncer in transaction pooling mode (IDEMGATE_TEST_PGBOUNCER, started by
// scripts/test; the tests fail without it): why PostgresPooling::transaction is needed, and that
// it keeps nothing in the server's sessions, as another client of the same pool sees them. The last
// test needs only the server. The pools idemgate_pool1 and idemgate_pool2 of that PgBouncer hold
// exactly one and two server connections, so which connection a transaction gets is known.

#include "support/pg_fault_proxy.hpp"
#include "support/pgbouncer.hpp"
#include "support/postgres.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

using idemgate::CommitStatus;
using idemgate::Key;
using idemgate::PostgresOptions;
using idemgate::PostgresPooling;
using idemgate::PostgresStore;
using idemgate::Reservation;
namespace pq = idemgate::detail::pq;
namespace t = idemgate::test;
using namespace std::chrono_literals;

namespace {

class PgBouncerTransactionPooling : public ::testing::Test {
 protected:
  void SetUp() override {
    direct = t::pg_uri();
    bouncer = t::pgbouncer_uri();
    ASSERT_FALSE(direct.empty());
    ASSERT_FALSE(bouncer.empty());
    pool1 = t::with_database(bouncer, "idemgate_pool1");
    pool2 = t::with_database(bouncer, "idemgate_pool2");
    log = t::unique_table("pgb");
    t::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches");
    PostgresStore(direct, {.table = log}).migrate();
    forget_sessions();
  }
  void TearDown() override {
    if (direct.empty() || bouncer.empty()) return;
    forget_sessions();
    t::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches");
  }

  // Clears what earlier clients left in the sessions of the small pools: as many transactions
  // at once as a pool has server connections, so each of them runs on another one.
  void forget_sessions() const {
    for (const auto& [uri, size] : {std::pair{pool1, 1}, std::pair{pool2, 2}}) {
      std::vector<std::unique_ptr<pqxx::connection>> clients;
      std::vector<std::unique_ptr<pqxx::work>> held;
      for (int i = 0; i < size; ++i) {
        clients.push_back(std::make_unique<pqxx::connection>(uri));
        held.push_back(std::make_unique<pqxx::work>(*clients.back()));
        pq::exec(*held.back(), "DEALLOCATE ALL");
        pq::exec(*held.back(), "RESET ALL");
      }
      for (auto& tx : held) tx->commit();
    }
  }

  // What another client of the pool at `uri` sees of synchronous_commit.
  static std::string synchronous_commit_seen_through(const std::string& uri) {
    return t::pg_exec_on(uri, "SHOW synchronous_commit")[0][0].c_str();
  }

  // What another client of the pool at `uri` finds in the session of the server connection it
  // gets: the settings made in the session (a SET), named prepared statements, advisory locks,
  // LISTEN channels, temporary tables and open cursors, as one line of text.
  static std::string session_state_seen_through(const std::string& uri) {
    return t::pg_exec_on(
               uri,
               "SELECT 'settings: ' || coalesce((SELECT string_agg(name || '=' || setting, ', ' "
               "ORDER BY"
               " name) FROM pg_settings WHERE source = 'session'), '') ||"
               " '; prepared: ' || (SELECT count(*) FROM pg_prepared_statements) ||"
               " '; advisory locks: ' || (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
               " AND pid = pg_backend_pid()) ||"
               " '; channels: ' || (SELECT count(*) FROM pg_listening_channels()) ||"
               " '; temporary tables: ' || (SELECT count(*) FROM pg_class WHERE relnamespace ="
               " pg_my_temp_schema()) ||"
               " '; cursors: ' || (SELECT count(*) FROM pg_cursors)")[0][0]
        .c_str();
  }

  PostgresOptions options(PostgresPooling pooling) const {
    return {.table = log, .checkout_timeout = 5s, .pooling = pooling};
  }

  // A reservation and its commit; throws what the store throws.
  static void reserve_and_commit(PostgresStore& store, const Key& key) {
    const std::string request = "request";
    const Reservation reservation =
        store.reserve(key, idemgate::detail::sha256(request), request, 1min);
    ASSERT_EQ(reservation.kind, Reservation::Kind::acquired);
    ASSERT_EQ(store.commit(key, reservation.fence, "slot", [](pqxx::work&) {}),
              CommitStatus::committed);
  }

  std::string direct, bouncer, pool1, pool2, log;
};

// The error of a named statement that another client prepared on the same server connection
// (42P05), or that this client prepared on another one (26000).
bool is_lost_prepared_statement(const pqxx::sql_error& e) {
  const std::string state = pq::sqlstate(e);
  return state == "42P05" || state == "26000";
}

}  // namespace

TEST_F(PgBouncerTransactionPooling, NamedStatementsOfTwoClientsCollideOnOneServerConnection) {
  const Key key = idemgate::derive_key("pgbouncer", "collide");
  PostgresStore first(pool1, options(PostgresPooling::session));
  PostgresStore second(pool1, options(PostgresPooling::session));
  EXPECT_FALSE(first.find(key).has_value());  // prepares idemgate_find on the one connection
  try {
    (void)second.find(key);
    ADD_FAILURE() << "a second client prepared idemgate_find on the same server connection";
  } catch (const pqxx::sql_error& e) {
    EXPECT_EQ(pq::sqlstate(e), "42P05") << e.what();
  }

  PostgresStore third(pool1, options(PostgresPooling::transaction));
  PostgresStore fourth(pool1, options(PostgresPooling::transaction));
  EXPECT_FALSE(third.find(key).has_value());
  EXPECT_FALSE(fourth.find(key).has_value());
  reserve_and_commit(third, key);
  EXPECT_EQ(fourth.find(key)->status, idemgate::RecordStatus::committed);
}

TEST_F(PgBouncerTransactionPooling, NamedStatementIsMissingOnTheConnectionTheNextTransactionGets) {
  const Key key = idemgate::derive_key("pgbouncer", "missing");
  PostgresStore named(pool2, options(PostgresPooling::session));
  PostgresStore unnamed(pool2, options(PostgresPooling::transaction));
  EXPECT_FALSE(named.find(key).has_value());  // prepared, and run, on one server connection
  EXPECT_FALSE(unnamed.find(key).has_value());
  // Another client's transaction takes that connection (PgBouncer hands out the one released
  // last, server_round_robin = 0): the store's next statement runs on the other one.
  bool missing = false;
  for (int round = 0; round < 3 && !missing; ++round) {
    pqxx::connection other(pool2);
    pqxx::work held(other);
    pq::exec(held, "SELECT 1");
    try {
      (void)named.find(key);
    } catch (const pqxx::sql_error& e) {
      EXPECT_EQ(pq::sqlstate(e), "26000") << e.what();
      missing = true;
    }
    EXPECT_FALSE(unnamed.find(key).has_value()) << "unnamed statements run on any connection";
    held.commit();
  }
  EXPECT_TRUE(missing) << "the named statement ran on a connection it was not prepared on";
}

TEST_F(PgBouncerTransactionPooling, ConcurrentClientsWithNamedStatementsFailAndUnnamedOnesDoNot) {
  // Eight clients at once over two server connections: at most two of them can prepare a
  // statement under its name, the others meet it already prepared (or miss their own).
  constexpr int clients = 8;
  std::atomic<int> lost{0}, other_errors{0}, committed{0};
  auto race = [&](PostgresPooling pooling, const std::string& tag) {
    std::vector<std::unique_ptr<PostgresStore>> stores;
    for (int i = 0; i < clients; ++i)
      stores.push_back(std::make_unique<PostgresStore>(pool2, options(pooling)));
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i)
      threads.emplace_back([&, i] {
        try {
          reserve_and_commit(*stores[static_cast<std::size_t>(i)],
                             idemgate::derive_key("pgbouncer " + tag, std::to_string(i)));
          if (!::testing::Test::HasFailure()) committed.fetch_add(1);
        } catch (const pqxx::sql_error& e) {
          (is_lost_prepared_statement(e) ? lost : other_errors).fetch_add(1);
        } catch (const std::exception&) {
          other_errors.fetch_add(1);
        }
      });
    for (auto& thread : threads) thread.join();
  };

  race(PostgresPooling::session, "named");
  EXPECT_GE(lost.load(), clients - 2) << "named statements are lost between transactions";
  EXPECT_EQ(other_errors.load(), 0);

  const std::string count_committed = "SELECT count(*) FROM " + log + " WHERE status = 'committed'";
  const std::int64_t committed_named = t::pg_count(count_committed);
  EXPECT_LE(committed_named, 2);

  forget_sessions();
  lost = 0;
  committed = 0;
  race(PostgresPooling::transaction, "unnamed");
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_EQ(committed.load(), clients);
  EXPECT_EQ(t::pg_count(count_committed), committed_named + clients);
}

TEST_F(PgBouncerTransactionPooling, RelaxedReservationsLeaveNoSettingOnTheServerConnections) {
  {
    PostgresStore store(pool1, {.table = log,
                                .checkout_timeout = 5s,
                                .relaxed_reservations = true,
                                .pooling = PostgresPooling::transaction});
    reserve_and_commit(store, idemgate::derive_key("pgbouncer", "relaxed"));
    EXPECT_EQ(synchronous_commit_seen_through(pool1), "on")
        << "another client's commits wait for the WAL flush";
  }
  // What the option prevents: the relaxed pool's session-level SET stays on the one server
  // connection, and every other client of the pool commits without the flush from then on.
  PostgresStore leaky(pool1, {.table = log,
                              .checkout_timeout = 5s,
                              .relaxed_reservations = true,
                              .pooling = PostgresPooling::session});
  reserve_and_commit(leaky, idemgate::derive_key("pgbouncer", "leaky"));
  EXPECT_EQ(synchronous_commit_seen_through(pool1), "off");
}

TEST_F(PgBouncerTransactionPooling, EveryCallLeavesNothingInTheSessionOfTheServerConnection) {
  // The pool idemgate_pool1 has one server connection: the store's connections and another
  // client's all run their transactions on it. That client must find its session as it was
  // before the store came (no statement_timeout, no synchronous_commit, no prepared statement
  // or lock of the store's), after every kind of call the store makes.
  const std::string before = session_state_seen_through(pool1);
  EXPECT_NE(before.find("prepared: 0;"), std::string::npos) << before;
  {
    PostgresStore store(pool1, {.table = log,
                                .checkout_timeout = 5s,
                                .relaxed_reservations = true,
                                .pooling = PostgresPooling::transaction});
    store.migrate();
    // A relaxed outcome turns the flush off for its own commit transaction alone.
    PostgresStore relaxed_outcomes(pool1, {.table = log,
                                           .checkout_timeout = 5s,
                                           .relaxed_outcomes = true,
                                           .pooling = PostgresPooling::transaction});
    reserve_and_commit(relaxed_outcomes, idemgate::derive_key("pgbouncer session", "outcome"));
    const std::string request = "request";
    const auto fingerprint = idemgate::detail::sha256(request);
    const Key committed = idemgate::derive_key("pgbouncer session", "committed");
    reserve_and_commit(store, committed);
    const Key released = idemgate::derive_key("pgbouncer session", "released");
    const Reservation r = store.reserve(released, fingerprint, request, 1min);
    const idemgate::HeldLease held{released, r.fence};
    EXPECT_EQ(store.extend(std::span<const idemgate::HeldLease>(&held, 1), 1min), 1u);
    EXPECT_TRUE(store.release(released, r.fence, "503"));
    EXPECT_EQ(store.take_stale(10, 0s, 1min).size(), 1u);
    const Key failed = idemgate::derive_key("pgbouncer session", "failed");
    const Reservation f = store.reserve(failed, fingerprint, request, 1min);
    EXPECT_EQ(store.fail(failed, f.fence, "422"), CommitStatus::committed);
    EXPECT_EQ(store.redrive_failed(failed), 1u);
    const Key parked = idemgate::derive_key("pgbouncer session", "escalated");
    const Reservation p = store.reserve(parked, fingerprint, request, 1min);
    EXPECT_EQ(store.escalate(parked, p.fence, "no key support"), CommitStatus::committed);
    EXPECT_TRUE(store.resolve(parked, "slot", [](pqxx::work&) {}));
    // One event in one transaction sets its lock timeout for that transaction alone.
    const Key once = idemgate::derive_key("pgbouncer session", "one transaction");
    EXPECT_EQ(store
                  .commit_once(once, fingerprint, request, "", 250ms,
                               [](pqxx::work&) { return std::string("slot"); })
                  .kind,
              idemgate::OnceResult::Kind::committed);
    store.record_mismatch(committed, "slot", "another slot", "lost_lease");
    EXPECT_EQ(store.mismatches(10).size(), 1u);
    EXPECT_EQ(store.signals(1h).in_flight, 2);
    EXPECT_TRUE(store.find(committed).has_value());
    EXPECT_EQ(store.purge(1h, 10), 0u);
  }
  const std::string after = session_state_seen_through(pool1);
  EXPECT_EQ(after, before) << "the store left its session state on a server connection it shared";
  const auto statement_timeout = [](const std::string& uri) {
    return std::string(t::pg_exec_on(uri, "SHOW statement_timeout")[0][0].c_str());
  };
  EXPECT_EQ(statement_timeout(pool1), statement_timeout(direct))
      << "another client of the pool runs under the store's statement timeout";
}

TEST(TransactionPooling, ARelaxedReservationWhoseCommitReplyIsLostIsRecognisedOnTheNextConnection) {
  // Behind a transaction pooler a relaxed reservation is a transaction of its own; a COMMIT
  // whose answer is lost leaves libpqxx in doubt. The store tries again on a fresh connection,
  // where the holder token shows the row is this reservation's own.
  const std::string direct = t::pg_uri();
  ASSERT_FALSE(direct.empty());
  const std::string log = t::unique_table("pgbdoubt");
  t::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches");
  PostgresStore(direct, {.table = log}).migrate();
  t::PgFaultProxy proxy(direct);
  PostgresStore store(proxy.uri(), {.table = log,
                                    .checkout_timeout = 5s,
                                    .relaxed_reservations = true,
                                    .pooling = PostgresPooling::transaction});
  const Key key = idemgate::derive_key("pgbouncer", "in doubt");
  const std::string request = "request";
  proxy.arm(t::Fault::lose_reply, "COMMIT");
  const Reservation reservation =
      store.reserve(key, idemgate::detail::sha256(request), request, 1min);
  EXPECT_TRUE(proxy.wait_fired(5s));
  EXPECT_EQ(reservation.kind, Reservation::Kind::acquired);
  EXPECT_EQ(reservation.fence, 1);
  EXPECT_EQ(t::pg_count("SELECT count(*) FROM " + log + " WHERE status = 'in_flight'"), 1);
  t::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches");
}
