// Books ECT Delta slots for Portbase notifications taken from a RabbitMQ queue, exactly once
// however often the broker delivers them. The consumer loop (manual acknowledgements, batches
// of the prefetch, dead letters, reconnecting) is the library's idemgate::amqp component; the
// application's part (the notification's key and request, the gate on PostgreSQL in front of
// the terminal's slot API, the booking, a reconciler, stopping) is
// examples/ect_delta/notification_consumer.hpp, shared with redis_streams_consumer.
//
//   rabbitmq_consumer --pg URI --terminal URL [--amqp HOST:PORT] [--queue NAME]
//                     [--prefetch N] [--max-deliveries N] [--requeue-delay-ms MS]
//                     [--lease-ms MS] [--reconcile-interval-ms MS] [--stale-after-ms MS]
//                     [--max-attempts N] [--no-reconciler] [--grace-ms MS]
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

#include <ect_delta/notification_consumer.hpp>

#include <idemgate/consumer/amqp.hpp>

#include <memory>

int main(int argc, char** argv) {
  namespace app = ect_delta::consumer_app;
  const app::Flavour flavour{"rabbitmq_consumer", "--amqp",     "IDEMGATE_AMQP",
                             "127.0.0.1:5672",    "--prefetch", 65535};
  return app::main_of(flavour, argc, argv,
                      [](auto& gate, const app::Arguments& args, const app::Hooks& hooks) {
                        idemgate::consumer::AmqpOptions options;
                        options.address = args.address;
                        options.queue = args.queue;
                        options.prefetch = static_cast<std::uint16_t>(args.batch);
                        options.poison.max_deliveries = args.max_deliveries;
                        options.redelivery_delay = args.requeue_delay;
                        options.on_received = hooks.on_received;
                        options.on_settled = hooks.on_settled;
                        options.on_error = hooks.on_error;
                        return std::make_unique<idemgate::consumer::AmqpConsumer<
                            std::remove_reference_t<decltype(gate)>, decltype(&app::decode)>>(
                            gate, &app::decode, options);
                      });
}
