// Books ECT Delta slots for Portbase notifications taken from a Redis stream, exactly once
// however often they are delivered. The consumer loop (a consumer group, batches of COUNT, XACK
// after the gate's answer, XAUTOCLAIM of a dead consumer's entries, dead letters, reconnecting)
// is the library's idemgate::redis_streams component; the application's part is
// examples/ect_delta/notification_consumer.hpp, shared with rabbitmq_consumer. An entry's field
// "body" holds the notification's JSON.
//
//   redis_streams_consumer --pg URI --terminal URL [--redis HOST:PORT] [--queue STREAM]
//                          [--consumer NAME] [--count N] [--max-deliveries N]
//                          [--claim-idle-ms MS] [--lease-ms MS] [--reconcile-interval-ms MS]
//                          [--stale-after-ms MS] [--max-attempts N] [--no-reconciler]
//                          [--grace-ms MS]
//
// The group is "slots"; the consumer's name defaults to "consumer-<pid>". Environment:
// IDEMGATE_PG, IDEMGATE_TERMINAL, IDEMGATE_REDIS, IDEMGATE_QUEUE. Its output lines and exit
// status are rabbitmq_consumer's ("requeue in-hand" aside: unfinished entries stay pending for
// another consumer's claim).

#include <ect_delta/notification_consumer.hpp>

#include <idemgate/consumer/redis_streams.hpp>

#include <memory>

int main(int argc, char** argv) {
  namespace app = ect_delta::consumer_app;
  const app::Flavour flavour{"redis_streams_consumer", "--redis", "IDEMGATE_REDIS",
                             "127.0.0.1:6379",         "--count", 10'000};
  return app::main_of(flavour, argc, argv,
                      [](auto& gate, const app::Arguments& args, const app::Hooks& hooks) {
                        idemgate::consumer::RedisStreamsOptions options;
                        options.address = args.address;
                        options.stream = args.queue;
                        options.group = "slots";
                        options.consumer = args.consumer;
                        options.count = static_cast<std::uint32_t>(args.batch);
                        options.poison.max_deliveries = args.max_deliveries;
                        options.claim_idle = args.claim_idle;
                        options.on_received = hooks.on_received;
                        options.on_settled = hooks.on_settled;
                        options.on_error = hooks.on_error;
                        return std::make_unique<idemgate::consumer::RedisStreamsConsumer<
                            std::remove_reference_t<decltype(gate)>, decltype(&app::decode)>>(
                            gate, &app::decode, options);
                      });
}
