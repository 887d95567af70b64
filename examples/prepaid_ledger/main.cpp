// prepaid_ledger: a white-label prepaid SMS account behind Standard Webhooks that never debits
// twice. See README.md beside this file.

#include "postgres_ledger.hpp"
#include "server.hpp"
#include "sqlite_ledger.hpp"

#include <idemgate/webhook/standard.hpp>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace {

constexpr const char* usage =
    "usage: prepaid_ledger --secret whsec_... [--port P] [--store sqlite:PATH | --store "
    "postgresql://...]\n"
    "                      [--initial-balance-cents N] [--lock-timeout-ms N]\n"
    "\n"
    "Serves POST /webhooks (Standard Webhooks-signed message.sent / message.received events) on\n"
    "127.0.0.1. --port 0 (the default) picks a free port; the first line on stdout is\n"
    "\"listening on 127.0.0.1:<port>\". The default store is SQLite in a new temporary\n"
    "directory; the default balance of a new account is 2000 cents. On PostgreSQL an event's\n"
    "transaction waits up to --lock-timeout-ms (3000) for a lock another one holds (for a\n"
    "concurrent delivery of the same event: then it answers 409 in_flight).\n"
    "GET /accounts/{account} and GET /stats answer only with \"Authorization: Bearer <token>\",\n"
    "where the token (at least 16 characters) is the environment variable\n"
    "PREPAID_LEDGER_ADMIN_TOKEN; without it they answer 404.\n";

/// Thrown for a command line that cannot be used; main prints it with the usage.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  int port = 0;
  std::string admin_token;
  std::string secret;
  bool has_secret = false;
  std::string store;
  prepaid::LedgerConfig config;
  prepaid::LedgerOptions ledger;
};

std::int64_t number(std::string_view flag, std::string_view text, std::int64_t low,
                    std::int64_t high) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < low || value > high)
    throw UsageError(std::string(flag) + " wants a whole number from " + std::to_string(low) +
                     " to " + std::to_string(high) + ", not \"" + std::string(text) + "\"");
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw UsageError(std::string(flag) + " needs a value");
    const std::string_view value = argv[++i];
    if (flag == "--port") {
      o.port = static_cast<int>(number(flag, value, 0, 65535));
    } else if (flag == "--secret") {
      o.secret = value;
      o.has_secret = true;
    } else if (flag == "--store") {
      o.store = value;
    } else if (flag == "--initial-balance-cents") {
      o.config.initial_balance_cents = number(flag, value, 0, std::int64_t{1} << 52);
    } else if (flag == "--lock-timeout-ms") {
      o.ledger.lock_timeout = std::chrono::milliseconds(number(flag, value, 1, 3'600'000));
    } else if (flag == "--exit-before-commit") {
      // Testing only: simulates a crash inside an event's transaction, before its commit.
      o.config.exit_before_commit = value;
    } else {
      throw UsageError("unknown option " + std::string(flag));
    }
  }
  if (!o.has_secret) throw UsageError("--secret is required (the endpoint's whsec_... secret)");
  // From the environment, not the command line, where every local user could read it.
  if (const char* token = std::getenv("PREPAID_LEDGER_ADMIN_TOKEN")) {
    o.admin_token = token;
    if (o.admin_token.size() < prepaid::min_admin_token_size)
      throw UsageError("PREPAID_LEDGER_ADMIN_TOKEN has " + std::to_string(o.admin_token.size()) +
                       " characters; use at least " +
                       std::to_string(prepaid::min_admin_token_size) +
                       " random ones (e.g. openssl rand -hex 32), or unset it");
  }
  return o;
}

std::string temporary_database() {
  std::string pattern = (std::filesystem::temp_directory_path() / "prepaid_ledger.XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("cannot create a temporary directory for the SQLite store");
  return pattern + "/ledger.db";
}

template <class Ledger>
int serve(typename Ledger::store_type& store, Ledger& ledger, const Options& o,
          const idemgate::StandardWebhookVerifier& verifier) {
  prepaid::PrepaidLedger<Ledger> service{store, ledger, o.ledger};
  prepaid::Server<prepaid::PrepaidLedger<Ledger>> server{
      service, verifier, prepaid::ServerOptions{.edge = {}, .admin_token = o.admin_token}};
  if (o.admin_token.empty())
    std::fputs(
        "prepaid_ledger: GET /accounts and /stats are off; set PREPAID_LEDGER_ADMIN_TOKEN to "
        "serve them\n",
        stderr);
  const int port = server.bind(o.port);
  std::printf("listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);

  // SIGINT and SIGTERM are blocked in every thread (see main); this one waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  std::thread stopper([&] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    server.stop();
  });
  server.listen();
  // listen() also returns when it fails; wake the waiting thread either way.
  kill(getpid(), SIGTERM);
  stopper.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "prepaid_ledger: %s\n\n%s", e.what(), usage);
    return 2;
  }

  std::optional<idemgate::StandardWebhookVerifier> verifier;
  try {
    verifier.emplace(options.secret);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "prepaid_ledger: --secret: %s\n", e.what());
    return 2;
  }

  // Blocked before any thread starts, so every thread inherits the mask and only the waiting
  // thread in serve() receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string& store = options.store;
  try {
    if (store.empty() || store.starts_with("sqlite:")) {
      const std::string path = store.empty() ? temporary_database() : store.substr(7);
      if (path.empty())
        throw UsageError("--store sqlite: needs a file path, e.g. sqlite:ledger.db");
      std::fprintf(stderr, "prepaid_ledger: SQLite store at %s\n", path.c_str());
      idemgate::SqliteStore sqlite{path};
      sqlite.migrate();
      prepaid::SqliteLedger ledger{path, options.config};
      ledger.migrate();
      return serve(sqlite, ledger, options, *verifier);
    }
    if (store.starts_with("postgresql://") || store.starts_with("postgres://")) {
      idemgate::PostgresStore postgres{store, {.pool_size = 8}};
      postgres.migrate();
      prepaid::PostgresLedger ledger{postgres, options.config};
      ledger.migrate();
      return serve(postgres, ledger, options, *verifier);
    }
    throw UsageError("--store \"" + idemgate::detail::redact_uri(store) +
                     "\" is neither sqlite:PATH nor a postgresql:// connection URI");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "prepaid_ledger: %s\n\n%s", e.what(), usage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prepaid_ledger: %s\n", e.what());
    return 1;
  }
}
