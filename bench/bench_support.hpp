#pragma once

// What every benchmark program shares: its own flags, per-event latency percentiles, resident
// memory, unique keys, the no-op downstream, and the tab-separated results scripts/bench reads.
// Core only: no database headers here.

#include <idemgate/codec.hpp>
#include <idemgate/key.hpp>
#include <idemgate/outcome.hpp>

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace idemgate::bench {

/// The request every benchmarked event carries: the size of a typical slot claim.
inline const std::string& request() {
  static const std::string text = "MSKU7000037|2025-06-09T10:00/11:00|ECT Delta|import";
  return text;
}

/// What the no-op downstream answers.
inline const std::string& outcome() {
  static const std::string text = "slot-4711";
  return text;
}

/// A downstream that does nothing and answers at once, so only the gate and the store are timed.
struct NoopDownstream {
  /// The request type.
  using request_type = std::string;
  /// The outcome type.
  using outcome_type = std::string;
  /// It honours keys (a relaxed reservation requires it).
  static constexpr bool honours_idempotency_key = true;
  /// Answers the fixed outcome.
  ClaimResult<std::string> claim(const std::string&, const Key&) { return outcome(); }
};

/// Unique keys: a tag unique to this process, and a counter. Keys never repeat across the
/// processes and rounds of one run, so every event is a first delivery.
class KeySource {
 public:
  /// A source whose keys no other source (in this or another process) repeats.
  KeySource()
      : tag_(std::to_string(::getpid()) + "-" + std::to_string(sources_.fetch_add(1)) + "-" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count())) {}
  /// The next key under `scope`.
  Key next(std::string_view scope) {
    char digits[24];
    const int n =
        std::snprintf(digits, sizeof digits, "%llu", static_cast<unsigned long long>(++counter_));
    return derive_key(scope, tag_, std::string_view(digits, static_cast<std::size_t>(n)));
  }

 private:
  static inline std::atomic<std::uint64_t> sources_{0};
  std::string tag_;
  std::uint64_t counter_ = 0;
};

/// Per-event wall times of one benchmark run; reports percentiles as counters.
class Latencies {
 public:
  /// The clock samples are taken with.
  using clock = std::chrono::steady_clock;

  /// Room for `expected` samples, so recording never allocates inside the timed loop.
  explicit Latencies(std::size_t expected) { samples_.reserve(expected); }

  /// Times one call of `work`.
  template <class Work>
  void time(Work&& work) {
    const auto started = clock::now();
    work();
    samples_.push_back(clock::now() - started);
  }

  /// The last sample taken.
  [[nodiscard]] clock::duration last() const { return samples_.back(); }

  /// The `p`-th percentile (nearest rank) in microseconds, each sample divided by `per`.
  [[nodiscard]] double percentile_us(double p, double per = 1.0) {
    if (samples_.empty()) return 0.0;
    std::sort(samples_.begin(), samples_.end());
    const auto rank =
        static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(samples_.size())));
    const auto index = std::min(samples_.size() - 1, rank == 0 ? 0 : rank - 1);
    return std::chrono::duration<double, std::micro>(samples_[index]).count() / per;
  }

  /// Sets `p50_us` and `p99_us` (per event: each sample divided by `events_per_sample`).
  void report(benchmark::State& state, double events_per_sample = 1.0) {
    state.counters["p50_us"] = percentile_us(50, events_per_sample);
    state.counters["p99_us"] = percentile_us(99, events_per_sample);
  }

 private:
  std::vector<clock::duration> samples_;
};

/// Untimed events every latency benchmark runs first: PostgreSQL plans a prepared statement
/// afresh for its first five executions, and no run should measure a cold connection. A
/// program may change it before its benchmarks run (bench_postgres --warm-up-events).
inline int warm_up = 6;

/// Each event `timed_events` runs, one line per event in the form of pgbench's `--log`
/// (`client_id transaction_no time_us script_no time_epoch time_us`, transactions numbered from
/// 1 as pgbench numbers them), warm-up events included and numbered first, so that scripts/bench
/// computes the gate's percentiles and pgbench's from the same raw latencies with the same code.
/// Like pgbench, the line goes into stdio's buffer after the event, outside its timed span.
class TransactionLog {
 public:
  TransactionLog() = default;
  TransactionLog(const TransactionLog&) = delete;
  TransactionLog& operator=(const TransactionLog&) = delete;
  ~TransactionLog() {
    if (file_ != nullptr) std::fclose(file_);
  }

  /// Starts writing to `path` (truncated); throws when it cannot be opened.
  void open(const std::string& path) {
    file_ = std::fopen(path.c_str(), "w");
    if (file_ == nullptr) throw std::runtime_error("cannot write the transaction log " + path);
  }

  /// Logs the next event's latency; nothing when no log was opened.
  void write(std::chrono::steady_clock::duration latency) {
    if (file_ == nullptr) return;
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const auto epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(now).count();
    std::fprintf(file_, "0 %lld %lld 0 %lld %lld\n", static_cast<long long>(++next_),
                 static_cast<long long>(
                     std::chrono::duration_cast<std::chrono::microseconds>(latency).count()),
                 static_cast<long long>(epoch_us / 1'000'000),
                 static_cast<long long>(epoch_us % 1'000'000));
  }

 private:
  std::FILE* file_ = nullptr;
  std::int64_t next_ = 0;
};

/// The log `timed_events` writes to, when a program opens it.
inline TransactionLog transaction_log;

/// Times `event(key)` once per iteration, each on a new key derived inside the timed span (as
/// a consumer derives it per event), after `warm_up` untimed events; reports the percentiles.
template <class Event>
void timed_events(benchmark::State& state, std::string_view scope, Event&& event) {
  KeySource keys;
  for (int i = 0; i < warm_up; ++i) {
    const auto started = Latencies::clock::now();
    event(keys.next(scope));
    transaction_log.write(Latencies::clock::now() - started);
  }
  Latencies latencies(static_cast<std::size_t>(state.max_iterations));
  for (auto _ : state) {
    latencies.time([&] { event(keys.next(scope)); });
    transaction_log.write(latencies.last());
  }
  latencies.report(state);
}

/// Resident memory of this process in KiB (from /proc/self/statm).
inline double resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0.0;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1024.0;
}

/// Flags of a benchmark program (`--name=value`, and switches: `--name` alone), taken out of argv
/// before Google Benchmark parses the rest.
class Flags {
 public:
  /// Removes every `--name=value` whose name is in `known`, and every `--name` whose name is in
  /// `switches`, from argv.
  Flags(int& argc, char** argv, std::initializer_list<std::string_view> known,
        std::initializer_list<std::string_view> switches = {})
      : known_(known.begin(), known.end()), switches_(switches.begin(), switches.end()) {
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      bool taken = false;
      for (std::string_view name : known) {
        if (arg.size() > name.size() + 3 && arg.starts_with("--") &&
            arg.substr(2, name.size()) == name && arg[name.size() + 2] == '=') {
          values_[std::string(name)] = std::string(arg.substr(name.size() + 3));
          taken = true;
        }
      }
      for (std::string_view name : switches) {
        if (arg.size() == name.size() + 2 && arg.starts_with("--") && arg.substr(2) == name) {
          given_.push_back(std::string(name));
          taken = true;
        }
      }
      if (!taken) argv[kept++] = argv[i];
    }
    argc = kept;
  }

  /// The flag's text, or `fallback`.
  [[nodiscard]] std::string text(const std::string& name, std::string fallback = {}) const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }

  /// The flag as a positive count, or `fallback`.
  [[nodiscard]] std::int64_t count(const std::string& name, std::int64_t fallback) const {
    return integer(name, fallback, 1);
  }

  /// The flag as a whole number from `min` to `max`, or `fallback`; throws
  /// std::invalid_argument naming the flag when its value is anything else.
  [[nodiscard]] std::int64_t integer(
      const std::string& name, std::int64_t fallback,
      std::int64_t min = std::numeric_limits<std::int64_t>::min(),
      std::int64_t max = std::numeric_limits<std::int64_t>::max()) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    const std::string& raw = it->second;
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(raw.data(), raw.data() + raw.size(), value);
    if (error != std::errc{} || end != raw.data() + raw.size() || value < min || value > max)
      throw std::invalid_argument("--" + name + "=" + raw + ": expected a whole number from " +
                                  std::to_string(min) + " to " + std::to_string(max));
    return value;
  }

  /// Whether the switch `--name` was given.
  [[nodiscard]] bool flag(std::string_view name) const {
    return std::find(given_.begin(), given_.end(), name) != given_.end();
  }

  /// For a program that takes no other arguments: throws std::invalid_argument naming the first
  /// argument no flag took (`argc` and `argv` as the constructor left them), and saying what is
  /// wrong with it when its name is a flag's.
  void expect_no_others(int argc, char** argv) const {
    if (argc <= 1) return;
    const std::string arg(argv[1]);
    for (const std::string& name : known_)
      if (arg == "--" + name || arg == "--" + name + "=")
        throw std::invalid_argument(arg + ": --" + name + " takes a value (--" + name + "=...)");
    for (const std::string& name : switches_)
      if (arg.starts_with("--" + name + "="))
        throw std::invalid_argument(arg + ": --" + name + " is a switch and takes no value");
    throw std::invalid_argument("unknown argument " + arg);
  }

 private:
  std::vector<std::string> known_;
  std::vector<std::string> switches_;
  std::vector<std::string> given_;
  std::map<std::string, std::string> values_;
};

/// Writes each run as tab-separated lines `name, metric, value` (metrics: `real_us` and
/// `cpu_us` per iteration, `iterations`, and every counter), for scripts/bench to aggregate.
class TsvReporter : public benchmark::BenchmarkReporter {
 public:
  /// Nothing to say about the context.
  bool ReportContext(const Context&) override { return true; }

  /// One line per metric of each finished run; aggregates are left to the reader.
  void ReportRuns(const std::vector<Run>& runs) override {
    std::ostream& out = GetOutputStream();
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration) continue;
      const std::string& name = run.run_name.function_name;
      if (run.error_occurred) {
        std::string message = run.error_message;
        std::replace_if(
            message.begin(), message.end(), [](char c) { return c == '\n' || c == '\t'; }, ' ');
        out << name << "\terror\t" << message << '\n';
        continue;
      }
      const double iterations = static_cast<double>(run.iterations);
      out << name << "\titerations\t" << run.iterations << '\n';
      out << name << "\treal_us\t" << run.real_accumulated_time * 1e6 / iterations << '\n';
      out << name << "\tcpu_us\t" << run.cpu_accumulated_time * 1e6 / iterations << '\n';
      for (const auto& [metric, counter] : run.counters)
        out << name << '\t' << metric << '\t' << counter.value << '\n';
    }
    out.flush();
  }
};

/// Google Benchmark's console output, remembering whether any run failed.
class ConsoleReporter : public benchmark::ConsoleReporter {
 public:
  /// Shows the runs and notes failures.
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) failed_ |= run.error_occurred;
    benchmark::ConsoleReporter::ReportRuns(runs);
  }

  /// Whether any run reported an error.
  [[nodiscard]] bool failed() const noexcept { return failed_; }

 private:
  bool failed_ = false;
};

/// Runs the registered benchmarks: the console shows them; `--benchmark_out=FILE` writes the
/// tab-separated results. Returns the process's exit code (1 when a benchmark failed).
inline int run_benchmarks(int argc, char** argv) {
  bool to_file = false;
  for (int i = 1; i < argc; ++i)
    to_file |= std::string_view(argv[i]).starts_with("--benchmark_out=");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  ConsoleReporter console;
  TsvReporter tsv;
  if (to_file)
    benchmark::RunSpecifiedBenchmarks(&console, &tsv);
  else
    benchmark::RunSpecifiedBenchmarks(&console);
  benchmark::Shutdown();
  return console.failed() ? 1 : 0;
}

/// Runs a benchmark body; a failure marks the run failed instead of ending the process.
template <class Body>
void guarded(benchmark::State& state, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// Throws unless the gate processed the event (a benchmark must not time duplicates by mistake).
inline void expect_processed(const Result<std::string>& result) {
  if (result.status() != Status::processed)
    throw std::runtime_error("unexpected result: " + std::string(to_string(result.status())) +
                             " (" + result.reason() + ")");
}

}  // namespace idemgate::bench
