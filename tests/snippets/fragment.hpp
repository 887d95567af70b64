// A fragment of the documentation, compiled inside a function that has what fragments use: a
// MemoryStore `store`, a `terminal`, a business write `book`, a `gate`, its `reconciler` and a
// `retention` worker, a `key`, a Portbase notification `n`, a queue `message`, a slot `request`
// and two times. A fragment may declare its own store or gate: it runs in a block of its own.
// Headers without a prelude of their own use this one too.
#include "context.hpp"

#include <idemgate/consumer/disposition.hpp>
#include <idemgate/server/endpoint.hpp>
#include <idemgate/store/sqlite.hpp>

#if __has_include(<httplib.h>)  // the console examples (idemgate::console)
#include <idemgate/console/httplib.hpp>
#endif

#if __has_include(<prometheus/exposer.h>)  // the metrics examples (idemgate::prometheus)
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <idemgate/metrics/prometheus_cpp.hpp>
#endif

using namespace snippet;

void SNIPPET_FUNCTION(ect_delta::Notification n, Message message, SlotRequest request,
                      std::chrono::system_clock::time_point expired_at,
                      std::chrono::system_clock::time_point fixed_at) {
  idemgate::MemoryStore store;
  Terminal terminal;
  auto book = [](idemgate::MemoryStore::transaction& tx, const SlotRequest&, const std::string&) {
    tx.on_commit([] {});
  };
  idemgate::Gate gate{"ect.claim_slot", store, terminal, book};
  idemgate::Reconciler reconciler{gate};
  idemgate::Retention retention{gate.store()};
  const idemgate::Key key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");
  {
    // @snippet: the example goes here
  }
}
