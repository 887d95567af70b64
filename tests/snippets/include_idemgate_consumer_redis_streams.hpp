// The examples of consumer/redis_streams.hpp and docs/brokers/redis-streams.md: a gate and a
// decode function.
#include "consumer.hpp"

#include <idemgate/consumer/redis_streams.hpp>

using namespace snippet;

void SNIPPET_FUNCTION() {
  IDEMGATE_SNIPPET_CONSUMER_GATE;
  auto decode = snippet::decode;
  // @snippet: the example goes here
}
