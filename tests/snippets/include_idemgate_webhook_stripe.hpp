// An example of a webhook header, inside a handler that answers a `Response`.
#include "webhook.hpp"

using namespace snippet;

Response SNIPPET_FUNCTION(const Request& request, const idemgate::StandardWebhookVerifier& verifier,
                          const std::string& secret, const Event& event) {
  {
    // @snippet: the example goes here
  }
  return respond(200, "ok");
}
