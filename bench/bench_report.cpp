// Turns the results of one scripts/bench run into the table of ratios and, as the last line of
// its output, one JSON object with them.
//
// Input (stdin): tab-separated lines `round, name, metric, value`, as the benchmark programs
// write them (--benchmark_out) with the round prefixed, and as scripts/bench writes the pgbench
// figures. Within a round, repeated runs of one benchmark are reduced to their median; a ratio is
// computed per round from figures measured side by side, and its median over the rounds is
// reported. Absolute figures are medians over the rounds.
//
// A round measured on a slow-flush disk (scripts/bench --disk-flush-ms) is named `R@Nms`: each
// disk gets its own table, and the JSON keys of a slow-flush disk end in `_Nms` (the real disk's
// keep their names). Only the ratios of PostgreSQL figures are measured on a slow-flush disk.
//
// Usage: bench_report [--note=TEXT]... [--flush-us=DISK=US]... < results.tsv
//   --flush-us  pg_test_fsync's fdatasync figure (us per flush) on DISK ("" for the real disk,
//               "2ms" for a 2 ms disk), printed and given in the JSON as pg_test_fsync_fdatasync_us

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Figures = std::map<std::string, std::vector<double>>;  // "name|metric" -> values

struct Results {
  std::map<std::string, Figures> rounds;  // round -> figures
  std::vector<std::string> errors;
};

// Disk ("" for the real one, "2ms" for a 2 ms slow-flush disk) -> its results.
using Disks = std::map<std::string, Results>;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Disks read(std::istream& in) {
  Disks disks;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string round, name, metric, value;
    if (!std::getline(fields, round, '\t') || !std::getline(fields, name, '\t') ||
        !std::getline(fields, metric, '\t') || !std::getline(fields, value))
      continue;
    std::string disk;
    if (const auto at = round.find('@'); at != std::string::npos) {
      disk = round.substr(at + 1);
      round.resize(at);
    }
    Results& results = disks[disk];
    if (metric == "error") {
      results.errors.push_back(name + ": " + value);
      continue;
    }
    try {
      results.rounds[round][name + "|" + metric].push_back(std::stod(value));
    } catch (const std::exception&) {
      results.errors.push_back(name + ": unreadable " + metric + " '" + value + "'");
    }
  }
  disks[""];  // the real disk's table is always printed
  return disks;
}

// One figure in one round (median of its repetitions).
std::optional<double> in_round(const Figures& figures, const std::string& name,
                               const std::string& metric) {
  const auto it = figures.find(name + "|" + metric);
  if (it == figures.end() || it->second.empty()) return std::nullopt;
  return median(it->second);
}

// One figure over the whole run (median over rounds).
std::optional<double> overall(const Results& results, const std::string& name,
                              const std::string& metric) {
  std::vector<double> values;
  for (const auto& [round, figures] : results.rounds)
    if (auto v = in_round(figures, name, metric)) values.push_back(*v);
  if (values.empty()) return std::nullopt;
  return median(values);
}

struct Figure {
  std::string name, metric;
};

struct Ratio {
  std::string key;
  Figure numerator, denominator;  // denominator.name empty: numerator is the ratio itself
  std::string relation;           // "<=", "<", ">="
  double target;
  std::string meaning;
  bool postgres = true;  // measured on a slow-flush disk too
  // The target on a slow-flush disk, when it differs.
  std::optional<std::pair<std::string, double>> slow_disk_target = std::nullopt;
};

std::optional<double> ratio_value(const Results& results, const Ratio& r) {
  std::vector<double> per_round;
  for (const auto& [round, figures] : results.rounds) {
    const auto n = in_round(figures, r.numerator.name, r.numerator.metric);
    if (!n) continue;
    if (r.denominator.name.empty()) {
      per_round.push_back(*n);
      continue;
    }
    const auto d = in_round(figures, r.denominator.name, r.denominator.metric);
    if (d && *d > 0) per_round.push_back(*n / *d);
  }
  if (per_round.empty()) return std::nullopt;
  return median(per_round);
}

bool meets(double value, const std::string& relation, double target) {
  if (relation == "<=") return value <= target;
  if (relation == "<") return value < target;
  return value >= target;
}

std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

std::string duration(double us) {
  if (us >= 1000) return format("%.2f ms", us / 1000);
  if (us >= 10) return format("%.0f us", us);
  if (us >= 1) return format("%.2f us", us);
  return format("%.0f ns", us * 1000);
}

// "label p50 X p99 Y" or "label N events/s" or "label X" for one benchmark.
std::string describe(const Results& results, const std::string& label, const std::string& name) {
  std::string text = label;
  if (auto p50 = overall(results, name, "p50_us")) {
    text += " p50 " + duration(*p50);
    if (auto p99 = overall(results, name, "p99_us")) text += " p99 " + duration(*p99);
  } else if (auto rate = overall(results, name, "events_per_s")) {
    text += format(" %.0f events/s", *rate);
  } else if (auto real = overall(results, name, "real_us")) {
    text += " " + duration(*real);
  } else {
    text += " (not measured)";
  }
  return text;
}

// One disk's table; adds its ratios to `json` and returns how many targets it missed.
int report_disk(
    const std::string& disk, const Results& results, const std::vector<Ratio>& ratios,
    const std::map<std::string, std::vector<std::pair<std::string, std::string>>>& behind,
    std::string& json) {
  const Ratio pgbench_event_vs_bare = {
      "", {"pgbench/event", "p50_us"}, {"pgbench/bare", "p50_us"}, "<=", 0, ""};
  const std::string suffix = disk.empty() ? "" : "_" + disk;

  std::cout << '\n'
            << (disk.empty() ? std::string("real disk") : disk + " slow-flush disk") << ": "
            << results.rounds.size() << " round(s)\n";
  std::printf("%-32s %8s %8s  %-6s %s\n", "ratio", "value", "target", "", "measured");
  int missed = 0;
  for (const Ratio& r : ratios) {
    if (!disk.empty() && !r.postgres) continue;
    const auto value = ratio_value(results, r);
    std::string measured;
    if (r.key == "rss_growth_1m") {
      const auto first = overall(results, "sqlite/gate_rss", "rss_first_kib");
      const auto last = overall(results, "sqlite/gate_rss", "rss_last_kib");
      const auto events = overall(results, "sqlite/gate_rss", "iterations");
      const auto first_events = overall(results, "sqlite/gate_rss", "first_events");
      if (first && last && events && first_events)
        measured = format("%.1f MiB after ", *first / 1024) +
                   format("%.0f events, ", *first_events) +
                   format("%.1f MiB after ", *last / 1024) + format("%.0f", *events);
    } else {
      for (const auto& [label, name] : behind.at(r.key))
        measured += (measured.empty() ? "" : "; ") + describe(results, label, name);
      // What the database itself does with the same two workloads bounds this ratio.
      if (r.key == "gate_vs_bare_p50")
        if (auto own = ratio_value(results, pgbench_event_vs_bare))
          measured += format("; pgbench's own ratio %.2f", *own);
    }
    const auto [relation, target_value] =
        !disk.empty() && r.slow_disk_target ? *r.slow_disk_target
                                            : std::pair<std::string, double>{r.relation, r.target};
    const std::string target = relation + " " + format("%.2f", target_value);
    const bool met = value && meets(*value, relation, target_value);
    const char* verdict = !value ? "n/a" : met ? "met" : "MISSED";
    if (value && !met) ++missed;
    const std::string key = r.key + suffix;
    std::printf("%-32s %8s %8s  %-6s %s\n", key.c_str(),
                value ? format("%.3f", *value).c_str() : "-", target.c_str(), verdict,
                measured.c_str());
    json += (json.size() > 1 ? ", " : "") + ("\"" + key + "\": ") +
            (value ? format("%.3f", *value) : std::string("null"));
  }

  std::cout << "other figures\n";
  const std::vector<std::pair<std::string, std::string>> others = {
      {"pgbench, business INSERT alone, 1 client:", "pgbench/bare"},
      {"gate, business INSERT through SqliteTransaction::exec:", "sqlite/gate_tx_exec"},
      {"duplicate delivery, no cache:", "postgres/duplicate"},
      {"duplicate delivery, cache_capacity on:", "postgres/duplicate_cached"},
      {"gate, 4 workers:", "postgres/gate_4_workers"},
      {"pgbench, 4 clients:", "pgbench/event_4_clients"},
  };
  for (const auto& [label, name] : others)
    if (overall(results, name, "p50_us") || overall(results, name, "events_per_s"))
      std::cout << "  " << describe(results, label, name) << '\n';
  const std::vector<std::pair<std::string, std::string>> cpu = {
      {"postgres gate", "postgres/gate"},
      {"postgres by hand", "postgres/hand_loop"},
      {"sqlite gate", "sqlite/gate"},
      {"sqlite by hand", "sqlite/hand_loop"},
  };
  std::string cpu_line;
  for (const auto& [label, name] : cpu)
    if (auto v = overall(results, name, "cpu_us"))
      cpu_line += (cpu_line.empty() ? "" : "; ") + label + " " + duration(*v);
  if (!cpu_line.empty())
    std::cout << "  client CPU per event (the benchmark thread): " << cpu_line << '\n';
  for (const auto& error : results.errors) std::cout << "  ERROR " << error << '\n';
  return missed;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> notes;
  std::map<std::string, double> flush_us;  // disk -> pg_test_fsync's fdatasync, us
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--note=")) notes.emplace_back(arg.substr(7));
    if (arg.starts_with("--flush-us=")) {
      const std::string_view value = arg.substr(11);
      const auto eq = value.rfind('=');
      try {
        if (eq != std::string_view::npos)
          flush_us[std::string(value.substr(0, eq))] = std::stod(std::string(value.substr(eq + 1)));
      } catch (const std::exception&) {
        std::cerr << "bench_report: ignoring unreadable " << arg << '\n';
      }
    }
  }
  const Disks disks = read(std::cin);

  const std::vector<Ratio> ratios = {
      {"derive_key_vs_evp",
       {"key/derive_key", "real_us"},
       {"key/evp_reused_ctx", "real_us"},
       "<=",
       1.5,
       "derive_key on two fields / SHA-256 of the same bytes on a reused EVP_MD_CTX with a "
       "pre-fetched EVP_MD (time per call)",
       false},
      {"gate_vs_pgbench_p50",
       {"postgres/gate_paired", "p50_us"},
       {"pgbench/event", "p50_us"},
       "<=",
       1.15,
       "gated event / pgbench running the gate's SQL, 1 client (p50 of raw per-transaction "
       "latencies, same warm-up, same count, same estimator)"},
      {"gate_4w_vs_pgbench_4c",
       {"postgres/gate_4_workers", "events_per_s"},
       {"pgbench/event_4_clients", "events_per_s"},
       ">=",
       0.85,
       "4 worker threads, pool of 4 / pgbench 4 clients -j 2 (events/s)"},
      {"gate_16w_vs_pgbench_16c",
       {"postgres/gate_16_workers", "events_per_s"},
       {"pgbench/event_16_clients", "events_per_s"},
       ">=",
       0.85,
       "16 worker threads, one gate, pool of 16 / pgbench 16 clients -j 2 (events/s)"},
      {"gate_16w_coalesced_vs_gate_16w",
       {"postgres/gate_16_workers_coalesced", "events_per_s"},
       {"postgres/gate_16_workers", "events_per_s"},
       ">=",
       1.0,
       "16 worker threads with GateOptions::coalesce / without (events/s, same process)",
       true,
       // The target set for it: one flush per group instead of per event, so it would double on
       // a slow-flush disk. PostgreSQL already shares a flush among the commits that wait for
       // it, and a group's round trips run in a row: not met here (docs/performance.md, "Group
       // commit: when it pays").
       std::pair<std::string, double>{">=", 2.0}},
      {"coalesce_lone_delivery_vs_gate_p50",
       {"postgres/gate_coalesced", "p50_us"},
       {"postgres/gate", "p50_us"},
       "<=",
       1.05,
       "a lone delivery through a coalescing gate (window 0) / without coalescing (p50)"},
      {"gate_vs_bare_p50",
       {"postgres/gate", "p50_us"},
       {"postgres/bare_insert", "p50_us"},
       "<=",
       2.3,
       "gated event / the business INSERT alone in its own transaction (p50)"},
      {"gate_relaxed_vs_gate_p50",
       {"postgres/gate_relaxed", "p50_us"},
       {"postgres/gate", "p50_us"},
       "<",
       1.0,
       "relaxed reservation / durable reservation (p50)",
       true,
       // On a slow-flush disk it saves one of two flushes: it must save most of one.
       std::pair<std::string, double>{"<=", 0.7}},
      {"gate_relaxed_outcomes_vs_gate_p50",
       {"postgres/gate_relaxed_outcomes", "p50_us"},
       {"postgres/gate", "p50_us"},
       "<",
       1.0,
       "relaxed outcome / durable outcome (p50)",
       true,
       // The same saving on the other commit, without a second pool.
       std::pair<std::string, double>{"<=", 0.7}},
      {"batch10_vs_single_per_event",
       {"postgres/gate_batch10", "p50_us"},
       {"postgres/gate", "p50_us"},
       "<=",
       0.3,
       "per event in a batch of 10 / single event (p50)"},
      {"library_overhead_sqlite",
       {"sqlite/gate", "p50_us"},
       {"sqlite/hand_loop", "p50_us"},
       "<=",
       1.10,
       "gated event / the same statements by hand, sqlite3 (p50)",
       false},
      {"library_overhead_postgres",
       {"postgres/gate", "p50_us"},
       {"postgres/hand_loop", "p50_us"},
       "<=",
       1.10,
       "gated event / the same statements by hand, libpqxx (p50)"},
      {"rss_growth_1m",
       {"sqlite/gate_rss", "rss_growth"},
       {},
       "<=",
       1.10,
       "resident memory after all gated events / after the first tenth (SQLite)",
       false},
  };

  const std::map<std::string, std::vector<std::pair<std::string, std::string>>> behind = {
      {"derive_key_vs_evp",
       {{"derive_key", "key/derive_key"}, {"EVP reused ctx", "key/evp_reused_ctx"}}},
      {"gate_vs_pgbench_p50", {{"gate", "postgres/gate_paired"}, {"pgbench", "pgbench/event"}}},
      {"gate_4w_vs_pgbench_4c",
       {{"gate 4w", "postgres/gate_4_workers"}, {"pgbench 4c", "pgbench/event_4_clients"}}},
      {"gate_16w_vs_pgbench_16c",
       {{"gate 16w", "postgres/gate_16_workers"}, {"pgbench 16c", "pgbench/event_16_clients"}}},
      {"gate_16w_coalesced_vs_gate_16w",
       {{"coalesced 16w", "postgres/gate_16_workers_coalesced"},
        {"gate 16w", "postgres/gate_16_workers"}}},
      {"coalesce_lone_delivery_vs_gate_p50",
       {{"coalesced, alone", "postgres/gate_coalesced"}, {"gate", "postgres/gate"}}},
      {"gate_vs_bare_p50", {{"gate", "postgres/gate"}, {"bare", "postgres/bare_insert"}}},
      {"gate_relaxed_vs_gate_p50",
       {{"relaxed", "postgres/gate_relaxed"}, {"durable", "postgres/gate"}}},
      {"gate_relaxed_outcomes_vs_gate_p50",
       {{"relaxed outcomes", "postgres/gate_relaxed_outcomes"}, {"durable", "postgres/gate"}}},
      {"batch10_vs_single_per_event",
       {{"batch/event", "postgres/gate_batch10"}, {"single", "postgres/gate"}}},
      {"library_overhead_sqlite", {{"gate", "sqlite/gate"}, {"by hand", "sqlite/hand_loop"}}},
      {"library_overhead_postgres", {{"gate", "postgres/gate"}, {"by hand", "postgres/hand_loop"}}},
  };

  std::cout << "idemgate benchmark\n";
  for (const auto& note : notes) std::cout << "  " << note << '\n';
  for (const auto& [disk, us] : flush_us)
    std::cout << "  pg_test_fsync, one 8 kB write and fdatasync, "
              << (disk.empty() ? std::string("real disk") : disk + " slow-flush disk") << ": "
              << format("%.0f us per flush", us) << format(" (%.0f/s)", 1e6 / us) << '\n';
  std::string json = "{";
  int missed = 0;
  bool errors = false;
  for (const auto& [disk, results] : disks) {
    missed += report_disk(disk, results, ratios, behind, json);
    errors = errors || !results.errors.empty();
  }
  for (const auto& [disk, us] : flush_us)
    json += std::string(json.size() > 1 ? ", " : "") + "\"pg_test_fsync_fdatasync_us" +
            (disk.empty() ? "" : "_" + disk) + "\": " + format("%.0f", us);
  json += "}";
  std::cout << '\n'
            << (missed == 0 ? "every measured target met"
                            : std::to_string(missed) + " target(s) missed")
            << '\n'
            << json << std::endl;
  return errors ? 1 : 0;
}
