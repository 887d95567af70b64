// A fragment about metrics in a prometheus-cpp registry: what fragment.hpp offers, with the
// observer's header and prometheus-cpp's Exposer (prometheus-cpp::pull) included.
#include "context.hpp"

#include <idemgate/metrics/prometheus_cpp.hpp>
#include <idemgate/store/sqlite.hpp>

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

using namespace snippet;

void fragment(ect_delta::Notification n, Message message, SlotRequest request,
              std::chrono::system_clock::time_point expired_at,
              std::chrono::system_clock::time_point fixed_at) {
  idemgate::MemoryStore store;
  Terminal terminal;
  auto book = [](idemgate::MemoryStore::transaction& tx, const SlotRequest&, const std::string&) {
    tx.on_commit([] {});
  };
  idemgate::Gate gate{store, terminal, book};
  idemgate::Reconciler reconciler{gate};
  idemgate::Retention retention{store};
  const idemgate::Key key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU7000037");
  {
    // @snippet: the example goes here
  }
}
