// Replays the 87-slot Monday over real HTTP: the naive handler, then the gate.
//
//   ect_delta_replay [--store sqlite:PATH | --store postgresql://…] [--seed N] [--json]
//                    [--terminal-ignores-keys] [--terminal URL]
//
// Exit status: 0 when the gated run ends with slots == bookings == containers and no ghost
// slot; 1 when it does not; 2 for bad arguments or a store that cannot be used; 3 when the
// terminal cannot be reached.

#include "replay.hpp"

#include <common/json.hpp>

#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/store/sqlite.hpp>

#include <sqlite3.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

namespace {

struct Arguments {
  std::string store;  // empty: SQLite in a temp file
  unsigned seed = 9;
  bool json = false;
  bool terminal_ignores_keys = false;
  std::string terminal_url;  // empty: the built-in fake terminal
};

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "ect_delta_replay: " << message
            << "\nusage: ect_delta_replay [--store sqlite:PATH | --store postgresql://…] "
               "[--seed N] [--json] [--terminal-ignores-keys] [--terminal URL]\n";
  std::exit(2);
}

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--store") {
      args.store = value();
      if (args.store.rfind("sqlite:", 0) != 0 && args.store.rfind("postgresql://", 0) != 0 &&
          args.store.rfind("postgres://", 0) != 0)
        usage_error("--store \"" + args.store +
                    "\" does not parse: use sqlite:PATH or postgresql://user@host:port/dbname");
      if (args.store == "sqlite:") usage_error("--store sqlite: needs a file path after the colon");
    } else if (arg == "--seed") {
      const std::string text = value();
      char* end = nullptr;
      const unsigned long seed = std::strtoul(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0')
        usage_error("--seed needs a whole number, not \"" + text + '"');
      args.seed = static_cast<unsigned>(seed);
    } else if (arg == "--json") {
      args.json = true;
    } else if (arg == "--terminal-ignores-keys") {
      args.terminal_ignores_keys = true;
    } else if (arg == "--terminal") {
      args.terminal_url = value();
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "usage: ect_delta_replay [--store sqlite:PATH | --store postgresql://…] "
                   "[--seed N] [--json] [--terminal-ignores-keys] [--terminal URL]\n";
      std::exit(0);
    } else {
      usage_error("unknown argument \"" + arg + '"');
    }
  }
  return args;
}

example::json::Json json_counts(const replay::Counts& c) {
  return {{"deliveries", c.deliveries},
          {"containers", c.containers},
          {"slots_claimed", c.slots_claimed},
          {"bookings", c.bookings},
          {"ghost_slots", c.ghost_slots},
          {"duplicates_blocked", c.duplicates_blocked},
          {"reconciled", c.reconciled},
          {"cancellation_cost_eur", replay::cancellation_cost_eur(c.ghost_slots)}};
}

void print_table(const replay::Counts& naive, const replay::Counts& gated) {
  auto row = [](const char* label, std::size_t a, std::size_t b) {
    std::printf("  %-34s %14zu %14zu\n", label, a, b);
  };
  std::printf("\n  %-34s %14s %14s\n", "The Monday, replayed", "naive handler", "idemgate");
  std::printf("  %-34s %14s %14s\n", "----------------------------------", "-------------",
              "--------");
  row("deliveries (redeliveries included)", naive.deliveries, gated.deliveries);
  row("containers", naive.containers, gated.containers);
  row("slots claimed at the terminal", naive.slots_claimed, gated.slots_claimed);
  row("TMS bookings", naive.bookings, gated.bookings);
  row("ghost slots", naive.ghost_slots, gated.ghost_slots);
  row("duplicates blocked", naive.duplicates_blocked, gated.duplicates_blocked);
  row("reconciled after a crash", naive.reconciled, gated.reconciled);
  if (gated.escalated > 0) row("escalated to the manual queue", naive.escalated, gated.escalated);
  std::printf("  %-34s %14ld %14ld\n", "cost of cancelling ghosts (EUR)",
              replay::cancellation_cost_eur(naive.ghost_slots),
              replay::cancellation_cost_eur(gated.ghost_slots));
  std::printf("\n");
}

/// Checks that the terminal answers at all, before anything is written.
void require_reachable(const std::string& url) {
  httplib::Client client(url);
  client.set_connection_timeout(std::chrono::seconds(3));
  client.set_read_timeout(std::chrono::seconds(5));
  if (!client.Get("/slots?idempotency_key=" + std::string(64, '0'))) {
    std::cerr << "ect_delta_replay: cannot reach the terminal at " << url
              << ". Nothing was claimed or booked. Check the URL and that the terminal is up.\n";
    std::exit(3);
  }
}

std::size_t count_sqlite_bookings(const std::string& path) {
  sqlite3* db = nullptr;
  std::size_t rows = 0;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM tms_bookings", -1, &statement, nullptr) ==
            SQLITE_OK &&
        sqlite3_step(statement) == SQLITE_ROW)
      rows = static_cast<std::size_t>(sqlite3_column_int64(statement, 0));
    sqlite3_finalize(statement);
  }
  sqlite3_close(db);
  return rows;
}

template <bool HonoursKeys>
replay::Counts run_gated_on_sqlite(const replay::Setup& setup, const std::string& url,
                                   const std::string& path) {
  idemgate::SqliteStore store(path, {.table = "ect_replay_log"});
  store.migrate();
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK ||
      sqlite3_exec(db,
                   "DROP TABLE IF EXISTS tms_bookings; CREATE TABLE tms_bookings (container TEXT "
                   "NOT NULL, slot_id TEXT NOT NULL, source_event TEXT NOT NULL);"
                   "DELETE FROM ect_replay_log;",
                   nullptr, nullptr, nullptr) != SQLITE_OK) {
    const std::string message = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    throw idemgate::StoreError("cannot prepare the TMS table in " + path + ": " + message);
  }
  sqlite3_close(db);
  auto book = [](idemgate::SqliteStore::transaction& tx, const idemgate::Key& key,
                 const ect_delta::SlotRequest& r, const std::string& slot) {
    tx.exec("INSERT INTO tms_bookings (container, slot_id, source_event) VALUES (?, ?, ?)",
            r.container, slot, key.hex());
  };
  return replay::run_gated<HonoursKeys>(setup, url, store, book,
                                        [&] { return count_sqlite_bookings(path); });
}

template <bool HonoursKeys>
replay::Counts run_gated_on_postgres(const replay::Setup& setup, const std::string& url,
                                     const std::string& uri) {
  idemgate::PostgresStore store(uri, {.table = "ect_replay_log", .pool_size = 4});
  store.migrate();
  {
    auto lease = store.connection();
    pqxx::nontransaction tx(lease.connection());
    idemgate::detail::pq::exec(
        tx,
        "DROP TABLE IF EXISTS ect_replay_tms_bookings; CREATE TABLE ect_replay_tms_bookings "
        "(container text NOT NULL, slot_id text NOT NULL, source_event text NOT NULL);"
        "TRUNCATE ect_replay_log;");
  }
  auto book = [](pqxx::work& tx, const idemgate::Key& key, const ect_delta::SlotRequest& r,
                 const std::string& slot) {
    idemgate::detail::pq::exec_params(tx, "INSERT INTO ect_replay_tms_bookings VALUES ($1, $2, $3)",
                                      r.container, slot, key.hex());
  };
  return replay::run_gated<HonoursKeys>(setup, url, store, book, [&] {
    auto lease = store.connection();
    pqxx::nontransaction tx(lease.connection());
    return static_cast<std::size_t>(
        idemgate::detail::pq::exec(tx, "SELECT count(*) FROM ect_replay_tms_bookings")[0][0]
            .as<std::int64_t>());
  });
}

template <bool HonoursKeys>
replay::Counts run_gated(const Arguments& args, const replay::Setup& setup,
                         const std::string& url) {
  if (args.store.rfind("postgres", 0) == 0)
    return run_gated_on_postgres<HonoursKeys>(setup, url, args.store);
  std::string path = args.store.empty() ? std::string() : args.store.substr(7);
  std::optional<std::filesystem::path> temp_dir;
  if (path.empty()) {
    temp_dir =
        std::filesystem::temp_directory_path() / ("ect_delta_replay." + std::to_string(::getpid()));
    std::filesystem::create_directories(*temp_dir);
    path = (*temp_dir / "replay.db").string();
  }
  auto counts = run_gated_on_sqlite<HonoursKeys>(setup, url, path);
  if (temp_dir) std::filesystem::remove_all(*temp_dir);
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  const Arguments args = parse(argc, argv);
  const replay::Setup setup = replay::monday(args.seed);

  // The fake terminal: one for the naive run (no keys, as the story's terminal call had none)
  // and one for the gated run, so each run's slots are its own.
  ect_delta::TerminalServer naive_terminal(
      {.key_retention = std::chrono::hours(24), .honours_keys = false});
  ect_delta::TerminalServer gated_terminal(
      {.key_retention = std::chrono::hours(24), .honours_keys = !args.terminal_ignores_keys});
  std::string naive_url = args.terminal_url, gated_url = args.terminal_url;
  if (args.terminal_url.empty()) {
    naive_terminal.start();
    gated_terminal.start();
    naive_url = naive_terminal.base_url();
    gated_url = gated_terminal.base_url();
  } else {
    require_reachable(args.terminal_url);
  }

  try {
    const replay::Counts naive = replay::run_naive(setup, naive_url);
    const replay::Counts gated = args.terminal_ignores_keys
                                     ? run_gated<false>(args, setup, gated_url)
                                     : run_gated<true>(args, setup, gated_url);
    if (args.json) {
      std::cout << example::json::Json{{"naive", json_counts(naive)}, {"gated", json_counts(gated)}}
                       .dump()
                << '\n';
    } else {
      print_table(naive, gated);
    }
    if (gated.escalated > 0) {
      std::cerr << "ect_delta_replay: the terminal does not honour Idempotency-Key, so the gate "
                   "claimed nothing and escalated "
                << gated.escalated
                << " events to the manual queue (Gate::escalated()). Integrate a terminal that "
                   "honours keys, or book these by hand.\n";
      return 1;
    }
    if (gated.dead_lettered > 0) {
      std::cerr << "ect_delta_replay: " << gated.dead_lettered
                << " messages could not be processed (the terminal kept failing); they were "
                   "not booked. Nothing was booked twice.\n";
      return 1;
    }
    const bool clean = gated.slots_claimed == gated.containers &&
                       gated.bookings == gated.containers && gated.ghost_slots == 0;
    if (!clean) std::cerr << "ect_delta_replay: the gated run did not end one slot per container\n";
    return clean ? 0 : 1;
  } catch (const idemgate::StoreError& e) {
    std::cerr << "ect_delta_replay: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ect_delta_replay: " << e.what() << '\n';
    return 2;
  }
}
