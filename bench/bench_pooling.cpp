// What PostgresOptions::pooling costs: one gated event and one duplicate, with the store's named
// prepared statements (PostgresPooling::session) and with unnamed ones
// (PostgresPooling::transaction), directly and through PgBouncer:
//   pooling/<path>/<statements>/gate       one gated event (no-op downstream, 1 worker)
//   pooling/<path>/<statements>/duplicate  a redelivery of a committed event (one round trip)
// <path> is `direct` (--pg), `pgbouncer_session` (--pgbouncer-session: PgBouncer with
// pool_mode = session) or `pgbouncer_transaction` (--pgbouncer: pool_mode = transaction, where
// named statements do not work and are not run). <statements> is `named` or `unnamed`.
// The business write is the same unnamed INSERT everywhere, so only the store's own statements
// differ. Latencies are per event (p50_us, p99_us).
//
// Flags: --pg=URI (required), --pgbouncer=URI, --pgbouncer-session=URI, --events=N per run;
// plus Google Benchmark's own. docs/stores.md says how to start both and run it.

#include "postgres_workload.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>

#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace {

namespace pg = idemgate::bench::pg;
using idemgate::PostgresPooling;
using idemgate::bench::expect_processed;
using idemgate::bench::guarded;
using idemgate::bench::Latencies;
using idemgate::bench::NoopDownstream;
using idemgate::bench::timed_events;

// The business write, unnamed: it runs through either pooling mode.
struct BusinessWrite {
  void operator()(pqxx::work& tx, const idemgate::Key& key, const std::string&,
                  const std::string& outcome) const {
    idemgate::detail::pq::exec_params(tx, pg::business_insert_sql(), pg::bytea_text(key.view()),
                                      outcome);
  }
};

using PgGate = idemgate::Gate<idemgate::PostgresStore, NoopDownstream, BusinessWrite>;

struct GatedStore {
  GatedStore(const std::string& uri, PostgresPooling pooling)
      : store(uri,
              [&] {
                idemgate::PostgresOptions options;
                options.table = pg::log_table;
                options.pooling = pooling;
                return options;
              }()),
        gate(store, downstream, BusinessWrite{}) {}

  idemgate::PostgresStore store;
  NoopDownstream downstream;
  PgGate gate;
};

std::int64_t events = 2000;

// One gated store per (URI, pooling), built on first use outside the timed loops.
GatedStore& gated(const std::string& uri, PostgresPooling pooling) {
  static std::map<std::pair<std::string, PostgresPooling>, std::unique_ptr<GatedStore>> stores;
  auto& slot = stores[{uri, pooling}];
  if (!slot) slot = std::make_unique<GatedStore>(uri, pooling);
  return *slot;
}

void gated_event(benchmark::State& state, std::string uri, PostgresPooling pooling) {
  guarded(state, [&] {
    PgGate& gate = gated(uri, pooling).gate;
    timed_events(state, "bench.pooling", [&](const idemgate::Key& key) {
      auto result = gate.process(key, idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      expect_processed(result);
    });
  });
}

void duplicate(benchmark::State& state, std::string uri, PostgresPooling pooling) {
  guarded(state, [&] {
    PgGate& gate = gated(uri, pooling).gate;
    const idemgate::Key key = idemgate::bench::KeySource().next("bench.pooling.duplicate");
    expect_processed(gate.process(key, idemgate::bench::request()));
    const auto redeliver = [&] {
      auto result = gate.process(key, idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      if (result.status() != idemgate::Status::duplicate)
        throw std::runtime_error("a redelivery was not answered as a duplicate");
    };
    for (int i = 0; i < idemgate::bench::warm_up; ++i) redeliver();
    Latencies latencies(static_cast<std::size_t>(state.max_iterations));
    for (auto _ : state) latencies.time(redeliver);
    latencies.report(state);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const idemgate::bench::Flags flags(argc, argv,
                                     {"pg", "pgbouncer", "pgbouncer-session", "events"});
  const std::string direct = flags.text("pg");
  if (direct.empty()) {
    std::cerr << "bench_pooling: pass --pg=postgresql://user@127.0.0.1:PORT/db, and "
                 "--pgbouncer=URI (pool_mode = transaction) and --pgbouncer-session=URI "
                 "(pool_mode = session) to measure through PgBouncer\n";
    return 2;
  }
  events = flags.count("events", events);
  try {
    idemgate::PostgresStore store(direct, {.table = pg::log_table});
    store.migrate();
    auto lease = store.connection();
    pqxx::nontransaction tx(lease.connection());
    idemgate::detail::pq::exec(tx, pg::business_schema_sql());
  } catch (const std::exception& e) {
    std::cerr << "bench_pooling: cannot set up the tables: " << e.what() << '\n';
    return 1;
  }

  const auto add = [](const std::string& path, const std::string& uri, PostgresPooling pooling) {
    const std::string name =
        "pooling/" + path + (pooling == PostgresPooling::session ? "/named" : "/unnamed");
    for (auto* b :
         {benchmark::RegisterBenchmark((name + "/gate").c_str(), gated_event, uri, pooling),
          benchmark::RegisterBenchmark((name + "/duplicate").c_str(), duplicate, uri, pooling)})
      b->Iterations(events)->UseRealTime()->Unit(benchmark::kMicrosecond);
  };
  add("direct", direct, PostgresPooling::session);
  add("direct", direct, PostgresPooling::transaction);
  if (const std::string session = flags.text("pgbouncer-session"); !session.empty()) {
    add("pgbouncer_session", session, PostgresPooling::session);
    add("pgbouncer_session", session, PostgresPooling::transaction);
  }
  if (const std::string transaction = flags.text("pgbouncer"); !transaction.empty())
    add("pgbouncer_transaction", transaction, PostgresPooling::transaction);
  return idemgate::bench::run_benchmarks(argc, argv);
}
