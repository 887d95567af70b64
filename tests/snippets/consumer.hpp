// What the broker consumers' examples (the headers under consumer/ and docs/brokers/) take for
// granted: a gate on a MemoryStore over the terminal, its reconciler, a StopSignal, a
// notification parser, the delivery count of a message, and a decode function.
#pragma once

#include "context.hpp"

#include <idemgate/consumer/decide.hpp>
#include <idemgate/consumer/disposition.hpp>
#include <idemgate/consumer/event.hpp>

#include <optional>
#include <string_view>
#include <thread>
#include <vector>

namespace snippet {

/// A notification from a message body; none when it is not one.
inline std::optional<ect_delta::Notification> parse_notification(std::string_view) {
  return ect_delta::Notification{"CIS-1", "MSKU7000037", "2025-06-09T06:00"};
}

/// Tells the broker what became of a delivery.
inline void tell_broker(std::uint64_t, idemgate::consumer::Disposition) {}

/// The application's decode function: the key from the notification's own fields.
inline std::optional<idemgate::consumer::Event<SlotRequest>> decode(std::string_view body) {
  auto n = parse_notification(body);
  if (!n) return std::nullopt;
  return idemgate::consumer::Event<SlotRequest>{
      idemgate::derive_key("ect.claim_slot", n->notification_id, n->equipment_number),
      {n->equipment_number, n->preferred_window}};
}

}  // namespace snippet

/// The store, terminal, gate and reconciler every consumer example has.
#define IDEMGATE_SNIPPET_CONSUMER_GATE                                                            \
  idemgate::MemoryStore store;                                                                    \
  Terminal terminal;                                                                              \
  auto book = [](idemgate::MemoryStore::transaction&, const SlotRequest&, const std::string&) {}; \
  idemgate::Gate gate{"ect.claim_slot", store, terminal, book};                                   \
  idemgate::Reconciler reconciler {                                                               \
    gate                                                                                          \
  }
