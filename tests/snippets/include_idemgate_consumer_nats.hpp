// The example of consumer/nats.hpp: a JetStream consumer over a gate on MemoryStore, stopped by
// SIGTERM.
#include "context.hpp"

#include <idemgate/consumer/nats.hpp>

#include <thread>

using namespace snippet;

/// The application's parser of a notification's JSON.
ect_delta::Notification parse(std::string_view data);

void SNIPPET_FUNCTION(idemgate::consumer::JetStreamOptions options, idemgate::StopSignal& sigterm) {
  idemgate::MemoryStore store;
  Terminal terminal;
  auto book = [](idemgate::MemoryStore::transaction&, const SlotRequest&, const std::string&) {};
  idemgate::Gate gate{"ect.claim_slot", store, terminal, book};
  // @snippet: the example goes here
}
