// The examples of consumer/amqp.hpp and docs/brokers/rabbitmq.md: a gate and a decode function.
#include "consumer.hpp"

#include <idemgate/consumer/amqp.hpp>

using namespace snippet;

void SNIPPET_FUNCTION() {
  IDEMGATE_SNIPPET_CONSUMER_GATE;
  auto decode = snippet::decode;
  // @snippet: the example goes here
}
