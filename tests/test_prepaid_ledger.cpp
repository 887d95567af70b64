// The prepaid ledger example as its users meet it: the real server binary on 127.0.0.1, signed
// Standard Webhooks deliveries over HTTP, on SQLite and on PostgreSQL. The seed's duplicate
// table, every refusal (and that it wrote nothing), a process killed inside an event's
// transaction, and 10,000 events with 30% replays.

#include <common/json.hpp>
#include "support/child_process.hpp"
#include "support/postgres.hpp"

#include <idemgate/store/postgres.hpp>
#include <idemgate/store/sqlite.hpp>
#include <idemgate/webhook/standard.hpp>

#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace json = example::json;

constexpr const char* secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
// What the admin views answer to; every server these tests start gets it from the environment.
constexpr const char* admin_token = "test-admin-token-5f1c9a0e27b4";
constexpr const char* admin_token_variable = "PREPAID_LEDGER_ADMIN_TOKEN";

std::int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string sent(const std::string& account, const std::string& message_id, std::int64_t cost) {
  return R"({"type":"message.sent","data":{"account":")" + account + R"(","message_id":")" +
         message_id + R"(","cost_cents":)" + std::to_string(cost) + "}}";
}

std::string received(const std::string& account, const std::string& message_id) {
  return R"({"type":"message.received","data":{"account":")" + account + R"(","message_id":")" +
         message_id + R"(","from":"+31612345678","text":"Hoi, klopt mijn saldo?"}})";
}

/// What the server answered: the HTTP status and the body's "status" or "error".
struct Answer {
  int http = 0;
  std::string word;
};

/// A keep-alive client that signs its deliveries with the endpoint's secret.
class Sender {
 public:
  explicit Sender(int port) : client_("127.0.0.1", port), signer_(secret) {
    client_.set_keep_alive(true);
    client_.set_tcp_nodelay(true);
    client_.set_connection_timeout(5);
    client_.set_read_timeout(20);
  }

  /// Posts `body` as event `id`, signed at `timestamp` (now by default).
  Answer deliver(const std::string& id, const std::string& body,
                 std::optional<std::int64_t> timestamp = std::nullopt) {
    const std::int64_t at = timestamp.value_or(now_seconds());
    return post({{"webhook-id", id},
                 {"webhook-timestamp", std::to_string(at)},
                 {"webhook-signature", signer_.sign(id, at, body)}},
                body);
  }

  /// Delivers like a real sender: tries again while the server says "in flight" or "retry".
  Answer deliver_until_settled(const std::string& id, const std::string& body) {
    for (int attempt = 0;; ++attempt) {
      Answer answer = deliver(id, body);
      if ((answer.http != 409 || answer.word != "in_flight") && answer.http != 503) return answer;
      if (attempt >= 50) return answer;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  /// Posts with exactly these headers.
  Answer post(const httplib::Headers& headers, const std::string& body) {
    const auto res = client_.Post("/webhooks", headers, body, "application/json");
    if (!res) return {0, "no answer: " + httplib::to_string(res.error())};
    const auto document = json::parse(res->body);
    Answer answer{res->status, {}};
    if (document)
      answer.word = json::string_member(*document, "status")
                        .value_or(json::string_member(*document, "error").value_or(""));
    return answer;
  }

  /// `GET /accounts/{account}`: the parsed account, or nullopt on 404.
  std::optional<json::Json> account(const std::string& account) {
    const auto res = client_.Get(("/accounts/" + account).c_str(), admin_headers());
    if (!res) {
      ADD_FAILURE() << "GET /accounts/" << account << " got no answer";
      return std::nullopt;
    }
    if (res->status == 404) return std::nullopt;
    EXPECT_EQ(res->status, 200) << res->body;
    auto document = json::parse(res->body);
    EXPECT_TRUE(document.has_value()) << res->body;
    return document;
  }

  /// `GET /stats`: the server's answer counters.
  json::Json stats() {
    const auto res = client_.Get("/stats", admin_headers());
    if (!res || res->status != 200) {
      ADD_FAILURE() << "GET /stats failed";
      return {};
    }
    return json::parse(res->body).value_or(json::Json{});
  }

  /// The signer (same secret as the server).
  const idemgate::StandardWebhookVerifier& signer() const { return signer_; }

  /// A GET with exactly these headers: the status and the body.
  std::pair<int, std::string> get(const std::string& path, const httplib::Headers& headers) {
    const auto res = client_.Get(path.c_str(), headers);
    if (!res) return {0, "no answer: " + httplib::to_string(res.error())};
    return {res->status,
            res->body + (res->has_header("WWW-Authenticate")
                             ? " WWW-Authenticate: " + res->get_header_value("WWW-Authenticate")
                             : std::string())};
  }

 private:
  static httplib::Headers admin_headers() {
    return {{"Authorization", std::string("Bearer ") + admin_token}};
  }

  httplib::Client client_;
  idemgate::StandardWebhookVerifier signer_;
};

/// The parts of an account the tests look at.
struct Ledger {
  std::int64_t balance = 0;
  struct Debit {
    std::int64_t id;
    std::string event_id, message_id;
    std::int64_t cost;
  };
  struct Inbox {
    std::int64_t id;
    std::string event_id, message_id;
  };
  struct Event {
    std::string event_id, kind;
    std::int64_t entry_id;
    std::string message_id;
    bool reused;
  };
  std::vector<Debit> debits;
  std::vector<Inbox> inbox;
  std::vector<Event> events;

  const Event* event(const std::string& id) const {
    for (const Event& e : events)
      if (e.event_id == id) return &e;
    return nullptr;
  }
};

Ledger read_ledger(const json::Json& v) {
  Ledger out;
  out.balance = json::integer_member(v, "balance_cents").value_or(-1);
  for (const json::Json& d : v.at("debits"))
    out.debits.push_back({d.at("debit_id").get<std::int64_t>(), d.at("event_id").get<std::string>(),
                          d.at("message_id").get<std::string>(),
                          d.at("cost_cents").get<std::int64_t>()});
  for (const json::Json& r : v.at("inbox"))
    out.inbox.push_back({r.at("inbox_id").get<std::int64_t>(), r.at("event_id").get<std::string>(),
                         r.at("message_id").get<std::string>()});
  for (const json::Json& e : v.at("events"))
    out.events.push_back({e.at("event_id").get<std::string>(), e.at("kind").get<std::string>(),
                          e.at("entry_id").get<std::int64_t>(),
                          e.at("message_id").get<std::string>(), e.at("reused").get<bool>()});
  return out;
}

/// The server binary, started on an ephemeral port; killed when destroyed.
class LedgerProcess {
 public:
  explicit LedgerProcess(std::vector<std::string> args) : child_(with_binary(std::move(args))) {
    const std::string line = child_.read_line();
    const std::string prefix = "listening on 127.0.0.1:";
    if (!line.starts_with(prefix))
      throw std::runtime_error("prepaid_ledger did not start; its first line was \"" + line + "\"");
    port_ = std::stoi(line.substr(prefix.size()));
  }

  int port() const { return port_; }
  idemgate::test::ChildProcess& child() { return child_; }

 private:
  static std::vector<std::string> with_binary(std::vector<std::string> args) {
    args.insert(args.begin(), PREPAID_LEDGER_PATH);
    return args;
  }

  idemgate::test::ChildProcess child_;
  int port_ = 0;
};

enum class Backend { sqlite, postgres };

void PrintTo(Backend backend, std::ostream* out) {
  *out << (backend == Backend::sqlite ? "SQLite" : "PostgreSQL");
}

// A new directory for an SQLite file, in RAM where the system has a shared-memory filesystem:
// these tests check what the ledger writes under concurrency, not how fast the disk syncs (on a
// virtual disk, the two syncs per event would cap the load test near 200 events a second).
std::string scratch_directory() {
  for (const std::filesystem::path& base :
       {std::filesystem::path("/dev/shm"), std::filesystem::temp_directory_path()}) {
    std::string pattern = (base / "prepaid_ledger_test.XXXXXX").string();
    if (std::filesystem::is_directory(base) && mkdtemp(pattern.data()) != nullptr) return pattern;
  }
  return {};
}

/// Each test gets its own database: a file in a new directory, or a new PostgreSQL database.
class PrepaidLedgerTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    setenv(admin_token_variable, admin_token, 1);
    if (GetParam() == Backend::sqlite) {
      directory_ = scratch_directory();
      ASSERT_FALSE(directory_.empty());
      store_ = "sqlite:" + directory_ + "/ledger.db";
      return;
    }
    const std::string base = idemgate::test::pg_uri();
    ASSERT_FALSE(base.empty()) << "the PostgreSQL half of this suite needs IDEMGATE_TEST_PG";
    static std::atomic<int> serial{0};
    database_ = "prepaid_ledger_" + std::to_string(getpid()) + "_" + std::to_string(serial++);
    idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + database_ + " WITH (FORCE)");
    idemgate::test::pg_exec("CREATE DATABASE " + database_);
    const auto slash = base.rfind('/');
    const auto query = base.find('?', slash);
    store_ = base.substr(0, slash + 1) + database_ +
             (query == std::string::npos ? std::string() : base.substr(query));
  }

  void TearDown() override {
    server_.reset();
    if (!directory_.empty()) std::filesystem::remove_all(directory_);
    if (!database_.empty())
      idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + database_ + " WITH (FORCE)");
  }

  /// Starts (or restarts) the server on this test's store.
  LedgerProcess& start(std::vector<std::string> extra = {}) {
    server_.reset();
    std::vector<std::string> args = {"--port", "0", "--secret", secret, "--store", store_};
    args.insert(args.end(), extra.begin(), extra.end());
    server_ = std::make_unique<LedgerProcess>(std::move(args));
    return *server_;
  }

  /// The idempotency log's row for event `event_id`, read from the database by a store of our
  /// own (the server may be running or not).
  std::optional<idemgate::Record> log_row(const std::string& event_id) {
    const idemgate::Key key = idemgate::derive_key("iosor.webhook", event_id);
    if (GetParam() == Backend::sqlite) {
      idemgate::SqliteStore store{store_.substr(7)};
      return store.for_gate("prepaid.ledger").find(key);
    }
    idemgate::PostgresStore store{store_};
    return store.for_gate("prepaid.ledger").find(key);
  }

  /// The account as the server shows it; fails the test on 404.
  Ledger ledger(Sender& sender, const std::string& account) {
    const auto document = sender.account(account);
    if (!document) {
      ADD_FAILURE() << "account " << account << " is unknown";
      return {};
    }
    return read_ledger(*document);
  }

  std::string store_;
  std::string directory_;
  std::string database_;
  std::unique_ptr<LedgerProcess> server_;
};

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::sqlite ? "Sqlite" : "Postgres";
}

// --- the buyer checklist ------------------------------------------------------------------------

TEST_P(PrepaidLedgerTest, ForcedSignedReplayOnDebitedAccountLeavesOneDebitRowAndOneInboxRow) {
  Sender sender(start().port());
  ASSERT_EQ(sender.deliver("evt_sent_1", sent("acc_1", "m_1", 7)).word, "accepted");
  ASSERT_EQ(sender.deliver("evt_recv_1", received("acc_1", "m_2")).word, "accepted");
  // The account is debited. Force one signed replay of each event, inside the window.
  const Answer debit_replay = sender.deliver("evt_sent_1", sent("acc_1", "m_1", 7));
  const Answer inbox_replay = sender.deliver("evt_recv_1", received("acc_1", "m_2"));
  EXPECT_EQ(debit_replay.http, 200);
  EXPECT_EQ(debit_replay.word, "duplicate");
  EXPECT_EQ(inbox_replay.http, 200);
  EXPECT_EQ(inbox_replay.word, "duplicate");

  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 2000 - 7);
  ASSERT_EQ(account.debits.size(), 1u);
  ASSERT_EQ(account.inbox.size(), 1u);
  // The export: the event id beside the ledger id, both ways.
  EXPECT_EQ(account.debits[0].event_id, "evt_sent_1");
  EXPECT_EQ(account.debits[0].message_id, "m_1");
  EXPECT_EQ(account.debits[0].cost, 7);
  EXPECT_EQ(account.inbox[0].event_id, "evt_recv_1");
  ASSERT_EQ(account.events.size(), 2u);
  ASSERT_NE(account.event("evt_sent_1"), nullptr);
  EXPECT_EQ(account.event("evt_sent_1")->entry_id, account.debits[0].id);
  EXPECT_EQ(account.event("evt_recv_1")->entry_id, account.inbox[0].id);
}

// --- the duplicate table ------------------------------------------------------------------------

TEST_P(PrepaidLedgerTest, SameEventIdIsAcknowledgedAsDuplicateWithoutSecondDebit) {
  Sender sender(start().port());
  EXPECT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
  for (int i = 0; i < 3; ++i) {
    const Answer again = sender.deliver("evt_1", sent("acc_1", "m_1", 5));
    EXPECT_EQ(again.http, 200);
    EXPECT_EQ(again.word, "duplicate");
  }
  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 1995);
  EXPECT_EQ(account.debits.size(), 1u);
}

TEST_P(PrepaidLedgerTest, SameMessageIdUnderNewEventIdReusesTheDebitRowWithoutNewCharge) {
  Sender sender(start().port());
  EXPECT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
  // An operator re-push: the same message under a new event id. It is a duplicate of a message
  // already on the ledger, so it is answered `duplicate` and recorded against the same row.
  const Answer repush = sender.deliver("evt_2", sent("acc_1", "m_1", 5));
  EXPECT_EQ(repush.http, 200);
  EXPECT_EQ(repush.word, "duplicate");
  EXPECT_EQ(sender.deliver("evt_2", sent("acc_1", "m_1", 5)).word, "duplicate");

  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 1995);
  ASSERT_EQ(account.debits.size(), 1u);
  EXPECT_EQ(account.debits[0].event_id, "evt_1");
  ASSERT_NE(account.event("evt_2"), nullptr);
  EXPECT_EQ(account.event("evt_2")->entry_id, account.debits[0].id);
  EXPECT_TRUE(account.event("evt_2")->reused);
  EXPECT_FALSE(account.event("evt_1")->reused);
}

TEST_P(PrepaidLedgerTest, SameInboxKeyUnderNewEventIdFilesNoSecondInboxRow) {
  Sender sender(start().port());
  EXPECT_EQ(sender.deliver("evt_1", received("acc_1", "mo_1")).word, "accepted");
  EXPECT_EQ(sender.deliver("evt_2", received("acc_1", "mo_1")).word, "duplicate");
  EXPECT_EQ(sender.deliver("evt_1", received("acc_1", "mo_1")).word, "duplicate");
  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 2000);
  ASSERT_EQ(account.inbox.size(), 1u);
  EXPECT_EQ(account.inbox[0].event_id, "evt_1");
  EXPECT_EQ(account.events.size(), 2u);
}

TEST_P(PrepaidLedgerTest, DeliveryOutsideReplayWindowIsRefusedAndWritesNoMoneyOrState) {
  Sender sender(start().port());
  const Answer stale = sender.deliver("evt_1", sent("acc_1", "m_1", 5), now_seconds() - 600);
  EXPECT_EQ(stale.http, 400);
  EXPECT_EQ(stale.word, "stale_timestamp");
  const Answer future = sender.deliver("evt_1", sent("acc_1", "m_1", 5), now_seconds() + 600);
  EXPECT_EQ(future.http, 400);
  EXPECT_EQ(future.word, "future_timestamp");
  EXPECT_FALSE(sender.account("acc_1").has_value());
  // Nothing was recorded under the event id either: a fresh delivery does the work.
  EXPECT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
}

TEST_P(PrepaidLedgerTest, UnknownEventTypeIsDroppedWith422AndNoSideEffect) {
  Sender sender(start().port());
  const std::string body =
      R"({"type":"message.refunded","data":{"account":"acc_1","message_id":"m_1","cost_cents":5}})";
  const Answer unknown = sender.deliver("evt_1", body);
  EXPECT_EQ(unknown.http, 422);
  EXPECT_EQ(unknown.word, "unknown_event_type");
  EXPECT_EQ(sender.deliver("evt_1", body).http, 422);
  EXPECT_FALSE(sender.account("acc_1").has_value());
  EXPECT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
}

// --- every refusal, and that it wrote nothing ---------------------------------------------------

TEST_P(PrepaidLedgerTest, MissingHeaderOrBadSignatureIs401AndWritesNothing) {
  Sender sender(start().port());
  const std::string body = sent("acc_1", "m_1", 5);
  const std::string ts = std::to_string(now_seconds());
  const std::string good = sender.signer().sign("evt_1", now_seconds(), body);

  const Answer unsigned_ = sender.post({{"webhook-id", "evt_1"}, {"webhook-timestamp", ts}}, body);
  EXPECT_EQ(unsigned_.http, 401);
  EXPECT_EQ(unsigned_.word, "missing_header");
  const Answer no_id = sender.post({{"webhook-timestamp", ts}, {"webhook-signature", good}}, body);
  EXPECT_EQ(no_id.http, 401);
  EXPECT_EQ(no_id.word, "missing_header");

  const idemgate::StandardWebhookVerifier other("whsec_" + std::string(43, 'A') + "=");
  const Answer forged =
      sender.post({{"webhook-id", "evt_1"},
                   {"webhook-timestamp", ts},
                   {"webhook-signature", other.sign("evt_1", now_seconds(), body)}},
                  body);
  EXPECT_EQ(forged.http, 401);
  EXPECT_EQ(forged.word, "bad_signature");
  // A genuine signature over another body: the cost was changed in transit.
  const Answer altered =
      sender.post({{"webhook-id", "evt_1"}, {"webhook-timestamp", ts}, {"webhook-signature", good}},
                  sent("acc_1", "m_1", 500));
  EXPECT_EQ(altered.http, 401);
  EXPECT_EQ(altered.word, "bad_signature");

  EXPECT_FALSE(sender.account("acc_1").has_value());
  EXPECT_EQ(sender.deliver("evt_1", body).word, "accepted");
}

TEST_P(PrepaidLedgerTest, MalformedTimestampOrBodyIs400AndWritesNothing) {
  Sender sender(start().port());
  const Answer bad_time = sender.post({{"webhook-id", "evt_1"},
                                       {"webhook-timestamp", "yesterday"},
                                       {"webhook-signature", "v1,AAAA"}},
                                      sent("acc_1", "m_1", 5));
  EXPECT_EQ(bad_time.http, 400);
  EXPECT_EQ(bad_time.word, "malformed");

  const std::vector<std::string> bodies = {
      "not json",
      R"({"type":"message.sent","data":{"account":"acc_1","message_id":"m_1","cost_cents":5})",
      R"({"data":{"account":"acc_1","message_id":"m_1","cost_cents":5}})",
      R"({"type":"message.sent"})",
      R"({"type":"message.sent","data":{"account":"acc_1","message_id":"m_1"}})",
      R"({"type":"message.sent","data":{"account":"acc_1","message_id":"m_1","cost_cents":-5}})",
      R"({"type":"message.sent","data":{"account":"acc_1","message_id":"m_1","cost_cents":"5"}})",
      R"({"type":"message.sent","data":{"account":"acc_1","message_id":"m_1","cost_cents":5.5}})",
      R"({"type":"message.sent","data":{"account":"acc_1","account":"acc_2","message_id":"m_1","cost_cents":5}})",
      R"({"type":"message.received","data":{"account":"acc_1","message_id":"m_1","text":"hi"}})",
      R"({"type":"message.received","data":{"account":"acc/1","message_id":"m_1","from":"+31","text":"hi"}})",
  };
  for (const std::string& body : bodies) {
    const Answer answer = sender.deliver("evt_1", body);
    EXPECT_EQ(answer.http, 400) << body;
    EXPECT_EQ(answer.word, "malformed") << body;
  }
  EXPECT_FALSE(sender.account("acc_1").has_value());
  EXPECT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
}

TEST_P(PrepaidLedgerTest, InsufficientBalanceIsStoredAs402AndReplayedWithoutDebit) {
  Sender sender(start({"--initial-balance-cents", "10"}).port());
  EXPECT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 7)).word, "accepted");
  const Answer refused = sender.deliver("evt_2", sent("acc_1", "m_2", 7));
  EXPECT_EQ(refused.http, 402);
  EXPECT_EQ(refused.word, "insufficient_balance");
  const Answer replayed = sender.deliver("evt_2", sent("acc_1", "m_2", 7));
  EXPECT_EQ(replayed.http, 402);
  EXPECT_EQ(replayed.word, "insufficient_balance");
  // The same message under a new event id is refused too: nothing was charged for it.
  EXPECT_EQ(sender.deliver("evt_3", sent("acc_1", "m_2", 7)).http, 402);
  // What the balance does cover still goes through.
  EXPECT_EQ(sender.deliver("evt_4", sent("acc_1", "m_3", 3)).word, "accepted");

  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 0);
  ASSERT_EQ(account.debits.size(), 2u);
  EXPECT_EQ(account.debits[0].message_id, "m_1");
  EXPECT_EQ(account.debits[1].message_id, "m_3");
  EXPECT_EQ(account.event("evt_2"), nullptr);
  // The refusal is the event's stored outcome, committed like any other.
  const std::optional<idemgate::Record> stored = log_row("evt_2");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->status, idemgate::RecordStatus::committed);
  EXPECT_EQ(stored->result, "refused:insufficient_balance");
}

TEST_P(PrepaidLedgerTest, ReusedIdsWithOtherContentAreConflictsNotDuplicates) {
  Sender sender(start().port());
  EXPECT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
  // The same event id with another body: a sender bug or a forgery, never a duplicate.
  const Answer event_conflict = sender.deliver("evt_1", sent("acc_1", "m_9", 5));
  EXPECT_EQ(event_conflict.http, 409);
  EXPECT_EQ(event_conflict.word, "event_conflict");
  // The same message id on another account, or at another cost: refused, nothing charged.
  const Answer other_account = sender.deliver("evt_2", sent("acc_2", "m_1", 5));
  EXPECT_EQ(other_account.http, 409);
  EXPECT_EQ(other_account.word, "message_conflict");
  EXPECT_EQ(sender.deliver("evt_3", sent("acc_1", "m_1", 6)).word, "message_conflict");

  EXPECT_EQ(ledger(sender, "acc_1").balance, 1995);
  EXPECT_EQ(ledger(sender, "acc_1").debits.size(), 1u);
  EXPECT_FALSE(sender.account("acc_2").has_value());
}

// --- concurrency and crashes --------------------------------------------------------------------

TEST_P(PrepaidLedgerTest, ConcurrentDeliveriesOfOneEventAndOneMessageDebitOnce) {
  const int port = start().port();
  constexpr int threads = 8;
  for (int round = 0; round < 5; ++round) {
    const std::string message = "m_" + std::to_string(round);
    std::latch go(threads);
    std::vector<Answer> answers(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        Sender sender(port);
        // Half send the same event, half re-push the message under their own event ids.
        const std::string id =
            t % 2 == 0 ? "evt_" + message : "evt_" + message + "_" + std::to_string(t);
        go.arrive_and_wait();
        answers[static_cast<std::size_t>(t)] =
            sender.deliver_until_settled(id, sent("acc_1", message, 3));
      });
    for (auto& thread : pool) thread.join();
    int accepted = 0;
    for (const Answer& answer : answers) {
      EXPECT_EQ(answer.http, 200) << answer.word;
      accepted += answer.word == "accepted" ? 1 : 0;
    }
    EXPECT_EQ(accepted, 1) << "round " << round;
  }
  Sender sender(port);
  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.debits.size(), 5u);
  EXPECT_EQ(account.balance, 2000 - 5 * 3);
  EXPECT_EQ(account.events.size(), 5u * (1 + threads / 2));
}

TEST_P(PrepaidLedgerTest, ConcurrentDeliveriesOfARefusedEventAllGetTheStoredRefusal) {
  const int port = start({"--initial-balance-cents", "5"}).port();
  constexpr int threads = 8;
  std::latch go(threads);
  std::vector<Answer> answers(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      Sender sender(port);
      go.arrive_and_wait();
      answers[static_cast<std::size_t>(t)] =
          sender.deliver_until_settled("evt_1", sent("acc_1", "m_1", 7));
    });
  for (auto& thread : pool) thread.join();
  // Those that waited for the first delivery's transaction get its stored 402, never a success.
  for (const Answer& answer : answers) {
    EXPECT_EQ(answer.http, 402);
    EXPECT_EQ(answer.word, "insufficient_balance");
  }
  Sender sender(port);
  EXPECT_FALSE(sender.account("acc_1").has_value()) << "the refused debit opened the account";
}

TEST_P(PrepaidLedgerTest, DeliveryKilledInsideItsTransactionLeavesNothingAndRedeliveryDebitsOnce) {
  {
    LedgerProcess& crashing = start({"--exit-before-commit", "m_crash"});
    Sender sender(crashing.port());
    ASSERT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
    // The debit row, the balance update and the event record are written in the event's
    // transaction; then the process dies before it commits.
    EXPECT_EQ(sender.deliver("evt_crash", sent("acc_1", "m_crash", 9)).http, 0);
    EXPECT_EQ(crashing.child().wait(), 3);
  }
  // Nothing of the event is left: no log row under its key, no debit, no record, no charge.
  EXPECT_FALSE(log_row("evt_crash").has_value());
  Sender sender(start().port());
  Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 2000 - 5);
  ASSERT_EQ(account.debits.size(), 1u);
  EXPECT_EQ(account.debits[0].message_id, "m_1");
  EXPECT_EQ(account.event("evt_crash"), nullptr);

  // The sender's retry runs the event as new, once.
  const Answer redelivered = sender.deliver("evt_crash", sent("acc_1", "m_crash", 9));
  EXPECT_EQ(redelivered.http, 200);
  EXPECT_EQ(redelivered.word, "accepted");
  EXPECT_EQ(sender.deliver("evt_crash", sent("acc_1", "m_crash", 9)).word, "duplicate");
  account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 2000 - 5 - 9);
  ASSERT_EQ(account.debits.size(), 2u);
  EXPECT_EQ(account.debits[1].message_id, "m_crash");
  EXPECT_EQ(account.debits[1].event_id, "evt_crash");
  ASSERT_NE(account.event("evt_crash"), nullptr);
  EXPECT_EQ(account.event("evt_crash")->entry_id, account.debits[1].id);
  EXPECT_FALSE(account.event("evt_crash")->reused);
  const std::optional<idemgate::Record> stored = log_row("evt_crash");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->status, idemgate::RecordStatus::committed);
  EXPECT_EQ(stored->attempts, 1) << "the killed delivery left no attempt behind";
}

// --- load ---------------------------------------------------------------------------------------

TEST_P(PrepaidLedgerTest, TenThousandEventsWithThirtyPercentReplaysDebitEachMessageOnce) {
  constexpr int originals = 7000;
  constexpr int accounts = 16;
  constexpr std::int64_t initial = 10'000'000;
  const int port = start({"--initial-balance-cents", std::to_string(initial)}).port();

  struct Delivery {
    std::string event_id, body, message_id, account;
    std::int64_t cost;
    bool debit;
  };
  std::mt19937 random(20240611);
  std::vector<Delivery> first;
  for (int i = 0; i < originals; ++i) {
    const std::string account = "acc_" + std::to_string(i % accounts);
    const std::string message = "msg_" + std::to_string(i);
    const bool debit = i % 8 != 0;
    const std::int64_t cost = debit ? 1 + static_cast<std::int64_t>(random() % 20) : 0;
    first.push_back({"evt_" + std::to_string(i),
                     debit ? sent(account, message, cost) : received(account, message), message,
                     account, cost, debit});
  }
  // 3,000 replays: 1,000 later re-sends of the same event; 250 bursts of 4 copies sent next to
  // the original (so several threads deliver them at once); 1,000 re-pushes of the message under
  // a new event id, half right beside the original (racing it), half later.
  std::vector<Delivery> list;
  std::vector<Delivery> later;
  for (int i = 0; i < originals; ++i) {
    const Delivery& d = first[static_cast<std::size_t>(i)];
    list.push_back(d);
    if (i % 7 == 1) later.push_back(d);
    if (i % 28 == 2)
      for (int k = 0; k < 4; ++k) list.push_back(d);
    if (i % 14 == 3 || i % 14 == 4) {
      Delivery repush = d;
      repush.event_id = d.event_id + "_repush";
      (i % 14 == 3 ? list : later).push_back(repush);
    }
  }
  std::shuffle(later.begin(), later.end(), random);
  for (std::size_t i = 0; i < later.size(); ++i)
    list.insert(list.begin() + static_cast<std::ptrdiff_t>(random() % list.size()), later[i]);
  ASSERT_EQ(list.size(), 10'000u);

  constexpr int threads = 8;
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::map<std::string, int> accepted_per_message;
  std::map<std::string, int> unexpected;
  std::vector<std::thread> pool;
  const auto started = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      Sender sender(port);
      for (std::size_t i; (i = next++) < list.size();) {
        const Delivery& d = list[i];
        const Answer answer = sender.deliver_until_settled(d.event_id, d.body);
        std::lock_guard lock(mutex);
        if (answer.http == 200 && answer.word == "accepted")
          ++accepted_per_message[d.message_id];
        else if (answer.http != 200 || answer.word != "duplicate")
          ++unexpected[std::to_string(answer.http) + " " + answer.word];
      }
    });
  for (auto& thread : pool) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("[ prepaid  ] 10000 deliveries in %.2f s (%.0f/s)\n", seconds, 10000 / seconds);

  EXPECT_TRUE(unexpected.empty()) << unexpected.size() << " kinds of unexpected answer, e.g. "
                                  << unexpected.begin()->first;
  EXPECT_EQ(accepted_per_message.size(), static_cast<std::size_t>(originals));
  for (const auto& [message, accepted] : accepted_per_message)
    ASSERT_EQ(accepted, 1) << message << " was accepted " << accepted << " times";

  Sender sender(port);
  std::size_t debits = 0;
  std::size_t inbox = 0;
  for (int a = 0; a < accounts; ++a) {
    const std::string account = "acc_" + std::to_string(a);
    std::int64_t expected_cost = 0;
    std::set<std::string> expected_debits, expected_inbox;
    for (const Delivery& d : first)
      if (d.account == account) {
        expected_cost += d.cost;
        (d.debit ? expected_debits : expected_inbox).insert(d.message_id);
      }
    const Ledger ledger_now = ledger(sender, account);
    EXPECT_EQ(ledger_now.balance, initial - expected_cost) << account;
    std::set<std::string> debited, filed;
    for (const auto& d : ledger_now.debits) EXPECT_TRUE(debited.insert(d.message_id).second);
    for (const auto& r : ledger_now.inbox) EXPECT_TRUE(filed.insert(r.message_id).second);
    EXPECT_EQ(debited, expected_debits) << account;
    EXPECT_EQ(filed, expected_inbox) << account;
    debits += ledger_now.debits.size();
    inbox += ledger_now.inbox.size();
  }
  EXPECT_EQ(debits + inbox, static_cast<std::size_t>(originals));

  // What monitoring sees: every replay was flagged as a duplicate.
  const json::Json stats = sender.stats();
  EXPECT_EQ(json::integer_member(stats, "accepted"), originals);
  EXPECT_EQ(json::integer_member(stats, "duplicate"), 10'000 - originals);
}

// --- the signed edge and the admin views -------------------------------------------------------

// cpp-httplib percent-decodes header values; the example verifies and keys the bytes sent.
TEST_P(PrepaidLedgerTest, WebhookIdIsVerifiedAndKeyedAsTheBytesSentNotPercentDecoded) {
  Sender sender(start().port());
  const Answer escaped = sender.deliver("evt%5Fone", sent("acc_1", "m_1", 5));
  EXPECT_EQ(escaped.http, 200);
  EXPECT_EQ(escaped.word, "accepted");
  EXPECT_EQ(sender.deliver("evt%5Fone", sent("acc_1", "m_1", 5)).word, "duplicate");
  // Two ids that decode alike are two events, each with its own message.
  EXPECT_EQ(sender.deliver("evt_a%41", sent("acc_1", "m_2", 5)).word, "accepted");
  EXPECT_EQ(sender.deliver("evt_aA", sent("acc_1", "m_3", 5)).word, "accepted");
  EXPECT_EQ(sender.deliver("evt_aA", sent("acc_1", "m_3", 5)).word, "duplicate");

  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 2000 - 3 * 5);
  EXPECT_EQ(account.events.size(), 3u);
  for (const std::string id : {"evt%5Fone", "evt_a%41", "evt_aA"})
    EXPECT_NE(account.event(id), nullptr) << id;
}

TEST_P(PrepaidLedgerTest, AdminViewsAnswerOnlyWithTheBearerToken) {
  Sender sender(start().port());
  ASSERT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
  for (const std::string path : {"/accounts/acc_1", "/stats"}) {
    const auto [missing_status, missing_body] = sender.get(path, {});
    EXPECT_EQ(missing_status, 401) << path;
    EXPECT_NE(missing_body.find("unauthorized"), std::string::npos) << missing_body;
    EXPECT_NE(missing_body.find("WWW-Authenticate: Bearer"), std::string::npos) << missing_body;
    EXPECT_EQ(sender.get(path, {{"Authorization", "Bearer wrong-token-of-some-length"}}).first, 401)
        << path;
    EXPECT_EQ(sender.get(path, {{"Authorization", admin_token}}).first, 401) << path;
    EXPECT_EQ(sender.get(path, {{"Authorization", std::string("Basic ") + admin_token}}).first, 401)
        << path;
    EXPECT_EQ(sender.get(path, {{"Authorization", std::string("Bearer ") + admin_token}}).first,
              200)
        << path;
  }
  EXPECT_EQ(ledger(sender, "acc_1").balance, 1995);
}

INSTANTIATE_TEST_SUITE_P(Stores, PrepaidLedgerTest,
                         ::testing::Values(Backend::sqlite, Backend::postgres), backend_name);

// On PostgreSQL a delivery waits for a concurrent delivery of its event up to the lock timeout.
using PrepaidLedgerPostgresTest = PrepaidLedgerTest;

TEST_P(PrepaidLedgerPostgresTest, DeliveryThatWaitsPastTheLockTimeoutIsInFlightAndWritesNothing) {
  const int port = start({"--lock-timeout-ms", "200"}).port();
  // The debit of m_slow takes 1.5 s (a trigger sleeps in its transaction), far past the timeout.
  idemgate::test::pg_exec_on(store_,
                             "CREATE FUNCTION prepaid_test_slow() RETURNS trigger LANGUAGE plpgsql"
                             " AS $$ BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END $$");
  idemgate::test::pg_exec_on(store_,
                             "CREATE TRIGGER prepaid_test_slow BEFORE INSERT ON prepaid_debits"
                             " FOR EACH ROW WHEN (NEW.message_id = 'm_slow')"
                             " EXECUTE FUNCTION prepaid_test_slow()");
  const std::string body = sent("acc_1", "m_slow", 4);
  Answer first;
  std::thread slow([&] { first = Sender(port).deliver("evt_slow", body); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Sender sender(port);
  const Answer second = sender.deliver("evt_slow", body);
  slow.join();
  // One delivery did the work; the other waited 200 ms for its transaction and was sent back.
  std::multiset<std::string> words{first.word, second.word};
  EXPECT_EQ(words, (std::multiset<std::string>{"accepted", "in_flight"}));
  EXPECT_EQ((first.word == "in_flight" ? first : second).http, 409);
  // The retry is answered from the log.
  EXPECT_EQ(sender.deliver("evt_slow", body).word, "duplicate");
  const Ledger account = ledger(sender, "acc_1");
  EXPECT_EQ(account.balance, 2000 - 4);
  EXPECT_EQ(account.debits.size(), 1u);
  EXPECT_EQ(account.events.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Stores, PrepaidLedgerPostgresTest, ::testing::Values(Backend::postgres),
                         backend_name);

// --- the command line ---------------------------------------------------------------------------

int exit_code(std::vector<std::string> args) {
  args.insert(args.begin(), PREPAID_LEDGER_PATH);
  idemgate::test::ChildProcess child(args);
  return child.wait();
}

TEST(PrepaidLedgerCommandLine, AdminViewsDoNotExistWithoutAnAdminToken) {
  unsetenv(admin_token_variable);
  const std::string directory = scratch_directory();
  ASSERT_FALSE(directory.empty());
  LedgerProcess server(
      {"--port", "0", "--secret", secret, "--store", "sqlite:" + directory + "/ledger.db"});
  Sender sender(server.port());
  ASSERT_EQ(sender.deliver("evt_1", sent("acc_1", "m_1", 5)).word, "accepted");
  for (const std::string path : {"/accounts/acc_1", "/stats"}) {
    EXPECT_EQ(sender.get(path, {}).first, 404) << path;
    EXPECT_EQ(sender.get(path, {{"Authorization", std::string("Bearer ") + admin_token}}).first,
              404)
        << path;
  }
  std::filesystem::remove_all(directory);
}

TEST(PrepaidLedgerCommandLine, ShortAdminTokenIsRefusedAtStartup) {
  setenv(admin_token_variable, "short", 1);
  EXPECT_EQ(exit_code({"--port", "0", "--secret", secret}), 2);
  setenv(admin_token_variable, admin_token, 1);
}

TEST(PrepaidLedgerCommandLine, BadArgumentsExitNonZeroWithoutServing) {
  EXPECT_NE(exit_code({"--port", "0"}), 0) << "a missing secret";
  EXPECT_NE(exit_code({"--port", "0", "--secret", "whsec_not base64!"}), 0);
  EXPECT_NE(exit_code({"--port", "0", "--secret", secret, "--store", "mysql://127.0.0.1/x"}), 0);
  EXPECT_NE(exit_code({"--port", "0", "--secret", secret, "--store", "sqlite:"}), 0);
  EXPECT_NE(exit_code({"--port", "http", "--secret", secret}), 0);
  EXPECT_NE(exit_code({"--port", "0", "--secret", secret, "--initial-balance-cents", "-1"}), 0);
  EXPECT_NE(exit_code({"--port", "0", "--secret", secret, "--lock-timeout-ms", "0"}), 0);
  // Nothing is left in flight, so there is no lease and no reconciler to tune.
  EXPECT_NE(exit_code({"--port", "0", "--secret", secret, "--lease-ms", "300"}), 0);
  EXPECT_NE(exit_code({"--port", "0", "--secret", secret, "--reconcile-interval-ms", "100"}), 0);
}

}  // namespace
