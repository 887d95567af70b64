// The example of consumer/disposition.hpp: one delivery, its broker's count, and a message.
#include "consumer.hpp"

using namespace snippet;

void SNIPPET_FUNCTION(Message message, SlotRequest request, std::uint32_t delivery_count) {
  IDEMGATE_SNIPPET_CONSUMER_GATE;
  const idemgate::Key key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");
  // @snippet: the example goes here
}
