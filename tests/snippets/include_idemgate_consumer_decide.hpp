// The example of consumer/decide.hpp: a batch as a consumer received it, with its delivery tags.
#include "consumer.hpp"

using namespace snippet;

void SNIPPET_FUNCTION(std::vector<idemgate::consumer::Received> received,
                      std::vector<std::uint64_t> tags, idemgate::consumer::PoisonPolicy policy) {
  IDEMGATE_SNIPPET_CONSUMER_GATE;
  auto decode = snippet::decode;
  // @snippet: the example goes here
}
