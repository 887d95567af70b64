// The example of server/canonical_json.hpp, inside a function.
#include <idemgate/server/canonical_json.hpp>

void SNIPPET_FUNCTION() {
  // @snippet: the example goes here
}
