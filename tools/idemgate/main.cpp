// SPDX-License-Identifier: MIT
// idemgate: the operator command. Lists, groups, re-drives and purges the rows of an idempotency
// log on PostgreSQL or SQLite. docs/operator-command.md describes every subcommand.

#include "commands.hpp"
#include "format.hpp"

#include <idemgate/errors.hpp>
#include <idemgate/key.hpp>
#include <idemgate/store/sqlite.hpp>
#include <idemgate/version.hpp>
#if IDEMGATE_TOOL_POSTGRES
#include <idemgate/store/postgres.hpp>
#endif

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace idemgate::tool;

// A PostgreSQL connection string: a URI, or libpq's key=value pairs. Anything else is a path.
bool is_postgres(const std::string& store) {
  return store.starts_with("postgresql://") || store.starts_with("postgres://") ||
         std::regex_search(store, std::regex(R"((^|\s)(host|hostaddr|dbname|service)=)"));
}

// The connection string without its password, for messages.
std::string redacted(const std::string& store) {
  const std::string out =
      std::regex_replace(store, std::regex(R"(://([^:/@]*):[^@/]*@)"), "://$1:***@");
  return std::regex_replace(out, std::regex(R"(password=\S*)"), "password=***");
}

// Everything the command line gave, for whichever subcommand runs.
struct Args {
  Common common;
  Filter filter;
  std::string window = "1h";
  idemgate::SignalThresholds thresholds;
  std::string stranded_after = "10m";
  std::string old_snapshot_after = "5m";
  std::string key;
  RedriveTarget redrive;
  std::string older_than;
  std::size_t batch = 1000;
  std::size_t causes_limit = 20;
  bool execute = false;
  std::string wait = "10s";
  std::string scope;
  std::vector<std::string> parts;
  bool partitioned = false;
  bool start_generation = false;
  bool drop_empty = false;
};

#if IDEMGATE_TOOL_POSTGRES
// Whether the PostgreSQL log is partitioned by generation, so the store opens it as such. A log
// that cannot be read here (no server, no table) is opened as it is and reports that itself.
bool log_is_partitioned(const std::string& store, const std::string& table) {
  try {
    pqxx::connection connection(store);
    pqxx::nontransaction tx(connection);
    namespace pq = idemgate::detail::pq;
    return pq::bool_field(pq::exec(tx, idemgate::PostgresStore::statement_sql(
                                           idemgate::sql::postgres::log_partitioned, table))[0][0]);
  } catch (const std::exception&) {
    return false;
  }
}
#endif

template <class Store>
int dispatch(const std::string& which, Store root, Args& a) {
  Commands<Store> run(std::move(root), a.common);
  if (which == "check") return run.check();
  if (which == "migrate") return run.migrate();
  if (which == "gates") return run.gates();
  if (which == "signals") {
    a.thresholds.stranded_after = parse_duration(a.stranded_after);
    a.thresholds.old_snapshot_after = parse_duration(a.old_snapshot_after);
    return run.signals(parse_duration(a.window), a.thresholds);
  }
  if (which == "list") return run.list(a.filter);
  if (which == "count") return run.count(a.filter);
  if (which == "show") return run.show(a.key);
  if (which == "causes") return run.causes(a.causes_limit);
  if (which == "redrive") {
    a.redrive.batch = a.batch;
    return run.redrive(a.redrive, a.execute);
  }
  if (which == "adopt") return run.adopt(a.batch, a.execute);
  if (which == "generations") return run.generations(a.start_generation, a.drop_empty, a.execute);
  if (which == "purge") {
    if (a.older_than.empty()) throw UsageError("purge needs --older-than, such as 30d");
    return run.purge(parse_duration(a.older_than), a.batch, a.execute);
  }
  throw UsageError("unknown subcommand " + which);
}

// Reads the durations, times and keys of the command line before the store is opened, so that
// a mistake in them is a usage error whatever the store's state.
void validate(const std::string& which, const Args& a) {
  const auto now = Clock::now();
  if (which == "list" || which == "count") (void)a.filter.query(now);
  if (which == "signals")
    (void)parse_duration(a.window), (void)parse_duration(a.stranded_after),
        (void)parse_duration(a.old_snapshot_after);
  if (which == "purge" && !a.older_than.empty()) (void)parse_duration(a.older_than);
  if (which == "migrate") (void)parse_duration(a.wait);
  if (which == "redrive") {
    if (!a.redrive.from.empty()) (void)parse_instant(a.redrive.from, now);
    if (!a.redrive.to.empty()) (void)parse_instant(a.redrive.to, now);
  }
}

// Opens the store the command line names and runs the subcommand on it.
int with_store(const std::string& which, Args& a) {
  const Common& c = a.common;
  validate(which, a);
  if (c.store.empty())
    throw UsageError(
        "say where the log is: --store postgresql://user@host/db, or --store path/to/log.db for "
        "SQLite (or set IDEMGATE_STORE)");
  if (is_postgres(c.store)) {
#if IDEMGATE_TOOL_POSTGRES
    std::vector<std::string> said;
    try {
      idemgate::PostgresOptions o;
      o.table = c.table;
      o.partitioned_log = a.partitioned || log_is_partitioned(c.store, c.table);
      o.pool_size = 2;  // one more for the progress line's counts
      o.startup_wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(parse_duration(a.wait));
      o.connect_timeout = std::chrono::seconds(5);
      // Counting and purging a large log may take longer than a consumer's statement.
      o.statement_timeout = std::chrono::minutes(10);
      o.reply_timeout = std::chrono::minutes(11);
      o.log = [&said](std::string_view line) { said.emplace_back(line); };
      return dispatch(which, idemgate::PostgresStore(c.store, o), a);
    } catch (const idemgate::StoreError& e) {
      std::fprintf(stderr, "idemgate: the log %s at %s cannot be used: %s\n", c.table.c_str(),
                   redacted(c.store).c_str(), e.what());
      // What the store logged while connecting, unless the error already says it.
      for (const auto& line : said)
        if (std::string_view(e.what()).find(line.substr(0, 60)) == std::string_view::npos)
          std::fprintf(stderr, "  %s\n", line.c_str());
      std::fprintf(stderr,
                   "Check that the server runs and accepts connections there (host, port, user, "
                   "password, database), and that the log exists: `idemgate check` tests both, "
                   "`idemgate migrate` creates the log.\n");
      return exit_store;
    }
#else
    std::fprintf(stderr,
                 "idemgate: this idemgate was built without PostgreSQL (libpqxx was missing); "
                 "install the Debian package libpqxx-dev and build it again, or give an SQLite "
                 "file with --store\n");
    return exit_store;
#endif
  }
  struct stat info {};
  if (which != "migrate" && ::stat(c.store.c_str(), &info) != 0) {
    std::fprintf(stderr,
                 "idemgate: there is no SQLite database at %s: check the path (a PostgreSQL log "
                 "takes a postgresql:// URI), or create the log with `idemgate migrate --store "
                 "%s`\n",
                 c.store.c_str(), c.store.c_str());
    return exit_store;
  }
  try {
    idemgate::SqliteOptions o;
    o.table = c.table;
    return dispatch(which, idemgate::SqliteStore(c.store, o), a);
  } catch (const idemgate::StoreError& e) {
    std::fprintf(stderr,
                 "idemgate: the log %s in %s cannot be used: %s\n"
                 "Check the path and that this user may read and write the file and its "
                 "directory; `idemgate check` tests the log, `idemgate migrate` creates it.\n",
                 c.table.c_str(), c.store.c_str(), e.what());
    return exit_store;
  }
}

void add_common(CLI::App& sub, Args& a, bool per_gate) {
  sub.add_option("-s,--store", a.common.store,
                 "The log: a PostgreSQL URI (postgresql://user@host/db) or key=value string, or "
                 "an SQLite file's path")
      ->envname("IDEMGATE_STORE");
  sub.add_option("--table", a.common.table, "The log's table (default idemgate_log)")
      ->envname("IDEMGATE_TABLE");
  sub.add_flag("--json", a.common.json, "Answer in JSON, for scripts");
  if (per_gate) sub.add_option("-g,--gate", a.common.gate, "Only this gate (default: every gate)");
}

void add_filter(CLI::App& sub, Args& a) {
  sub.add_option("--status", a.filter.status, "in_flight, committed, failed or escalated");
  sub.add_option("--reason", a.filter.reason, "Exactly this reason");
  sub.add_option("--label", a.filter.label,
                 "Rows whose label contains this text (an upstream's event id, say)");
  sub.add_option("--older-than", a.filter.older_than, "Changed at least this long ago (7d)");
  sub.add_option("--newer-than", a.filter.newer_than, "Changed at most this long ago (2h)");
  sub.add_option("--from", a.filter.from,
                 "Changed at or after this time (ISO 8601 UTC, or a duration ago)");
  sub.add_option("--to", a.filter.to, "Changed before this time (ISO 8601 UTC, or a duration ago)");
}

void add_changing(CLI::App& sub, Args& a) {
  sub.add_flag("--all-gates", a.common.all_gates, "Work on every gate (instead of --gate NAME)");
  sub.add_flag("--execute", a.execute,
               "Change the rows (without it: a dry run that changes nothing)");
  sub.add_flag("--progress", a.common.progress,
               "Show progress even when standard error is not a terminal");
}

// `key`: the key derive_key gives, so an operator finds a row from the upstream's ids.
int derive(const Args& a) {
  const auto& p = a.parts;
  idemgate::Key key;
  switch (p.size()) {
    case 1:
      key = idemgate::derive_key(a.scope, p[0]);
      break;
    case 2:
      key = idemgate::derive_key(a.scope, p[0], p[1]);
      break;
    case 3:
      key = idemgate::derive_key(a.scope, p[0], p[1], p[2]);
      break;
    case 4:
      key = idemgate::derive_key(a.scope, p[0], p[1], p[2], p[3]);
      break;
    default:
      throw UsageError("key takes a scope and one to four parts");
  }
  if (a.common.json)
    std::printf("{\"key\": \"%s\"}\n", key.hex().c_str());
  else
    std::printf("%s\n", key.hex().c_str());
  return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{std::string("idemgate ") + idemgate::version_string +
               ": look after the rows of an idempotency log on PostgreSQL or SQLite: list, "
               "recognise, group, re-drive and purge them."};
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 done; 1 nothing matched (or a signal raises an alarm); 2 the command line "
      "is wrong; 3 the store cannot be opened or reached, or its log is missing or behind.\n"
      "Every subcommand takes --help. docs/operator-command.md has examples.");
  app.set_version_flag("--version", idemgate::version_string);

  auto* check = app.add_subcommand("check",
                                   "Check that the log is reachable and readable by this "
                                   "version (exit 3 when not)");
  add_common(*check, a, false);
  auto* migrate = app.add_subcommand(
      "migrate", "Create the log, or bring an earlier version's to this one's shape (online)");
  add_common(*migrate, a, false);
  migrate->add_option("--wait", a.wait,
                      "How long to wait for an unreachable PostgreSQL server (default 10s)");
  migrate->add_flag("--partitioned", a.partitioned,
                    "Make the PostgreSQL log a log of generations (PostgresOptions::"
                    "partitioned_log), online; every process of the log must then set it");

  auto* gates = app.add_subcommand("gates", "Every gate of the log, with its rows by status");
  add_common(*gates, a, true);

  auto* signals = app.add_subcommand(
      "signals", "The signals per gate over a window, and their alarms (exit 1 on an alarm)");
  add_common(*signals, a, true);
  signals->add_option("--window", a.window, "Events of this window (default 1h)");
  signals->add_option("--stranded-after", a.stranded_after,
                      "An in-flight row older than this is stranded (default 10m)");
  signals->add_option("--old-snapshot-after", a.old_snapshot_after,
                      "A transaction open this long in the log's database holds back its "
                      "cleanup (PostgreSQL; default 5m)");
  signals->add_option("--high-duplicate-ratio", a.thresholds.high_duplicate_ratio,
                      "A duplicate ratio above it raises an alarm (default 0.20)");

  auto* list = app.add_subcommand("list", "Rows by status, reason, label and age, newest first");
  add_common(*list, a, true);
  add_filter(*list, a);
  list->add_option("-n,--limit", a.filter.limit, "At most this many rows per gate (default 50)");

  auto* count = app.add_subcommand("count", "How many rows match, per gate (the filters of list)");
  add_common(*count, a, true);
  add_filter(*count, a);

  auto* show = app.add_subcommand(
      "show", "One row in full: request, outcome, label and history (exit 1 when absent)");
  add_common(*show, a, true);
  show->add_option("key", a.key, "The key: 64 hex digits, as list shows them")->required();

  auto* causes = app.add_subcommand(
      "causes", "Failed and escalated rows grouped by cause: rows, first and last seen");
  add_common(*causes, a, true);
  causes->add_option("-n,--limit", a.causes_limit, "At most this many causes per gate (20)");

  auto* redrive = app.add_subcommand(
      "redrive",
      "Put failed rows back in flight, by key, by cause or by when they failed (a dry run "
      "unless --execute)");
  add_common(*redrive, a, true);
  add_changing(*redrive, a);
  redrive->add_option("-k,--key", a.redrive.keys, "This key (repeatable)");
  redrive->add_option("--cause", a.redrive.cause,
                      "Every failed row of this cause: its ID or the cause itself, as causes "
                      "shows them (a whole reason works too)");
  redrive->add_option("--from", a.redrive.from,
                      "Rows that failed at or after this time (ISO 8601 UTC, or a duration ago)");
  redrive->add_option("--to", a.redrive.to,
                      "Rows that failed before this time (ISO 8601 UTC, or a duration ago)");
  redrive->add_option("-n,--limit", a.redrive.limit, "At most this many rows per gate");
  redrive->add_option("--batch", a.batch, "Rows per statement (default 1000)");

  auto* purge = app.add_subcommand(
      "purge",
      "Delete committed and failed rows that finished long ago (a dry run unless --execute)");
  add_common(*purge, a, true);
  add_changing(*purge, a);
  purge->add_option("--older-than", a.older_than, "Rows that finished this long ago (30d)")
      ->required();
  purge->add_option("--batch", a.batch, "Rows per statement (default 1000)");

  auto* adopt = app.add_subcommand(
      "adopt",
      "Give the rows that belong to no gate (written before logs knew their gates) to the gate "
      "named by --gate (a dry run unless --execute)");
  add_common(*adopt, a, true);
  adopt->add_flag("--execute", a.execute,
                  "Change the rows (without it: a dry run that changes nothing)");
  adopt->add_flag("--progress", a.common.progress,
                  "Show progress even when standard error is not a terminal");
  adopt->add_option("--batch", a.batch, "Rows per statement (default 1000)");

  auto* generations = app.add_subcommand(
      "generations",
      "The generations of a partitioned PostgreSQL log with their sizes; start the next one, or "
      "drop the older ones that hold no row (a dry run unless --execute)");
  add_common(*generations, a, false);
  generations->add_flag("--start", a.start_generation,
                        "Start the next generation now (waits for reservations in flight)");
  generations->add_flag("--drop-empty", a.drop_empty,
                        "Drop every generation older than the current one that holds no row");
  generations->add_flag("--execute", a.execute,
                        "Start or drop (without it: a dry run that changes nothing)");

  auto* key = app.add_subcommand(
      "key", "The key derive_key gives for a scope and the upstream's ids (no store needed)");
  key->add_flag("--json", a.common.json, "Answer in JSON, for scripts");
  key->add_option("scope", a.scope, "The scope the consumer derives keys under")->required();
  key->add_option("parts", a.parts, "The parts, in the consumer's order (one to four)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_usage;
  }
  try {
    const auto* chosen = app.get_subcommands().front();
    if (chosen == key) return derive(a);
    return with_store(chosen->get_name(), a);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "idemgate: %s\n", e.what());
    return exit_usage;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "idemgate: %s\n", e.what());
    return exit_usage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "idemgate: %s\n", e.what());
    return exit_store;
  }
}
