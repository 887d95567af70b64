// Where the server's work goes per gated event, beside a bare business-INSERT transaction
// (scripts/bench --server-work). One worker, one event at a time, every event new:
//   gate             gate.process with one business INSERT (prepared) in the commit transaction
//   relaxed          the same gate with PostgresOptions::relaxed_reservations
//   relaxed_outcomes the same gate with PostgresOptions::relaxed_outcomes (durable reservations)
//   one_transaction  TransactionGate: the reservation, the same business INSERT and the row's
//                    commit in one transaction (PostgresStore::commit_once)
//   bare             BEGIN, the same prepared INSERT, COMMIT, on one connection of the same driver
//   skeleton         the gate's shape with the narrowest statements: an autocommit INSERT of the
//                    key into a one-column table, then BEGIN, the same business INSERT, an UPDATE
//                    of that key's row, COMMIT (two durable commits, five round trips); between
//                    bare and gate, it parts what the shape costs from what the log's rows cost
//   round_trip       a prepared SELECT 1 in autocommit: what one empty round trip costs the server
//   generations      the gate over a log of generations (PostgresOptions::partitioned_log) with
//                    three live generations, as a log under retention has while a snapshot is
//                    held: two older ones of 1,000 events each and the current one
// Per event and per kind: the server's CPU (every server process, the exited ones included
// through the postmaster's children's times), the CPU of the client backends alone, WAL bytes
// (pg_current_wal_lsn before and after), round trips (send() calls of this process on the
// server's sockets: libpq sends each request, or each batch of requests it sends together, with
// one call), statements, plan and execution time (pg_stat_statements), and the log's updates
// that were HOT (pg_stat_user_tables). Kinds alternate over rounds, each on fresh connections
// after untimed warm-up events; figures are medians over rounds.
// The server's CPU of a round also holds what its events do not cause (the monitor's queries,
// the background processes over the round, the source's connections ending, whose CPU then
// counts in whole clock ticks), spread over the round's events: for a kind as light as
// round_trip that is a large part of the figure, and the client backends' CPU is the closer one.
//
// Usage: server_work --pg=URI --postmaster-pid=PID [--events=N] [--rounds=N] [--warm-up=N]
//                    [--kinds=K,K,...]
// (defaults: 2000 events per kind and round, 3 rounds, 200 untimed events per kind and round,
// every kind; a ratio whose kinds did not run prints as 0).
// Prints a table and, as its last line, one JSON object.

#include "postgres_workload.hpp"
#include "server_cpu.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/transaction_gate.hpp>

#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<std::uint64_t> sends{0};

}  // namespace

// libpq writes every request with send(): counting the calls counts the round trips of a
// client that waits for each answer (the program is linked with its symbols exported, so this
// definition comes before the C library's).
extern "C" ssize_t send(int fd, const void* buffer, size_t length, int flags) {
  using Send = ssize_t (*)(int, const void*, size_t, int);
  static const auto real = reinterpret_cast<Send>(dlsym(RTLD_NEXT, "send"));
  sends.fetch_add(1, std::memory_order_relaxed);
  return real(fd, buffer, length, flags);
}

namespace {

namespace pg = idemgate::bench::pg;

const char* const usage =
    "usage: server_work --pg=URI --postmaster-pid=PID [--events=N] [--rounds=N] [--warm-up=N]\n"
    "                   [--kinds=K,K,...]";

const std::vector<std::string> all_kinds{"gate", "relaxed",  "relaxed_outcomes", "one_transaction",
                                         "bare", "skeleton", "round_trip",       "generations"};

struct Settings {
  std::string uri;
  long postmaster = 0;
  int events = 2000;
  int rounds = 3;
  int warm_up = 200;
  std::vector<std::string> kinds = all_kinds;
};

// The settings from the command line; throws std::invalid_argument naming a flag it cannot take.
Settings parse(int argc, char** argv) {
  const idemgate::bench::Flags flags(
      argc, argv, {"pg", "postmaster-pid", "events", "rounds", "warm-up", "kinds"});
  flags.expect_no_others(argc, argv);
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  Settings s;
  s.uri = flags.text("pg");
  s.postmaster = static_cast<long>(
      flags.integer("postmaster-pid", s.postmaster, 1, std::numeric_limits<long>::max()));
  s.events = static_cast<int>(flags.integer("events", s.events, 1, int_max));
  s.rounds = static_cast<int>(flags.integer("rounds", s.rounds, 1, int_max));
  s.warm_up = static_cast<int>(flags.integer("warm-up", s.warm_up, 0, int_max));
  if (s.uri.empty() || s.postmaster <= 0)
    throw std::invalid_argument("needs --pg=URI and --postmaster-pid=PID");
  if (const std::string listed = flags.text("kinds"); !listed.empty()) {
    s.kinds.clear();
    std::istringstream in(listed);
    for (std::string kind; std::getline(in, kind, ',');) {
      if (std::find(all_kinds.begin(), all_kinds.end(), kind) == all_kinds.end())
        throw std::invalid_argument("--kinds: no kind named '" + kind + "'");
      s.kinds.push_back(kind);
    }
  }
  return s;
}

double backends_cpu_us(const std::vector<long>& pids) {
  double total = 0;
  for (const long pid : pids) total += idemgate::bench::process_cpu_us(pid, false);
  return total;
}

struct Snapshot {
  double server_us = 0;
  double backends_us = 0;
  std::int64_t wal = 0;
  std::uint64_t sends = 0;
  std::int64_t updates = 0;
  std::int64_t hot_updates = 0;
};

// What the monitor session reads; it is not part of what is measured.
class Monitor {
 public:
  explicit Monitor(const Settings& settings) : settings_(settings), connection_(settings.uri) {
    pqxx::nontransaction tx(connection_);
    tx.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  }

  std::vector<long> client_backends() {
    pqxx::nontransaction tx(connection_);
    std::vector<long> pids;
    for (const auto& row :
         tx.exec("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
                 " AND pid <> pg_backend_pid()"))
      pids.push_back(static_cast<long>(idemgate::detail::pq::int_field(row[0])));
    return pids;
  }

  Snapshot take(const std::vector<long>& backends) {
    Snapshot s;
    s.sends = sends.load();
    s.backends_us = backends_cpu_us(backends);
    s.server_us = idemgate::bench::server_cpu_us(settings_.postmaster);
    pqxx::nontransaction tx(connection_);
    s.wal = idemgate::detail::pq::int_field(
        tx.exec("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0]);
    const pqxx::result t = tx.exec(
        "SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint"
        " FROM pg_stat_user_tables WHERE relname = '" +
        pg::log_table + "'");
    s.updates = idemgate::detail::pq::int_field(t[0][0]);
    s.hot_updates = idemgate::detail::pq::int_field(t[0][1]);
    return s;
  }

  void reset_statements() {
    pqxx::nontransaction tx(connection_);
    tx.exec("SELECT pg_stat_statements_reset()");
  }

  // The statements since the reset, except the monitor's own.
  pqxx::result statements() {
    pqxx::nontransaction tx(connection_);
    return tx.exec(
        "SELECT calls, total_plan_time, total_exec_time, wal_bytes::bigint, rows, shared_blks_hit,"
        " regexp_replace(left(query, 90), '\\s+', ' ', 'g') FROM pg_stat_statements"
        " WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal_lsn%'"
        " AND query NOT LIKE '%pg_backend_pid%' ORDER BY total_exec_time + total_plan_time DESC");
  }

 private:
  const Settings& settings_;
  pqxx::connection connection_;
};

struct BusinessWrite {
  void operator()(pqxx::work& tx, const idemgate::Key& key, const std::string&,
                  const std::string& outcome) const {
    pg::write_business(tx, key, outcome);
  }
};

using PgGate =
    idemgate::Gate<idemgate::PostgresStore, idemgate::bench::NoopDownstream, BusinessWrite>;

// One event source: the gate over a fresh store, or a reference on a fresh connection.
class Source {
 public:
  virtual ~Source() = default;
  virtual void event(const idemgate::Key& key) = 0;
  /// The untimed events before the measured ones.
  virtual void warm_up(idemgate::bench::KeySource& keys, int events) {
    for (int i = 0; i < events; ++i) event(keys.next("bench.server_work"));
  }
};

// The gate's options: its own log table, one prepared business INSERT.
idemgate::PostgresOptions gate_options(const std::string& table) {
  idemgate::PostgresOptions options;
  options.table = table;
  options.business_statements = {{pg::business_statement, pg::business_insert_sql()}};
  return options;
}

class GateSource : public Source {
 public:
  GateSource(const std::string& uri, idemgate::PostgresOptions options)
      : store_(uri, std::move(options)),
        gate_(pg::gate_name, store_, downstream_, BusinessWrite{}) {}
  void event(const idemgate::Key& key) override {
    idemgate::bench::expect_processed(gate_.process(key, idemgate::bench::request()));
  }

 protected:
  idemgate::PostgresStore store_;

 private:
  idemgate::bench::NoopDownstream downstream_;
  PgGate gate_;
};

// The gate over a log of generations, its own table made again for every round: two older
// generations of 1,000 events each, then the warm-up and the measured events in the current one.
class GenerationsSource : public GateSource {
 public:
  explicit GenerationsSource(const std::string& uri) : GateSource(uri, options(uri)) {
    store_.migrate();
  }
  void warm_up(idemgate::bench::KeySource& keys, int events) override {
    for (int generation = 0; generation < 2; ++generation) {
      Source::warm_up(keys, older_rows);
      store_.start_generation();
    }
    Source::warm_up(keys, events);
  }

 private:
  static inline const std::string table = "bench_generations_log";
  static constexpr int older_rows = 1000;
  // Drops the table of the round before, then the options of a log of generations.
  static idemgate::PostgresOptions options(const std::string& uri) {
    {
      pqxx::connection c(uri);
      pqxx::nontransaction tx(c);
      tx.exec("DROP TABLE IF EXISTS " + table + ", " + table + "_generations, " + table +
              "_migrations, " + table + "_mismatches CASCADE");
    }
    idemgate::PostgresOptions o = gate_options(table);
    o.partitioned_log = true;
    return o;
  }
};

class BareSource : public Source {
 public:
  explicit BareSource(const std::string& uri) : connection_(uri) {
    idemgate::detail::pq::prepare(connection_, pg::business_statement, pg::business_insert_sql());
  }
  void event(const idemgate::Key& key) override {
    pqxx::work tx(connection_);
    pg::write_business(tx, key, idemgate::bench::outcome());
    tx.commit();
  }

 private:
  pqxx::connection connection_;
};

// TransactionGate: the reservation, the business INSERT and the row's commit in one transaction.
class OneTransactionSource : public Source {
 public:
  explicit OneTransactionSource(const std::string& uri)
      : store_(uri, gate_options(pg::log_table)),
        gate_(pg::gate_name, store_,
              [](pqxx::work& tx, const idemgate::Key& key, const std::string&) {
                pg::write_business(tx, key, idemgate::bench::outcome());
                return idemgate::bench::outcome();
              }) {}
  void event(const idemgate::Key& key) override {
    idemgate::bench::expect_processed(gate_.process(key, idemgate::bench::request()));
  }

 private:
  using Write = std::function<std::string(pqxx::work&, const idemgate::Key&, const std::string&)>;
  idemgate::PostgresStore store_;
  idemgate::TransactionGate<idemgate::PostgresStore, std::string, std::string, Write> gate_;
};

// The gate's transactions and round trips with the narrowest statements that have its shape.
class SkeletonSource : public Source {
 public:
  explicit SkeletonSource(const std::string& uri) : connection_(uri) {
    namespace pq = idemgate::detail::pq;
    pq::prepare(connection_, pg::business_statement, pg::business_insert_sql());
    pq::prepare(connection_, hold, "INSERT INTO " + table + " (key) VALUES ($1::bytea)");
    pq::prepare(connection_, settle, "UPDATE " + table + " SET done = true WHERE key = $1::bytea");
  }
  static std::string schema_sql() {
    return "CREATE TABLE IF NOT EXISTS " + table +
           " (key bytea PRIMARY KEY, done boolean NOT NULL DEFAULT false)";
  }
  void event(const idemgate::Key& key) override {
    namespace pq = idemgate::detail::pq;
    const std::string key_param = pg::bytea_text(key.view());
    {
      pqxx::nontransaction reservation(connection_);
      pq::exec_prepared(reservation, hold, key_param);
    }
    pqxx::work tx(connection_);
    pg::write_business(tx, key, idemgate::bench::outcome());
    if (pq::affected_rows(pq::exec_prepared(tx, settle, key_param)) != 1)
      throw std::runtime_error("the skeleton's row was not there to settle");
    tx.commit();
  }

 private:
  static inline const std::string table = "bench_skeleton";
  static constexpr const char* hold = "bench_skeleton_hold";
  static constexpr const char* settle = "bench_skeleton_settle";
  pqxx::connection connection_;
};

// One empty round trip per event: a prepared SELECT 1 in autocommit.
class RoundTripSource : public Source {
 public:
  explicit RoundTripSource(const std::string& uri) : connection_(uri) {
    idemgate::detail::pq::prepare(connection_, statement, "SELECT 1");
  }
  void event(const idemgate::Key&) override {
    pqxx::nontransaction tx(connection_);
    if (idemgate::detail::pq::exec_prepared(tx, statement).size() != 1)
      throw std::runtime_error("SELECT 1 did not return one row");
  }

 private:
  static constexpr const char* statement = "bench_round_trip";
  pqxx::connection connection_;
};

std::unique_ptr<Source> source_of(const std::string& kind, const std::string& uri) {
  if (kind == "gate" || kind == "relaxed" || kind == "relaxed_outcomes") {
    idemgate::PostgresOptions options = gate_options(pg::log_table);
    options.relaxed_reservations = kind == "relaxed";
    options.relaxed_outcomes = kind == "relaxed_outcomes";
    return std::make_unique<GateSource>(uri, std::move(options));
  }
  if (kind == "one_transaction") return std::make_unique<OneTransactionSource>(uri);
  if (kind == "bare") return std::make_unique<BareSource>(uri);
  if (kind == "skeleton") return std::make_unique<SkeletonSource>(uri);
  if (kind == "round_trip") return std::make_unique<RoundTripSource>(uri);
  if (kind == "generations") return std::make_unique<GenerationsSource>(uri);
  throw std::logic_error("no event source named " + kind);
}

struct StatementLine {
  double calls = 0, plan_ms = 0, exec_ms = 0, wal = 0, rows = 0, buffers = 0;
};

struct Figures {
  double server_us = 0, backends_us = 0, wal = 0, round_trips = 0, statements = 0, plan_us = 0,
         exec_us = 0, hot_fraction = -1;
  std::map<std::string, StatementLine> lines;  // per event
};

Figures measure(const Settings& settings, Monitor& monitor, const std::string& kind) {
  idemgate::bench::KeySource keys;
  std::unique_ptr<Source> source = source_of(kind, settings.uri);
  source->warm_up(keys, settings.warm_up);
  const std::vector<long> backends = monitor.client_backends();
  // Statistics of the warm-up reach the shared counters before the first snapshot.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  monitor.reset_statements();
  const Snapshot before = monitor.take(backends);
  for (int i = 0; i < settings.events; ++i) source->event(keys.next("bench.server_work"));
  const std::uint64_t sent = sends.load() - before.sends;
  const double backends_us = backends_cpu_us(backends) - before.backends_us;
  // Closing the connections makes their backends flush their table statistics.
  source.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const Snapshot after = monitor.take({});
  const double n = settings.events;
  Figures f;
  f.server_us = (after.server_us - before.server_us) / n;
  f.backends_us = backends_us / n;
  f.wal = static_cast<double>(after.wal - before.wal) / n;
  f.round_trips = static_cast<double>(sent) / n;
  const auto updates = after.updates - before.updates;
  if (updates > 0)
    f.hot_fraction =
        static_cast<double>(after.hot_updates - before.hot_updates) / static_cast<double>(updates);
  for (const auto& row : monitor.statements()) {
    StatementLine line;
    line.calls = static_cast<double>(idemgate::detail::pq::int_field(row[0])) / n;
    line.plan_ms = std::stod(row[1].c_str()) / n;
    line.exec_ms = std::stod(row[2].c_str()) / n;
    line.wal = static_cast<double>(idemgate::detail::pq::int_field(row[3])) / n;
    line.rows = static_cast<double>(idemgate::detail::pq::int_field(row[4])) / n;
    line.buffers = static_cast<double>(idemgate::detail::pq::int_field(row[5])) / n;
    f.statements += line.calls;
    f.plan_us += line.plan_ms * 1000;
    f.exec_us += line.exec_ms * 1000;
    f.lines[row[6].c_str()] = line;
  }
  return f;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// The median over rounds of one figure.
template <class Get>
double over_rounds(const std::vector<Figures>& rounds, Get get) {
  std::vector<double> v;
  for (const Figures& f : rounds) v.push_back(get(f));
  return median(v);
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  try {
    settings = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "server_work: " << e.what() << "\n" << usage << "\n";
    return 2;
  }
  try {
    {
      idemgate::PostgresOptions options;
      options.table = pg::log_table;
      idemgate::PostgresStore store(settings.uri, options);
      store.migrate();
      pqxx::connection c(settings.uri);
      pqxx::nontransaction tx(c);
      tx.exec(pg::business_schema_sql());
      tx.exec(SkeletonSource::schema_sql());
    }
    Monitor monitor(settings);
    const std::vector<std::string>& kinds = settings.kinds;
    std::map<std::string, std::vector<Figures>> rounds;
    for (int r = 0; r < settings.rounds; ++r) {
      // The order reverses every round, so a drift within a round favours no kind.
      std::vector<std::string> order = kinds;
      if (r % 2) std::reverse(order.begin(), order.end());
      for (const std::string& kind : order) {
        rounds[kind].push_back(measure(settings, monitor, kind));
        std::cerr << "round " << r + 1 << " " << kind << ": " << rounds[kind].back().server_us
                  << " us server CPU per event\n";
      }
    }
    std::map<std::string, Figures> m;
    for (const auto& [kind, figures] : rounds) {
      Figures& f = m[kind];
      f.server_us = over_rounds(figures, [](const Figures& x) { return x.server_us; });
      f.backends_us = over_rounds(figures, [](const Figures& x) { return x.backends_us; });
      f.wal = over_rounds(figures, [](const Figures& x) { return x.wal; });
      f.round_trips = over_rounds(figures, [](const Figures& x) { return x.round_trips; });
      f.statements = over_rounds(figures, [](const Figures& x) { return x.statements; });
      f.plan_us = over_rounds(figures, [](const Figures& x) { return x.plan_us; });
      f.exec_us = over_rounds(figures, [](const Figures& x) { return x.exec_us; });
      f.hot_fraction = over_rounds(figures, [](const Figures& x) { return x.hot_fraction; });
      f.lines = figures.back().lines;
    }
    std::printf("per event, median of %d rounds of %d events (after %d untimed)\n", settings.rounds,
                settings.events, settings.warm_up);
    std::printf("%-16s %14s %14s %10s %12s %11s %9s %9s\n", "kind", "server_cpu_us",
                "backend_cpu_us", "wal_bytes", "round_trips", "statements", "plan_us", "exec_us");
    for (const std::string& kind : kinds) {
      const Figures& f = m[kind];
      std::printf("%-16s %14.1f %14.1f %10.0f %12.2f %11.2f %9.1f %9.1f\n", kind.c_str(),
                  f.server_us, f.backends_us, f.wal, f.round_trips, f.statements, f.plan_us,
                  f.exec_us);
    }
    for (const std::string& kind : kinds) {
      const Figures& f = m[kind];
      std::printf("\n%s: statements per event (last round)\n", kind.c_str());
      std::printf("%6s %8s %8s %8s %6s %8s  %s\n", "calls", "plan_us", "exec_us", "wal_B", "rows",
                  "buffers", "query");
      for (const auto& [query, line] : f.lines)
        std::printf("%6.2f %8.1f %8.1f %8.0f %6.2f %8.1f  %s\n", line.calls, line.plan_ms * 1000,
                    line.exec_ms * 1000, line.wal, line.rows, line.buffers, query.c_str());
    }
    if (m["gate"].hot_fraction >= 0)
      std::printf("\nHOT updates of the log: %.0f %% of its updates\n",
                  m["gate"].hot_fraction * 100);
    const Figures& g = m["gate"];
    const Figures& b = m["bare"];
    const Figures& x = m["relaxed"];
    const Figures& y = m["relaxed_outcomes"];
    const Figures& k = m["skeleton"];
    const Figures& t = m["round_trip"];
    // A ratio is the median of the rounds' own ratios: the two kinds of a round ran minutes
    // apart at most, so a slow stretch of the machine moves both.
    const auto ratio = [&](const std::string& kind, const std::string& base) {
      std::vector<double> per_round;
      for (std::size_t r = 0; r < rounds[kind].size() && r < rounds[base].size(); ++r)
        if (rounds[base][r].server_us > 0)
          per_round.push_back(rounds[kind][r].server_us / rounds[base][r].server_us);
      return per_round.empty() ? 0.0 : median(per_round);
    };
    std::printf(
        "\nserver CPU per event, median of the rounds' ratios: gate / bare %.2f, "
        "relaxed_outcomes / bare %.2f, skeleton / bare %.2f, gate / skeleton %.2f, "
        "relaxed_outcomes / gate %.2f, one_transaction / bare %.2f, generations / gate %.2f\n",
        ratio("gate", "bare"), ratio("relaxed_outcomes", "bare"), ratio("skeleton", "bare"),
        ratio("gate", "skeleton"), ratio("relaxed_outcomes", "gate"),
        ratio("one_transaction", "bare"), ratio("generations", "gate"));
    std::printf(
        "{\"server_cpu_us_per_event\": %.1f, \"bare_server_cpu_us_per_event\": %.1f, "
        "\"server_cpu_per_event_vs_bare\": %.2f, \"backend_cpu_us_per_event\": %.1f, "
        "\"bare_backend_cpu_us_per_event\": %.1f, \"wal_bytes_per_event\": %.0f, "
        "\"bare_wal_bytes_per_event\": %.0f, \"wal_bytes_per_event_vs_bare\": %.2f, "
        "\"round_trips_per_event\": %.2f, \"bare_round_trips_per_event\": %.2f, "
        "\"statements_per_event\": %.2f, \"bare_statements_per_event\": %.2f, "
        "\"plan_us_per_event\": %.1f, \"exec_us_per_event\": %.1f, "
        "\"bare_plan_us_per_event\": %.1f, \"bare_exec_us_per_event\": %.1f, "
        "\"log_hot_update_fraction\": %.2f, \"relaxed_server_cpu_us_per_event\": %.1f, "
        "\"relaxed_server_cpu_per_event_vs_bare\": %.2f, \"relaxed_wal_bytes_per_event\": %.0f, "
        "\"relaxed_round_trips_per_event\": %.2f, \"one_transaction_vs_bare\": %.2f, "
        "\"one_transaction_vs_gate\": %.2f, \"one_transaction_vs_bare_target\": 1.3, "
        "\"server_cpu_per_event_vs_bare_target\": 2.5, "
        "\"relaxed_outcomes_server_cpu_us_per_event\": %.1f, "
        "\"relaxed_outcomes_server_cpu_per_event_vs_bare\": %.2f, "
        "\"relaxed_outcomes_wal_bytes_per_event\": %.0f, "
        "\"relaxed_outcomes_round_trips_per_event\": %.2f, "
        "\"skeleton_server_cpu_us_per_event\": %.1f, \"skeleton_vs_bare\": %.2f, "
        "\"gate_vs_skeleton\": %.2f, \"round_trip_server_cpu_us\": %.1f, "
        "\"generations_server_cpu_us_per_event\": %.1f, \"generations_vs_gate\": %.2f}\n",
        g.server_us, b.server_us, ratio("gate", "bare"), g.backends_us, b.backends_us, g.wal, b.wal,
        b.wal > 0 ? g.wal / b.wal : 0, g.round_trips, b.round_trips, g.statements, b.statements,
        g.plan_us, g.exec_us, b.plan_us, b.exec_us, g.hot_fraction, x.server_us,
        ratio("relaxed", "bare"), x.wal, x.round_trips, ratio("one_transaction", "bare"),
        ratio("one_transaction", "gate"), y.server_us, ratio("relaxed_outcomes", "bare"), y.wal,
        y.round_trips, k.server_us, ratio("skeleton", "bare"), ratio("gate", "skeleton"),
        t.server_us, m["generations"].server_us, ratio("generations", "gate"));
  } catch (const std::exception& e) {
    std::cerr << "server_work: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
