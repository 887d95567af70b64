// What PostgresOptions::pooling costs: one gated event and one duplicate, with the store's named
// prepared statements (PostgresPooling::session) and with unnamed ones
// (PostgresPooling::transaction), directly and through PgBouncer. The variants take turns event
// by event inside one benchmark, so a machine whose load drifts weighs on all of them alike:
//   pooling/gate       one gated event (no-op downstream, 1 worker) per variant per iteration
//   pooling/duplicate  a redelivery of a committed event (one round trip), likewise
// Each variant reports <path>_<statements>_p50_us and _p99_us. <path> is `direct` (--pg),
// `session` (--pgbouncer-session: PgBouncer with pool_mode = session) or `transaction`
// (--pgbouncer: pool_mode = transaction, where named statements fail and are not run);
// <statements> is `named` or `unnamed`. The business write is the same unnamed INSERT
// everywhere, so only the store's own statements differ.
//
// Flags: --pg=URI (required), --pgbouncer=URI, --pgbouncer-session=URI, --events=N per variant;
// plus Google Benchmark's own. docs/stores.md says how to start PgBouncer and run it.

#include "postgres_workload.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
        gate(pg::gate_name, store, downstream, BusinessWrite{}) {}

  idemgate::PostgresStore store;
  NoopDownstream downstream;
  PgGate gate;
};

std::int64_t events = 2000;

// One way to reach the server, with one pooling mode: a gate and the latencies of its events.
struct Variant {
  std::string name;
  std::unique_ptr<GatedStore> gated;
  std::unique_ptr<Latencies> latencies;
};

std::vector<Variant> variants;

void add_variant(const std::string& path, const std::string& uri, PostgresPooling pooling) {
  variants.push_back({path + (pooling == PostgresPooling::session ? "_named" : "_unnamed"),
                      std::make_unique<GatedStore>(uri, pooling), nullptr});
}

void report(benchmark::State& state) {
  for (Variant& v : variants) {
    state.counters[v.name + "_p50_us"] = v.latencies->percentile_us(50);
    state.counters[v.name + "_p99_us"] = v.latencies->percentile_us(99);
  }
}

void gated_events(benchmark::State& state) {
  guarded(state, [&] {
    idemgate::bench::KeySource keys;
    const auto event = [&](Variant& v) {
      auto result = v.gated->gate.process(keys.next("bench.pooling"), idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      expect_processed(result);
    };
    for (Variant& v : variants) {
      for (int i = 0; i < idemgate::bench::warm_up; ++i) event(v);
      v.latencies = std::make_unique<Latencies>(static_cast<std::size_t>(state.max_iterations));
    }
    for (auto _ : state)
      for (Variant& v : variants) v.latencies->time([&] { event(v); });
    report(state);
  });
}

void duplicates(benchmark::State& state) {
  guarded(state, [&] {
    const idemgate::Key key = idemgate::bench::KeySource().next("bench.pooling.duplicate");
    const auto redeliver = [&](Variant& v) {
      auto result = v.gated->gate.process(key, idemgate::bench::request());
      benchmark::DoNotOptimize(result);
      if (result.status() != idemgate::Status::duplicate)
        throw std::runtime_error("a redelivery was not answered as a duplicate");
    };
    expect_processed(variants.front().gated->gate.process(key, idemgate::bench::request()));
    for (Variant& v : variants) {
      for (int i = 0; i < idemgate::bench::warm_up; ++i) redeliver(v);
      v.latencies = std::make_unique<Latencies>(static_cast<std::size_t>(state.max_iterations));
    }
    for (auto _ : state)
      for (Variant& v : variants) v.latencies->time([&] { redeliver(v); });
    report(state);
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

  try {
    add_variant("direct", direct, PostgresPooling::session);
    add_variant("direct", direct, PostgresPooling::transaction);
    if (const std::string session = flags.text("pgbouncer-session"); !session.empty()) {
      add_variant("session", session, PostgresPooling::session);
      add_variant("session", session, PostgresPooling::transaction);
    }
    if (const std::string transaction = flags.text("pgbouncer"); !transaction.empty())
      add_variant("transaction", transaction, PostgresPooling::transaction);
  } catch (const std::exception& e) {
    std::cerr << "bench_pooling: cannot connect: " << e.what() << '\n';
    return 1;
  }
  for (auto* b : {benchmark::RegisterBenchmark("pooling/gate", gated_events),
                  benchmark::RegisterBenchmark("pooling/duplicate", duplicates)})
    b->Iterations(events)->UseRealTime()->Unit(benchmark::kMicrosecond);
  return idemgate::bench::run_benchmarks(argc, argv);
}
