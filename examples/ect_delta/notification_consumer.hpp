#pragma once

// The application's part of the examples' broker consumers (rabbitmq_consumer,
// redis_streams_consumer): their flags, the Portbase notification's key and request, the gate on
// PostgreSQL in front of the terminal's slot API with the TMS booking, a reconciler, the output
// lines, and stopping on SIGTERM. Each example only makes its broker's consumer loop
// (idemgate::amqp, idemgate::redis_streams) over the gate and the hooks given here.

#include <common/json.hpp>
#include <ect_delta/portbase.hpp>
#include <ect_delta/slot_api.hpp>

#include <idemgate/consumer/decide.hpp>
#include <idemgate/consumer/event.hpp>
#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/downstream/http.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/postgres.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

namespace ect_delta::consumer_app {

/// What differs between the examples' command lines.
struct Flavour {
  /// The program's name, for messages.
  std::string program;
  /// The flag (and environment variable) of the broker's address, and its default.
  std::string address_flag, address_env, default_address;
  /// The flag of the largest batch, and its largest value.
  std::string batch_flag;
  long long most_batch = 65535;
};

/// The command line.
struct Arguments {
  std::string address;
  std::string queue = "portbase.notifications";
  std::string consumer;  // the name in a Redis consumer group
  std::string pg;
  std::string terminal;
  int batch = 4;
  std::uint32_t max_deliveries = 10;
  std::chrono::milliseconds requeue_delay{500};
  std::chrono::milliseconds claim_idle{30'000};
  std::chrono::milliseconds grace{20'000};
  idemgate::GateOptions gate;
  idemgate::ReconcilerOptions reconciler;
  bool run_reconciler = true;
};

[[noreturn]] inline void usage_error(const Flavour& f, const std::string& message) {
  std::cerr << f.program << ": " << message << "\nusage: " << f.program
            << " --pg URI --terminal URL [" << f.address_flag << " HOST:PORT] [--queue NAME] ["
            << f.batch_flag
            << " N] [--max-deliveries N] [--requeue-delay-ms MS] [--claim-idle-ms MS] "
               "[--consumer NAME] [--lease-ms MS] [--reconcile-interval-ms MS] "
               "[--stale-after-ms MS] [--max-attempts N] [--no-reconciler] [--grace-ms MS]\n";
  std::exit(2);
}

inline long long whole_number(const Flavour& f, const std::string& flag, const std::string& text,
                              long long least, long long most) {
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < least || n > most)
    usage_error(f, flag + " needs a whole number from " + std::to_string(least) + " to " +
                       std::to_string(most) + ", not \"" + text + '"');
  return n;
}

inline Arguments parse(const Flavour& f, int argc, char** argv) {
  Arguments args;
  args.address = f.default_address;
  args.consumer = "consumer-" + std::to_string(::getpid());
  for (const auto& [name, field] :
       {std::pair{f.address_env.c_str(), &args.address}, std::pair{"IDEMGATE_QUEUE", &args.queue},
        std::pair{"IDEMGATE_PG", &args.pg}, std::pair{"IDEMGATE_TERMINAL", &args.terminal}})
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') *field = value;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(f, arg + " needs a value");
      return argv[++i];
    };
    auto millis = [&](long long least) {
      return std::chrono::milliseconds(whole_number(f, arg, value(), least, 86'400'000));
    };
    if (arg == f.address_flag) {
      args.address = value();
    } else if (arg == "--queue") {
      args.queue = value();
    } else if (arg == "--consumer") {
      args.consumer = value();
    } else if (arg == "--pg") {
      args.pg = value();
    } else if (arg == "--terminal") {
      args.terminal = value();
    } else if (arg == f.batch_flag) {
      args.batch = static_cast<int>(whole_number(f, arg, value(), 1, f.most_batch));
    } else if (arg == "--max-deliveries") {
      args.max_deliveries = static_cast<std::uint32_t>(whole_number(f, arg, value(), 1, 1000));
    } else if (arg == "--requeue-delay-ms") {
      args.requeue_delay = millis(0);
    } else if (arg == "--claim-idle-ms") {
      args.claim_idle = millis(1);
    } else if (arg == "--lease-ms") {
      args.gate.lease = millis(1);
    } else if (arg == "--reconcile-interval-ms") {
      args.reconciler.interval = millis(1);
    } else if (arg == "--stale-after-ms") {
      args.reconciler.stale_after = millis(0);
    } else if (arg == "--max-attempts") {
      args.reconciler.max_attempts =
          static_cast<std::size_t>(whole_number(f, arg, value(), 1, 1000));
    } else if (arg == "--grace-ms") {
      args.grace = millis(0);
    } else if (arg == "--no-reconciler") {
      args.run_reconciler = false;
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "see the comment at the top of examples/" << f.program << "/main.cpp\n";
      std::exit(0);
    } else {
      usage_error(f, "unknown argument \"" + arg + '"');
    }
  }
  if (args.pg.empty()) usage_error(f, "--pg (or IDEMGATE_PG) is required: the PostgreSQL URI");
  if (args.terminal.empty())
    usage_error(f, "--terminal (or IDEMGATE_TERMINAL) is required: the slot API's base URL");
  return args;
}

/// One output line, flushed at once (the tests and the chaos run read it).
inline void say(const std::string& line) {
  std::fputs((line + '\n').c_str(), stdout);
  std::fflush(stdout);
}

/// A notification as published: `{"notification_id":…,"equipment_number":…,
/// "preferred_window":…}`; none when a field is missing.
inline std::optional<Notification> parse_notification(std::string_view body) {
  namespace json = example::json;
  const auto document = json::parse(std::string(body));
  if (!document) return std::nullopt;
  auto id = json::string_member(*document, "notification_id");
  auto container = json::string_member(*document, "equipment_number");
  auto window = json::string_member(*document, "preferred_window");
  if (!id || !container || !window || id->empty()) return std::nullopt;
  return Notification{std::move(*id), std::move(*container), std::move(*window)};
}

/// The notification's id for the output lines; "-" when the body is not a notification.
inline std::string id_of(std::string_view body) {
  const auto n = parse_notification(body);
  return n ? n->notification_id : "-";
}

/// The event of a body. The key comes from what Portbase controls, never from the broker's
/// delivery tag, message id or entry id, which are new on every delivery or publish: a key made
/// of them would never see a duplicate.
inline std::optional<idemgate::consumer::Event<SlotRequest>> decode(std::string_view body) {
  auto n = parse_notification(body);
  if (!n) return std::nullopt;  // dead-lettered
  return idemgate::consumer::Event<SlotRequest>{
      idemgate::derive_key("ect.claim_slot", n->notification_id, n->equipment_number),
      {n->equipment_number, n->preferred_window}};
}

/// The business write: the TMS bookings of every event the gate commits at once (a batch of the
/// broker's prefetch, or one event), in one multi-row INSERT in the transaction that records
/// their slots.
inline void book_all(pqxx::work& tx,
                     std::span<const idemgate::CommittedEvent<SlotRequest, std::string>> events) {
  std::vector<std::string> containers, slots;
  containers.reserve(events.size());
  slots.reserve(events.size());
  for (const auto& event : events) {
    containers.push_back(event.request.container);
    slots.push_back(event.outcome);
  }
  idemgate::exec_params(tx,
                        "INSERT INTO tms_bookings (container, slot)"
                        " SELECT * FROM unnest($1::text[], $2::text[])",
                        idemgate::text_array(containers), idemgate::text_array(slots));
}

/// The hooks every consumer gets: the output lines, and errors on stderr.
struct Hooks {
  std::function<void(const idemgate::consumer::Received&)> on_received;
  std::function<void(const idemgate::consumer::Settlement&)> on_settled;
  std::function<void(std::string_view)> on_error;
};

inline Hooks hooks(const std::string& program) {
  Hooks h;
  h.on_received = [](const idemgate::consumer::Received& r) {
    say("begin " + id_of(r.body) + " " + std::to_string(r.deliveries));
  };
  h.on_settled = [program](const idemgate::consumer::Settlement& s) {
    const std::string id = id_of(s.body);
    const std::string disposition(idemgate::consumer::to_string(s.disposition));
    if (s.status) {
      say("done " + id + " " + std::string(idemgate::to_string(*s.status)) + " " + disposition);
    } else if (s.disposition == idemgate::consumer::Disposition::dead_letter) {
      say("done " + id + " malformed " + disposition);
    } else {  // the store failed: the reason goes to stderr
      std::cerr << program << ": " << id << ": " << s.reason << '\n';
      say("error " + id + " " + disposition);
    }
  };
  h.on_error = [program](std::string_view what) {
    std::cerr << program << ": " << what << " (connecting again)\n";
  };
  return h;
}

/**
 * The whole program: parses the flags, sets up the gate on PostgreSQL, makes the consumer with
 * `make(gate, args, hooks)`, runs it until SIGTERM, and stops gracefully. Exit status: 0 after
 * SIGTERM, 2 for bad arguments, 3 when the broker or the database cannot be used.
 */
template <class Make>
int main_of(const Flavour& flavour, int argc, char** argv, Make make) {
  const Arguments args = parse(flavour, argc, argv);
  try {
    idemgate::StopSignal stop;  // SIGTERM and SIGINT
    // The store connects lazily; `migrate()` waits for a database that is not up yet (a
    // consumer restarted during a failover) up to `PostgresOptions::startup_wait`.
    idemgate::PostgresStore store{args.pg};
    store.migrate();
    {
      pqxx::connection c{args.pg};
      pqxx::work tx{c};
      tx.exec(
          "CREATE TABLE IF NOT EXISTS tms_bookings (container text NOT NULL, slot text NOT NULL,"
          " booked_at timestamptz NOT NULL DEFAULT clock_timestamp())");
      tx.commit();
    }
    idemgate::HttpDownstream<SlotApi> terminal{args.terminal};
    // The business write is a bulk one: the consumer's batches commit with one INSERT each.
    auto book = [](pqxx::work& tx,
                   std::span<const idemgate::CommittedEvent<SlotRequest, std::string>> events) {
      book_all(tx, events);
    };
    idemgate::Gate gate{"ect.claim_slot", store, terminal, book, args.gate};
    idemgate::Reconciler reconciler{gate, args.reconciler};
    if (args.run_reconciler) reconciler.start();

    auto consumer = make(gate, args, hooks(flavour.program));
    say("ready");
    std::thread loop([&] { consumer->run(stop); });
    stop.wait();  // SIGTERM from the deployment, or Ctrl-C
    // The gate takes no new work, the reconciler ends its pass, the messages in hand get what
    // is left of the grace; if one is still running then, its lease was given back...
    const auto report = idemgate::stop_gracefully(args.grace, gate, reconciler);
    if (!report.clean()) {
      // ...and a broker that can take messages back at once gets them now, so a redelivery
      // takes the events over at once. Never acked: if a call still commits, the redelivery
      // finds it done. (A Redis entry stays pending for another consumer's claim.)
      if constexpr (requires { consumer->requeue_in_hand(); })
        if (consumer->requeue_in_hand() > 0) say("requeue in-hand");
      say("stopped");
      // The call in hand may hang on the terminal; the connection closes at exit.
      std::_Exit(0);
    }
    loop.join();
    say("stopped");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << flavour.program << ": " << e.what() << '\n';
    return 3;
  }
}

}  // namespace ect_delta::consumer_app
