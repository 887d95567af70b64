// The wire-fault proxy itself, against the real server: what each fault does to a libpqxx
// session, and what it leaves on the server.

#include "support/pg_fault_proxy.hpp"
#include "support/postgres.hpp"

#include <idemgate/detail/postgres/pqxx_compat.hpp>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using idemgate::test::Fault;
using idemgate::test::pg_count;
using idemgate::test::pg_exec;
using idemgate::test::PgFaultProxy;
namespace pq = idemgate::detail::pq;
using namespace std::chrono_literals;

namespace {

class FaultProxy : public ::testing::Test {
 protected:
  void SetUp() override {
    uri = idemgate::test::pg_uri();
    ASSERT_FALSE(uri.empty());
    table = idemgate::test::unique_table("proxy");
    pg_exec("DROP TABLE IF EXISTS " + table + "; CREATE TABLE " + table + " (n int NOT NULL)");
    proxy = std::make_unique<PgFaultProxy>(uri);
  }
  void TearDown() override {
    proxy.reset();
    if (!uri.empty()) pg_exec("DROP TABLE IF EXISTS " + table);
  }

  /// Rows in the test's table, read on a direct connection.
  std::int64_t rows() { return pg_count("SELECT count(*) FROM " + table); }

  std::string insert(int n) const {
    return "INSERT INTO " + table + " VALUES (" + std::to_string(n) + ")";
  }

  std::string uri, table;
  std::unique_ptr<PgFaultProxy> proxy;
};

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

}  // namespace

TEST_F(FaultProxy, PassesAWholeSessionThroughUnchanged) {
  pqxx::connection c(proxy->uri());
  {
    pqxx::nontransaction tx(c);
    pq::exec(tx, insert(1));
    pq::exec_params(tx, "INSERT INTO " + table + " VALUES ($1)", 2);
  }
  pq::prepare(c, "proxy_insert", "INSERT INTO " + table + " VALUES ($1)");
  {
    pqxx::work tx(c);
    pq::exec_prepared(tx, "proxy_insert", 3);
    pq::exec(tx, insert(4));
    tx.commit();
  }
  pqxx::nontransaction tx(c);
  EXPECT_EQ(pq::int_field(pq::exec(tx, "SELECT sum(n) FROM " + table)[0][0]), 10);
  // Messages far larger than one read, both ways.
  const std::string big(3'000'000, 'x');
  EXPECT_EQ(pq::int_field(pq::exec_params(tx, "SELECT length($1)", big)[0][0]), 3'000'000);
  EXPECT_EQ(std::string(pq::exec(tx, "SELECT repeat('y', 3000000)")[0][0].c_str()).size(),
            3'000'000u);
  EXPECT_EQ(proxy->connections(), 1u);
  EXPECT_EQ(proxy->swallowed_bytes(), 0u);
  EXPECT_FALSE(proxy->fired()) << "nothing was armed";
}

TEST_F(FaultProxy, LostReplyOfAnAutocommitInsertLeavesTheRowAndBreaksTheConnection) {
  pqxx::connection c(proxy->uri());
  pqxx::nontransaction tx(c);
  proxy->arm(Fault::lose_reply, "INSERT INTO " + table);
  EXPECT_THROW(pq::exec(tx, insert(1)), pqxx::broken_connection);
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_GT(proxy->swallowed_bytes(), 0u);
  EXPECT_EQ(rows(), 1) << "the server ran and committed the insert";
}

TEST_F(FaultProxy, LostReplyOfCommitLeavesTheTransactionCommittedAndLibpqxxInDoubt) {
  pqxx::connection c(proxy->uri());
  pqxx::work tx(c);
  pq::exec(tx, insert(1));
  proxy->arm(Fault::lose_reply, "COMMIT");
  // libpqxx 6.4 reports a connection lost during COMMIT as in doubt, not as broken.
  EXPECT_THROW(tx.commit(), pqxx::in_doubt_error);
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(rows(), 1) << "the transaction committed on the server";
}

TEST_F(FaultProxy, CutOfCommitRollsTheTransactionBackAndLeavesLibpqxxInDoubt) {
  pqxx::connection c(proxy->uri());
  pqxx::work tx(c);
  pq::exec(tx, insert(1));
  proxy->arm(Fault::cut, "COMMIT");
  EXPECT_THROW(tx.commit(), pqxx::in_doubt_error);
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(rows(), 0) << "the server never got COMMIT";
}

TEST_F(FaultProxy, CutInTheMiddleOfAStatementWritesNothing) {
  pqxx::connection c(proxy->uri());
  pqxx::nontransaction tx(c);
  proxy->arm(Fault::cut, "INSERT INTO " + table);
  EXPECT_THROW(pq::exec(tx, insert(1)), pqxx::broken_connection);
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(rows(), 0) << "an autocommit insert the server had run would be there";
}

TEST_F(FaultProxy, FaultOnAPreparedStatementFiresAtItsBindNotAtItsPreparation) {
  pqxx::connection c(proxy->uri());
  pq::prepare(c, "proxy_insert", "INSERT INTO " + table + " VALUES ($1)");
  pqxx::nontransaction tx(c);
  proxy->arm(Fault::cut, "proxy_insert");
  EXPECT_THROW(pq::exec_prepared(tx, "proxy_insert", 1), pqxx::broken_connection);
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(rows(), 0);

  pqxx::connection again(proxy->uri());
  pq::prepare(again, "proxy_insert", "INSERT INTO " + table + " VALUES ($1)");
  pqxx::nontransaction tx2(again);
  proxy->arm(Fault::lose_reply, "proxy_insert");
  EXPECT_THROW(pq::exec_prepared(tx2, "proxy_insert", 2), pqxx::broken_connection);
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(rows(), 1) << "the prepared insert ran; only its answer was lost";
}

TEST_F(FaultProxy, SkipLetsTheFirstMatchesThrough) {
  pqxx::connection c(proxy->uri());
  pqxx::nontransaction tx(c);
  proxy->arm(Fault::lose_reply, "INSERT INTO " + table, 2);
  pq::exec(tx, insert(1));
  pq::exec(tx, insert(2));
  EXPECT_FALSE(proxy->fired());
  EXPECT_THROW(pq::exec(tx, insert(3)), pqxx::broken_connection);
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(rows(), 3);
}

TEST_F(FaultProxy, TwoArmedFaultsFireOnTwoMatchesInTurn) {
  proxy->arm(Fault::cut, "INSERT INTO " + table);
  proxy->arm(Fault::cut, "INSERT INTO " + table);
  for (int attempt = 0; attempt < 2; ++attempt) {
    pqxx::connection c(proxy->uri());
    pqxx::nontransaction tx(c);
    EXPECT_THROW(pq::exec(tx, insert(attempt)), pqxx::broken_connection);
  }
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(proxy->fired_count(), 2u);
  pqxx::connection c(proxy->uri());
  pqxx::nontransaction tx(c);
  pq::exec(tx, insert(3));
  EXPECT_EQ(rows(), 1) << "both cut inserts are missing, the third one is there";
}

TEST_F(FaultProxy, DelayHoldsEveryMessageInOrder) {
  pqxx::connection c(proxy->uri());
  pqxx::nontransaction tx(c);
  proxy->delay(100ms);
  const auto started = std::chrono::steady_clock::now();
  for (int i = 1; i <= 3; ++i) pq::exec(tx, insert(i));
  EXPECT_TRUE(pq::bool_field(
      pq::exec(tx, "SELECT string_agg(n::text, ',' ORDER BY n) = '1,2,3' FROM " + table)[0][0]));
  // Four round trips, each held 100 ms on the way out and 100 ms on the way back.
  EXPECT_GE(std::chrono::steady_clock::now() - started, 800ms);
  EXPECT_GE(proxy->delayed_messages(), 8u);
  proxy->delay(0ms);
  pq::exec(tx, insert(4));
  EXPECT_EQ(rows(), 4);
}

TEST_F(FaultProxy, BlackholeEatsAStatementAndClosesItsConnectionWhenItEnds) {
  pqxx::connection c(proxy->uri());
  pqxx::nontransaction tx(c);
  const auto started = std::chrono::steady_clock::now();
  proxy->blackhole(500ms);
  EXPECT_THROW(pq::exec(tx, insert(1)), pqxx::broken_connection);
  EXPECT_GE(std::chrono::steady_clock::now() - started, 500ms) << "nothing came back meanwhile";
  EXPECT_GT(proxy->swallowed_bytes(), 0u);
  EXPECT_EQ(rows(), 0) << "nothing reached the server";

  pqxx::connection after(proxy->uri());
  pqxx::nontransaction tx2(after);
  pq::exec(tx2, insert(2));
  EXPECT_EQ(rows(), 1) << "the proxy carries on after the blackhole";
}

TEST_F(FaultProxy, BlackholeKeepsANewConnectionFromCompletingUntilHealed) {
  proxy->blackhole(1h);
  // libpq's own connect timeout (at least 2 s) is the only thing that ends the wait.
  EXPECT_THROW(pqxx::connection(proxy->uri() + "&connect_timeout=2"), pqxx::broken_connection);
  proxy->heal();
  pqxx::connection c(proxy->uri() + "&connect_timeout=2");
  pqxx::nontransaction tx(c);
  pq::exec(tx, insert(1));
  EXPECT_EQ(rows(), 1);
}

TEST_F(FaultProxy, AnswersAnSslRequestWithNoSoTheClientGoesOnInTheClear) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(proxy->port());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const unsigned char ssl_request[8] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
  ASSERT_EQ(::send(fd, ssl_request, sizeof ssl_request, 0), 8);
  char answer = 0;
  EXPECT_EQ(::recv(fd, &answer, 1, 0), 1);
  EXPECT_EQ(answer, 'N');
  ::close(fd);

  // libpq asks for TLS first under sslmode=prefer; after 'N' the session runs as usual.
  pqxx::connection c("postgresql://postgres@127.0.0.1:" + std::to_string(proxy->port()) +
                     "/postgres?sslmode=prefer&gssencmode=disable");
  pqxx::nontransaction tx(c);
  pq::exec(tx, insert(1));
  EXPECT_EQ(rows(), 1);
}

TEST_F(FaultProxy, ConcurrentSessionsRunSideBySideWhileAFaultFires) {
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      try {
        pqxx::connection c(proxy->uri());
        pqxx::nontransaction tx(c);
        for (int i = 0; i < 30; ++i) pq::exec(tx, insert(t * 100 + i));
      } catch (const std::exception&) {
        ++failures;
      }
    });
  proxy->arm(Fault::lose_reply, "SELECT 'marker'");
  pqxx::connection c(proxy->uri());
  pqxx::nontransaction tx(c);
  EXPECT_THROW(pq::exec(tx, "SELECT 'marker'"), pqxx::broken_connection);
  for (auto& client : clients) client.join();
  EXPECT_TRUE(proxy->wait_fired(5s));
  EXPECT_EQ(failures.load(), 0) << "only the marked session was hit";
  EXPECT_EQ(rows(), 120);
  EXPECT_EQ(proxy->connections(), 5u);
}

TEST_F(FaultProxy, DestructionClosesEveryConnectionAndLeaksNoDescriptor) {
  proxy.reset();
  const std::size_t before = open_fds();
  {
    auto local = std::make_unique<PgFaultProxy>(uri);
    pqxx::connection c(local->uri());
    {
      pqxx::nontransaction tx(c);
      pq::exec(tx, insert(1));
    }
    local.reset();
    // libpqxx 6.4 tries to reconnect when the next transaction opens: that fails too.
    EXPECT_THROW(
        {
          pqxx::nontransaction tx(c);
          pq::exec(tx, insert(2));
        },
        pqxx::broken_connection);
  }
  EXPECT_EQ(open_fds(), before);
  EXPECT_EQ(rows(), 1);
}
