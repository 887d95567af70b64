// Several gates on one SQLite file: each sees only its own rows, under crashes and across
// processes; one upstream event fanned out to two gates; a log made before rows knew their
// gates, migrated in place and its rows given to a gate. What every store shares about gates is
// in the conformance suite (test_conformance_sqlite.cpp).

#include "support/child_process.hpp"
#include "support/fake_terminal.hpp"
#include "support/slot_request.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::Reconciler;
using idemgate::RecordStatus;
using idemgate::SqliteStore;
using idemgate::SqliteTransaction;
using idemgate::Status;
using idemgate::test::SlotRequest;
using namespace idemgate::test::sqlite;

/// A payment to credit: another request type than the slot claim, on another gate.
struct Credit {
  std::string account;
  std::int64_t cents = 0;
};

/// Canonical encoding of a credit: account, newline, cents.
template <>
struct idemgate::codec<Credit> {
  static void encode(const Credit& c, std::string& out) {
    out = c.account + '\n' + std::to_string(c.cents);
  }
  static Credit decode(std::string_view in) {
    const auto split = in.find('\n');
    if (split == std::string_view::npos) throw idemgate::CodecError("no newline in a credit");
    return {std::string(in.substr(0, split)),
            idemgate::codec<std::int64_t>::decode(in.substr(split + 1))};
  }
};

namespace {

/// A downstream that honours keys and can look them up, counting what it was asked: the same
/// key always gets the answer it got first. `Request` is what it acts on.
template <class Request>
class Counting {
 public:
  using request_type = Request;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  explicit Counting(std::string prefix) : prefix_(std::move(prefix)) {}

  idemgate::ClaimResult<std::string> claim(const Request& request, const Key& key) {
    std::lock_guard lock(mutex_);
    ++calls_;
    received_.push_back(request);
    auto [it, fresh] = by_key_.try_emplace(key, prefix_ + std::to_string(by_key_.size() + 1));
    return it->second;
  }
  idemgate::LookupResult<std::string> lookup(const Key& key) {
    std::lock_guard lock(mutex_);
    ++lookups_;
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return idemgate::NotFound{};
    return it->second;
  }
  int calls() const {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  int lookups() const {
    std::lock_guard lock(mutex_);
    return lookups_;
  }
  std::vector<Request> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }

 private:
  std::string prefix_;
  mutable std::mutex mutex_;
  int calls_ = 0;
  int lookups_ = 0;
  std::vector<Request> received_;
  std::map<Key, std::string> by_key_;
};

using Bank = Counting<Credit>;
using SmsSender = Counting<std::string>;

/// A downstream whose call never ends: it writes one byte to `ready` and waits to be killed.
template <class Request>
struct Hanging {
  using request_type = Request;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  int ready = -1;
  idemgate::ClaimResult<std::string> claim(const Request&, const Key&) {
    const char byte = 'x';
    if (::write(ready, &byte, 1) != 1) ::_exit(3);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
};

/// The payments gate's business write: one ledger row per event.
const auto credit_account = [](SqliteTransaction& tx, const Key& key, const Credit& c,
                               const std::string& txn) {
  tx.exec("INSERT INTO ledger (account, cents, txn, source_event) VALUES (?, ?, ?, ?)", c.account,
          c.cents, txn, key);
};

/// The receipt gate's business write: one receipt row per event.
const auto log_receipt = [](SqliteTransaction& tx, const Key& key, const std::string& phone,
                            const std::string& sms) {
  tx.exec("INSERT INTO receipts (phone, sms, source_event) VALUES (?, ?, ?)", phone, sms, key);
};

/// The payments service's tables beside the log and the bookings.
void add_payment_tables(const std::string& path) {
  auto raw = open_raw(path);
  sq::exec(raw.get(),
           "CREATE TABLE IF NOT EXISTS ledger (id INTEGER PRIMARY KEY, account TEXT NOT NULL, "
           "cents INTEGER NOT NULL, txn TEXT NOT NULL, source_event BLOB NOT NULL)");
  sq::exec(raw.get(),
           "CREATE TABLE IF NOT EXISTS receipts (id INTEGER PRIMARY KEY, phone TEXT NOT NULL, "
           "sms TEXT NOT NULL, source_event BLOB NOT NULL)");
}

/// The status of `key`'s row of `gate`, as another connection sees it.
std::string status_of(const std::string& path, const std::string& gate, const Key& key) {
  auto db = open_raw(path);
  sq::Statement read(db.get(), "SELECT status FROM idemgate_log WHERE gate = ? AND key = ?",
                     "reading");
  read.bind("reading", gate, key);
  return read.step("reading") ? read.bytes(0) : std::string("(no row)");
}

/// The detail lines of SQLite's plan for `sql`.
std::vector<std::string> plan(sqlite3* db, const std::string& sql) {
  sq::Statement statement(db, "EXPLAIN QUERY PLAN " + sql, "explaining");
  statement.bind("explaining");
  std::vector<std::string> lines;
  while (statement.step("explaining")) lines.push_back(statement.bytes(3));
  return lines;
}

/// A forked child that runs `body` (which never returns) and is SIGKILLed by the test.
class Worker {
 public:
  template <class Body>
  explicit Worker(Body body) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(fds[0]);
      try {
        body(fds[1]);
      } catch (...) {
      }
      ::_exit(2);
    }
    ::close(fds[1]);
    ready_ = fds[0];
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    if (pid_ > 0) kill_now();
    if (ready_ >= 0) ::close(ready_);
  }

  /// Whether the child said, within 20 s, that it is inside the downstream call.
  bool inside_the_call() {
    pollfd p{ready_, POLLIN, 0};
    char byte = 0;
    return ::poll(&p, 1, 20000) == 1 && ::read(ready_, &byte, 1) == 1;
  }

  /// SIGKILL, as a crash or an OOM kill ends a worker.
  void kill_now() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int ready_ = -1;
};

}  // namespace

// The reproduction: a slot gate's worker dies holding a key; another service's gate on
// the same file (another downstream, another request type, default options) reconciles with
// stale_after = 0. It must not see the row; the slot gate's own reconciler finishes it.
TEST(SqliteGates, AnotherGatesReconcilerNeverTouchesAStrandedRow) {
  Fixture f;
  add_payment_tables(f.db);
  idemgate::test::FakeTerminal<> terminal;
  const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
  const Key key = idemgate::derive_key("ect.claim_slot", "CIS-1", msku.container);
  {
    // Gate A reserves with a 1 ms lease and dies inside the call.
    terminal.before = [](const SlotRequest&,
                         const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
      throw idemgate::test::SimulatedCrash{};
    };
    Gate dying{"ect.claim_slot", f.store, terminal, book,
               idemgate::GateOptions{.lease = std::chrono::milliseconds(1)}};
    EXPECT_THROW((void)dying.process(key, msku), idemgate::test::SimulatedCrash);
    terminal.before = nullptr;
  }
  std::this_thread::sleep_for(20ms);  // A's lease is over
  Bank bank("txn-");
  Gate payments{"payments.credit", f.store, bank, credit_account};
  Reconciler other{payments, idemgate::ReconcilerOptions{.stale_after = 0ms}};
  const idemgate::ReconcileReport report = other.run_once();
  EXPECT_EQ(report.taken, 0u) << "another gate's stranded row is not this gate's work";
  EXPECT_EQ(bank.calls(), 0);
  EXPECT_EQ(bank.lookups(), 0);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM ledger"), 0);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 0);
  EXPECT_FALSE(payments.store().find(key).has_value());
  EXPECT_EQ(payments.store().signals(std::chrono::hours(1)).in_flight, 0);
  EXPECT_EQ(status_of(f.db, "ect.claim_slot", key), "in_flight");

  // A restarts with the default options; its reconciler finishes its own row, once.
  Gate claims{"ect.claim_slot", f.store, terminal, book};
  Reconciler mine{claims, idemgate::ReconcilerOptions{.stale_after = 0ms}};
  const idemgate::ReconcileReport finished = mine.run_once();
  EXPECT_EQ(finished.taken, 1u);
  EXPECT_EQ(finished.found + finished.reclaimed, 1u) << finished.first_error;
  EXPECT_EQ(status_of(f.db, "ect.claim_slot", key), "committed");
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 1);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM idemgate_log WHERE gate <> 'ect.claim_slot'"), 0);
  EXPECT_EQ(claims.process(key, msku).status(), Status::duplicate);
  EXPECT_EQ(bank.calls() + bank.lookups(), 0);
}

// Two services in two processes on one file, each with a worker SIGKILLed inside the downstream
// call; then each service's reconciler, in a process of its own and at the same time, finishes
// its own event and never the other's.
TEST(SqliteGates, TwoProcessesReconcileOnlyTheirOwnCrashedWork) {
  TempDir dir;
  const std::string path = dir.file("shared.db");
  {
    SqliteStore store(path);
    store.migrate();
  }  // nothing open across the forks
  {
    auto raw = open_raw(path);
    sq::exec(raw.get(),
             "CREATE TABLE bookings (id INTEGER PRIMARY KEY, container TEXT NOT NULL, slot TEXT "
             "NOT NULL, source_event BLOB NOT NULL)");
  }
  add_payment_tables(path);
  const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
  const Credit credit{"ACC-42", 1250};
  const Key slot_key = idemgate::derive_key("ect.claim_slot", "CIS-7", msku.container);
  const Key pay_key = idemgate::derive_key("payments.credit", "evt_1", credit.account);
  const idemgate::GateOptions short_lease{.lease = 300ms};
  {
    Worker slots([&](int ready) {
      SqliteStore store(path);
      Hanging<SlotRequest> hanging{ready};
      Gate gate{"ect.claim_slot", store, hanging, book, short_lease};
      (void)gate.process(slot_key, msku);
    });
    Worker payments([&](int ready) {
      SqliteStore store(path);
      Hanging<Credit> hanging{ready};
      Gate gate{"payments.credit", store, hanging, credit_account, short_lease};
      (void)gate.process(pay_key, credit);
    });
    ASSERT_TRUE(slots.inside_the_call());
    ASSERT_TRUE(payments.inside_the_call());
    slots.kill_now();
    payments.kill_now();
  }
  EXPECT_EQ(status_of(path, "ect.claim_slot", slot_key), "in_flight");
  EXPECT_EQ(status_of(path, "payments.credit", pay_key), "in_flight");
  std::this_thread::sleep_for(600ms);  // both leases (300 ms, no longer renewed) are over

  // Exit codes: 0 when the child's reconciler finished exactly its own event, else what broke.
  const std::vector<int> codes = idemgate::test::run_in_children(2, [&](int c) {
    SqliteStore store(path);
    const idemgate::ReconcilerOptions now{.stale_after = 0ms};
    if (c == 0) {
      idemgate::test::FakeTerminal<> terminal;
      Gate gate{"ect.claim_slot", store, terminal, book};
      const auto report = Reconciler{gate, now}.run_once();
      if (report.taken != 1 || report.found + report.reclaimed != 1) return 10;
      for (const auto& claim : terminal.received())
        if (claim.container != msku.container || !(claim.key == slot_key)) return 11;
      return terminal.calls() == 1 ? 0 : 12;
    }
    Bank bank("txn-");
    Gate gate{"payments.credit", store, bank, credit_account};
    const auto report = Reconciler{gate, now}.run_once();
    if (report.taken != 1 || report.found + report.reclaimed != 1) return 20;
    for (const Credit& asked : bank.received())
      if (asked.account != credit.account || asked.cents != credit.cents) return 21;
    return bank.calls() == 1 ? 0 : 22;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  EXPECT_EQ(status_of(path, "ect.claim_slot", slot_key), "committed");
  EXPECT_EQ(status_of(path, "payments.credit", pay_key), "committed");
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log"), 2);
  EXPECT_EQ(count(path, "SELECT count(*) FROM bookings WHERE container = 'MSKU7000037'"), 1);
  EXPECT_EQ(count(path, "SELECT count(*) FROM bookings"), 1);
  EXPECT_EQ(count(path, "SELECT count(*) FROM ledger WHERE account = 'ACC-42' AND cents = 1250"),
            1);
  EXPECT_EQ(count(path, "SELECT count(*) FROM ledger"), 1);
}

namespace {

/// The log as the version before gates created it (primary key: the key alone), with its
/// indexes and its mismatch table.
void create_log_without_gates(const std::string& path) {
  auto raw = open_raw(path);
  for (const char* sql :
       {"CREATE TABLE idemgate_log (key BLOB NOT NULL PRIMARY KEY CHECK (typeof(key) = 'blob' "
        "AND length(key) = 32), status TEXT NOT NULL CHECK (status IN ('in_flight', "
        "'committed', 'failed', 'escalated')), fence INTEGER NOT NULL DEFAULT 1 CHECK (fence > "
        "0), lease_until INTEGER NOT NULL, fingerprint BLOB NOT NULL CHECK "
        "(typeof(fingerprint) = 'blob' AND length(fingerprint) = 32), request BLOB NOT NULL, "
        "result BLOB, reason TEXT, duplicates INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT "
        "NULL DEFAULT 1, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, CHECK "
        "(status <> 'committed' OR result IS NOT NULL))",
        "CREATE INDEX idemgate_log_in_flight ON idemgate_log (lease_until) WHERE status = "
        "'in_flight'",
        "CREATE INDEX idemgate_log_escalated ON idemgate_log (updated_at) WHERE status = "
        "'escalated'",
        "CREATE INDEX idemgate_log_failed ON idemgate_log (updated_at) WHERE status = 'failed'",
        "CREATE INDEX idemgate_log_created ON idemgate_log (created_at)",
        "CREATE TABLE idemgate_log_mismatches (key BLOB NOT NULL CHECK (typeof(key) = 'blob' "
        "AND length(key) = 32), stored BLOB NOT NULL, observed BLOB NOT NULL, source TEXT NOT "
        "NULL, at INTEGER NOT NULL)",
        "CREATE INDEX idemgate_log_mismatches_at ON idemgate_log_mismatches (at)",
        "CREATE TABLE bookings (id INTEGER PRIMARY KEY, container TEXT NOT NULL, slot TEXT NOT "
        "NULL, source_event BLOB NOT NULL)"})
    sq::exec(raw.get(), sql);
}

/// One row of the old log.
struct OldRow {
  Key key;
  const char* status;
  std::int64_t fence;
  std::optional<std::string> result;
  std::optional<std::string> reason;
  std::int64_t duplicates;
  std::int64_t attempts;
};

std::int64_t schema_version(const std::string& path) {
  return count(path, "PRAGMA schema_version");
}

}  // namespace

// A populated log of the previous shape migrates in place: every row keeps its data and belongs
// to no gate; a second migrate() changes nothing; adopt_unowned_rows gives the rows to a gate,
// whose reconciler then finishes its stranded one.
TEST(SqliteGates, ALogWithoutGatesMigratesInPlaceAndItsRowsAreAdopted) {
  TempDir dir;
  const std::string path = dir.file("old.db");
  create_log_without_gates(path);
  const SlotRequest msku{"MSKU7000037", "2025-06-09T07:00"};
  std::string request;
  idemgate::codec<SlotRequest>::encode(msku, request);
  const auto print = idemgate::detail::sha256(request);
  const idemgate::SqliteBlob print_blob{
      std::string_view(reinterpret_cast<const char*>(print.data()), print.size())};
  const auto key_of = [](const char* id) { return idemgate::derive_key("ect.claim_slot", id); };
  const std::vector<OldRow> rows = {
      {key_of("committed"), "committed", 1, "slot-1", std::nullopt, 2, 1},
      {key_of("stranded"), "in_flight", 3, std::nullopt, "503 from the terminal", 0, 3},
      {key_of("failed"), "failed", 1, std::nullopt, "no such container", 0, 1},
      {key_of("escalated"), "escalated", 2, std::nullopt, "ambiguous", 1, 2},
      {key_of("held"), "committed", 1, "slot-9", std::nullopt, 0, 1},
  };
  const std::int64_t at = sq::to_micros(std::chrono::system_clock::now() - std::chrono::hours(1));
  {
    auto raw = open_raw(path);
    for (const OldRow& r : rows)
      sq::exec(raw.get(),
               "INSERT INTO idemgate_log (key, status, fence, lease_until, fingerprint, request, "
               "result, reason, duplicates, attempts, created_at, updated_at) VALUES (?, ?, ?, ?, "
               "?, ?, ?, ?, ?, ?, ?, ?)",
               r.key, r.status, r.fence, at, print_blob, idemgate::SqliteBlob{request}, r.result,
               r.reason, r.duplicates, r.attempts, at, at);
    sq::exec(raw.get(),
             "INSERT INTO idemgate_log_mismatches (key, stored, observed, source, at) VALUES (?, "
             "'slot-1', 'slot-2', 'reconciler', ?)",
             rows[0].key, at);
  }

  SqliteStore store(path);
  store.migrate();
  // The new shape: the gate column, the primary key (gate, key), indexes that lead with the gate.
  {
    auto raw = open_raw(path);
    EXPECT_EQ(text(raw.get(),
                   "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                   "pragma_table_info('idemgate_log') WHERE pk > 0 ORDER BY pk)"),
              "gate,key");
    for (const auto& [index, columns] : std::vector<std::pair<std::string, std::string>>{
             {"idemgate_log_in_flight", "gate,lease_until"},
             {"idemgate_log_escalated", "gate,updated_at"},
             {"idemgate_log_failed", "gate,updated_at"},
             {"idemgate_log_created", "gate,created_at"},
             {"idemgate_log_mismatches_at", "gate,at"}})
      EXPECT_EQ(text(raw.get(),
                     "SELECT group_concat(name, ',') FROM (SELECT name FROM "
                     "pragma_index_info('" +
                         index + "') ORDER BY seqno)"),
                columns)
          << index;
    EXPECT_EQ(sq::query_int(raw.get(),
                            "SELECT count(*) FROM sqlite_master WHERE name LIKE "
                            "'%with_gates%'"),
              0)
        << "the rebuilt table took the log's name";
  }
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = ''"), 5);
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log_mismatches WHERE gate = ''"), 1);
  for (const OldRow& r : rows) {
    const auto row = store.find(r.key);  // the constructor's handle: rows of no gate
    ASSERT_TRUE(row.has_value()) << r.status;
    EXPECT_EQ(row->gate, "");
    EXPECT_EQ(idemgate::to_string(row->status), std::string_view(r.status));
    EXPECT_EQ(row->fence, r.fence);
    EXPECT_EQ(row->request, request);
    EXPECT_EQ(row->fingerprint, print);
    EXPECT_EQ(row->result, r.result);
    EXPECT_EQ(row->reason, r.reason.value_or(""));
    EXPECT_EQ(row->duplicates, r.duplicates);
    EXPECT_EQ(row->attempts, r.attempts);
    EXPECT_EQ(sq::to_micros(row->created_at), at);
    EXPECT_EQ(sq::to_micros(row->updated_at), at);
    EXPECT_EQ(sq::to_micros(row->lease_until), at);
  }
  EXPECT_EQ(store.mismatches(10).size(), 1u);

  // Again, from a second store on the file: nothing changes.
  const std::int64_t version = schema_version(path);
  {
    SqliteStore again(path);
    again.migrate();
  }
  store.migrate();
  EXPECT_EQ(schema_version(path), version) << "a second migrate() leaves the schema alone";
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log"), 5);

  // Before adoption the gate sees none of them; its stranded row waits.
  SqliteStore slots = store.for_gate("ect.claim_slot");
  EXPECT_TRUE(slots.take_stale(10, 0s, 1min).empty());
  EXPECT_EQ(slots.signals(std::chrono::hours(2)).events, 0);
  // A redelivery after the upgrade, before adoption: the reservation takes the key's row of no
  // gate over and answers from it (the event is not processed again).
  const auto again = slots.reserve(key_of("held"), print, request, 1min);
  EXPECT_EQ(again.kind, idemgate::Reservation::Kind::existing);
  EXPECT_EQ(again.result, "slot-9");
  EXPECT_THROW((void)store.adopt_unowned_rows(10), std::logic_error);
  EXPECT_EQ(slots.adopt_unowned_rows(2), 2u);
  EXPECT_EQ(slots.adopt_unowned_rows(10), 2u);
  EXPECT_EQ(slots.adopt_unowned_rows(10), 0u);
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = 'ect.claim_slot'"), 5);
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = ''"), 0);
  EXPECT_EQ(slots.find(key_of("held"))->result, "slot-9") << "the held key's row moved whole";
  EXPECT_EQ(slots.find(key_of("failed"))->reason, "no such container");
  EXPECT_EQ(slots.escalated(10).size(), 1u);

  // The gate's reconciler now finishes its stranded row, and only that one.
  idemgate::test::FakeTerminal<> terminal;
  Gate claims{"ect.claim_slot", store, terminal, book};
  Reconciler reconciler{claims, idemgate::ReconcilerOptions{.stale_after = 0ms}};
  const idemgate::ReconcileReport report = reconciler.run_once();
  EXPECT_EQ(report.taken, 1u);
  EXPECT_EQ(report.found + report.reclaimed, 1u) << report.first_error;
  EXPECT_EQ(slots.find(key_of("stranded"))->status, RecordStatus::committed);
  EXPECT_EQ(slots.find(key_of("stranded"))->attempts, 4);
  EXPECT_EQ(count(path, "SELECT count(*) FROM bookings"), 1);
  EXPECT_EQ(claims.process(key_of("committed"), msku).outcome(), "slot-1")
      << "an adopted committed row answers its redelivery";
  EXPECT_EQ(terminal.calls(), 1);
}

// Replicas starting at once each call migrate() on a log without gates: one rebuilds it, the
// others wait for its transaction and find nothing left to do.
TEST(SqliteGates, SeveralProcessesMigratingALogWithoutGatesAtOnceRebuildItOnce) {
  TempDir dir;
  const std::string path = dir.file("replicas.db");
  create_log_without_gates(path);
  const auto print = idemgate::detail::sha256("request");
  const idemgate::SqliteBlob print_blob{
      std::string_view(reinterpret_cast<const char*>(print.data()), print.size())};
  {
    auto raw = open_raw(path);
    for (int i = 0; i < 200; ++i)
      sq::exec(raw.get(),
               "INSERT INTO idemgate_log (key, status, lease_until, fingerprint, request, result, "
               "created_at, updated_at) VALUES (?, 'committed', 0, ?, 'request', 'slot', 0, 0)",
               idemgate::derive_key("replicas", std::to_string(i)), print_blob);
  }
  const std::vector<int> codes = idemgate::test::run_in_children(4, [&](int) {
    SqliteStore store(path, idemgate::SqliteOptions{.busy_timeout = 20s});
    store.migrate();
    return store.find(idemgate::derive_key("replicas", "7")).has_value() ? 0 : 1;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(count(path,
                  "SELECT count(*) FROM idemgate_log WHERE gate = '' AND status = "
                  "'committed'"),
            200);
  EXPECT_EQ(count(path,
                  "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE "
                  "'idemgate_log%'"),
            3)
      << "the log, its mismatch table and its record of migrations, nothing left over";
}

// One webhook, two gates acting on it (credit the account; send the receipt), both deriving the
// key from the webhook's id: each does its work exactly once, however often the webhook comes.
TEST(SqliteGates, OneEventFannedOutToTwoGatesIsProcessedOnceByEach) {
  Fixture f;
  add_payment_tables(f.db);
  Bank bank("txn-");
  SmsSender sms("sms-");
  Gate credits{"sms.credit", f.store, bank, credit_account};
  Gate receipts{"sms.receipt", f.store, sms, log_receipt};
  const std::string webhook_id = "wh_01HZX3";
  const Key key = idemgate::derive_key("sms.webhook", webhook_id);
  const Credit credit{"ACC-7", 500};
  const std::string phone = "+31600000000";
  for (int delivery = 0; delivery < 3; ++delivery) {
    const auto credited = credits.process(key, credit);
    const auto sent = receipts.process(key, phone);
    const Status expected = delivery == 0 ? Status::processed : Status::duplicate;
    EXPECT_EQ(credited.status(), expected) << delivery;
    EXPECT_EQ(sent.status(), expected) << delivery;
    EXPECT_EQ(credited.outcome(), "txn-1");
    EXPECT_EQ(sent.outcome(), "sms-1");
  }
  // Again after a restart, from another store on the file, and from threads at once.
  {
    SqliteStore restarted(f.db);
    Gate credits_again{"sms.credit", restarted, bank, credit_account};
    Gate receipts_again{"sms.receipt", restarted, sms, log_receipt};
    std::vector<std::thread> threads;
    std::atomic<int> duplicates{0};
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        const bool both =
            (t % 2 == 0 ? credits_again.process(key, credit).status()
                        : receipts_again.process(key, phone).status()) == Status::duplicate;
        if (both) duplicates.fetch_add(1);
      });
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(duplicates.load(), 4);
  }
  EXPECT_EQ(bank.calls(), 1);
  EXPECT_EQ(sms.calls(), 1);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM ledger"), 1);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM receipts"), 1);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM idemgate_log"), 2);
  EXPECT_EQ(status_of(f.db, "sms.credit", key), "committed");
  EXPECT_EQ(status_of(f.db, "sms.receipt", key), "committed");
  // Two redeliveries, then two threads per gate: every reservation but the first counted.
  EXPECT_EQ(credits.store().find(key)->duplicates, 4);
  EXPECT_EQ(receipts.store().find(key)->duplicates, 4);
  EXPECT_FALSE(f.store.find(key).has_value()) << "neither row belongs to no gate";
}

// A handle is a view: copies and for_gate share the connection, so the store's lock orders
// calls from every gate, and a handle outlives the store object it came from.
TEST(SqliteGates, AHandleSharesTheConnectionAndOutlivesTheObjectItCameFrom) {
  TempDir dir;
  const std::string path = dir.file("handles.db");
  const Key key = idemgate::derive_key("handles", "1");
  std::optional<SqliteStore> scoped;
  {
    SqliteStore store(path);
    store.migrate();
    scoped.emplace(store.for_gate("payments.credit"));
    EXPECT_EQ(scoped->path(), store.path());
    EXPECT_EQ(SqliteStore(*scoped).gate(), "payments.credit") << "a copy keeps the gate";
  }
  // The hooks SQLite calls belong to the connection, not to the object destroyed above.
  const auto r = reserve(*scoped, key);
  EXPECT_EQ(scoped->commit(key, r.fence, "txn-1", [](SqliteTransaction&) {}),
            idemgate::CommitStatus::committed);
  EXPECT_EQ(scoped->find(key)->gate, "payments.credit");
  EXPECT_EQ(count(path, "SELECT count(*) FROM idemgate_log WHERE gate = 'payments.credit'"), 1);
  EXPECT_THROW((void)scoped->for_gate(""), std::invalid_argument);
  EXPECT_THROW((void)scoped->for_gate("payments credit"), std::invalid_argument);
}

// The scans the store runs for one gate are narrowed by indexes that lead with the gate, never a
// walk over the whole log (or over other gates' rows).
TEST(SqliteGates, EveryScanOfAGateIsNarrowedByAnIndexThatLeadsWithTheGate) {
  Fixture f;
  auto raw = open_raw(f.db);
  const std::vector<std::pair<std::string, std::string>> reads = {
      {"SELECT key FROM idemgate_log WHERE gate = ?5 AND status = 'in_flight' AND lease_until < "
       "?1 AND updated_at <= ?2 ORDER BY lease_until LIMIT ?4",
       "idemgate_log_in_flight"},
      {"SELECT key FROM idemgate_log WHERE gate = ?2 AND status = 'escalated' ORDER BY "
       "updated_at, rowid LIMIT ?1",
       "idemgate_log_escalated"},
      {"SELECT key FROM idemgate_log WHERE gate = ?6 AND status = 'failed' AND updated_at >= ?1 "
       "AND updated_at < ?2 ORDER BY updated_at LIMIT ?3",
       "idemgate_log_failed"},
      {"SELECT count(*), sum(duplicates) FROM idemgate_log WHERE gate = ?2 AND created_at >= ?1",
       "idemgate_log_created"},
      {"SELECT key FROM idemgate_log WHERE gate = ?3 AND created_at < ?1 AND updated_at < ?1 AND "
       "status IN ('committed', 'failed') LIMIT ?2",
       "idemgate_log_created"},
      {"SELECT count(DISTINCT key) FROM idemgate_log_mismatches WHERE gate = ?2 AND at >= ?1",
       "idemgate_log_mismatches_at"},
      {"SELECT status, fence FROM idemgate_log WHERE gate = ?2 AND key = ?1",
       "sqlite_autoindex_idemgate_log_1"},
  };
  for (const auto& [sql, index] : reads) {
    std::string lines;
    for (const std::string& line : plan(raw.get(), sql)) lines += line + "; ";
    EXPECT_NE(lines.find(index), std::string::npos) << sql << " -> " << lines;
    EXPECT_NE(lines.find("gate=?"), std::string::npos) << sql << " -> " << lines;
  }
}
