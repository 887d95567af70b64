// How long writers wait while migrate() brings a populated log of the earlier shape (keyed by
// key alone, no gate column) to the per-gate shape. Fills a log of N rows, starts writers that
// insert one row per statement (a statement both shapes take) and time each, runs migrate(),
// and prints one JSON object: the migration's time, and the writers' latencies before and
// during it. Usage: migration_wait --pg=URI [--rows=1000000] [--writers=4]

#include "support/earlier_pg_log.hpp"

#include <idemgate/store/postgres.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

namespace pq = idemgate::detail::pq;
using Clock = std::chrono::steady_clock;

void exec(const std::string& uri, const std::string& sql) {
  pqxx::connection c(uri);
  pqxx::nontransaction tx(c);
  pq::exec(tx, sql);
}

struct Latencies {
  std::vector<double> before, during;  // milliseconds
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

std::string arg(int argc, char** argv, std::string_view name, std::string fallback) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a(argv[i]);
    if (a.starts_with(name) && a.size() > name.size() && a[name.size()] == '=')
      return std::string(a.substr(name.size() + 1));
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string uri = arg(argc, argv, "--pg", "");
  const long rows = std::stol(arg(argc, argv, "--rows", "1000000"));
  const int writers = std::stoi(arg(argc, argv, "--writers", "4"));
  if (uri.empty()) {
    std::fprintf(stderr, "usage: migration_wait --pg=URI [--rows=N] [--writers=N]\n");
    return 2;
  }
  const std::string table = "migration_wait_log";
  exec(uri, "DROP TABLE IF EXISTS " + table + ", " + table + "_mismatches");
  exec(uri, idemgate::test::earlier_pg_log_schema(table));
  const auto filling = Clock::now();
  exec(uri, "INSERT INTO " + table +
                " (key, status, lease_until, fingerprint, request, result)"
                " SELECT sha256(int8send(i)), CASE WHEN i % 100 = 0 THEN 'in_flight' ELSE"
                " 'committed' END, now(), sha256(int8send(-i)), convert_to('MSKU' || i, 'UTF8'),"
                " CASE WHEN i % 100 = 0 THEN NULL ELSE convert_to('slot-' || i, 'UTF8') END"
                " FROM generate_series(1, " +
                std::to_string(rows) + ") AS i");
  exec(uri, "VACUUM ANALYZE " + table);
  const double fill_s = std::chrono::duration<double>(Clock::now() - filling).count();

  std::atomic<int> phase{0};  // 0: before, 1: during the migration, 2: done
  std::atomic<long> errors{0};
  std::mutex mutex;
  Latencies all;
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w)
    threads.emplace_back([&, w] {
      pqxx::connection c(uri);
      Latencies mine;
      for (long i = 0; phase.load() < 2; ++i) {
        const int at = phase.load();
        const auto start = Clock::now();
        try {
          pqxx::nontransaction tx(c);
          pq::exec(tx, "INSERT INTO " + table +
                           " (key, status, lease_until, fingerprint, request, result) VALUES"
                           " (sha256(convert_to('w" +
                           std::to_string(w) + "-" + std::to_string(i) +
                           "', 'UTF8')), 'committed', now(), sha256(''::bytea), ''::bytea,"
                           " ''::bytea)");
        } catch (const std::exception&) {
          ++errors;
        }
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        (at == 0 ? mine.before : mine.during).push_back(ms);
      }
      std::lock_guard lock(mutex);
      all.before.insert(all.before.end(), mine.before.begin(), mine.before.end());
      all.during.insert(all.during.end(), mine.during.begin(), mine.during.end());
    });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  idemgate::PostgresStore store(uri, {.table = table});
  phase = 1;
  const auto migrating = Clock::now();
  store.migrate();
  const double migrate_s = std::chrono::duration<double>(Clock::now() - migrating).count();
  phase = 2;
  for (auto& t : threads) t.join();
  std::printf(
      "{\"rows\": %ld, \"writers\": %d, \"fill_s\": %.1f, \"migrate_s\": %.2f, "
      "\"writer_errors\": %ld, \"before\": {\"statements\": %zu, \"p50_ms\": %.2f, "
      "\"p99_ms\": %.2f, \"max_ms\": %.1f}, \"during\": {\"statements\": %zu, \"p50_ms\": %.2f, "
      "\"p99_ms\": %.2f, \"max_ms\": %.1f}}\n",
      rows, writers, fill_s, migrate_s, errors.load(), all.before.size(),
      percentile(all.before, 0.5), percentile(all.before, 0.99), percentile(all.before, 1.0),
      all.during.size(), percentile(all.during, 0.5), percentile(all.during, 0.99),
      percentile(all.during, 1.0));
  exec(uri, "DROP TABLE IF EXISTS " + table + ", " + table + "_mismatches");
  return errors.load() == 0 ? 0 : 1;
}
