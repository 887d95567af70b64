// The gate on PostgreSQL, each policy beside the baseline it is compared to:
//   postgres/gate            one gated event (no-op downstream, 1 worker, durable reservation)
//   postgres/gate_relaxed    the same with PostgresOptions::relaxed_reservations
//   postgres/gate_relaxed_outcomes  the same with PostgresOptions::relaxed_outcomes instead
//   postgres/gate_batch10    process_batch of 10 new events (figures per event)
//   postgres/bare_insert     the business INSERT alone in its own transaction, same driver
//   postgres/hand_loop       the gate's own statements (PostgresStore::statement_sql), same
//                            transactions, written by hand against libpqxx
//   postgres/duplicate       a redelivery of a committed event (one round trip)
//   postgres/duplicate_cached the same with GateOptions::cache_capacity (no round trip)
//   postgres/gate_4_workers  4 threads sharing one gate over a pool of 4 connections
//   postgres/gate_16_workers 16 threads sharing one gate over a pool of 16 connections (many
//                            deliveries at once: the database's group commit is what they share);
//                            --worker-events / 4 events per thread, as many as 4 workers run
//   postgres/gate_16_workers_coalesced  the same with GateOptions::coalesce (window 300 us)
//   postgres/gate_coalesced  one gated event through a coalescing gate, alone (window 0)
//   postgres/reserve         the reservation alone, on --growth-table (reserve cost vs size)
// Latencies are per event (p50_us, p99_us); throughput is events_per_s. Every connection is
// opened once per process and warmed up before it is timed, the gate's and the baselines' alike.
//
// Flags: --pg=URI (required), --events=N per latency run, --worker-events=N per thread,
// --warm-up-ms=N of untimed events before any benchmark, --warm-up-events=N untimed events at
// the start of each latency run (default 6), --transaction-log=FILE to log every event of the
// latency runs as pgbench's --log does (scripts/bench compares the gate with pgbench from those
// raw latencies), --growth-table=NAME; plus Google Benchmark's own (--benchmark_filter,
// --benchmark_out, ...).

#include "postgres_workload.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using idemgate::bench::expect_processed;
using idemgate::bench::guarded;

namespace pg = idemgate::bench::pg;
using idemgate::bench::Latencies;
using idemgate::bench::NoopDownstream;
using idemgate::bench::timed_events;
using idemgate::bench::warm_up;

// The business write as the gate calls it.
struct BusinessWrite {
  void operator()(pqxx::work& tx, const idemgate::Key& key, const std::string&,
                  const std::string& outcome) const {
    pg::write_business(tx, key, outcome);
  }
};

using PgGate = idemgate::Gate<idemgate::PostgresStore, NoopDownstream, BusinessWrite>;

// A store over the benchmark's log whose every pooled connection has the business INSERT
// prepared, and a gate over it.
struct GatedStore {
  GatedStore(const std::string& uri, idemgate::PostgresOptions options,
             idemgate::GateOptions gate_options = {})
      : pool_size(options.pool_size),
        store(uri, std::move(options)),
        gate(pg::gate_name, store, downstream, BusinessWrite{}, gate_options) {
    store.migrate();
    std::vector<idemgate::detail::ConnectionPool::Lease> leases;
    for (std::size_t i = 0; i < pool_size; ++i) {
      leases.push_back(store.connection());
      if (i == 0) {
        pqxx::nontransaction tx(leases.back().connection());
        idemgate::detail::pq::exec(tx, pg::business_schema_sql());
      }
      idemgate::detail::pq::prepare(leases.back().connection(), pg::business_statement,
                                    pg::business_insert_sql());
    }
  }

  std::size_t pool_size;
  idemgate::PostgresStore store;
  NoopDownstream downstream;
  PgGate gate;
};

struct Settings {
  std::string uri;
  std::int64_t events = 1000;
  std::int64_t worker_events = 1000;
  std::string growth_table;
};

Settings settings;

idemgate::PostgresOptions store_options(std::size_t pool_size) {
  idemgate::PostgresOptions options;
  options.table = pg::log_table;
  options.pool_size = pool_size;
  return options;
}

// Built on first use, once per process, outside every timed loop.
GatedStore& durable_gate() {
  static GatedStore gated(settings.uri, store_options(1));
  return gated;
}

// One connection, with one of the relaxed options on.
idemgate::PostgresOptions relaxed_options(bool idemgate::PostgresOptions::*relaxed) {
  idemgate::PostgresOptions options = store_options(1);
  options.*relaxed = true;
  return options;
}

GatedStore& relaxed_gate() {
  static GatedStore gated(settings.uri,
                          relaxed_options(&idemgate::PostgresOptions::relaxed_reservations));
  return gated;
}

GatedStore& relaxed_outcomes_gate() {
  static GatedStore gated(settings.uri,
                          relaxed_options(&idemgate::PostgresOptions::relaxed_outcomes));
  return gated;
}

GatedStore& cached_gate() {
  idemgate::GateOptions options;
  options.cache_capacity = 10'000;
  static GatedStore gated(settings.uri, store_options(1), options);
  return gated;
}

GatedStore& worker_gate() {
  static GatedStore gated(settings.uri, store_options(4));
  return gated;
}

GatedStore& worker_gate_16() {
  static GatedStore gated(settings.uri, store_options(16));
  return gated;
}

// Group commit (GateOptions::coalesce): the calls that arrive while a group runs share the next
// group's reservation statement and commit transaction.
idemgate::GateOptions coalescing(std::chrono::microseconds window) {
  idemgate::GateOptions options;
  options.coalesce.enabled = true;
  options.coalesce.window = window;
  return options;
}

// 16 workers with a window of 300 us: the callers a group releases reach the next step a few
// hundred microseconds apart, and the window lets them form one group instead of a first caller
// alone and then the rest (with a window of 0, every other group held one call).
GatedStore& worker_gate_16_coalesced() {
  static GatedStore gated(settings.uri, store_options(16),
                          coalescing(std::chrono::microseconds(300)));
  return gated;
}

// A lone delivery through a coalescing gate (nothing else waiting, window 0).
GatedStore& coalescing_gate() {
  static GatedStore gated(settings.uri, store_options(1), coalescing(std::chrono::microseconds(0)));
  return gated;
}

void gated_event(benchmark::State& state, GatedStore& (*gated)()) {
  guarded(state, [&] {
    PgGate& gate = gated().gate;
    timed_events(state, "bench.gate", [&](const idemgate::Key& key) {
      auto result = gate.process(key, idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      expect_processed(result);
    });
  });
}

// Batches of 10 new events; p50_us and p99_us are per event (a batch's time divided by 10).
void gated_batch(benchmark::State& state) {
  guarded(state, [&] {
    constexpr std::size_t batch_size = 10;
    PgGate& gate = durable_gate().gate;
    idemgate::bench::KeySource keys;
    std::vector<idemgate::BatchMessage<std::string>> batch(batch_size);
    std::size_t message = 0;
    const auto fill = [&] {
      for (auto& m : batch)
        m = {"m-" + std::to_string(++message), keys.next("bench.batch"),
             idemgate::bench::request()};
    };
    const auto process = [&] {
      auto result = gate.process_batch(batch);
      benchmark::DoNotOptimize(result);
      for (const auto& item : result.items()) expect_processed(item.result);
    };
    for (int i = 0; i < warm_up; ++i) {
      fill();
      process();
    }
    Latencies latencies(static_cast<std::size_t>(state.max_iterations));
    for (auto _ : state) {
      fill();
      latencies.time(process);
    }
    latencies.report(state, batch_size);
    state.counters["events_per_batch"] = batch_size;
  });
}

// A redelivery of an event already committed: one round trip, or none from the cache.
void duplicate(benchmark::State& state, GatedStore& (*gated)()) {
  guarded(state, [&] {
    PgGate& gate = gated().gate;
    idemgate::bench::KeySource keys;
    const idemgate::Key key = keys.next("bench.duplicate");
    expect_processed(gate.process(key, idemgate::bench::request()));
    const auto redeliver = [&] {
      auto result = gate.process(key, idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      if (result.status() != idemgate::Status::duplicate)
        throw std::runtime_error("a redelivery was not answered as a duplicate");
    };
    for (int i = 0; i < warm_up; ++i) redeliver();
    Latencies latencies(static_cast<std::size_t>(state.max_iterations));
    for (auto _ : state) latencies.time(redeliver);
    latencies.report(state);
  });
}

// The business INSERT alone in its own transaction, on one connection kept for the process.
class BareInsert {
 public:
  BareInsert() : connection_(settings.uri) {
    durable_gate();  // the business table exists
    idemgate::detail::pq::prepare(connection_, pg::business_statement, pg::business_insert_sql());
  }

  void event(const idemgate::Key& key) {
    pqxx::work tx(connection_);
    pg::write_business(tx, key, idemgate::bench::outcome());
    tx.commit();
  }

 private:
  pqxx::connection connection_;
};

BareInsert& bare() {
  static BareInsert instance;
  return instance;
}

// The gate's own statements in the gate's two transactions, written by hand (pg::HandLoop).
pg::HandLoop& hand() {
  static pg::HandLoop instance = [] {
    durable_gate();  // the log and the business table exist
    return pg::HandLoop(settings.uri);
  }();
  return instance;
}

void bare_insert(benchmark::State& state) {
  guarded(state, [&] {
    timed_events(state, "bench.bare", [&](const idemgate::Key& key) { bare().event(key); });
  });
}

void hand_loop(benchmark::State& state) {
  guarded(state, [&] {
    timed_events(state, "bench.hand", [&](const idemgate::Key& key) { hand().event(key); });
  });
}

// A fresh process runs its first few hundred milliseconds of database work measurably slower
// (client CPU per event several times higher), whatever the work: untimed events of the
// single-worker kinds, taking turns, until `duration` has passed.
void warm_up_process(std::chrono::milliseconds duration) {
  idemgate::bench::KeySource keys;
  // Every single-worker gate the latency runs compare, so none of them starts cold.
  const std::vector<PgGate*> gates{&durable_gate().gate, &relaxed_gate().gate,
                                   &relaxed_outcomes_gate().gate, &coalescing_gate().gate};
  const auto until = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < until) {
    for (PgGate* gate : gates)
      expect_processed(gate->process(keys.next("bench.warm"), idemgate::bench::request()));
    hand().event(keys.next("bench.warm"));
    bare().event(keys.next("bench.warm"));
  }
}

void gate_workers(benchmark::State& state, GatedStore& (*gated)()) {
  guarded(state, [&] {
    PgGate& gate = gated().gate;
    idemgate::bench::KeySource keys;
    const auto event = [&] {
      auto result = gate.process(keys.next("bench.workers"), idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      expect_processed(result);
    };
    // Before the threads' common start, so every pooled connection is warm.
    for (int i = 0; i < warm_up; ++i) event();
    for (auto _ : state) event();
    state.counters["events_per_s"] =
        benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
    if (state.thread_index() == 0) {
      // Group commit's groups so far in this process (zero without it).
      const idemgate::CoalescingStats c = gate.coalescing();
      if (c.commit_groups > 0) {
        state.counters["commits_per_group"] =
            static_cast<double>(c.commits) / static_cast<double>(c.commit_groups);
        state.counters["reservations_per_group"] =
            static_cast<double>(c.reservations) / static_cast<double>(c.reservation_groups);
      }
    }
  });
}

void reserve_only(benchmark::State& state) {
  guarded(state, [&] {
    static idemgate::PostgresStore store(settings.uri, [] {
      idemgate::PostgresOptions options;
      options.table = settings.growth_table;
      return options;
    }());
    const std::string request = pg::request_bytes();
    const idemgate::Fingerprint fingerprint = idemgate::detail::sha256(request);
    const std::chrono::milliseconds lease(pg::lease_ms());
    timed_events(state, "bench.reserve", [&](const idemgate::Key& key) {
      const idemgate::Reservation r = store.reserve(key, fingerprint, request, lease);
      benchmark::DoNotOptimize(r);
      if (r.kind != idemgate::Reservation::Kind::acquired)
        throw std::runtime_error("the reservation met an existing key");
    });
  });
}

}  // namespace

int main(int argc, char** argv) {
  const idemgate::bench::Flags flags(argc, argv,
                                     {"pg", "events", "worker-events", "growth-table", "warm-up-ms",
                                      "warm-up-events", "transaction-log"});
  settings.uri = flags.text("pg");
  if (settings.uri.empty()) {
    std::cerr << "bench_postgres: pass --pg=postgresql://user@127.0.0.1:PORT/db (scripts/bench "
                 "starts a server and passes it)\n";
    return 2;
  }
  settings.events = flags.count("events", settings.events);
  settings.worker_events = flags.count("worker-events", settings.worker_events);
  settings.growth_table = flags.text("growth-table");
  idemgate::bench::warm_up =
      static_cast<int>(flags.count("warm-up-events", idemgate::bench::warm_up));
  if (const std::string log = flags.text("transaction-log"); !log.empty()) {
    try {
      idemgate::bench::transaction_log.open(log);
    } catch (const std::exception& e) {
      std::cerr << "bench_postgres: " << e.what() << '\n';
      return 2;
    }
  }
  if (const auto ms = flags.count("warm-up-ms", 0); ms > 0) {
    try {
      warm_up_process(std::chrono::milliseconds(ms));
    } catch (const std::exception& e) {
      std::cerr << "bench_postgres: the warm-up failed: " << e.what() << '\n';
      return 1;
    }
  }

  const auto latency = [](benchmark::internal::Benchmark* b) {
    b->Iterations(settings.events)->UseRealTime()->Unit(benchmark::kMicrosecond);
  };
  latency(benchmark::RegisterBenchmark("postgres/gate", gated_event, &durable_gate));
  latency(benchmark::RegisterBenchmark("postgres/gate_relaxed", gated_event, &relaxed_gate));
  latency(benchmark::RegisterBenchmark("postgres/gate_relaxed_outcomes", gated_event,
                                       &relaxed_outcomes_gate));
  latency(benchmark::RegisterBenchmark("postgres/gate_coalesced", gated_event, &coalescing_gate));
  benchmark::RegisterBenchmark("postgres/gate_batch10", gated_batch)
      ->Iterations(std::max<std::int64_t>(settings.events / 4, 3))
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  latency(benchmark::RegisterBenchmark("postgres/bare_insert", bare_insert));
  latency(benchmark::RegisterBenchmark("postgres/hand_loop", hand_loop));
  latency(benchmark::RegisterBenchmark("postgres/duplicate", duplicate, &durable_gate));
  latency(benchmark::RegisterBenchmark("postgres/duplicate_cached", duplicate, &cached_gate));
  benchmark::RegisterBenchmark("postgres/gate_4_workers", gate_workers, &worker_gate)
      ->Threads(4)
      ->Iterations(settings.worker_events)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("postgres/gate_16_workers", gate_workers, &worker_gate_16)
      ->Threads(16)
      ->Iterations(std::max<std::int64_t>(settings.worker_events / 4, 10))
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("postgres/gate_16_workers_coalesced", gate_workers,
                               &worker_gate_16_coalesced)
      ->Threads(16)
      ->Iterations(std::max<std::int64_t>(settings.worker_events / 4, 10))
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  if (!settings.growth_table.empty())
    latency(benchmark::RegisterBenchmark("postgres/reserve", reserve_only));
  return idemgate::bench::run_benchmarks(argc, argv);
}
