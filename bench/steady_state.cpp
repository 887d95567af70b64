// A steady state over time (scripts/bench --steady-state): worker threads process new events
// through one gate as fast as it goes, for `--windows` retention windows of `--keep-s` seconds,
// while (with --retention) `Retention` purges every second what is older than the window, and
// (with --hold-snapshot-s) another session holds a REPEATABLE READ snapshot open from the end of
// the first window on, which keeps vacuum from removing any row deleted or updated after it.
// With --failing the traffic is a server-side endpoint's whose handler always throws: every
// request under a new key, none completing (each row is left in flight, its lease given back);
// with --abandoned, retention also deletes those rows past the window (`abandoned_after`).
// Every sample prints the events per second since the previous one, the log's heap and index
// sizes (pg_relation_size, pg_indexes_size), its live and dead rows and its vacuums; the last line
// is one JSON object with the throughput after the first window and the sizes at its end and at
// the end of the run.
//
// Usage: steady_state --pg=URI [--keep-s=N] [--windows=N] [--workers=N] [--retention]
//                     [--hold-snapshot-s=N] [--sample-s=N] [--autovacuum=default|log]
//                     [--postmaster-pid=PID] [--failing [--abandoned]] [--partitioned]
//   Defaults: --keep-s=10 --windows=10 --workers=4, no retention, no snapshot held,
//   --sample-s=0 (every keep-s / 2 seconds, at least 1), --autovacuum=default.
//   --postmaster-pid adds the server's CPU per event to every sample (server_cpu.hpp).
//   --partitioned runs on a log of generations (PostgresOptions::partitioned_log); its sizes are
//   its generations' together.
//   --autovacuum=log sets the log table's autovacuum storage parameters that docs/operations.md
//   recommends for a log under retention before the run.

#include "postgres_workload.hpp"
#include "server_cpu.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/retention.hpp>
#include <idemgate/server/endpoint.hpp>
#include <idemgate/store/postgres.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace pg = idemgate::bench::pg;

const std::string table = "steady_log";
const std::string business = "steady_business";

const char* const usage =
    "usage: steady_state --pg=URI [--keep-s=N] [--windows=N] [--workers=N] [--retention]\n"
    "                    [--hold-snapshot-s=N] [--sample-s=N] [--autovacuum=default|log]\n"
    "                    [--postmaster-pid=PID] [--failing [--abandoned]] [--partitioned]";

struct Settings {
  std::string uri;
  int keep_s = 10;
  int windows = 10;
  int workers = 4;
  bool retention = false;
  bool partitioned = false;
  int hold_s = 0;
  int sample_s = 0;
  std::string autovacuum = "default";
  long postmaster = 0;
  bool failing = false;
  bool abandoned = false;
};

// The settings from the command line; throws std::invalid_argument naming a flag it cannot take.
Settings parse(int argc, char** argv) {
  const idemgate::bench::Flags flags(argc, argv,
                                     {"pg", "keep-s", "windows", "workers", "hold-snapshot-s",
                                      "sample-s", "autovacuum", "postmaster-pid"},
                                     {"retention", "failing", "abandoned", "partitioned"});
  flags.expect_no_others(argc, argv);
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  Settings s;
  s.uri = flags.text("pg");
  s.keep_s = static_cast<int>(flags.integer("keep-s", s.keep_s, 1, int_max));
  s.windows = static_cast<int>(flags.integer("windows", s.windows, 2, int_max));
  s.workers = static_cast<int>(flags.integer("workers", s.workers, 1, int_max));
  s.retention = flags.flag("retention");
  s.partitioned = flags.flag("partitioned");
  s.failing = flags.flag("failing");
  s.abandoned = flags.flag("abandoned");
  if (s.abandoned && !(s.failing && s.retention))
    throw std::invalid_argument("--abandoned goes with --failing and --retention");
  s.hold_s = static_cast<int>(flags.integer("hold-snapshot-s", s.hold_s, 0, int_max));
  s.sample_s = static_cast<int>(flags.integer("sample-s", s.sample_s, 0, int_max));
  s.autovacuum = flags.text("autovacuum", s.autovacuum);
  s.postmaster = static_cast<long>(
      flags.integer("postmaster-pid", s.postmaster, 0, std::numeric_limits<long>::max()));
  if (s.uri.empty() || (s.autovacuum != "default" && s.autovacuum != "log"))
    throw std::invalid_argument("needs --pg=URI, and --autovacuum=default or log");
  if (s.sample_s <= 0) s.sample_s = std::max(1, s.keep_s / 2);
  return s;
}

struct BusinessWrite {
  void operator()(pqxx::work& tx, const idemgate::Key& key, const std::string&,
                  const std::string& outcome) const {
    idemgate::detail::pq::exec_prepared(tx, "steady_business_insert", pg::bytea_text(key.view()),
                                        outcome);
  }
};

using PgGate =
    idemgate::Gate<idemgate::PostgresStore, idemgate::bench::NoopDownstream, BusinessWrite>;

struct Sample {
  double at_s = 0, events_per_s = 0, server_cpu_us_per_event = 0;
  std::int64_t heap = 0, indexes = 0, live = 0, dead = 0, vacuums = 0, rows = 0;
};

Sample sample(pqxx::connection& monitor) {
  pqxx::nontransaction tx(monitor);
  const pqxx::result r = tx.exec(
      // The table's own figures, or the sum of its generations' (--partitioned).
      "SELECT sum(pg_relation_size(relid)), sum(pg_indexes_size(relid)),"
      " sum(coalesce(n_live_tup, 0)), sum(coalesce(n_dead_tup, 0)),"
      " sum(coalesce(autovacuum_count + vacuum_count, 0))"
      " FROM pg_stat_user_tables WHERE relid = '" +
      table +
      "'::regclass"
      " OR relid IN (SELECT relid FROM pg_partition_tree('" +
      table +
      "') WHERE isleaf)"
      " HAVING count(*) > 0");
  Sample s;
  if (r.empty()) return s;
  s.heap = idemgate::detail::pq::int_field(r[0][0]);
  s.indexes = idemgate::detail::pq::int_field(r[0][1]);
  s.live = idemgate::detail::pq::int_field(r[0][2]);
  s.dead = idemgate::detail::pq::int_field(r[0][3]);
  s.vacuums = idemgate::detail::pq::int_field(r[0][4]);
  s.rows = idemgate::detail::pq::int_field(tx.exec("SELECT count(*) FROM " + table)[0][0]);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  try {
    settings = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "steady_state: " << e.what() << "\n" << usage << "\n";
    return 2;
  }
  try {
    pqxx::connection monitor(settings.uri);
    {
      pqxx::nontransaction tx(monitor);
      tx.exec("DROP TABLE IF EXISTS " + table + ", " + table + "_mismatches, " + table +
              "_migrations, " + table + "_generations, " + business);
      for (const auto& row : tx.exec("SELECT relname FROM pg_class WHERE relkind = 'r' AND "
                                     "relname ~ '^" +
                                     table + "_g[0-9]+$'"))
        tx.exec("DROP TABLE " + std::string(row[0].c_str()));
      tx.exec("CREATE TABLE " + business +
              " (key bytea PRIMARY KEY, outcome text NOT NULL, created_at timestamptz NOT NULL "
              "DEFAULT now())");
    }
    idemgate::PostgresOptions options;
    options.table = table;
    options.partitioned_log = settings.partitioned;
    options.pool_size = static_cast<std::size_t>(settings.workers) + 1;
    options.business_statements = {
        {"steady_business_insert",
         "INSERT INTO " + business + " (key, outcome) VALUES ($1::bytea, $2::text)"}};
    idemgate::PostgresStore store(settings.uri, options);
    store.migrate();
    if (settings.autovacuum == "log") {
      pqxx::nontransaction tx(monitor);
      tx.exec("ALTER TABLE " + table +
              " SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,"
              " autovacuum_vacuum_insert_scale_factor = 0,"
              " autovacuum_vacuum_insert_threshold = 10000, autovacuum_vacuum_cost_delay = 0)");
    }
    idemgate::bench::NoopDownstream downstream;
    PgGate gate(pg::gate_name, store, downstream, BusinessWrite{});
    idemgate::RetentionOptions retention_options;
    retention_options.keep = std::chrono::seconds(settings.keep_s);
    retention_options.interval = std::chrono::seconds(1);
    retention_options.batch = 1000;
    if (settings.abandoned) retention_options.abandoned_after = retention_options.keep;
    idemgate::server::EndpointOptions endpoint_options;
    endpoint_options.key_lifetime = std::chrono::seconds(settings.keep_s);
    endpoint_options.log = {};
    idemgate::server::Endpoint endpoint{"bench.failing", store, endpoint_options};
    idemgate::Retention retention(settings.failing ? endpoint.store() : gate.store(),
                                  retention_options);

    using clock = std::chrono::steady_clock;
    const auto window = std::chrono::seconds(settings.keep_s);
    const auto started = clock::now();
    const auto end = started + window * settings.windows;
    std::atomic<std::int64_t> events{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> workers;
    for (int w = 0; w < settings.workers; ++w)
      workers.emplace_back([&] {
        idemgate::bench::KeySource keys;
        try {
          idemgate::server::Request request{
              "POST", "/orders", {}, "application/json", R"({"item":"reefer"})", "client", ""};
          while (clock::now() < end && !failed) {
            if (settings.failing) {
              request.idempotency_key = keys.next("bench.failing").hex();
              const auto answer = endpoint.handle(
                  request,
                  [](pqxx::work&, const idemgate::server::Request&) -> idemgate::server::Response {
                    throw std::runtime_error("the ledger is down");
                  });
              if (answer.status != 500)
                throw std::runtime_error("a failing request answered " +
                                         std::to_string(answer.status) + ": " + answer.body);
            } else {
              idemgate::bench::expect_processed(
                  gate.process(keys.next("bench.steady"), idemgate::bench::request()));
            }
            events.fetch_add(1, std::memory_order_relaxed);
          }
        } catch (const std::exception& e) {
          std::cerr << "steady_state worker: " << e.what() << "\n";
          failed = true;
        }
      });
    if (settings.retention) retention.start();
    std::thread holder;
    if (settings.hold_s > 0)
      holder = std::thread([&] {
        std::this_thread::sleep_until(started + window);
        try {
          pqxx::connection c(settings.uri);
          pqxx::work tx(c);
          tx.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
          tx.exec("SELECT count(*) FROM pg_class");
          std::fprintf(stderr, "snapshot taken at %.0f s, held for %d s\n",
                       std::chrono::duration<double>(clock::now() - started).count(),
                       settings.hold_s);
          std::this_thread::sleep_until(
              std::min(end, clock::now() + std::chrono::seconds(settings.hold_s)));
          tx.commit();
          std::fprintf(stderr, "snapshot released at %.0f s\n",
                       std::chrono::duration<double>(clock::now() - started).count());
        } catch (const std::exception& e) {
          std::cerr << "steady_state snapshot holder: " << e.what() << "\n";
        }
      });

    std::vector<Sample> samples;
    std::printf(
        "at_s\tevents_per_s\tserver_cpu_us_per_event\theap_bytes\tindex_bytes\tlive_rows\t"
        "dead_rows\tvacuums\trows\n");
    std::int64_t previous_events = 0;
    double previous_cpu =
        settings.postmaster > 0 ? idemgate::bench::server_cpu_us(settings.postmaster) : 0;
    auto previous = started;
    for (auto next = started + std::chrono::seconds(settings.sample_s); next <= end;
         next += std::chrono::seconds(settings.sample_s)) {
      std::this_thread::sleep_until(next);
      const auto now = clock::now();
      const std::int64_t n = events.load();
      Sample s = sample(monitor);
      s.at_s = std::chrono::duration<double>(now - started).count();
      s.events_per_s = static_cast<double>(n - previous_events) /
                       std::chrono::duration<double>(now - previous).count();
      if (settings.postmaster > 0 && n > previous_events) {
        const double cpu = idemgate::bench::server_cpu_us(settings.postmaster);
        s.server_cpu_us_per_event = (cpu - previous_cpu) / static_cast<double>(n - previous_events);
        previous_cpu = cpu;
      }
      previous_events = n;
      previous = now;
      samples.push_back(s);
      std::printf("%.0f\t%.0f\t%.0f\t%lld\t%lld\t%lld\t%lld\t%lld\t%lld\n", s.at_s, s.events_per_s,
                  s.server_cpu_us_per_event, static_cast<long long>(s.heap),
                  static_cast<long long>(s.indexes), static_cast<long long>(s.live),
                  static_cast<long long>(s.dead), static_cast<long long>(s.vacuums),
                  static_cast<long long>(s.rows));
      std::fflush(stdout);
      if (failed) break;
    }
    for (std::thread& t : workers) t.join();
    if (holder.joinable()) holder.join();
    retention.stop();
    if (failed) return 1;

    // The first window fills the log; the figures are of what comes after it.
    double rate_sum = 0, cpu_sum = 0;
    int rate_n = 0;
    Sample first{};
    bool have_first = false;
    std::int64_t heap_max = 0, index_max = 0, rows_max = 0;
    for (const Sample& s : samples) {
      if (s.at_s < settings.keep_s * 2 - 0.5) {
        first = s;
        have_first = true;
        continue;
      }
      rate_sum += s.events_per_s;
      cpu_sum += s.server_cpu_us_per_event;
      ++rate_n;
      heap_max = std::max(heap_max, s.heap);
      index_max = std::max(index_max, s.indexes);
      rows_max = std::max(rows_max, s.rows);
    }
    const Sample& last = samples.back();
    if (!have_first) first = samples.front();
    std::printf(
        "{\"events_per_s\": %.0f, \"server_cpu_us_per_event\": %.0f, "
        "\"heap_bytes_after_first_windows\": %lld, "
        "\"index_bytes_after_first_windows\": %lld, \"heap_bytes_end\": %lld, "
        "\"index_bytes_end\": %lld, \"heap_bytes_max\": %lld, \"index_bytes_max\": %lld, "
        "\"rows_after_first_windows\": %lld, \"rows_end\": %lld, \"rows_max\": %lld, "
        "\"purged\": %zu, \"retention_error\": \"%s\"}\n",
        rate_n ? rate_sum / rate_n : 0, rate_n ? cpu_sum / rate_n : 0,
        static_cast<long long>(first.heap), static_cast<long long>(first.indexes),
        static_cast<long long>(last.heap), static_cast<long long>(last.indexes),
        static_cast<long long>(heap_max), static_cast<long long>(index_max),
        static_cast<long long>(first.rows), static_cast<long long>(last.rows),
        static_cast<long long>(rows_max), retention.purged(), retention.last_error().c_str());
  } catch (const std::exception& e) {
    std::cerr << "steady_state: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
