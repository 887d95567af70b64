// Turns the results of one scripts/bench run into the table of ratios and, as the last line of
// its output, one JSON object with them.
//
// Input (stdin): tab-separated lines `round, name, metric, value`, as the benchmark programs
// write them (--benchmark_out) with the round prefixed, and as scripts/bench writes the pgbench
// figures. Within a round, repeated runs of one benchmark are reduced to their median; a ratio is
// computed per round from figures measured side by side, and its median over the rounds is
// reported. Absolute figures are medians over the rounds.
//
// Usage: bench_report [--note=TEXT]... < results.tsv

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

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Results read(std::istream& in) {
  Results results;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string round, name, metric, value;
    if (!std::getline(fields, round, '\t') || !std::getline(fields, name, '\t') ||
        !std::getline(fields, metric, '\t') || !std::getline(fields, value))
      continue;
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
  return results;
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

bool meets(double value, const Ratio& r) {
  if (r.relation == "<=") return value <= r.target;
  if (r.relation == "<") return value < r.target;
  return value >= r.target;
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> notes;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--note=")) notes.emplace_back(arg.substr(7));
  }
  const Results results = read(std::cin);

  const std::vector<Ratio> ratios = {
      {"derive_key_vs_evp",
       {"key/derive_key", "real_us"},
       {"key/evp_reused_ctx", "real_us"},
       "<=",
       1.5,
       "derive_key on two fields / SHA-256 of the same bytes on a reused EVP_MD_CTX with a "
       "pre-fetched EVP_MD (time per call)"},
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
       "relaxed reservation / durable reservation (p50)"},
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
       "gated event / the same statements by hand, sqlite3 (p50)"},
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
       "resident memory after all gated events / after the first tenth (SQLite)"},
  };

  const Ratio pgbench_event_vs_bare = {
      "", {"pgbench/event", "p50_us"}, {"pgbench/bare", "p50_us"}, "<=", 0, ""};

  const std::map<std::string, std::vector<std::pair<std::string, std::string>>> behind = {
      {"derive_key_vs_evp",
       {{"derive_key", "key/derive_key"}, {"EVP reused ctx", "key/evp_reused_ctx"}}},
      {"gate_vs_pgbench_p50", {{"gate", "postgres/gate_paired"}, {"pgbench", "pgbench/event"}}},
      {"gate_4w_vs_pgbench_4c",
       {{"gate 4w", "postgres/gate_4_workers"}, {"pgbench 4c", "pgbench/event_4_clients"}}},
      {"gate_vs_bare_p50", {{"gate", "postgres/gate"}, {"bare", "postgres/bare_insert"}}},
      {"gate_relaxed_vs_gate_p50",
       {{"relaxed", "postgres/gate_relaxed"}, {"durable", "postgres/gate"}}},
      {"batch10_vs_single_per_event",
       {{"batch/event", "postgres/gate_batch10"}, {"single", "postgres/gate"}}},
      {"library_overhead_sqlite", {{"gate", "sqlite/gate"}, {"by hand", "sqlite/hand_loop"}}},
      {"library_overhead_postgres", {{"gate", "postgres/gate"}, {"by hand", "postgres/hand_loop"}}},
  };

  std::cout << "idemgate benchmark: " << results.rounds.size() << " round(s)\n";
  for (const auto& note : notes) std::cout << "  " << note << '\n';
  std::cout << '\n';
  std::printf("%-28s %8s %8s  %-6s %s\n", "ratio", "value", "target", "", "measured");
  std::string json = "{";
  int missed = 0;
  for (const Ratio& r : ratios) {
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
    const std::string target = r.relation + " " + format("%.2f", r.target);
    const char* verdict = !value ? "n/a" : meets(*value, r) ? "met" : "MISSED";
    if (value && !meets(*value, r)) ++missed;
    std::printf("%-28s %8s %8s  %-6s %s\n", r.key.c_str(),
                value ? format("%.3f", *value).c_str() : "-", target.c_str(), verdict,
                measured.c_str());
    json += (json.size() > 1 ? ", " : "") + ("\"" + r.key + "\": ") +
            (value ? format("%.3f", *value) : std::string("null"));
  }
  json += "}";

  std::cout << "\nother figures\n";
  const std::vector<std::pair<std::string, std::string>> others = {
      {"pgbench, business INSERT alone, 1 client:", "pgbench/bare"},
      {"gate, business INSERT through SqliteTransaction::exec:", "sqlite/gate_tx_exec"},
      {"duplicate delivery, no cache:", "postgres/duplicate"},
      {"duplicate delivery, cache_capacity on:", "postgres/duplicate_cached"},
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
  std::cout << '\n'
            << (missed == 0 ? "every measured target met"
                            : std::to_string(missed) + " target(s) missed")
            << '\n'
            << json << std::endl;
  return results.errors.empty() ? 0 : 1;
}
