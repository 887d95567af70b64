// A consumer process for the broker tests (test_amqp_consumer, test_redis_streams_consumer):
// the library's consumer loop for one broker over a gate on PostgreSQL that books each
// notification in a business table. Bodies are "<notification>|<payload>"; the key is derived
// from the notification id. A notification whose id starts with "poison" always fails for now
// (the gate answers retry) until it is dead-lettered.
//
//   booking_consumer --broker amqp|redis --address HOST:PORT --queue NAME --pg URI
//                    [--latency-ms MS] [--batch N] [--max-deliveries N] [--redelivery-ms MS]
//                    [--claim-idle-ms MS]
//
// Prints "ready", "claim <notification>" when the downstream is called, "done <notification>
// <deliveries> <status|-> <disposition>" when a message is settled, "stopped" after SIGTERM.

#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/postgres.hpp>
#ifdef IDEMGATE_TEST_AMQP_CONSUMER
#include <idemgate/consumer/amqp.hpp>
#endif
#ifdef IDEMGATE_TEST_REDIS_CONSUMER
#include <idemgate/consumer/redis_streams.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <unistd.h>

namespace {

using namespace std::chrono_literals;

void say(const std::string& line) {
  std::fputs((line + '\n').c_str(), stdout);
  std::fflush(stdout);
}

/// A downstream whose answer is a function of the request alone (so a repeated claim returns
/// the same outcome: it honours the key), slow by `latency`; "poison" notifications fail.
struct Ledger {
  using request_type = std::string;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  std::chrono::milliseconds latency{0};

  idemgate::ClaimResult<std::string> claim(const std::string& request, const idemgate::Key&) {
    const std::string id = request.substr(0, request.find('|'));
    say("claim " + id);
    std::this_thread::sleep_for(latency);
    if (id.rfind("poison", 0) == 0) return idemgate::TransientFailure{"poison"};
    return "booked:" + request;
  }
};

std::string id_of(std::string_view body) {
  const auto bar = body.find('|');
  return bar == std::string_view::npos ? "-" : std::string(body.substr(0, bar));
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a{{"--latency-ms", "0"},
                                       {"--batch", "16"},
                                       {"--max-deliveries", "3"},
                                       {"--redelivery-ms", "100"},
                                       {"--claim-idle-ms", "2000"}};
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  for (const char* required : {"--broker", "--address", "--queue", "--pg"})
    if (a[required].empty()) {
      std::cerr << "booking_consumer: " << required << " is required\n";
      return 2;
    }
  try {
    idemgate::StopSignal stop;
    idemgate::PostgresStore store{a["--pg"]};
    store.migrate();
    {
      pqxx::connection c{a["--pg"]};
      pqxx::work tx{c};
      tx.exec(
          "CREATE TABLE IF NOT EXISTS bookings (notification text NOT NULL, payload text NOT "
          "NULL)");
      tx.commit();
    }
    Ledger ledger{std::chrono::milliseconds(std::stoi(a["--latency-ms"]))};
    auto book = [](pqxx::work& tx, const std::string& request, const std::string&) {
      const auto bar = request.find('|');
      idemgate::exec_params(tx, "INSERT INTO bookings (notification, payload) VALUES ($1, $2)",
                            request.substr(0, bar), request.substr(bar + 1));
    };
    idemgate::GateOptions gate_options;
    gate_options.lease = 1500ms;
    idemgate::Gate gate{"test.booking", store, ledger, book, gate_options};
    idemgate::ReconcilerOptions reconciler_options;
    reconciler_options.interval = 300ms;
    // Stale only well after a poison message went through its few deliveries, so that the
    // reconciler does not hold it while the broker redelivers it.
    reconciler_options.stale_after = 4s;
    reconciler_options.max_attempts = 2;
    idemgate::Reconciler reconciler{gate, reconciler_options};
    reconciler.start();

    // The key is the notification's, never the broker's message or entry id.
    auto decode =
        [](std::string_view body) -> std::optional<idemgate::consumer::Event<std::string>> {
      const auto bar = body.find('|');
      if (bar == std::string_view::npos || bar == 0) return std::nullopt;
      return idemgate::consumer::Event<std::string>{
          idemgate::derive_key("test.booking", body.substr(0, bar)), std::string(body)};
    };
    auto on_settled = [](const idemgate::consumer::Settlement& s) {
      say("done " + id_of(s.body) + " " + std::to_string(s.deliveries) + " " +
          (s.status ? std::string(idemgate::to_string(*s.status)) : std::string("-")) + " " +
          std::string(idemgate::consumer::to_string(s.disposition)));
    };
    auto on_error = [](std::string_view what) {
      std::cerr << "booking_consumer: " << what << '\n';
    };
    const idemgate::consumer::PoisonPolicy poison{
        static_cast<std::uint32_t>(std::stoi(a["--max-deliveries"]))};
    const auto redelivery = std::chrono::milliseconds(std::stoi(a["--redelivery-ms"]));
    const auto batch = std::stoi(a["--batch"]);

    std::function<void()> run;
#ifdef IDEMGATE_TEST_AMQP_CONSUMER
    std::optional<idemgate::consumer::AmqpConsumer<decltype(gate), decltype(decode)>> amqp;
    if (a["--broker"] == "amqp") {
      idemgate::consumer::AmqpOptions o;
      o.address = a["--address"];
      o.queue = a["--queue"];
      o.prefetch = static_cast<std::uint16_t>(batch);
      o.poison = poison;
      o.redelivery_delay = redelivery;
      o.reconnect_delay = 200ms;
      o.on_settled = on_settled;
      o.on_error = on_error;
      amqp.emplace(gate, decode, o);
      run = [&] { amqp->run(stop); };
    }
#endif
#ifdef IDEMGATE_TEST_REDIS_CONSUMER
    std::optional<idemgate::consumer::RedisStreamsConsumer<decltype(gate), decltype(decode)>> redis;
    if (a["--broker"] == "redis") {
      idemgate::consumer::RedisStreamsOptions o;
      o.address = a["--address"];
      o.stream = a["--queue"];
      o.group = "bookers";
      o.consumer = "booker-" + std::to_string(::getpid());
      o.count = static_cast<std::uint32_t>(batch);
      o.poison = poison;
      o.claim_idle = std::chrono::milliseconds(std::stoi(a["--claim-idle-ms"]));
      o.claim_interval = 200ms;
      o.reconnect_delay = 200ms;
      o.on_settled = on_settled;
      o.on_error = on_error;
      redis.emplace(gate, decode, o);
      run = [&] { redis->run(stop); };
    }
#endif
    if (!run) {
      std::cerr << "booking_consumer: --broker " << a["--broker"] << " is not built in\n";
      return 2;
    }
    say("ready");
    std::thread loop(run);
    stop.wait();
    idemgate::stop_gracefully(10s, gate, reconciler);
    loop.join();
    say("stopped");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "booking_consumer: " << e.what() << '\n';
    return 3;
  }
}
