// A consumer process of the NATS JetStream tests: JetStreamConsumer over a gate on PostgreSQL,
// whose terminal is a table of the same database (so that a killed consumer's claims are seen by
// the next one). Notifications are "<notification id>|<container>|<window>"; the key is derived
// from the notification id, so two notifications of one id with other containers conflict. A
// container named POISON-... is refused by the terminal for now, every time (a `retry` forever).
//
//   nats_consumer --nats URL --stream S --subject S --durable D --pg URI
//                 [--batch N] [--ack-wait-ms MS] [--max-deliveries N] [--retry-delay-ms MS]
//                 [--lease-ms MS] [--stall-at N] [--grace-ms MS]
//
// --stall-at N: the N-th claim of this process stops after the terminal booked the slot and
// before the gate commits, and prints "stalled <notification>" (the test kills it then).
// Prints "ready", "done <notification> <status|none> <disposition> <deliveries>" per message,
// "handed-back <n>" and "stopped"; broker errors go to stderr.

#include "support/pg_bookings.hpp"
#include "support/pg_terminal.hpp"
#include "support/slot_request.hpp"

#include <idemgate/consumer/nats.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/postgres.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <thread>

namespace {

using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

void say(const std::string& line) {
  std::fputs((line + '\n').c_str(), stdout);
  std::fflush(stdout);
}

/// The test terminal, refusing POISON containers for now and stalling at one claim.
struct Terminal {
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  idemgate::test::PgTerminal& inner;
  int stall_at = 0;
  std::atomic<int> claims{0};

  idemgate::ClaimResult<std::string> claim(const SlotRequest& request, const idemgate::Key& key) {
    if (request.container.rfind("POISON", 0) == 0)
      return idemgate::TransientFailure{"the terminal refuses this container for now"};
    auto result = inner.claim(request, key);
    if (++claims == stall_at) {
      say("stalled " + request.container);
      std::this_thread::sleep_for(1h);
    }
    return result;
  }
  idemgate::LookupResult<std::string> lookup(const idemgate::Key& key) { return inner.lookup(key); }
};

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args{{"--batch", "16"},         {"--ack-wait-ms", "2000"},
                                          {"--max-deliveries", "3"}, {"--retry-delay-ms", "200"},
                                          {"--lease-ms", "1500"},    {"--stall-at", "0"},
                                          {"--grace-ms", "5000"}};
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  for (const char* required : {"--nats", "--stream", "--subject", "--durable", "--pg"})
    if (args[required].empty()) {
      std::cerr << "nats_consumer: " << required << " is required\n";
      return 2;
    }
  auto millis = [&](const char* flag) { return std::chrono::milliseconds(std::stoll(args[flag])); };
  try {
    idemgate::StopSignal stop;
    idemgate::PostgresStore store{args["--pg"]};
    store.migrate();
    idemgate::test::PgTerminal slots{args["--pg"], "terminal_slots"};
    Terminal terminal{slots, std::stoi(args["--stall-at"])};
    idemgate::GateOptions gate_options;
    gate_options.lease = millis("--lease-ms");
    idemgate::Gate gate{"ect.claim_slot", store, terminal,
                        idemgate::test::PgBookingWriter{"bookings"}, gate_options};
    idemgate::ReconcilerOptions reconciler_options;
    reconciler_options.interval = 300ms;
    // Above max_deliveries x retry delay: a poison message reaches the dead-letter stream before
    // the reconciler takes its event over (its redeliveries would then be answered in_flight).
    reconciler_options.stale_after = 5s;
    idemgate::Reconciler reconciler{gate, reconciler_options};
    reconciler.start();

    idemgate::consumer::JetStreamOptions options;
    options.url = args["--nats"];
    options.stream = args["--stream"];
    options.subject = args["--subject"];
    options.durable = args["--durable"];
    options.batch = static_cast<std::uint32_t>(std::stoul(args["--batch"]));
    options.ack_wait = millis("--ack-wait-ms");
    options.poison.max_deliveries =
        static_cast<std::uint32_t>(std::stoul(args["--max-deliveries"]));
    options.retry_delay = millis("--retry-delay-ms");
    options.fetch_wait = 200ms;
    // The key comes from the notification's id, which the upstream controls.
    idemgate::consumer::JetStreamConsumer consumer{
        gate, options,
        [](std::string_view data)
            -> std::optional<idemgate::consumer::JetStreamEvent<SlotRequest>> {
          const auto first = data.find('|');
          const auto second = data.find('|', first == data.npos ? first : first + 1);
          if (first == data.npos || second == data.npos || first == 0) return std::nullopt;
          const std::string id(data.substr(0, first));
          return idemgate::consumer::JetStreamEvent<SlotRequest>{
              idemgate::derive_key("ect.claim_slot", id),
              SlotRequest{std::string(data.substr(first + 1, second - first - 1)),
                          std::string(data.substr(second + 1))}};
        }};
    consumer.declare();
    consumer.on_settled([](const idemgate::consumer::JetStreamSettled& s) {
      const std::string id(s.data.substr(0, s.data.find('|')));
      say("done " + id + " " +
          (s.status ? std::string(idemgate::to_string(*s.status)) : std::string("none")) + " " +
          std::string(idemgate::consumer::to_string(s.disposition)) + " " +
          std::to_string(s.deliveries) + (s.settled ? "" : " unsettled"));
    });
    consumer.on_error(
        [](const std::string& what) { std::cerr << "nats_consumer: " << what << '\n'; });
    say("ready");
    std::exception_ptr failure;
    std::thread loop([&] {
      try {
        consumer.run(stop);
      } catch (...) {
        failure = std::current_exception();
        stop.request();
      }
    });
    stop.wait();
    const auto report = idemgate::stop_gracefully(millis("--grace-ms"), gate, reconciler);
    if (!report.clean()) {
      say("handed-back " + std::to_string(consumer.hand_back()));
      say("stopped");
      std::_Exit(0);  // the call in hand may hang; the connection closes with the process
    }
    loop.join();
    if (failure) std::rethrow_exception(failure);
    say("stopped");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "nats_consumer: " << e.what() << '\n';
    return 3;
  }
}
