// The example of server/key_header.hpp, inside a function.
#include <idemgate/server/key_header.hpp>

void SNIPPET_FUNCTION() {
  // @snippet: the example goes here
}
