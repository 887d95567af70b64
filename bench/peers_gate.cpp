// idemgate's side of `scripts/bench --peers`: the workload the peer's driver
// (bench/peers/powertools.mjs) runs too, on PostgreSQL with an in-process side effect and one
// business row per event in the gate's commit transaction. A plain driver: it runs an untimed
// warm-up round of every mode, then the timed round, and prints `name<TAB>metric<TAB>value`
// lines that scripts/bench gathers with the round prefixed.
//
// Modes, each with 4 and 16 workers (threads sharing one gate over a pool as large):
//   gate/single_W      gate.process per delivery
//   gate/coalesced_W   the same with GateOptions::coalesce (window 300 us)
//   gate/batch10_W     gate.process_batch over 10 consecutive deliveries at a time, its
//                      business rows written by one bulk INSERT per batch
//   gate/once_W        a TransactionGate's process per delivery: the business row is the whole
//                      side effect, reserved, written and committed in one transaction (its
//                      side effects are its business rows)
//   gate/race          16 threads deliver one new event at once (its side effects must be 1)
// Metrics per mode: events_per_s (deliveries, duplicates included, over the wall time of the
// timed round), deliveries, distinct, side_effects, business_rows, and the answers by status;
// gate/process: cpu_s of this process over all its deliveries (warm-up and race included).
//
// Flags: --pg=URI (required), --events=N deliveries per mode (default 2000), --warm-up-events=N
// per mode in the warm-up round (default 1000), --duplicate-percent=N (default 3),
// --tag=TEXT that keeps this process's event ids apart from other runs' (default: the pid).

#include "postgres_workload.hpp"

#include <idemgate/batch.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/transaction_gate.hpp>

#include <sys/resource.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

// The deliveries of one mode: `events` event numbers in which `duplicate_percent` % repeat an
// earlier event, shuffled. The generator (mulberry32) and the order of its draws are the same in
// bench/peers/powertools.mjs, so both sides see the same sequence.
class Mulberry32 {
 public:
  explicit Mulberry32(std::uint32_t seed) : state_(seed) {}
  std::uint32_t next() {
    state_ += 0x6D2B79F5u;
    std::uint32_t t = state_;
    t = (t ^ (t >> 15)) * (t | 1u);
    t ^= t + (t ^ (t >> 7)) * (t | 61u);
    return t ^ (t >> 14);
  }

 private:
  std::uint32_t state_;
};

std::vector<std::uint32_t> deliveries(std::uint32_t events, std::uint32_t duplicate_percent) {
  const std::uint32_t duplicates = events * duplicate_percent / 100;
  const std::uint32_t distinct = events - duplicates;
  Mulberry32 rng(0x1de49a7e);
  std::vector<std::uint32_t> order;
  order.reserve(events);
  for (std::uint32_t i = 0; i < distinct; ++i) order.push_back(i);
  for (std::uint32_t i = 0; i < duplicates; ++i) order.push_back(rng.next() % distinct);
  for (std::uint32_t i = events - 1; i > 0; --i) std::swap(order[i], order[rng.next() % (i + 1)]);
  return order;
}

// The in-process side effect: every claim is counted, so a second run of one event shows.
struct CountingDownstream {
  using request_type = std::string;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  idemgate::ClaimResult<std::string> claim(const std::string&, const idemgate::Key&) {
    side_effects.fetch_add(1, std::memory_order_relaxed);
    return idemgate::bench::outcome();
  }
  std::atomic<std::uint64_t> side_effects{0};
};

const std::string business_table = "peers_business";
const std::string business_statement = "peers_business_insert";

const std::string bulk_statement = "peers_business_insert_many";

// The business write, in the gate's commit transaction: one row per event. A bulk write: the
// batch mode's commit calls it once for the batch (one multi-row INSERT over unnest), the other
// modes once per event (the one-row INSERT).
struct BusinessWrite {
  void operator()(
      pqxx::work& tx,
      std::span<const idemgate::CommittedEvent<std::string, std::string>> events) const {
    if (events.size() == 1) {
      const auto& e = events.front();
      idemgate::exec_prepared(tx, business_statement, e.key, e.request, e.outcome);
      return;
    }
    std::vector<std::string_view> keys;
    std::vector<std::string_view> requests, outcomes;
    for (const auto& e : events) {
      keys.push_back(e.key.view());
      requests.push_back(e.request);
      outcomes.push_back(e.outcome);
    }
    idemgate::exec_prepared(tx, bulk_statement, idemgate::bytea_array(keys),
                            idemgate::text_array(requests), idemgate::text_array(outcomes));
  }
};

using PeerGate = idemgate::Gate<idemgate::PostgresStore, CountingDownstream, BusinessWrite>;

// The one-transaction gate: its write is the business row, and returns the outcome.
using OnceWrite = std::function<std::string(pqxx::work&, const idemgate::Key&, const std::string&)>;
using OnceGate =
    idemgate::TransactionGate<idemgate::PostgresStore, std::string, std::string, OnceWrite>;

std::string write_once(pqxx::work& tx, const idemgate::Key& key, const std::string& request) {
  idemgate::exec_prepared(tx, business_statement, key, request, idemgate::bench::outcome());
  return idemgate::bench::outcome();
}

// A store with `workers` pooled connections, each with the business INSERT prepared, and a gate.
struct Gated {
  Gated(const std::string& uri, std::size_t workers, idemgate::GateOptions options)
      : store(uri,
              [&] {
                idemgate::PostgresOptions o;
                o.table = "peers_log";
                o.pool_size = workers;
                return o;
              }()),
        gate("peers.claim", store, downstream, BusinessWrite{}, options),
        once_gate("peers.claim", store, write_once) {
    store.migrate();
    std::vector<idemgate::detail::ConnectionPool::Lease> leases;
    for (std::size_t i = 0; i < workers; ++i) {
      leases.push_back(store.connection());
      idemgate::detail::pq::prepare(
          leases.back().connection(), business_statement,
          "INSERT INTO " + business_table + " (key, request, outcome) VALUES ($1::bytea, $2, $3)");
      idemgate::detail::pq::prepare(leases.back().connection(), bulk_statement,
                                    "INSERT INTO " + business_table +
                                        " (key, request, outcome) SELECT * FROM "
                                        "unnest($1::bytea[], $2::text[], $3::text[])");
    }
  }
  idemgate::PostgresStore store;
  CountingDownstream downstream;
  PeerGate gate;
  OnceGate once_gate;
};

struct Settings {
  std::string uri;
  std::uint32_t events = 2000;
  std::uint32_t warm_up_events = 1000;
  std::uint32_t duplicate_percent = 3;
  std::string tag;
};

Settings settings;

// What one mode's run answered.
struct Tally {
  std::mutex mutex;
  std::map<std::string, std::uint64_t> statuses;
  void add(idemgate::Status s) {
    const std::lock_guard lock(mutex);
    ++statuses[std::string(idemgate::to_string(s))];
  }
};

std::string request_of(const std::string& event_id) {
  return event_id + "|" + idemgate::bench::request();
}

// Runs `order` through the gate with `workers` threads; returns the wall time.
std::chrono::duration<double> run(Gated& gated, std::size_t workers, bool batch, bool once,
                                  const std::string& prefix,
                                  const std::vector<std::uint32_t>& order, Tally& tally) {
  constexpr std::size_t batch_size = 10;
  std::atomic<std::size_t> next{0};
  std::barrier start(static_cast<std::ptrdiff_t>(workers + 1));
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto worker = [&] {
    start.arrive_and_wait();
    try {
      const std::size_t step = batch ? batch_size : 1;
      std::vector<idemgate::BatchMessage<std::string>> messages;
      for (;;) {
        const std::size_t from = next.fetch_add(step);
        if (from >= order.size()) break;
        const std::size_t to = std::min(order.size(), from + step);
        messages.clear();
        for (std::size_t i = from; i < to; ++i) {
          const std::string id = prefix + std::to_string(order[i]);
          messages.push_back(
              {"m-" + std::to_string(i), idemgate::derive_key("peers.event", id), request_of(id)});
        }
        if (batch) {
          const auto result = gated.gate.process_batch(messages);
          for (const auto& item : result.items()) tally.add(item.result.status());
        } else if (once) {
          tally.add(gated.once_gate.process(messages[0].key, messages[0].request).status());
        } else {
          tally.add(gated.gate.process(messages[0].key, messages[0].request).status());
        }
      }
    } catch (...) {
      const std::lock_guard lock(error_mutex);
      error = std::current_exception();
    }
  };
  std::vector<std::jthread> threads;
  for (std::size_t i = 0; i < workers; ++i) threads.emplace_back(worker);
  const auto started = std::chrono::steady_clock::now();
  start.arrive_and_wait();
  threads.clear();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - started;
  if (error) std::rethrow_exception(error);
  return elapsed;
}

std::uint64_t business_rows(const std::string& prefix) {
  pqxx::connection connection(settings.uri);
  pqxx::nontransaction tx(connection);
  const pqxx::result rows =
      idemgate::detail::pq::exec(tx, "SELECT count(*) FROM " + business_table +
                                         " WHERE request LIKE " + tx.quote(prefix + "%"));
  return static_cast<std::uint64_t>(idemgate::detail::pq::int_field(rows[0][0]));
}

void print(const std::string& name, const std::string& metric, double value) {
  std::cout << name << '\t' << metric << '\t' << value << '\n';
}

struct Mode {
  std::string name;
  std::size_t workers;
  bool coalesce;
  bool batch;
  bool once;
  std::unique_ptr<Gated> gated;
};

// One round of every mode over `events` deliveries; printed when `timed`.
void round(std::vector<Mode>& modes, std::uint32_t events, const std::string& phase, bool timed) {
  const std::vector<std::uint32_t> order = deliveries(events, settings.duplicate_percent);
  const std::uint32_t distinct = events - events * settings.duplicate_percent / 100;
  for (Mode& mode : modes) {
    const std::string prefix = settings.tag + "-" + phase + "-" + mode.name + "-";
    Tally tally;
    const std::uint64_t before = mode.gated->downstream.side_effects.load();
    const auto elapsed =
        run(*mode.gated, mode.workers, mode.batch, mode.once, prefix, order, tally);
    const std::uint64_t rows = business_rows(prefix);
    const std::uint64_t side_effects =
        mode.once ? rows : mode.gated->downstream.side_effects.load() - before;
    if (side_effects != distinct || rows != distinct)
      std::cerr << "peers_gate: " << mode.name << ": " << side_effects << " side effects and "
                << rows << " business rows for " << distinct << " events\n";
    if (!timed) continue;
    const std::string name = "gate/" + mode.name;
    print(name, "events_per_s", events / elapsed.count());
    print(name, "deliveries", events);
    print(name, "distinct", distinct);
    print(name, "side_effects", static_cast<double>(side_effects));
    print(name, "business_rows", static_cast<double>(rows));
    for (const auto& [status, n] : tally.statuses)
      print(name, "status_" + status, static_cast<double>(n));
  }
}

// 16 threads deliver one new event at the same moment: one side effect, one business row.
void race(const std::string& phase) {
  constexpr std::size_t racers = 16;
  Gated gated(settings.uri, racers, {});
  const std::string id = settings.tag + "-" + phase + "-race-0";
  const idemgate::Key key = idemgate::derive_key("peers.event", id);
  Tally tally;
  std::barrier start(static_cast<std::ptrdiff_t>(racers));
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < racers; ++i)
      threads.emplace_back([&] {
        start.arrive_and_wait();
        tally.add(gated.gate.process(key, request_of(id)).status());
      });
  }
  print("gate/race", "deliveries", racers);
  print("gate/race", "side_effects", static_cast<double>(gated.downstream.side_effects.load()));
  print("gate/race", "business_rows", static_cast<double>(business_rows(id)));
  for (const auto& [status, n] : tally.statuses)
    print("gate/race", "status_" + status, static_cast<double>(n));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const idemgate::bench::Flags flags(
        argc, argv, {"pg", "events", "warm-up-events", "duplicate-percent", "tag"});
    settings.uri = flags.text("pg");
    if (settings.uri.empty() || argc > 1) {
      std::cerr << "usage: peers_gate --pg=URI [--events=N] [--warm-up-events=N] "
                   "[--duplicate-percent=N] [--tag=TEXT]\n";
      return 2;
    }
    settings.events = static_cast<std::uint32_t>(flags.count("events", settings.events));
    settings.warm_up_events =
        static_cast<std::uint32_t>(flags.count("warm-up-events", settings.warm_up_events));
    settings.duplicate_percent =
        static_cast<std::uint32_t>(flags.count("duplicate-percent", settings.duplicate_percent));
    settings.tag = flags.text("tag", std::to_string(::getpid()));
    {
      pqxx::connection connection(settings.uri);
      pqxx::nontransaction tx(connection);
      idemgate::detail::pq::exec(tx, "CREATE TABLE IF NOT EXISTS " + business_table +
                                         " (key bytea PRIMARY KEY, request text NOT NULL, "
                                         "outcome text NOT NULL)");
    }
    idemgate::GateOptions coalescing;
    coalescing.coalesce.enabled = true;
    coalescing.coalesce.window = std::chrono::microseconds(300);
    std::vector<Mode> modes;
    for (const std::size_t workers : {std::size_t{4}, std::size_t{16}}) {
      const std::string w = std::to_string(workers);
      modes.push_back({"single_" + w, workers, false, false, false, nullptr});
      modes.push_back({"coalesced_" + w, workers, true, false, false, nullptr});
      modes.push_back({"batch10_" + w, workers, false, true, false, nullptr});
      modes.push_back({"once_" + w, workers, false, false, true, nullptr});
    }
    for (Mode& mode : modes)
      mode.gated = std::make_unique<Gated>(settings.uri, mode.workers,
                                           mode.coalesce ? coalescing : idemgate::GateOptions{});
    round(modes, settings.warm_up_events, "warm", false);
    round(modes, settings.events, "timed", true);
    race("timed");
    // This process's CPU over every delivery it made (scripts/bench sets it beside the server's).
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    const auto seconds = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
    };
    print("gate/process", "cpu_s", seconds(usage.ru_utime) + seconds(usage.ru_stime));
    print("gate/process", "deliveries",
          static_cast<double>(modes.size() * (settings.warm_up_events + settings.events) + 16));
  } catch (const std::exception& e) {
    std::cerr << "peers_gate: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
