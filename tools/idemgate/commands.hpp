// SPDX-License-Identifier: MIT
// The operator command's subcommands, over any store an operator works with.
#pragma once

#include "format.hpp"

#include <idemgate/concepts.hpp>
#include <idemgate/record.hpp>
#include <idemgate/signals.hpp>
#include <idemgate/store/log/migration.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::tool {

/// The exit statuses, as docs/operator-command.md lists them.
enum Exit : int {
  exit_ok = 0,       ///< Done; something matched.
  exit_nothing = 1,  ///< Nothing matched, or the signals raise an alarm.
  exit_usage = 2,    ///< The command line is wrong.
  exit_store = 3,    ///< The store cannot be opened or reached, or its log is missing or behind.
};

/// What every subcommand shares: where the log is and how to answer.
struct Common {
  /// A PostgreSQL URI or key=value string, or an SQLite file's path.
  std::string store;
  /// The log's table.
  std::string table = "idemgate_log";
  /// Answer in JSON instead of tables.
  bool json = false;
  /// The gate to work on; empty means every gate.
  std::string gate;
  /// Whether a command that changes rows may work on every gate.
  bool all_gates = false;
  /// Print progress even when standard error is not a terminal.
  bool progress = false;
};

/// Which rows `list`, `count` and the dry runs ask for, as given on the command line.
struct Filter {
  /// in_flight, committed, failed or escalated ("" for any).
  std::string status;
  /// Exactly this reason (unset for any).
  std::optional<std::string> reason;
  /// A substring of the label.
  std::string label;
  /// Rows that changed at or after this instant (ISO 8601 or a duration ago).
  std::string from;
  /// Rows that changed before this instant (ISO 8601 or a duration ago).
  std::string to;
  /// Rows that changed at least this long ago.
  std::string older_than;
  /// Rows that changed at most this long ago.
  std::string newer_than;
  /// At most this many rows per gate.
  std::size_t limit = 50;

  /// The store's query for this filter, with times taken from `now`.
  [[nodiscard]] RowQuery query(Clock::time_point now) const {
    RowQuery q;
    if (!status.empty()) {
      try {
        q.status = parse_record_status(status);
      } catch (const std::runtime_error&) {
        throw UsageError("--status " + status + ": use in_flight, committed, failed or escalated");
      }
    }
    q.reason = reason;
    q.label_contains = label;
    // Two bounds on one side (--from and --newer-than) both hold: the narrower one wins.
    const auto from_at_least = [&q](Clock::time_point at) {
      q.changed_from = q.changed_from ? std::max(*q.changed_from, at) : at;
    };
    const auto before = [&q](Clock::time_point at) {
      q.changed_to = q.changed_to ? std::min(*q.changed_to, at) : at;
    };
    if (!from.empty()) from_at_least(parse_instant(from, now));
    if (!newer_than.empty()) from_at_least(now - parse_duration(newer_than));
    if (!to.empty()) before(parse_instant(to, now));
    if (!older_than.empty()) before(now - parse_duration(older_than));
    q.limit = limit;
    return q;
  }
};

/// A progress line on standard error, rewritten in place on a terminal; silent elsewhere unless
/// asked for (`--progress`), then one line per step.
class Progress {
 public:
  /// Shows progress when standard error is a terminal, or when `forced`.
  explicit Progress(bool forced)
      : terminal_(::isatty(STDERR_FILENO) == 1), on_(forced || terminal_) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { done(); }

  /// Shows `line` (replacing the previous one on a terminal).
  void show(const std::string& line) {
    if (!on_) return;
    std::lock_guard lock(mutex_);
    if (terminal_)
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
    else
      std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  /// Ends the line on a terminal.
  void done() {
    std::lock_guard lock(mutex_);
    if (on_ && terminal_ && shown_) std::fprintf(stderr, "\n");
    shown_ = false;
  }

 private:
  bool terminal_;
  bool on_;
  bool shown_ = false;
  std::mutex mutex_;
};

/// The rows' JSON form.
[[nodiscard]] inline nlohmann::json row_json(const Record& r, bool full) {
  nlohmann::json j = {{"gate", r.gate},
                      {"key", r.key.hex()},
                      {"status", std::string(to_string(r.status))},
                      {"attempts", r.attempts},
                      {"duplicates", r.duplicates},
                      {"fence", r.fence},
                      {"reason", r.reason},
                      {"label", r.label},
                      {"created_at", format_time(r.created_at)},
                      {"updated_at", format_time(r.updated_at)}};
  if (!full) return j;
  j["lease_until"] = format_time(r.lease_until);
  j["fingerprint"] = to_hex(
      std::string_view(reinterpret_cast<const char*>(r.fingerprint.data()), r.fingerprint.size()));
  j["request"] = readable_json(r.request);
  j["result"] = r.result ? readable_json(*r.result) : nlohmann::json(nullptr);
  auto history = nlohmann::json::array();
  for (const auto& h : r.history)
    history.push_back({{"attempt", h.attempt},
                       {"outcome", h.outcome},
                       {"reason", h.reason},
                       {"at", format_time(h.at)}});
  j["history"] = std::move(history);
  return j;
}

/// Prints a JSON value on standard output.
inline void print_json(const nlohmann::json& j) {
  std::printf("%s\n", j.dump(2).c_str());
}

/// What `redrive` selects: keys, one cause, or a time range of failures.
struct RedriveTarget {
  /// Re-drive these keys.
  std::vector<std::string> keys;
  /// Re-drive the failed rows with exactly this reason.
  std::optional<std::string> cause;
  /// Re-drive the rows that failed at or after this instant.
  std::string from;
  /// Re-drive the rows that failed before this instant.
  std::string to;
  /// At most this many rows per gate (0: no limit).
  std::size_t limit = 0;
  /// Rows per statement.
  std::size_t batch = 500;
};

/// The subcommands over one opened store. `Store` is the root handle (scoped to no gate); every
/// per-gate call goes through `for_gate`.
template <operable_store Store>
class Commands {
 public:
  /// Works on `root` as `common` says.
  Commands(Store root, const Common& common) : root_(std::move(root)), c_(common) {}

  /// The handles of the gates a command works on: `--gate`, or every gate of the log, and with
  /// `with_unowned` the rows of no gate too when there are any (written before logs knew their
  /// gates, not adopted yet). A command that changes rows (`changes`) needs `--gate` or
  /// `--all-gates`.
  std::vector<Store> scope(bool changes, bool with_unowned = false) {
    std::vector<Store> out;
    if (!c_.gate.empty()) {
      if (!GateName::valid(c_.gate))
        throw UsageError("--gate " + c_.gate +
                         ": a gate name is 1 to 64 ASCII letters, digits, '.', '_', '-' and ':'");
      out.push_back(root_.for_gate(c_.gate));
      return out;
    }
    if (changes && !c_.all_gates)
      throw UsageError(
          "this command changes rows: name the gate with --gate NAME (`idemgate gates` lists "
          "them), or give --all-gates to work on every gate");
    for (const auto& name : root_.gates()) out.push_back(root_.for_gate(name));
    if (with_unowned && has_unowned_rows()) out.push_back(root_);
    return out;
  }

  /// Whether any row belongs to no gate.
  bool has_unowned_rows() {
    RowQuery one;
    one.limit = 1;
    return !root_.rows(one).empty();
  }

  /// What `check` and `gates` say of `n` rows that belong to no gate.
  static std::string unowned_note(std::int64_t n) {
    return std::to_string(n) + (n == 1 ? " row belongs" : " rows belong") +
           " to no gate (written before logs knew their gates): a gate's reservation takes its "
           "key's row over, but no gate's reconciler, queue, signals or retention sees them "
           "until `idemgate adopt --gate NAME` gives them to the gate that wrote them";
  }

  /// How a handle's gate is shown in a table: its name, or "(no gate)" for the rows of no gate.
  static std::string shown(const Store& store) {
    return store.gate().empty() ? std::string("(no gate)") : std::string(store.gate());
  }

  /// `check`: the log can be read by this version (every column, the mismatches table).
  int check() {
    root_.signals(std::chrono::seconds(1));
    root_.mismatches(1);
    RowQuery one;
    one.limit = 1;
    root_.rows(one);
    const auto gates = root_.gates();
    for (const auto& name : gates) root_.for_gate(name).rows(one);
    const std::int64_t unowned = root_.count(RowQuery{});
    if (c_.json) {
      print_json({{"ok", true}, {"table", c_.table}, {"gates", gates}, {"unowned_rows", unowned}});
    } else {
      std::printf("ok: the log %s is reachable and readable by this version (%zu gate%s)\n",
                  c_.table.c_str(), gates.size(), gates.size() == 1 ? "" : "s");
      if (unowned > 0) std::printf("note: %s\n", unowned_note(unowned).c_str());
    }
    return exit_ok;
  }

  /// `gates`: every gate with its rows by status.
  int gates() {
    Table table({"GATE", "IN_FLIGHT", "COMMITTED", "FAILED", "ESCALATED"});
    auto out = nlohmann::json::array();
    for (auto& store : scope(false)) {
      std::int64_t n[4]{};
      const RecordStatus statuses[] = {RecordStatus::in_flight, RecordStatus::committed,
                                       RecordStatus::failed, RecordStatus::escalated};
      for (int i = 0; i < 4; ++i) {
        RowQuery q;
        q.status = statuses[i];
        n[i] = store.count(q);
      }
      table.add({shown(store), std::to_string(n[0]), std::to_string(n[1]), std::to_string(n[2]),
                 std::to_string(n[3])});
      out.push_back({{"gate", store.gate()},
                     {"in_flight", n[0]},
                     {"committed", n[1]},
                     {"failed", n[2]},
                     {"escalated", n[3]}});
    }
    if (c_.json)
      print_json(out);
    else if (!table.empty())
      table.print(stdout);
    else
      std::fprintf(stderr, "the log %s has no rows of any gate\n", c_.table.c_str());
    if (const std::int64_t unowned = root_.count(RowQuery{}); unowned > 0)
      std::fprintf(stderr, "%s\n", unowned_note(unowned).c_str());
    return out.empty() ? exit_nothing : exit_ok;
  }

  /// `adopt`: gives the rows that belong to no gate (written before logs knew their gates) to
  /// gate `name`, `batch` rows per statement; a key the gate already holds is left unowned.
  int adopt(std::size_t batch, bool execute) {
    if (batch == 0) throw UsageError("--batch must be at least 1");
    if (c_.gate.empty())
      throw UsageError(
          "adopt needs --gate NAME: the gate that wrote the rows, as its consumer names it");
    Store gate = scope(true).front();
    const std::int64_t unowned = root_.count(RowQuery{});
    std::int64_t adopted = 0;
    if (execute) {
      Progress progress(c_.progress);
      for (;;) {
        const std::size_t n = gate.adopt_unowned_rows(batch);
        adopted += static_cast<std::int64_t>(n);
        progress.show("adopted " + std::to_string(adopted) + " of " + std::to_string(unowned) +
                      " rows");
        if (n < batch) break;
      }
      progress.done();
    }
    const std::int64_t left = execute ? root_.count(RowQuery{}) : unowned;
    if (c_.json) {
      print_json({{"executed", execute},
                  {"gate", gate.gate()},
                  {execute ? "adopted" : "would_adopt", execute ? adopted : unowned},
                  {"left_unowned", left}});
    } else if (execute) {
      std::printf("adopted %lld row%s into gate %s; %lld left without a gate%s\n",
                  static_cast<long long>(adopted), adopted == 1 ? "" : "s",
                  std::string(gate.gate()).c_str(), static_cast<long long>(left),
                  left > 0 ? " (keys the gate already holds)" : "");
    } else {
      std::printf(
          "dry run: %lld row%s without a gate would be given to gate %s (keys it already "
          "holds stay as they are); add --execute to adopt them\n",
          static_cast<long long>(unowned), unowned == 1 ? "" : "s",
          std::string(gate.gate()).c_str());
    }
    return (execute ? adopted : unowned) == 0 ? exit_nothing : exit_ok;
  }

  /// `signals`: the signals of each gate over `window`, and the alarms they raise.
  int signals(std::chrono::seconds window, const SignalThresholds& thresholds) {
    Table table({"GATE", "EVENTS", "DUPLICATES", "RATIO", "IN_FLIGHT", "OLDEST", "RETRYING",
                 "ESCALATED", "MISMATCHED", "ALARMS"});
    auto out = nlohmann::json::array();
    bool alarm = false;
    // The oldest open transaction is the database's, the same for every gate: told once.
    std::optional<StoreSignals> held_too_long;
    for (auto& store : scope(false)) {
      const StoreSignals s = store.signals(window);
      const Health h = evaluate(s, thresholds);
      std::vector<std::string> alarms;
      if (h.key_derivation_suspect) alarms.emplace_back("key_derivation_suspect");
      if (h.upstream_misbehaving) alarms.emplace_back("upstream_misbehaving");
      if (h.stranded_work) alarms.emplace_back("stranded_work");
      if (h.result_mismatch) alarms.emplace_back("result_mismatch");
      if (h.old_snapshot) {
        alarms.emplace_back("old_snapshot");
        held_too_long = s;
      }
      alarm = alarm || !h.healthy();
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.1f%%", 100.0 * s.duplicate_ratio());
      std::string alarm_text;
      for (const auto& a : alarms) alarm_text += (alarm_text.empty() ? "" : ",") + a;
      table.add({shown(store), std::to_string(s.events), std::to_string(s.duplicates), ratio,
                 std::to_string(s.in_flight),
                 s.oldest_in_flight ? format_age(*s.oldest_in_flight) : "-",
                 std::to_string(s.retrying), std::to_string(s.escalated),
                 std::to_string(s.mismatched_keys), alarm_text.empty() ? "-" : alarm_text});
      out.push_back({{"gate", store.gate()},
                     {"window_seconds", s.window.count()},
                     {"events", s.events},
                     {"duplicates", s.duplicates},
                     {"duplicate_ratio", s.duplicate_ratio()},
                     {"in_flight", s.in_flight},
                     {"oldest_in_flight_seconds",
                      s.oldest_in_flight ? nlohmann::json(s.oldest_in_flight->count()) : nullptr},
                     {"retrying", s.retrying},
                     {"escalated", s.escalated},
                     {"mismatched_keys", s.mismatched_keys},
                     {"mismatches_total", s.mismatches_total},
                     {"wal_bytes", s.wal_bytes ? nlohmann::json(*s.wal_bytes) : nullptr},
                     {"oldest_snapshot_seconds",
                      s.oldest_snapshot ? nlohmann::json(s.oldest_snapshot->count()) : nullptr},
                     {"oldest_snapshot_holder",
                      s.oldest_snapshot ? nlohmann::json(s.oldest_snapshot_holder) : nullptr},
                     {"alarms", alarms}});
    }
    if (c_.json)
      print_json(out);
    else if (!table.empty())
      table.print(stdout);
    else
      std::fprintf(stderr, "the log %s has no rows of any gate\n", c_.table.c_str());
    if (held_too_long && !c_.json)
      std::fprintf(stderr,
                   "old_snapshot: %s has kept a transaction open for %s; until it ends, no "
                   "vacuum reclaims the rows retention deletes or the versions commits replace, "
                   "and the log grows. End it (pg_terminate_backend, or COMMIT/ROLLBACK "
                   "PREPARED), and bound it with idle_in_transaction_session_timeout\n",
                   held_too_long->oldest_snapshot_holder.c_str(),
                   format_age(*held_too_long->oldest_snapshot).c_str());
    return alarm ? exit_nothing : exit_ok;
  }

  /// `list`: rows by status, reason, label and age, newest change first.
  int list(const Filter& filter) {
    const auto now = Clock::now();
    const RowQuery q = filter.query(now);
    Table table({"GATE", "KEY", "STATUS", "ATTEMPTS", "CHANGED", "REASON", "LABEL"});
    auto out = nlohmann::json::array();
    for (auto& store : scope(false)) {
      for (const auto& r : store.rows(q)) {
        table.add({r.gate, r.key.hex(), std::string(to_string(r.status)),
                   std::to_string(r.attempts), age_of(r.updated_at, now) + " ago", r.reason,
                   r.label});
        out.push_back(row_json(r, false));
      }
    }
    if (c_.json)
      print_json(out);
    else if (!table.empty())
      table.print(stdout, 64);
    else
      std::fprintf(stderr, "no row matched\n");
    return out.empty() ? exit_nothing : exit_ok;
  }

  /// `count`: how many rows match, per gate.
  int count(const Filter& filter) {
    const RowQuery q = filter.query(Clock::now());
    Table table({"GATE", "ROWS"});
    nlohmann::json gates = nlohmann::json::object();
    std::int64_t total = 0;
    for (auto& store : scope(false)) {
      const std::int64_t n = store.count(q);
      total += n;
      table.add({shown(store), std::to_string(n)});
      gates[store.gate()] = n;
    }
    if (c_.json) {
      print_json({{"total", total}, {"gates", gates}});
    } else {
      table.add({"total", std::to_string(total)});
      table.print(stdout);
    }
    return total == 0 ? exit_nothing : exit_ok;
  }

  /// `show`: one row in full: its fields, request, outcome and history.
  int show(const std::string& key_text) {
    const Key key = parse_key(key_text);
    const auto now = Clock::now();
    auto out = nlohmann::json::array();
    bool first = true;
    for (auto& store : scope(false)) {
      const auto found = store.find(key);
      if (!found) continue;
      const Record& r = *found;
      out.push_back(row_json(r, true));
      if (c_.json) continue;
      if (!first) std::printf("\n");
      first = false;
      std::printf("gate:        %s\n", r.gate.c_str());
      std::printf("key:         %s\n", r.key.hex().c_str());
      std::printf("status:      %s\n", std::string(to_string(r.status)).c_str());
      if (!r.reason.empty()) std::printf("reason:      %s\n", r.reason.c_str());
      std::printf("label:       %s\n", r.label.empty() ? "(none kept)" : r.label.c_str());
      std::printf("attempts:    %lld\n", static_cast<long long>(r.attempts));
      std::printf("duplicates:  %lld\n", static_cast<long long>(r.duplicates));
      std::printf("fence:       %lld\n", static_cast<long long>(r.fence));
      std::printf("created:     %s (%s ago)\n", format_time(r.created_at).c_str(),
                  age_of(r.created_at, now).c_str());
      std::printf("changed:     %s (%s ago)\n", format_time(r.updated_at).c_str(),
                  age_of(r.updated_at, now).c_str());
      if (r.status == RecordStatus::in_flight)
        std::printf("lease until: %s\n", format_time(r.lease_until).c_str());
      std::printf("request:\n%s\n", indent(readable_text(r.request)).c_str());
      if (r.result) std::printf("outcome:\n%s\n", indent(readable_text(*r.result)).c_str());
      if (r.history.empty()) {
        std::printf("history:     (none)\n");
      } else {
        std::printf("history:\n");
        Table history({"  AT", "ATTEMPT", "OUTCOME", "REASON"});
        for (const auto& h : r.history)
          history.add({"  " + format_time(h.at), std::to_string(h.attempt), h.outcome, h.reason});
        history.print(stdout, 100);
      }
    }
    if (c_.json) print_json(out);
    if (out.empty())
      std::fprintf(stderr, "no row has the key %s%s\n", key.hex().c_str(),
                   c_.gate.empty() ? " in any gate" : (" in the gate " + c_.gate).c_str());
    return out.empty() ? exit_nothing : exit_ok;
  }

  /// `causes`: failed and escalated rows grouped by status and cause (the first line of their
  /// reasons), most rows first. Each cause's ID is what `redrive --cause` takes.
  int causes(std::size_t limit) {
    Table table({"ID", "GATE", "STATUS", "ROWS", "FIRST_SEEN", "LAST_SEEN", "CAUSE"});
    auto out = nlohmann::json::array();
    for (auto& store : scope(false)) {
      for (const auto& cause : store.causes(limit)) {
        table.add({cause.id(), shown(store), std::string(to_string(cause.status)),
                   std::to_string(cause.rows), format_time(cause.first_seen),
                   format_time(cause.last_seen), cause.reason});
        out.push_back({{"id", cause.id()},
                       {"gate", store.gate()},
                       {"status", std::string(to_string(cause.status))},
                       {"cause", cause.reason},
                       {"reason", cause.reason},
                       {"rows", cause.rows},
                       {"first_seen", format_time(cause.first_seen)},
                       {"last_seen", format_time(cause.last_seen)}});
      }
    }
    if (c_.json)
      print_json(out);
    else if (!table.empty())
      table.print(stdout, 80);
    else
      std::fprintf(stderr, "no failed or escalated rows\n");
    return out.empty() ? exit_nothing : exit_ok;
  }

  /// `redrive`: failed rows back in flight, so the next delivery or the reconciler claims them
  /// again under the same key. A dry run unless `execute`.
  int redrive(const RedriveTarget& t, bool execute) {
    const bool by_keys = !t.keys.empty(), by_cause = t.cause.has_value(),
               by_range = !t.from.empty() || !t.to.empty();
    if (by_keys + by_cause + by_range != 1)
      throw UsageError(
          "say which failed rows to re-drive with exactly one of: --key KEY (repeatable), "
          "--cause ID or CAUSE (as `idemgate causes` shows it), or --from/--to (when they "
          "failed)");
    if (t.batch == 0) throw UsageError("--batch must be at least 1");
    if (by_keys) return redrive_keys(t.keys, execute);
    auto stores = scope(true);
    std::optional<std::string> cause = t.cause;
    if (by_cause) cause = cause_named(stores, *t.cause);

    const auto now = Clock::now();
    RowQuery q;
    q.status = RecordStatus::failed;
    if (by_cause) q.reason = cause;
    if (!t.from.empty()) q.changed_from = parse_instant(t.from, now);
    q.changed_to = t.to.empty() ? now + std::chrono::seconds(1) : parse_instant(t.to, now);
    const std::size_t cap = t.limit == 0 ? static_cast<std::size_t>(-1) : t.limit;
    auto out = nlohmann::json::array();
    Table table({"GATE", execute ? "REDRIVEN" : "WOULD_REDRIVE", "ESCALATED_SAME_CAUSE"});
    std::int64_t total = 0;
    Progress progress(c_.progress);
    for (auto& store : stores) {
      const std::int64_t matching = store.count(q);
      const std::int64_t planned =
          std::min<std::int64_t>(matching, static_cast<std::int64_t>(std::min<std::size_t>(
                                               cap, static_cast<std::size_t>(INT64_MAX))));
      std::int64_t escalated_same = 0;
      if (by_cause) {
        RowQuery e = q;
        e.status = RecordStatus::escalated;
        escalated_same = store.count(e);
      }
      std::int64_t done = 0;
      nlohmann::json sample = nlohmann::json::array();
      if (execute) {
        while (static_cast<std::size_t>(done) < cap) {
          const std::size_t step = std::min(t.batch, cap - static_cast<std::size_t>(done));
          const std::size_t n =
              by_cause ? store.redrive_cause(*cause, step)
                       : store.redrive_failed(q.changed_from.value_or(Clock::time_point{}),
                                              *q.changed_to, step);
          done += static_cast<std::int64_t>(n);
          if (n > 0)
            progress.show("re-driving " + store.gate() + ": " + std::to_string(done) + " of " +
                          std::to_string(planned) + " rows");
          if (n < step) break;
        }
        progress.done();
      } else {
        done = planned;
        RowQuery s = q;
        s.limit = 5;
        for (const auto& r : store.rows(s)) sample.push_back(row_json(r, false));
      }
      total += done;
      table.add({shown(store), std::to_string(done), std::to_string(escalated_same)});
      nlohmann::json entry = {{"gate", store.gate()},
                              {execute ? "redriven" : "would_redrive", done},
                              {"escalated_same_cause", escalated_same}};
      if (!execute) entry["sample"] = std::move(sample);
      out.push_back(std::move(entry));
    }
    if (c_.json) {
      print_json({{"executed", execute}, {"gates", out}, {"total", total}});
    } else {
      table.print(stdout);
      if (!execute) print_samples(out);
      std::printf(execute ? "re-drove %lld failed row%s\n"
                          : "dry run: %lld failed row%s would be re-driven; add --execute to "
                            "re-drive them\n",
                  static_cast<long long>(total), total == 1 ? "" : "s");
    }
    if (total == 0 && by_cause) no_such_cause(stores, *t.cause);
    return total == 0 ? exit_nothing : exit_ok;
  }

  /// The cause `given` names: the cause whose ID it is (as `causes` prints it), else `given`
  /// itself, a cause or a whole reason.
  static std::string cause_named(std::vector<Store>& stores, const std::string& given) {
    const bool looks_like_an_id =
        given.size() == 12 && given.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (looks_like_an_id)
      for (auto& store : stores)
        if (auto named = failed_cause_with_id(store.causes(cause_search_limit), given))
          return *named;
    return given;
  }

  /// Says on stderr that no failed row has the cause `given`, and which causes they have.
  static void no_such_cause(std::vector<Store>& stores, const std::string& given) {
    std::string found;
    std::size_t listed = 0;
    for (auto& store : stores)
      for (const auto& cause : store.causes(cause_search_limit)) {
        if (cause.status != RecordStatus::failed || listed == 10) continue;
        ++listed;
        found += "  " + cause.id() + "  " + store.gate() + "  " + std::to_string(cause.rows) +
                 " row" + (cause.rows == 1 ? "" : "s") + "  " + cause.reason + "\n";
      }
    std::string hint;
    if (given.size() >= 3 && given.compare(given.size() - 3, 3, "...") == 0)
      hint = " (the table cuts long causes short: give the cause's ID instead)";
    if (found.empty())
      std::fprintf(stderr, "no failed row has the cause \"%s\"%s; no row failed at all\n",
                   given.c_str(), hint.c_str());
    else
      std::fprintf(stderr,
                   "no failed row has the cause \"%s\"%s; the failed rows' causes (ID, gate, "
                   "rows, cause; give --cause the ID or the cause whole):\n%s",
                   given.c_str(), hint.c_str(), found.c_str());
  }

  /// How many causes per gate `--cause` looks through for an ID or a hint.
  static constexpr std::size_t cause_search_limit = 1000;

  /// `purge`: committed and failed rows that finished longer ago than `older_than`. A dry run
  /// unless `execute`.
  int purge(std::chrono::seconds older_than, std::size_t batch, bool execute) {
    if (batch == 0) throw UsageError("--batch must be at least 1");
    if (older_than.count() <= 0)
      throw UsageError("--older-than must be longer than 0s: purge keeps recent rows");
    auto stores = scope(true, true);
    Table table({"GATE", execute ? "PURGED" : "WOULD_PURGE", "COMMITTED", "FAILED"});
    auto out = nlohmann::json::array();
    std::int64_t total = 0;
    Progress progress(c_.progress);
    for (auto& store : stores) {
      const auto cutoff = Clock::now() - older_than;
      RowQuery committed, failed;
      committed.status = RecordStatus::committed;
      failed.status = RecordStatus::failed;
      committed.changed_to = failed.changed_to = cutoff;
      const std::int64_t c = store.count(committed), f = store.count(failed);
      std::int64_t n = c + f;
      if (execute) {
        n = static_cast<std::int64_t>(
            purge_watched(store, older_than, batch, c + f, progress, committed, failed));
        progress.done();
      }
      total += n;
      table.add({shown(store), std::to_string(n), std::to_string(c), std::to_string(f)});
      out.push_back({{"gate", store.gate()},
                     {execute ? "purged" : "would_purge", n},
                     {"committed", c},
                     {"failed", f}});
    }
    if (c_.json) {
      print_json({{"executed", execute}, {"gates", out}, {"total", total}});
    } else {
      table.print(stdout);
      std::printf(execute ? "purged %lld row%s\n"
                          : "dry run: %lld row%s would be purged (committed and failed rows that "
                            "finished more than %s ago); add --execute to purge them\n",
                  static_cast<long long>(total), total == 1 ? "" : "s",
                  format_age(older_than).c_str());
    }
    return total == 0 ? exit_nothing : exit_ok;
  }

  /// `generations`: the generations of a partitioned PostgreSQL log, oldest first; with `start`
  /// the next one starts, with `drop_empty` the older ones that hold no row are dropped (a dry
  /// run unless `execute`).
  int generations(bool start, bool drop_empty, bool execute) {
    if constexpr (requires { root_.generations(); }) {
      if (!root_.partitioned_log()) {
        std::fprintf(stderr,
                     "idemgate: the log %s is not partitioned by generation; `idemgate migrate "
                     "--partitioned` makes it so (online)\n",
                     c_.table.c_str());
        return exit_nothing;
      }
      nlohmann::json done = nlohmann::json::object();
      if (execute && start) done["started"] = root_.start_generation();
      if (execute && drop_empty) done["dropped"] = root_.drop_empty_generations();
      Table table({"GENERATION", "CURRENT", "ROWS", "BYTES", "DETACH_PENDING"});
      auto out = nlohmann::json::array();
      for (const auto& g : root_.generations()) {
        table.add({std::to_string(g.number), g.current ? "yes" : "",
                   std::to_string(g.rows_estimate), std::to_string(g.bytes),
                   g.detach_pending ? "yes" : ""});
        out.push_back({{"generation", g.number},
                       {"current", g.current},
                       {"rows_estimate", g.rows_estimate},
                       {"bytes", g.bytes},
                       {"detach_pending", g.detach_pending}});
      }
      if (c_.json) {
        done["executed"] = execute;
        done["generations"] = out;
        print_json(done);
        return exit_ok;
      }
      table.print(stdout);
      if (done.contains("started"))
        std::printf("reservations write into generation %d now\n", done["started"].get<int>());
      if (done.contains("dropped"))
        std::printf("dropped %zu empty generation%s\n", done["dropped"].get<std::size_t>(),
                    done["dropped"].get<std::size_t>() == 1 ? "" : "s");
      if (!execute && (start || drop_empty))
        std::printf("dry run: add --execute to %s\n",
                    start && drop_empty ? "start the next generation and drop the empty older ones"
                    : start             ? "start the next generation"
                                        : "drop the older generations that hold no row");
      return exit_ok;
    } else {
      throw UsageError(
          "generations: an SQLite log has no generations (a PostgreSQL log has them "
          "with `idemgate migrate --partitioned`)");
    }
  }

  /// `migrate`: creates the log, or applies the numbered steps an earlier version's lacks; says
  /// which steps it applied, and which a log made before versions were recorded already had.
  int migrate() {
    const idemgate::MigrationReport report = root_.migrate();
    if (c_.json) {
      const auto steps = [](const std::vector<idemgate::MigrationStep>& list) {
        nlohmann::json out = nlohmann::json::array();
        for (const idemgate::MigrationStep& step : list)
          out.push_back({{"version", step.version},
                         {"name", step.name},
                         {"summary", step.summary},
                         {"took_ms", step.took.count()}});
        return out;
      };
      print_json({{"table", report.table},
                  {"from_version", report.from_version},
                  {"to_version", report.to_version},
                  {"applied", steps(report.applied)},
                  {"found", steps(report.found)}});
      return exit_ok;
    }
    if (report.changed()) {
      Table table({"VERSION", "NAME", "DONE", "TOOK", "WHAT"});
      for (const idemgate::MigrationStep& step : report.found)
        table.add({std::to_string(step.version), step.name, "found in place", "-", step.summary});
      for (const idemgate::MigrationStep& step : report.applied)
        table.add({std::to_string(step.version), step.name, "applied",
                   std::to_string(step.took.count()) + " ms", step.summary});
      table.print(stdout);
    }
    if (report.applied.empty())
      std::printf("the log %s is at version %d: nothing to apply\n", report.table.c_str(),
                  report.to_version);
    else
      std::printf("migrated the log %s from version %d to %d\n", report.table.c_str(),
                  report.from_version, report.to_version);
    return exit_ok;
  }

 private:
  static std::string indent(const std::string& text) {
    std::string out = "  ";
    for (char ch : text) {
      out += ch;
      if (ch == '\n') out += "  ";
    }
    return out;
  }

  static Key parse_key(const std::string& text) {
    if (auto key = Key::from_hex(text)) return *key;
    throw UsageError("\"" + text +
                     "\" is not a key: give its 64 hex digits as `idemgate list` shows them, or "
                     "derive it with `idemgate key SCOPE PART...`");
  }

  void print_samples(const nlohmann::json& gates) const {
    for (const auto& g : gates) {
      if (g["sample"].empty()) continue;
      std::printf("\nfor example, in %s:\n", g["gate"].get<std::string>().c_str());
      Table t({"  KEY", "CHANGED", "REASON", "LABEL"});
      for (const auto& r : g["sample"])
        t.add({"  " + r["key"].get<std::string>(), r["updated_at"].get<std::string>(),
               r["reason"].get<std::string>(), r["label"].get<std::string>()});
      t.print(stdout, 66);
    }
    std::printf("\n");
  }

  int redrive_keys(const std::vector<std::string>& texts, bool execute) {
    std::vector<Key> keys;
    for (const auto& text : texts) keys.push_back(parse_key(text));
    auto stores = scope(true);
    Table table({"GATE", "KEY", "STATUS", execute ? "REDRIVEN" : "WOULD_REDRIVE"});
    auto out = nlohmann::json::array();
    std::int64_t total = 0;
    for (auto& store : stores) {
      for (const auto& key : keys) {
        const auto found = store.find(key);
        if (!found) continue;
        bool changed = found->status == RecordStatus::failed;
        if (execute && changed) changed = store.redrive_failed(key) == 1;
        total += changed;
        table.add({shown(store), key.hex(), std::string(to_string(found->status)),
                   changed ? "yes" : "no (only failed rows are re-driven)"});
        out.push_back({{"gate", store.gate()},
                       {"key", key.hex()},
                       {"status", std::string(to_string(found->status))},
                       {execute ? "redriven" : "would_redrive", changed}});
      }
    }
    if (c_.json) {
      print_json({{"executed", execute}, {"rows", out}, {"total", total}});
    } else {
      if (!table.empty()) table.print(stdout);
      std::printf(execute ? "re-drove %lld failed row%s\n"
                          : "dry run: %lld failed row%s would be re-driven; add --execute to "
                            "re-drive them\n",
                  static_cast<long long>(total), total == 1 ? "" : "s");
    }
    return total == 0 ? exit_nothing : exit_ok;
  }

  // The store purges batch after batch in one call; a second handle counts what is left while it
  // runs, for the progress line.
  std::size_t purge_watched(Store& store, std::chrono::seconds older_than, std::size_t batch,
                            std::int64_t planned, Progress& progress, const RowQuery& committed,
                            const RowQuery& failed) {
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    std::thread watcher([&, counter = store]() mutable {
      std::unique_lock lock(m);
      while (!cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return finished; })) {
        lock.unlock();
        std::int64_t left = planned;
        try {
          left = counter.count(committed) + counter.count(failed);
        } catch (const std::exception&) {
          // The progress line is a courtesy: the purge's own call reports what went wrong.
        }
        progress.show("purging " + shown(counter) + ": " +
                      std::to_string(std::max<std::int64_t>(0, planned - left)) + " of " +
                      std::to_string(planned) + " rows");
        lock.lock();
      }
    });
    std::size_t purged = 0;
    try {
      purged = store.purge(older_than, batch);
    } catch (...) {
      {
        std::lock_guard lock(m);
        finished = true;
      }
      cv.notify_all();
      watcher.join();
      throw;
    }
    {
      std::lock_guard lock(m);
      finished = true;
    }
    cv.notify_all();
    watcher.join();
    progress.show("purging " + shown(store) + ": " + std::to_string(purged) + " rows purged");
    return purged;
  }

  Store root_;
  const Common& c_;
};

}  // namespace idemgate::tool
