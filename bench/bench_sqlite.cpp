// The gate on SQLite, beside the same statements written by hand against the sqlite3 C API:
//   sqlite/gate          one gated event (no-op downstream); the business INSERT is a statement
//                        the business write prepared once on the store's connection
//   sqlite/hand_loop     exactly the statements the store ran for one event (captured from the
//                        store's connection with sqlite3_trace_v2), on one connection
//   sqlite/gate_tx_exec  the gate with the business INSERT through SqliteTransaction::exec
//   sqlite/gate_rss      resident memory after --rss-events gated events ÷ after --rss-first
//                        (with GateOptions::cache_capacity = 10000)
//
// Flags: --dir=DIR for the database files (put it on a tmpfs such as /dev/shm so fsync does not
// dominate), --events=N per latency run, --rss-events=N, --rss-first=N.

#include "bench_support.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/sqlite.hpp>

#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using idemgate::bench::expect_processed;
using idemgate::bench::guarded;

using idemgate::bench::NoopDownstream;
using idemgate::bench::timed_events;

const std::string log_table = "bench_log";
// The gate every loop here stands for (the hand loop writes that gate's rows too).
const std::string gate_name = "ect.claim_slot";
const std::string business_sql = "INSERT INTO bench_business (key, outcome) VALUES (?1, ?2)";

struct Settings {
  std::string dir = "/tmp";
  std::int64_t events = 5000;
  std::int64_t rss_events = 1'000'000;
  std::int64_t rss_first = 100'000;
};

Settings settings;

[[noreturn]] void fail(sqlite3* db, const std::string& doing) {
  throw std::runtime_error(doing + ": " + sqlite3_errmsg(db));
}

// A prepared statement owned by the benchmark.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v3(db, sql.c_str(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT,
                           &statement_, nullptr) != SQLITE_OK)
      fail(db, "preparing " + sql);
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(statement_); }

  sqlite3_stmt* get() const noexcept { return statement_; }

  // Steps to the end; true if a row came first (left readable until reset).
  bool step() {
    const int code = sqlite3_step(statement_);
    if (code == SQLITE_ROW) return true;
    if (code != SQLITE_DONE) {
      sqlite3_reset(statement_);
      fail(db_, "stepping");
    }
    return false;
  }
  void run() {
    while (step()) {
    }
    sqlite3_reset(statement_);
  }
  void reset() noexcept { sqlite3_reset(statement_); }

 private:
  sqlite3* db_;
  sqlite3_stmt* statement_ = nullptr;
};

void bind_blob(sqlite3_stmt* s, int index, std::string_view bytes) {
  sqlite3_bind_blob64(s, index, bytes.data(), bytes.size(), SQLITE_STATIC);
}

void bind_text(sqlite3_stmt* s, int index, std::string_view text) {
  sqlite3_bind_text64(s, index, text.data(), text.size(), SQLITE_STATIC, SQLITE_UTF8);
}

// The business INSERT prepared once per connection: the same function for every loop.
class BusinessWrite {
 public:
  void operator()(idemgate::SqliteTransaction& tx, const idemgate::Key& key, const std::string&,
                  const std::string& outcome) {
    write(tx.db(), key, outcome);
  }
  void write(sqlite3* db, const idemgate::Key& key, const std::string& outcome) {
    if (statement_ == nullptr || db != db_) {
      statement_ = std::make_shared<Statement>(db, business_sql);
      db_ = db;
    }
    sqlite3_stmt* s = statement_->get();
    bind_blob(s, 1, key.view());
    sqlite3_bind_text64(s, 2, outcome.data(), outcome.size(), SQLITE_STATIC, SQLITE_UTF8);
    statement_->run();
  }

 private:
  sqlite3* db_ = nullptr;
  std::shared_ptr<Statement> statement_;
};

// The documented way: SqliteTransaction::exec, which prepares the statement on every call.
struct ExecBusinessWrite {
  void operator()(idemgate::SqliteTransaction& tx, const idemgate::Key& key, const std::string&,
                  const std::string& outcome) const {
    tx.exec(business_sql, key, outcome);
  }
};

template <class Write>
using SqliteGate = idemgate::Gate<idemgate::SqliteStore, NoopDownstream, Write>;

// A database file beside the others of this process, removed with its WAL and shared memory.
class DatabaseFile {
 public:
  explicit DatabaseFile(const std::string& stem)
      : path_(settings.dir + "/idemgate-bench-" + std::to_string(::getpid()) + "-" + stem + ".db") {
    remove();
  }
  DatabaseFile(const DatabaseFile&) = delete;
  DatabaseFile& operator=(const DatabaseFile&) = delete;
  ~DatabaseFile() { remove(); }
  const std::string& path() const noexcept { return path_; }

 private:
  void remove() const {
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path_ + suffix).c_str());
  }
  std::string path_;
};

void create_business_table(idemgate::SqliteStore& store) {
  store.migrate();
  sqlite3* db = nullptr;
  if (sqlite3_open(store.path().c_str(), &db) != SQLITE_OK) fail(db, "opening");
  char* error = nullptr;
  const int code = sqlite3_exec(db,
                                "CREATE TABLE IF NOT EXISTS bench_business (key BLOB PRIMARY "
                                "KEY, outcome TEXT NOT NULL)",
                                nullptr, nullptr, &error);
  sqlite3_free(error);
  if (code != SQLITE_OK) fail(db, "creating the business table");
  sqlite3_close(db);
}

idemgate::SqliteOptions store_options() {
  idemgate::SqliteOptions options;
  options.table = log_table;
  return options;
}

// The file both sqlite/gate and sqlite/hand_loop write, so both see the same table.
struct Shared {
  Shared() : file("shared"), store(file.path(), store_options()) { create_business_table(store); }
  DatabaseFile file;
  idemgate::SqliteStore store;
  NoopDownstream downstream;
};

Shared& shared() {
  static Shared instance;
  return instance;
}

template <class Write>
void gated_event(benchmark::State& state) {
  guarded(state, [&] {
    Shared& s = shared();
    SqliteGate<Write> gate(gate_name, s.store, s.downstream, Write{});
    timed_events(state, "bench.sqlite.gate", [&](const idemgate::Key& key) {
      auto result = gate.process(key, idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      expect_processed(result);
    });
  });
}

// The statements the store runs for one first delivery, in order, as SQLite saw them.
struct Captured {
  std::string begin, reserve, end, commit, check;
};

int record_statement(unsigned type, void* context, void* statement, void*) {
  if (type == SQLITE_TRACE_STMT) {
    const char* sql = sqlite3_sql(static_cast<sqlite3_stmt*>(statement));
    if (sql != nullptr) static_cast<std::vector<std::string>*>(context)->emplace_back(sql);
  }
  return 0;
}

Captured capture_statements(Shared& s) {
  std::vector<std::string> seen;
  sqlite3* traced = nullptr;
  BusinessWrite business;
  auto tracing = [&](idemgate::SqliteTransaction& tx, const idemgate::Key& key, const std::string&,
                     const std::string& outcome) {
    if (traced == nullptr) {
      traced = tx.db();
      sqlite3_trace_v2(traced, SQLITE_TRACE_STMT, record_statement, &seen);
    }
    business.write(tx.db(), key, outcome);
  };
  SqliteGate<decltype(tracing)> gate(gate_name, s.store, s.downstream, tracing);
  idemgate::bench::KeySource keys;
  expect_processed(gate.process(keys.next("bench.sqlite.capture"), idemgate::bench::request()));
  seen.clear();
  expect_processed(gate.process(keys.next("bench.sqlite.capture"), idemgate::bench::request()));
  sqlite3_trace_v2(traced, 0, nullptr, nullptr);
  // After the business write the store reads its own row back (the write must not have ended
  // or replaced the transaction); the hand loop runs that statement too.
  const bool expected_shape = seen.size() == 8 && seen[0] == seen[3] && seen[2] == seen[7] &&
                              seen[0].starts_with("BEGIN") && seen[2] == "COMMIT" &&
                              seen[5] == business_sql && seen[6].starts_with("SELECT count(*)");
  if (!expected_shape) {
    std::string list;
    for (const auto& sql : seen) list += "\n  " + sql;
    throw std::runtime_error(
        "the SQLite store no longer runs BEGIN / reserve / COMMIT / BEGIN / commit / business / "
        "check / COMMIT for a first delivery; update the hand loop to what it runs now:" +
        list);
  }
  return {seen[0], seen[1], seen[2], seen[4], seen[6]};
}

std::int64_t now_micros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The same statements by hand: the store's own SQL text, the same parameters in the same order,
// the same two write transactions, on one connection to the same file with the same settings.
class HandLoop {
 public:
  explicit HandLoop(Shared& s) : sql_(capture_statements(s)) {
    open(s);
    idemgate::bench::KeySource keys;
    const idemgate::Key first = keys.next("bench.sqlite.hand.check");
    event(first);
    verify(s, first);
  }
  HandLoop(const HandLoop&) = delete;
  HandLoop& operator=(const HandLoop&) = delete;
  ~HandLoop() {
    begin_.reset();
    reserve_.reset();
    end_.reset();
    commit_.reset();
    check_.reset();
    business_ = BusinessWrite();
    sqlite3_close_v2(db_);
  }

  void event(const idemgate::Key& key) {
    const auto fingerprint = idemgate::detail::sha256(request_);
    const std::int64_t now = now_micros();
    begin_->run();
    // The parameters of idemgate::sql::sqlite::reserve, commit and left_as_written, in order.
    sqlite3_stmt* r = reserve_->get();
    bind_text(r, 1, gate_name);
    bind_blob(r, 2, key.view());
    sqlite3_bind_int64(r, 3, now + lease_us_);
    bind_blob(r, 4, {reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()});
    bind_blob(r, 5, request_);
    sqlite3_bind_int64(r, 6, now);
    bind_text(r, 7, "");
    reserve_->run();
    if (sqlite3_changes(db_) != 1) {
      end_->run();
      throw std::runtime_error("the hand loop met an existing key");
    }
    // A new row's fence.
    const std::int64_t fence = 1;
    end_->run();

    const std::int64_t committed_at = now_micros();
    begin_->run();
    sqlite3_stmt* c = commit_->get();
    bind_text(c, 1, gate_name);
    bind_blob(c, 2, key.view());
    sqlite3_bind_int64(c, 3, fence);
    bind_blob(c, 4, result_);
    sqlite3_bind_int64(c, 5, committed_at);
    commit_->run();
    if (sqlite3_changes(db_) != 1) throw std::runtime_error("the hand loop lost a fence");
    business_.write(db_, key, idemgate::bench::outcome());
    sqlite3_stmt* k = check_->get();
    bind_text(k, 1, gate_name);
    bind_blob(k, 2, key.view());
    sqlite3_bind_int64(k, 3, fence);
    sqlite3_bind_int64(k, 4, committed_at);
    const bool written = check_->step() && sqlite3_column_int64(k, 0) == 1;
    check_->reset();
    if (!written) throw std::runtime_error("the hand loop's row was not as written");
    end_->run();
  }

 private:
  void open(Shared& s) {
    if (sqlite3_open_v2(s.store.path().c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK)
      fail(db_, "opening");
    sqlite3_busy_timeout(db_, 5000);
    sqlite3_exec(db_, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
    sqlite3_exec(db_, "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr);
    begin_ = std::make_unique<Statement>(db_, sql_.begin);
    reserve_ = std::make_unique<Statement>(db_, sql_.reserve);
    end_ = std::make_unique<Statement>(db_, sql_.end);
    commit_ = std::make_unique<Statement>(db_, sql_.commit);
    check_ = std::make_unique<Statement>(db_, sql_.check);
  }

  // Checks one event's row against what the gate would have stored.
  void verify(Shared& s, const idemgate::Key& key) {
    const std::optional<idemgate::Record> row = s.store.for_gate(gate_name).find(key);
    if (!row || row->status != idemgate::RecordStatus::committed || row->fence != 1 ||
        row->request != request_ || row->result != result_ ||
        row->fingerprint != idemgate::detail::sha256(request_))
      throw std::runtime_error(
          "the hand loop's row differs from a gated one; its parameters no "
          "longer match the store's statements");
  }

  Captured sql_;
  sqlite3* db_ = nullptr;
  std::unique_ptr<Statement> begin_, reserve_, end_, commit_, check_;
  BusinessWrite business_;
  std::string request_ = idemgate::bench::request();
  std::string result_ = idemgate::bench::outcome();
  std::int64_t lease_us_ =
      std::chrono::duration_cast<std::chrono::microseconds>(idemgate::GateOptions{}.lease).count();
};

void hand_loop(benchmark::State& state) {
  guarded(state, [&] {
    static HandLoop loop(shared());
    timed_events(state, "bench.sqlite.hand", [&](const idemgate::Key& key) { loop.event(key); });
  });
}

void gate_rss(benchmark::State& state) {
  guarded(state, [&] {
    const DatabaseFile file("rss");
    idemgate::SqliteStore store(file.path(), store_options());
    create_business_table(store);
    NoopDownstream downstream;
    // The cache on: its bound is part of what this run proves.
    idemgate::GateOptions options;
    options.cache_capacity = 10'000;
    SqliteGate<BusinessWrite> gate(gate_name, store, downstream, BusinessWrite{}, options);
    idemgate::bench::KeySource keys;
    std::int64_t done = 0;
    double first = 0;
    for (auto _ : state) {
      auto result = gate.process(keys.next("bench.sqlite.rss"), idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      if (result.status() != idemgate::Status::processed) expect_processed(result);
      if (++done == settings.rss_first) first = idemgate::bench::resident_kib();
    }
    const double last = idemgate::bench::resident_kib();
    state.counters["rss_first_kib"] = first;
    state.counters["rss_last_kib"] = last;
    state.counters["rss_growth"] = first > 0 ? last / first : 0;
    state.counters["first_events"] = static_cast<double>(settings.rss_first);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const idemgate::bench::Flags flags(argc, argv, {"dir", "events", "rss-events", "rss-first"});
  settings.dir = flags.text("dir", settings.dir);
  settings.events = flags.count("events", settings.events);
  settings.rss_events = flags.count("rss-events", settings.rss_events);
  settings.rss_first = flags.count("rss-first", settings.rss_events / 10);

  const auto latency = [](benchmark::internal::Benchmark* b) {
    b->Iterations(settings.events)->UseRealTime()->Unit(benchmark::kMicrosecond);
  };
  latency(benchmark::RegisterBenchmark("sqlite/gate", gated_event<BusinessWrite>));
  latency(benchmark::RegisterBenchmark("sqlite/hand_loop", hand_loop));
  latency(benchmark::RegisterBenchmark("sqlite/gate_tx_exec", gated_event<ExecBusinessWrite>));
  benchmark::RegisterBenchmark("sqlite/gate_rss", gate_rss)
      ->Iterations(settings.rss_events)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  return idemgate::bench::run_benchmarks(argc, argv);
}
