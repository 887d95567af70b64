// The example of consumer/event.hpp: a decode function over the notification parser.
#include "consumer.hpp"

using namespace snippet;

void SNIPPET_FUNCTION() {
  // @snippet: the example goes here
}
