// Books ECT Delta slots for Portbase notifications taken from a RabbitMQ queue, exactly once
// however often the broker delivers them. The consumer loop (manual acknowledgements, batches
// of the prefetch, dead letters, reconnecting) is the library's idemgate::amqp component; this
// is the application's part: the notification's key and request, the gate on PostgreSQL in
// front of the terminal's slot API, the booking, and a reconciler for what a crash leaves in
// flight.
//
//   rabbitmq_consumer --pg URI --terminal URL [--amqp HOST:PORT] [--queue NAME]
//                     [--prefetch N] [--requeue-delay-ms MS] [--lease-ms MS]
//                     [--reconcile-interval-ms MS] [--stale-after-ms MS] [--max-attempts N]
//                     [--no-reconciler] [--grace-ms MS] [--max-deliveries N]
//
// Each flag may be given by environment instead: IDEMGATE_PG, IDEMGATE_TERMINAL, IDEMGATE_AMQP,
// IDEMGATE_QUEUE. Gate and reconciler options not given keep the library's defaults.
//
// It prints one line per event on stdout: "ready" once started, "begin <notification>
// <deliveries>" when a delivery is taken (the broker's count, 1 the first time), "done
// <notification> <status> <disposition>" when it is settled, "error <notification> redeliver"
// when the store failed (the message is requeued), "requeue in-hand" when a SIGTERM's grace
// (--grace-ms, default 20000) ran out with messages unfinished, "stopped" once stopped. Exit
// status: 0 after SIGTERM, 2 for bad arguments, 3 when the broker or the database cannot be used.

#include <ect_delta/portbase.hpp>
#include <ect_delta/slot_api.hpp>

#include <idemgate/consumer/amqp.hpp>
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
#include <iostream>
#include <optional>
#include <string>
#include <thread>

namespace {

namespace json = example::json;
using namespace std::chrono_literals;

struct Arguments {
  std::string amqp = "127.0.0.1:5672";
  std::string queue = "portbase.notifications";
  std::string pg;
  std::string terminal;
  int prefetch = 4;
  std::uint32_t max_deliveries = 10;
  std::chrono::milliseconds requeue_delay{500};
  std::chrono::milliseconds grace{20'000};
  idemgate::GateOptions gate;
  idemgate::ReconcilerOptions reconciler;
  bool run_reconciler = true;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "rabbitmq_consumer: " << message
            << "\nusage: rabbitmq_consumer --pg URI --terminal URL [--amqp HOST:PORT] "
               "[--queue NAME] [--prefetch N] [--requeue-delay-ms MS] [--lease-ms MS] "
               "[--reconcile-interval-ms MS] [--stale-after-ms MS] [--max-attempts N] "
               "[--no-reconciler] [--grace-ms MS] [--max-deliveries N]\n";
  std::exit(2);
}

long long whole_number(const std::string& flag, const std::string& text, long long least,
                       long long most) {
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < least || n > most)
    usage_error(flag + " needs a whole number from " + std::to_string(least) + " to " +
                std::to_string(most) + ", not \"" + text + '"');
  return n;
}

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (const auto& [name, field] :
       {std::pair{"IDEMGATE_AMQP", &args.amqp}, std::pair{"IDEMGATE_QUEUE", &args.queue},
        std::pair{"IDEMGATE_PG", &args.pg}, std::pair{"IDEMGATE_TERMINAL", &args.terminal}})
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') *field = value;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    auto millis = [&](long long least) {
      return std::chrono::milliseconds(whole_number(arg, value(), least, 86'400'000));
    };
    if (arg == "--amqp") {
      args.amqp = value();
    } else if (arg == "--queue") {
      args.queue = value();
    } else if (arg == "--pg") {
      args.pg = value();
    } else if (arg == "--terminal") {
      args.terminal = value();
    } else if (arg == "--prefetch") {
      args.prefetch = static_cast<int>(whole_number(arg, value(), 1, 65535));
    } else if (arg == "--max-deliveries") {
      args.max_deliveries = static_cast<std::uint32_t>(whole_number(arg, value(), 1, 1000));
    } else if (arg == "--requeue-delay-ms") {
      args.requeue_delay = millis(0);
    } else if (arg == "--lease-ms") {
      args.gate.lease = millis(1);
    } else if (arg == "--reconcile-interval-ms") {
      args.reconciler.interval = millis(1);
    } else if (arg == "--stale-after-ms") {
      args.reconciler.stale_after = millis(0);
    } else if (arg == "--max-attempts") {
      args.reconciler.max_attempts = static_cast<std::size_t>(whole_number(arg, value(), 1, 1000));
    } else if (arg == "--grace-ms") {
      args.grace = millis(0);
    } else if (arg == "--no-reconciler") {
      args.run_reconciler = false;
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "see the comment at the top of examples/rabbitmq_consumer/main.cpp\n";
      std::exit(0);
    } else {
      usage_error("unknown argument \"" + arg + '"');
    }
  }
  if (args.pg.empty()) usage_error("--pg (or IDEMGATE_PG) is required: the PostgreSQL URI");
  if (args.terminal.empty())
    usage_error("--terminal (or IDEMGATE_TERMINAL) is required: the slot API's base URL");
  return args;
}

void say(const std::string& line) {
  std::fputs((line + '\n').c_str(), stdout);
  std::fflush(stdout);
}

/// A notification as published: `{"notification_id":…,"equipment_number":…,
/// "preferred_window":…}`; none when a field is missing.
std::optional<ect_delta::Notification> parse_notification(const std::string& body) {
  const auto document = json::parse(body);
  if (!document) return std::nullopt;
  auto id = json::string_member(*document, "notification_id");
  auto container = json::string_member(*document, "equipment_number");
  auto window = json::string_member(*document, "preferred_window");
  if (!id || !container || !window || id->empty()) return std::nullopt;
  return ect_delta::Notification{std::move(*id), std::move(*container), std::move(*window)};
}

/// The notification's id for the output lines; "-" when the body is not a notification.
std::string id_of(std::string_view body) {
  const auto n = parse_notification(std::string(body));
  return n ? n->notification_id : "-";
}

int run(const Arguments& args, idemgate::StopSignal& stop) {
  // The store connects lazily; `migrate()` waits for a database that is not up yet (a consumer
  // restarted during a failover) up to `PostgresOptions::startup_wait`.
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
  idemgate::HttpDownstream<ect_delta::SlotApi> terminal{args.terminal};
  // The business write: the TMS booking, in the transaction that records the slot.
  auto book = [](pqxx::work& tx, const ect_delta::SlotRequest& request, const std::string& slot) {
    idemgate::exec_params(tx, "INSERT INTO tms_bookings (container, slot) VALUES ($1, $2)",
                          request.container, slot);
  };
  idemgate::Gate gate{"ect.claim_slot", store, terminal, book, args.gate};
  idemgate::Reconciler reconciler{gate, args.reconciler};
  if (args.run_reconciler) reconciler.start();

  // The key comes from what Portbase controls, never from the broker's delivery tag or message
  // id, which are new on every delivery: a key made of them would never see a duplicate.
  auto decode = [](std::string_view body)
      -> std::optional<idemgate::consumer::Event<ect_delta::SlotRequest>> {
    auto n = parse_notification(std::string(body));
    if (!n) return std::nullopt;  // dead-lettered
    return idemgate::consumer::Event<ect_delta::SlotRequest>{
        idemgate::derive_key("ect.claim_slot", n->notification_id, n->equipment_number),
        {n->equipment_number, n->preferred_window}};
  };
  idemgate::consumer::AmqpOptions options;
  options.address = args.amqp;
  options.queue = args.queue;
  options.prefetch = static_cast<std::uint16_t>(args.prefetch);
  options.poison.max_deliveries = args.max_deliveries;
  options.redelivery_delay = args.requeue_delay;
  options.on_received = [](const idemgate::consumer::Received& r) {
    say("begin " + id_of(r.body) + " " + std::to_string(r.deliveries));
  };
  options.on_settled = [](const idemgate::consumer::Settlement& s) {
    const std::string id = id_of(s.body);
    const std::string disposition(idemgate::consumer::to_string(s.disposition));
    if (s.status)
      say("done " + id + " " + std::string(idemgate::to_string(*s.status)) + " " + disposition);
    else if (s.disposition == idemgate::consumer::Disposition::dead_letter)
      say("done " + id + " malformed " + disposition);
    else {  // the store failed: the reason goes to stderr
      std::cerr << "rabbitmq_consumer: " << id << ": " << s.reason << '\n';
      say("error " + id + " " + disposition);
    }
  };
  options.on_error = [](std::string_view what) {
    std::cerr << "rabbitmq_consumer: " << what << " (connecting again)\n";
  };
  idemgate::consumer::AmqpConsumer consumer{gate, decode, options};
  say("ready");

  std::thread loop([&] { consumer.run(stop); });
  stop.wait();  // SIGTERM from the deployment, or Ctrl-C
  // The gate takes no new work, the reconciler ends its pass, the messages in hand get what is
  // left of the grace; if one is still running then, its lease was given back...
  const auto report = idemgate::stop_gracefully(args.grace, gate, reconciler);
  if (!report.clean()) {
    // ...and the messages go back to the broker now, so a redelivery takes the events over at
    // once. Never acked: if a call still commits, the redelivery finds it done.
    if (consumer.requeue_in_hand() > 0) say("requeue in-hand");
    say("stopped");
    // The call in hand may hang on the terminal; closing the connection at exit hands the
    // prefetched messages back.
    std::_Exit(0);
  }
  loop.join();
  say("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Arguments args = parse(argc, argv);
  try {
    idemgate::StopSignal stop;  // SIGTERM and SIGINT
    return run(args, stop);
  } catch (const std::exception& e) {
    std::cerr << "rabbitmq_consumer: " << e.what() << '\n';
    return 3;
  }
}
