// The operator command as an operator runs it: the installed bin/idemgate (from the package
// install fixture) over an SQLite file and a PostgreSQL table seeded through the library, in its
// table and --json forms; the store's state is checked through the library afterwards.

#include "support/postgres.hpp"

#include "../tools/idemgate/format.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/store/sqlite.hpp>
#include <idemgate/transaction_gate.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using idemgate::Key;
using idemgate::RecordStatus;
using idemgate::RowQuery;
using json = nlohmann::json;

constexpr const char* payments = "payments.credit";
constexpr const char* slots = "ect.claim_slot";

// What one run of the command gave.
struct Ran {
  int rc = -1;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the installed command with `args`, its standard output and error in files.
Ran idemgate_run(const std::vector<std::string>& args) {
  const fs::path dir = fs::temp_directory_path() / ("idemgate_run_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path out = dir / "out", err = dir / "err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(o, STDOUT_FILENO);
    ::dup2(e, STDERR_FILENO);
    std::vector<std::string> all{IDEMGATE_INSTALLED_COMMAND};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::unsetenv("IDEMGATE_STORE");
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Ran r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove_all(dir);
  return r;
}

// The rows every test starts from, on one store. Two gates; in payments.credit: four rows failed
// with card_expired (one of them ten days ago), two with insufficient_funds, one escalated with
// card_expired, two committed ten days ago, one committed now and one in flight (its request
// binary, and ten days old: stranded); in ect.claim_slot: two failed with card_expired and one
// committed ten days ago.
struct Seed {
  std::vector<Key> expired, funds, escalated, committed_old, committed_new, in_flight, old_failed;
  std::vector<Key> slot_failed, slot_committed_old;
};

Key key_of(const std::string& id) {
  return idemgate::derive_key("seed", id);
}

// Writes one row through `store` and leaves it as `status` says; `reason` for failed and
// escalated rows, the label is the upstream's event id and the account.
template <class Store>
Key write_row(Store& store, const std::string& id, const std::string& request, RecordStatus status,
              const std::string& reason) {
  const Key key = key_of(id);
  const auto r = store.reserve(key, idemgate::detail::sha256(request), request, 30s,
                               "evt_" + id + " account ACME-" + id);
  EXPECT_EQ(r.kind, idemgate::Reservation::Kind::acquired) << id;
  switch (status) {
    case RecordStatus::committed:
      EXPECT_EQ(store.commit(key, r.fence, "{\"slot\":\"S-" + id + "\"}", [](auto&) {}),
                idemgate::CommitStatus::committed);
      break;
    case RecordStatus::failed:
      EXPECT_EQ(store.fail(key, r.fence, reason), idemgate::CommitStatus::committed);
      break;
    case RecordStatus::escalated:
      EXPECT_EQ(store.escalate(key, r.fence, reason), idemgate::CommitStatus::committed);
      break;
    case RecordStatus::in_flight:
      break;
  }
  return key;
}

std::string json_request(const std::string& id) {
  return "{\"account\":\"ACME-" + id + "\",\"cents\":1200}";
}

// Seeds `root`; `age(gate, key)` moves a row's times ten days back.
template <class Store, class Age>
Seed seed(Store& root, Age&& age) {
  Seed s;
  auto p = root.for_gate(payments);
  auto e = root.for_gate(slots);
  for (int i = 0; i < 3; ++i)
    s.expired.push_back(write_row(p, "p-exp-" + std::to_string(i),
                                  json_request("e" + std::to_string(i)), RecordStatus::failed,
                                  "card_expired"));
  for (int i = 0; i < 2; ++i)
    s.funds.push_back(write_row(p, "p-funds-" + std::to_string(i),
                                "plain text request " + std::to_string(i), RecordStatus::failed,
                                "insufficient_funds"));
  s.escalated.push_back(
      write_row(p, "p-esc", json_request("esc"), RecordStatus::escalated, "card_expired"));
  for (int i = 0; i < 2; ++i)
    s.committed_old.push_back(
        write_row(p, "p-old-" + std::to_string(i), json_request("o"), RecordStatus::committed, ""));
  s.committed_new.push_back(write_row(p, "p-new", json_request("n"), RecordStatus::committed, ""));
  s.in_flight.push_back(
      write_row(p, "p-flight", std::string("\x00\x01\xfe\xff", 4), RecordStatus::in_flight, ""));
  s.old_failed.push_back(
      write_row(p, "p-exp-old", json_request("old"), RecordStatus::failed, "card_expired"));
  for (int i = 0; i < 2; ++i)
    s.slot_failed.push_back(write_row(e, "e-exp-" + std::to_string(i), json_request("s"),
                                      RecordStatus::failed, "card_expired"));
  s.slot_committed_old.push_back(
      write_row(e, "e-old", json_request("so"), RecordStatus::committed, ""));
  for (const auto& k : s.committed_old) age(payments, k);
  for (const auto& k : s.old_failed) age(payments, k);
  for (const auto& k : s.slot_committed_old) age(slots, k);
  for (const auto& k : s.in_flight) age(payments, k);
  return s;
}

// One store under test: its command-line arguments and a way to read it back.
class OperatorCommand : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "sqlite") {
      std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
      std::replace(name.begin(), name.end(), '/', '_');
      dir_ =
          fs::temp_directory_path() / ("idemgate_cmd_" + std::to_string(::getpid()) + "_" + name);
      fs::remove_all(dir_);
      fs::create_directories(dir_);
      path_ = (dir_ / "log.db").string();
      sqlite_.emplace(path_);
      sqlite_->migrate();
      age_ = [this](const char* gate, const Key& key) {
        // The store keeps times in microseconds since the epoch.
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
        sqlite3_busy_timeout(db, 5000);
        const std::string sql =
            "UPDATE idemgate_log SET created_at = created_at - 864000000000, updated_at = "
            "updated_at - 864000000000 WHERE gate = '" +
            std::string(gate) + "' AND key = x'" + key.hex() + "'";
        EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
            << sqlite3_errmsg(db);
        EXPECT_EQ(sqlite3_changes(db), 1);
        sqlite3_close(db);
      };
      seed_ = seed(*sqlite_, age_);
      args_ = {"--store", path_};
    } else {
      uri_ = idemgate::test::pg_uri();
      table_ = idemgate::test::unique_table("cmd");
      idemgate::test::pg_exec("DROP TABLE IF EXISTS " + table_ + ", " + table_ + "_mismatches");
      idemgate::PostgresOptions o;
      o.table = table_;
      postgres_.emplace(uri_, o);
      postgres_->migrate();
      age_ = [this](const char* gate, const Key& key) {
        idemgate::test::pg_exec("UPDATE " + table_ +
                                " SET created_at = created_at - interval '10 days', updated_at = "
                                "updated_at - interval '10 days' WHERE gate = '" +
                                gate + "' AND key = '\\x" + key.hex() + "'::bytea");
      };
      seed_ = seed(*postgres_, age_);
      args_ = {"--store", uri_, "--table", table_};
    }
  }
  void TearDown() override {
    if (GetParam() == "sqlite") {
      sqlite_.reset();
      fs::remove_all(dir_);
    } else if (!uri_.empty()) {
      postgres_.reset();
      idemgate::test::pg_exec("DROP TABLE IF EXISTS " + table_ + ", " + table_ + "_mismatches, " +
                              table_ + "_generations, " + table_ + "_migrations");
    }
  }

  // Runs `idemgate <sub> <store args> <more>`.
  Ran run(const std::string& sub, std::vector<std::string> more = {}) {
    std::vector<std::string> args{sub};
    args.insert(args.end(), args_.begin(), args_.end());
    args.insert(args.end(), more.begin(), more.end());
    return idemgate_run(args);
  }
  // The same, with --json, parsed.
  json run_json(const std::string& sub, std::vector<std::string> more, int expect_rc = 0) {
    more.push_back("--json");
    const Ran r = run(sub, more);
    EXPECT_EQ(r.rc, expect_rc) << r.out << r.err;
    return json::parse(r.out.empty() ? "null" : r.out);
  }

  // The status of `key` in `gate`, read through the library.
  std::optional<RecordStatus> status(const char* gate, const Key& key) {
    auto found = GetParam() == "sqlite" ? sqlite_->for_gate(gate).find(key)
                                        : postgres_->for_gate(gate).find(key);
    if (!found) return std::nullopt;
    return found->status;
  }
  std::int64_t count(const char* gate, RecordStatus s) {
    RowQuery q;
    q.status = s;
    return GetParam() == "sqlite" ? sqlite_->for_gate(gate).count(q)
                                  : postgres_->for_gate(gate).count(q);
  }

  std::string path_, uri_, table_;
  fs::path dir_;
  std::optional<idemgate::SqliteStore> sqlite_;
  std::optional<idemgate::PostgresStore> postgres_;
  std::vector<std::string> args_;
  Seed seed_;
  std::function<void(const char*, const Key&)> age_;
};

TEST_P(OperatorCommand, GatesListsEveryGateWithItsRowsByStatus) {
  const json gates = run_json("gates", {});
  ASSERT_EQ(gates.size(), 2u) << gates.dump();
  EXPECT_EQ(gates[0]["gate"], slots);
  EXPECT_EQ(gates[0]["failed"], 2);
  EXPECT_EQ(gates[0]["committed"], 1);
  EXPECT_EQ(gates[1]["gate"], payments);
  EXPECT_EQ(gates[1]["failed"], 6);
  EXPECT_EQ(gates[1]["escalated"], 1);
  EXPECT_EQ(gates[1]["committed"], 3);
  EXPECT_EQ(gates[1]["in_flight"], 1);
  const Ran table = run("gates");
  EXPECT_EQ(table.rc, 0);
  EXPECT_NE(table.out.find("GATE"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(payments), std::string::npos) << table.out;
}

TEST_P(OperatorCommand, ListFiltersByStatusGateAgeAndLabel) {
  const json failed = run_json("list", {"--gate", payments, "--status", "failed"});
  ASSERT_EQ(failed.size(), 6u) << failed.dump();
  for (const auto& r : failed) {
    EXPECT_EQ(r["status"], "failed");
    EXPECT_EQ(r["gate"], payments);
  }
  const json old = run_json("list", {"--status", "committed", "--older-than", "7d"});
  ASSERT_EQ(old.size(), 3u) << old.dump();  // both gates
  const json recent =
      run_json("list", {"--gate", payments, "--newer-than", "1d", "--status", "committed"});
  ASSERT_EQ(recent.size(), 1u) << recent.dump();
  EXPECT_EQ(recent[0]["key"], seed_.committed_new[0].hex());

  // The upstream's event id, found in the label.
  const json by_label = run_json("list", {"--label", "evt_p-funds-1"});
  ASSERT_EQ(by_label.size(), 1u) << by_label.dump();
  EXPECT_EQ(by_label[0]["key"], seed_.funds[1].hex());
  EXPECT_EQ(by_label[0]["label"], "evt_p-funds-1 account ACME-p-funds-1");

  const Ran table = run("list", {"--label", "evt_p-funds-1"});
  EXPECT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find(seed_.funds[1].hex()), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("insufficient_funds"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("evt_p-funds-1"), std::string::npos) << table.out;

  const Ran none = run("list", {"--label", "no such event"});
  EXPECT_EQ(none.rc, 1) << none.out;
  EXPECT_NE(none.err.find("no row matched"), std::string::npos);
}

TEST_P(OperatorCommand, CountCountsPerGateWithoutTheLimit) {
  const json n = run_json("count", {"--status", "failed", "--reason", "card_expired"});
  EXPECT_EQ(n["total"], 6);
  EXPECT_EQ(n["gates"][payments], 4);
  EXPECT_EQ(n["gates"][slots], 2);
}

TEST_P(OperatorCommand, ShowPrintsOneRowInFullWithItsRequestReadable) {
  const json rows = run_json("show", {seed_.expired[0].hex()});
  ASSERT_EQ(rows.size(), 1u) << rows.dump();
  const json& r = rows[0];
  EXPECT_EQ(r["status"], "failed");
  EXPECT_EQ(r["reason"], "card_expired");
  EXPECT_EQ(r["request"]["encoding"], "json");
  EXPECT_EQ(r["request"]["value"]["account"], "ACME-e0");
  ASSERT_FALSE(r["history"].empty()) << r.dump();
  EXPECT_EQ(r["history"].back()["outcome"], "failed");
  EXPECT_EQ(r["history"].back()["reason"], "card_expired");

  const Ran text = run("show", {seed_.expired[0].hex()});
  EXPECT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("\"account\": \"ACME-e0\""), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("label:       evt_p-exp-0 account ACME-p-exp-0"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("history:"), std::string::npos) << text.out;

  // A plain text request is shown as text, a binary one in hex.
  EXPECT_EQ(run_json("show", {seed_.funds[0].hex()})[0]["request"]["value"],
            "plain text request 0");
  const json binary = run_json("show", {seed_.in_flight[0].hex()});
  EXPECT_EQ(binary[0]["request"]["encoding"], "hex");
  EXPECT_EQ(binary[0]["request"]["value"], "0001feff");
  EXPECT_NE(run("show", {seed_.in_flight[0].hex()}).out.find("0001feff"), std::string::npos);

  const Ran absent = run("show", {key_of("never").hex()});
  EXPECT_EQ(absent.rc, 1);
  EXPECT_NE(absent.err.find("no row has the key"), std::string::npos) << absent.err;
  const Ran not_a_key = run("show", {"12ab"});
  EXPECT_EQ(not_a_key.rc, 2);
  EXPECT_NE(not_a_key.err.find("64 hex digits"), std::string::npos) << not_a_key.err;
}

// Events a TransactionGate ran in one transaction are rows like any other: the operator lists,
// counts and shows them, each committed at its first attempt with its outcome, and none is ever
// in flight (a write that threw left nothing to see).
TEST_P(OperatorCommand, RowsOfATransactionGateAreListedAndShownCommittedWithTheirOutcome) {
  const char* ledger = "ledger.debit";
  const auto run_ledger = [&](auto& store, auto write_row) {
    using Store = std::decay_t<decltype(store)>;
    idemgate::TransactionGate<
        Store, std::string, std::string,
        std::function<std::string(typename Store::transaction&, const std::string&)>>
        gate(ledger, store, [&](typename Store::transaction& tx, const std::string& account) {
          write_row(tx);
          if (account == "closed") throw std::runtime_error("account closed");
          return "debited " + account;
        });
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(
          gate.process(key_of("ledger " + std::to_string(i)), "ACME-" + std::to_string(i)).status(),
          idemgate::Status::processed);
    EXPECT_EQ(gate.process(key_of("ledger 0"), "ACME-0").status(), idemgate::Status::duplicate);
    EXPECT_THROW((void)gate.process(key_of("ledger closed"), "closed"), std::runtime_error);
  };
  if (GetParam() == "sqlite")
    run_ledger(*sqlite_, [](idemgate::SqliteTransaction&) {});
  else
    run_ledger(*postgres_, [](pqxx::work&) {});

  const json gates = run_json("gates", {});
  const auto it =
      std::find_if(gates.begin(), gates.end(), [&](const json& g) { return g["gate"] == ledger; });
  ASSERT_NE(it, gates.end()) << gates.dump();
  EXPECT_EQ((*it)["committed"], 3);
  EXPECT_EQ((*it)["in_flight"], 0);
  const json rows = run_json("list", {"--gate", ledger});
  ASSERT_EQ(rows.size(), 3u) << rows.dump();
  for (const auto& r : rows) EXPECT_EQ(r["status"], "committed");
  const json shown = run_json("show", {key_of("ledger 1").hex()});
  ASSERT_EQ(shown.size(), 1u) << shown.dump();
  EXPECT_EQ(shown[0]["status"], "committed");
  EXPECT_EQ(shown[0]["attempts"], 1);
  EXPECT_EQ(shown[0]["request"]["value"], "ACME-1");
  EXPECT_NE(shown[0].dump().find("debited ACME-1"), std::string::npos) << shown.dump();
  EXPECT_EQ(run("show", {key_of("ledger closed").hex()}).rc, 1)
      << "a write that threw left a row behind";
}

TEST_P(OperatorCommand, CausesGroupsFailedAndEscalatedRowsPerGate) {
  const json causes = run_json("causes", {});
  std::map<std::string, std::int64_t> rows;
  for (const auto& c : causes)
    rows[c["gate"].get<std::string>() + "/" + c["status"].get<std::string>() + "/" +
         c["reason"].get<std::string>()] = c["rows"];
  EXPECT_EQ(rows,
            (std::map<std::string, std::int64_t>{{"ect.claim_slot/failed/card_expired", 2},
                                                 {"payments.credit/failed/card_expired", 4},
                                                 {"payments.credit/failed/insufficient_funds", 2},
                                                 {"payments.credit/escalated/card_expired", 1}}))
      << causes.dump();
  for (const auto& c : causes) {
    if (c["gate"] == payments && c["status"] == "failed" && c["reason"] == "card_expired") {
      EXPECT_LT(c["first_seen"].get<std::string>(), c["last_seen"].get<std::string>())
          << "the oldest failure is ten days old";
    }
  }
  const Ran table = run("causes", {"--gate", slots});
  EXPECT_EQ(table.rc, 0);
  EXPECT_NE(table.out.find("FIRST_SEEN"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find(payments), std::string::npos) << table.out;
}

TEST_P(OperatorCommand, RedriveByCauseIsADryRunUntilExecuteThenRedrivesExactlyThoseRows) {
  const json dry = run_json("redrive", {"--gate", payments, "--cause", "card_expired"});
  EXPECT_EQ(dry["executed"], false);
  EXPECT_EQ(dry["total"], 4);
  EXPECT_EQ(dry["gates"][0]["escalated_same_cause"], 1);
  EXPECT_FALSE(dry["gates"][0]["sample"].empty());
  EXPECT_EQ(count(payments, RecordStatus::failed), 6) << "a dry run changes nothing";

  const Ran text = run("redrive", {"--gate", payments, "--cause", "card_expired"});
  EXPECT_NE(text.out.find("dry run: 4 failed rows would be re-driven"), std::string::npos)
      << text.out;

  const Ran executed = run("redrive", {"--gate", payments, "--cause", "card_expired", "--execute",
                                       "--batch", "3", "--progress", "--json"});
  ASSERT_EQ(executed.rc, 0) << executed.err;
  EXPECT_EQ(json::parse(executed.out)["total"], 4);
  // The progress line, one step per batch of three, on standard error.
  EXPECT_NE(executed.err.find("re-driving payments.credit: 3 of 4 rows\n"
                              "re-driving payments.credit: 4 of 4 rows\n"),
            std::string::npos)
      << executed.err;
  for (const auto& k : seed_.expired) EXPECT_EQ(status(payments, k), RecordStatus::in_flight);
  EXPECT_EQ(status(payments, seed_.old_failed[0]), RecordStatus::in_flight);
  for (const auto& k : seed_.funds) EXPECT_EQ(status(payments, k), RecordStatus::failed);
  EXPECT_EQ(status(payments, seed_.escalated[0]), RecordStatus::escalated);
  for (const auto& k : seed_.slot_failed)
    EXPECT_EQ(status(slots, k), RecordStatus::failed) << "another gate's rows stay";
  const Ran again = run("redrive", {"--gate", payments, "--cause", "card_expired", "--execute"});
  EXPECT_EQ(again.rc, 1) << "nothing left to re-drive";
}

TEST_P(OperatorCommand, RedriveByCauseTakesTheIdCausesPrintsAndNamesTheCausesWhenNoneMatches) {
  std::string expired_id, funds_id;
  for (const auto& c : run_json("causes", {"--gate", payments})) {
    ASSERT_EQ(c["id"].get<std::string>().size(), 12u) << c.dump();
    EXPECT_EQ(c["cause"], c["reason"]);
    if (c["status"] == "failed" && c["cause"] == "card_expired") expired_id = c["id"];
    if (c["status"] == "failed" && c["cause"] == "insufficient_funds") funds_id = c["id"];
  }
  ASSERT_FALSE(expired_id.empty());
  ASSERT_FALSE(funds_id.empty());
  EXPECT_NE(run("causes", {"--gate", payments}).out.find(expired_id), std::string::npos)
      << "the table prints the ID";

  const json dry = run_json("redrive", {"--gate", payments, "--cause", expired_id});
  EXPECT_EQ(dry["total"], 4) << dry.dump();
  EXPECT_EQ(dry["gates"][0]["escalated_same_cause"], 1);

  const Ran none = run("redrive", {"--gate", payments, "--cause", "card_exp"});
  EXPECT_EQ(none.rc, 1);
  EXPECT_NE(none.err.find("no failed row has the cause \"card_exp\""), std::string::npos)
      << none.err;
  EXPECT_NE(none.err.find(expired_id + "  " + payments + "  4 rows  card_expired"),
            std::string::npos)
      << none.err;
  EXPECT_NE(none.err.find(funds_id + "  " + payments + "  2 rows  insufficient_funds"),
            std::string::npos)
      << none.err;
  const Ran cut = run("redrive", {"--gate", payments, "--cause", "card_exp..."});
  EXPECT_NE(cut.err.find("give the cause's ID instead"), std::string::npos) << cut.err;

  const json executed = run_json("redrive", {"--gate", payments, "--cause", funds_id, "--execute"});
  EXPECT_EQ(executed["total"], 2);
  for (const auto& k : seed_.funds) EXPECT_EQ(status(payments, k), RecordStatus::in_flight);
  for (const auto& k : seed_.expired) EXPECT_EQ(status(payments, k), RecordStatus::failed);
}

TEST_P(OperatorCommand, RedriveByKeyAndByTimeRange) {
  const Ran dry = run("redrive", {"--gate", payments, "--key", seed_.funds[0].hex()});
  EXPECT_EQ(dry.rc, 0) << dry.err;
  EXPECT_EQ(status(payments, seed_.funds[0]), RecordStatus::failed);
  const json by_key = run_json("redrive", {"--gate", payments, "--key", seed_.funds[0].hex(),
                                           "--key", seed_.committed_new[0].hex(), "--execute"});
  EXPECT_EQ(by_key["total"], 1);
  EXPECT_EQ(status(payments, seed_.funds[0]), RecordStatus::in_flight);
  EXPECT_EQ(status(payments, seed_.committed_new[0]), RecordStatus::committed);

  // Only the failure of ten days ago lies before five days ago, in every gate.
  const json range = run_json("redrive", {"--all-gates", "--to", "5d", "--execute"});
  EXPECT_EQ(range["total"], 1) << range.dump();
  EXPECT_EQ(status(payments, seed_.old_failed[0]), RecordStatus::in_flight);
  EXPECT_EQ(status(payments, seed_.expired[0]), RecordStatus::failed);
}

TEST_P(OperatorCommand, RowChangingCommandsNeedAGateOrAllGates) {
  for (const auto& [sub, what] : {std::pair{"redrive", "--cause"}, {"purge", "--older-than"}}) {
    const Ran r = run(sub, {what, "7d"});
    EXPECT_EQ(r.rc, 2) << sub << r.out << r.err;
    EXPECT_NE(r.err.find("--all-gates"), std::string::npos) << r.err;
  }
  EXPECT_EQ(count(payments, RecordStatus::committed), 3);
}

TEST_P(OperatorCommand, PurgeIsADryRunUntilExecuteAndKeepsRecentAndOpenRows) {
  const json dry = run_json("purge", {"--all-gates", "--older-than", "7d"});
  EXPECT_EQ(dry["total"], 4) << dry.dump();  // two + one committed, one failed, ten days old
  EXPECT_EQ(status(payments, seed_.committed_old[0]), RecordStatus::committed);

  const Ran done = run("purge", {"--gate", payments, "--older-than", "7d", "--execute", "--batch",
                                 "1", "--progress", "--json"});
  ASSERT_EQ(done.rc, 0) << done.err;
  EXPECT_EQ(json::parse(done.out)["total"], 3) << done.out;
  EXPECT_NE(done.err.find("purging payments.credit: 3 rows purged"), std::string::npos) << done.err;
  // Without --progress, and with standard error not a terminal, no progress line.
  const Ran quiet = run("purge", {"--gate", payments, "--older-than", "7d", "--execute"});
  EXPECT_EQ(quiet.rc, 1) << "nothing left to purge";
  EXPECT_EQ(quiet.err.find("purging"), std::string::npos) << quiet.err;
  for (const auto& k : seed_.committed_old) EXPECT_EQ(status(payments, k), std::nullopt);
  EXPECT_EQ(status(payments, seed_.old_failed[0]), std::nullopt);
  EXPECT_EQ(status(payments, seed_.committed_new[0]), RecordStatus::committed);
  EXPECT_EQ(status(payments, seed_.escalated[0]), RecordStatus::escalated);
  EXPECT_EQ(status(payments, seed_.in_flight[0]), RecordStatus::in_flight);
  EXPECT_EQ(status(slots, seed_.slot_committed_old[0]), RecordStatus::committed);
}

TEST_P(OperatorCommand, AdoptGivesRowsOfNoGateToTheGateNamedAndKeepsKeysItHolds) {
  // Two rows written before logs knew their gates (the store as constructed writes rows of no
  // gate); one of them under a key payments.credit already holds.
  const auto write_unowned = [this](const std::string& id) {
    if (GetParam() == "sqlite")
      return write_row(*sqlite_, id, json_request(id), RecordStatus::failed, "card_expired");
    return write_row(*postgres_, id, json_request(id), RecordStatus::failed, "card_expired");
  };
  const auto still_unowned = [this](const Key& key) {
    return (GetParam() == "sqlite" ? sqlite_->find(key) : postgres_->find(key)).has_value();
  };
  const Key fresh = write_unowned("legacy-1");
  const Key held = write_unowned("p-exp-0");  // the key payments.credit holds already
  const Ran listed = run("gates");
  EXPECT_NE(listed.err.find("2 rows belong to no gate"), std::string::npos) << listed.err;

  const Ran refused = run("adopt", {"--execute"});
  EXPECT_EQ(refused.rc, 2) << refused.err;
  EXPECT_NE(refused.err.find("--gate"), std::string::npos) << refused.err;

  const json dry = run_json("adopt", {"--gate", payments});
  EXPECT_EQ(dry["executed"], false);
  EXPECT_EQ(dry["would_adopt"], 2);
  EXPECT_FALSE(status(payments, fresh)) << "a dry run changed a row";

  const json done = run_json("adopt", {"--gate", payments, "--execute", "--batch", "1"});
  EXPECT_EQ(done["adopted"], 1);
  EXPECT_EQ(done["left_unowned"], 1);
  EXPECT_EQ(status(payments, fresh), RecordStatus::failed);
  EXPECT_EQ(status(payments, held), RecordStatus::failed);
  EXPECT_FALSE(still_unowned(fresh));
  EXPECT_TRUE(still_unowned(held)) << "a key the gate holds was adopted over its own row";
  EXPECT_FALSE(status(slots, fresh));
  EXPECT_EQ(run("adopt", {"--gate", payments, "--execute"}).rc, 1) << "nothing left to adopt";

  // What adopting leaves is seen and reached: `check` names it, `purge --all-gates` purges it.
  const Ran checked = run("check");
  EXPECT_NE(checked.out.find("1 row belongs to no gate"), std::string::npos) << checked.out;
  EXPECT_EQ(run_json("check", {})["unowned_rows"], 1);
  age_("", held);
  const json purged = run_json("purge", {"--all-gates", "--older-than", "7d", "--execute"});
  bool reached = false;
  for (const auto& g : purged["gates"])
    if (g["gate"] == "") reached = g["purged"] == 1;
  EXPECT_TRUE(reached) << purged.dump();
  EXPECT_FALSE(still_unowned(held)) << "purge --all-gates left a finished row of no gate";
  EXPECT_EQ(status(payments, held), RecordStatus::failed) << "the gate's own row was purged";
}

TEST_P(OperatorCommand, SignalsPerGateAndTheirAlarms) {
  // The in-flight row is ten days old: stranded, an alarm, exit 1.
  const json signals = run_json("signals", {"--window", "30d"}, 1);
  ASSERT_EQ(signals.size(), 2u) << signals.dump();
  EXPECT_EQ(signals[1]["gate"], payments);
  EXPECT_EQ(signals[1]["escalated"], 1);
  EXPECT_EQ(signals[1]["in_flight"], 1);
  EXPECT_EQ(signals[1]["alarms"], json::array({"stranded_work"}));
  EXPECT_TRUE(signals[0]["alarms"].empty());
  const Ran alarm = run("signals", {"--gate", payments});
  EXPECT_EQ(alarm.rc, 1) << alarm.out << alarm.err;
  EXPECT_NE(alarm.out.find("stranded_work"), std::string::npos) << alarm.out;
  // With a threshold past its age, no alarm: exit 0.
  const Ran calm = run("signals", {"--gate", payments, "--stranded-after", "30d"});
  EXPECT_EQ(calm.rc, 0) << calm.out << calm.err;
  EXPECT_EQ(calm.out.find("stranded_work"), std::string::npos) << calm.out;
}

TEST_P(OperatorCommand, ATransactionHeldOpenRaisesOldSnapshotAndNamesItsHolder) {
  if (GetParam() == "sqlite") {
    // SQLite has no such horizon (its long readers show as wal_bytes): nothing to report, and
    // no alarm even at a threshold of zero.
    const json signals = run_json("signals", {"--gate", slots, "--old-snapshot-after", "0s"});
    ASSERT_EQ(signals.size(), 1u) << signals.dump();
    EXPECT_TRUE(signals[0]["oldest_snapshot_seconds"].is_null());
    EXPECT_TRUE(signals[0]["oldest_snapshot_holder"].is_null());
    EXPECT_TRUE(signals[0]["alarms"].empty());
    return;
  }
  // Another session of the log's database holds a snapshot for over a second. Other tests may
  // hold older ones meanwhile: the reported transaction is at least as old as this one.
  pqxx::connection reports(uri_);
  pqxx::work held(reports);
  // REPEATABLE READ keeps its snapshot until the transaction ends (READ COMMITTED lets go of it
  // after each statement, and a read-only one then holds nothing back).
  (void)idemgate::detail::pq::exec(held, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
  (void)idemgate::detail::pq::exec(held, "SELECT count(*) FROM " + table_);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));

  const json signals = run_json("signals", {"--old-snapshot-after", "0s"}, 1);
  ASSERT_EQ(signals.size(), 2u) << signals.dump();
  for (const auto& gate : signals) {
    EXPECT_GE(gate["oldest_snapshot_seconds"].get<std::int64_t>(), 1) << gate.dump();
    EXPECT_NE(gate["oldest_snapshot_holder"].get<std::string>(), "") << gate.dump();
    EXPECT_NE(gate["alarms"].dump().find("old_snapshot"), std::string::npos) << gate.dump();
  }
  const Ran alarm = run("signals", {"--gate", slots, "--old-snapshot-after", "0s"});
  EXPECT_EQ(alarm.rc, 1) << alarm.out << alarm.err;
  EXPECT_NE(alarm.out.find("old_snapshot"), std::string::npos) << alarm.out;
  EXPECT_NE(alarm.err.find("old_snapshot: session "), std::string::npos) << alarm.err;
  EXPECT_NE(alarm.err.find("idle_in_transaction_session_timeout"), std::string::npos) << alarm.err;
  // Past the default threshold (5 minutes) a second-old transaction raises nothing.
  const json calm = run_json("signals", {"--gate", slots});
  ASSERT_EQ(calm.size(), 1u) << calm.dump();
  EXPECT_TRUE(calm[0]["alarms"].empty()) << calm.dump();
  held.abort();
}

TEST_P(OperatorCommand, CheckPassesOnTheLogAndFailsWithExitThreeWithoutIt) {
  const Ran ok = run("check");
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_NE(ok.out.find("ok"), std::string::npos);
  const Ran missing = idemgate_run({"check", "--store", args_[1], "--table", "no_such_log"});
  EXPECT_EQ(missing.rc, 3) << missing.out << missing.err;
  EXPECT_NE(missing.err.find("idemgate migrate"), std::string::npos) << missing.err;
}

TEST_P(OperatorCommand, GenerationsPartitionsTheLogThenListsStartsAndDropsGenerations) {
  if (GetParam() == "sqlite") {
    const Ran r = run("generations");
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.err.find("an SQLite log has no generations"), std::string::npos) << r.err;
    return;
  }
  const Ran plain = run("generations");
  EXPECT_EQ(plain.rc, 1);
  EXPECT_NE(plain.err.find("idemgate migrate --partitioned"), std::string::npos) << plain.err;

  const json migrated = run_json("migrate", {"--partitioned"});
  ASSERT_FALSE(migrated["applied"].empty()) << migrated.dump();
  EXPECT_EQ(migrated["applied"].back()["version"], 6) << migrated.dump();
  const json first = run_json("generations", {});
  ASSERT_EQ(first["generations"].size(), 1u) << first.dump();
  EXPECT_EQ(first["generations"][0]["generation"], 0);
  EXPECT_EQ(first["generations"][0]["current"], true);

  // A dry run starts nothing; --execute starts generation 1.
  EXPECT_EQ(run_json("generations", {"--start"})["generations"].size(), 1u);
  const json started = run_json("generations", {"--start", "--execute"});
  EXPECT_EQ(started["started"], 1) << started.dump();
  ASSERT_EQ(started["generations"].size(), 2u) << started.dump();
  EXPECT_EQ(started["generations"][1]["current"], true);

  // The command finds the log partitioned and purges it as such; generation 0 still holds the
  // recent, escalated and in-flight rows, so it stays.
  EXPECT_EQ(run_json("purge", {"--all-gates", "--older-than", "7d", "--execute"})["total"], 4);
  const json kept = run_json("generations", {"--drop-empty", "--execute"});
  EXPECT_EQ(kept["dropped"], 0) << kept.dump();
  EXPECT_EQ(status(payments, seed_.committed_new[0]), RecordStatus::committed);
  EXPECT_EQ(status(payments, seed_.escalated[0]), RecordStatus::escalated);

  // Once those rows end, generation 0 is dropped.
  idemgate::test::pg_exec("DELETE FROM " + table_ + "_g0");
  const json dropped = run_json("generations", {"--drop-empty", "--execute"});
  EXPECT_EQ(dropped["dropped"], 1) << dropped.dump();
  ASSERT_EQ(dropped["generations"].size(), 1u) << dropped.dump();
  EXPECT_EQ(dropped["generations"][0]["generation"], 1);
  const Ran table = run("generations");
  EXPECT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find("GENERATION"), std::string::npos) << table.out;
}

INSTANTIATE_TEST_SUITE_P(Stores, OperatorCommand, ::testing::Values("sqlite", "postgres"),
                         [](const auto& param) { return param.param; });

TEST(OperatorCommandAlone, EverySubcommandHasHelp) {
  for (const auto& sub : {"check", "migrate", "gates", "signals", "list", "count", "show", "causes",
                          "redrive", "purge", "generations", "key"}) {
    const Ran r = idemgate_run({sub, "--help"});
    EXPECT_EQ(r.rc, 0) << sub;
    EXPECT_NE(r.out.find("Usage:"), std::string::npos) << sub << r.out;
  }
  const Ran top = idemgate_run({"--help"});
  EXPECT_NE(top.out.find("Exit status"), std::string::npos) << top.out;
}

TEST(OperatorCommandAlone, UsageErrorsExitTwo) {
  EXPECT_EQ(idemgate_run({"no-such-subcommand"}).rc, 2);
  EXPECT_EQ(idemgate_run({}).rc, 2);
  const Ran duration = idemgate_run({"list", "--store", "x.db", "--older-than", "7 days"});
  EXPECT_EQ(duration.rc, 2);
  const Ran no_store = idemgate_run({"list"});
  EXPECT_EQ(no_store.rc, 2);
  EXPECT_NE(no_store.err.find("--store"), std::string::npos) << no_store.err;
}

TEST(OperatorCommandAlone, AnUnreachableStoreExitsThreeSayingWhatToDo) {
  // A port nothing listens on.
  const Ran pg = idemgate_run({"list", "--store", "postgresql://nobody@127.0.0.1:1/none"});
  EXPECT_EQ(pg.rc, 3) << pg.out << pg.err;
  EXPECT_NE(pg.err.find("Check that the server runs"), std::string::npos) << pg.err;
  const Ran file = idemgate_run({"list", "--store", "/nonexistent/dir/log.db"});
  EXPECT_EQ(file.rc, 3);
  EXPECT_NE(file.err.find("no SQLite database at /nonexistent/dir/log.db"), std::string::npos)
      << file.err;
}

TEST(OperatorCommandAlone, MigrateCreatesAnSqliteLogThatCheckAccepts) {
  const fs::path dir =
      fs::temp_directory_path() / ("idemgate_migrate_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "new.db").string();
  EXPECT_EQ(idemgate_run({"check", "--store", path}).rc, 3);
  const Ran m = idemgate_run({"migrate", "--store", path});
  EXPECT_EQ(m.rc, 0) << m.err;
  EXPECT_NE(m.out.find("migrated the log idemgate_log from version 0 to 5"), std::string::npos)
      << m.out;
  std::size_t applied = 0;
  for (auto at = m.out.find(" applied "); at != std::string::npos;
       at = m.out.find(" applied ", at + 1))
    ++applied;
  EXPECT_EQ(applied, 5U) << "each step, applied, in the table\n" << m.out;
  EXPECT_NE(m.out.find(" gates "), std::string::npos) << m.out;
  EXPECT_EQ(idemgate_run({"check", "--store", path}).rc, 0);
  const Ran again = idemgate_run({"migrate", "--store", path, "--json"});
  EXPECT_EQ(again.rc, 0) << again.err;
  const auto report = nlohmann::json::parse(again.out);
  EXPECT_EQ(report["from_version"], 5);
  EXPECT_EQ(report["to_version"], 5);
  EXPECT_TRUE(report["applied"].empty()) << again.out;
  EXPECT_TRUE(report["found"].empty()) << again.out;
  fs::remove_all(dir);
}

TEST(OperatorCommandAlone, KeyDerivesTheKeyOfTheUpstreamsIds) {
  const Ran r = idemgate_run({"key", "ect.claim_slot", "CIS-2025-06-09-1001", "MSKU7000037"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(
      r.out,
      idemgate::derive_key("ect.claim_slot", "CIS-2025-06-09-1001", "MSKU7000037").hex() + "\n");
}

// The command's words for durations, times and stored bytes.
TEST(OperatorCommandWords, DurationsTakeUnitsFromSecondsToWeeks) {
  using idemgate::tool::parse_duration;
  EXPECT_EQ(parse_duration("90s"), 90s);
  EXPECT_EQ(parse_duration("1h30m"), 5400s);
  EXPECT_EQ(parse_duration("7d"), std::chrono::hours(24 * 7));
  EXPECT_EQ(parse_duration("2w"), std::chrono::hours(24 * 14));
  for (const auto* bad : {"", "7", "7 days", "d", "3x", "1h30"})
    EXPECT_THROW((void)parse_duration(bad), idemgate::tool::UsageError) << bad;
}

TEST(OperatorCommandWords, TimesAreIso8601Utc) {
  using idemgate::tool::format_time;
  using idemgate::tool::parse_time;
  EXPECT_EQ(format_time(parse_time("2026-06-09T14:30:05Z")), "2026-06-09T14:30:05Z");
  EXPECT_EQ(format_time(parse_time("2026-06-09 14:30")), "2026-06-09T14:30:00Z");
  EXPECT_EQ(format_time(parse_time("2026-06-09")), "2026-06-09T00:00:00Z");
  EXPECT_EQ(format_time(parse_time("2026-06-09T14:30:05.750+00:00")), "2026-06-09T14:30:05Z");
  for (const auto* bad : {"2026-6-9", "2026-06-09T25:00", "09/06/2026", "2026-06-09T14:30+02:00"})
    EXPECT_THROW((void)parse_time(bad), idemgate::tool::UsageError) << bad;
  const auto now = parse_time("2026-06-09T12:00:00Z");
  EXPECT_EQ(format_time(idemgate::tool::parse_instant("2h", now)), "2026-06-09T10:00:00Z");
}

TEST(OperatorCommandWords, StoredBytesReadAsJsonTextOrHex) {
  using idemgate::tool::readable;
  EXPECT_EQ(readable("{\"a\":1}").encoding, "json");
  EXPECT_EQ(readable("{not json").encoding, "text");
  EXPECT_EQ(readable("Grüße\tand a tab").encoding, "text");
  EXPECT_EQ(readable(std::string("\xc3", 1)).encoding, "hex");  // a cut UTF-8 sequence
  EXPECT_EQ(readable(std::string("a\0b", 3)).value, "610062");
}

}  // namespace
