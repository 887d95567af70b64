// An example of a webhook header, inside a handler that answers a `Response`.
#include "webhook.hpp"

using namespace snippet;

Response handler(const Request& request, const idemgate::StandardWebhookVerifier& verifier,
                 const std::string& secret, const Event& event) {
  { @SNIPPET @ }
  return respond(200, "ok");
}
