// What the documentation's fragments take for granted, declared once: a slot claim and its
// codec, a terminal that honours keys, a notification, a queue message. Included by the
// preludes; each prelude then declares a store, a business write and a gate of its kind.
#pragma once

#include <idemgate/idemgate.hpp>
#include <idemgate/prometheus.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/retention.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/testing/slot_request.hpp>

#include <ect_delta/portbase.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace snippet {

/// The slot claim: `container` and `window`, with a codec.
using SlotRequest = idemgate::testing::detail::SlotRequest;

/// A downstream policy that honours keys and looks up by key.
struct Terminal {
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  idemgate::ClaimResult<std::string> claim(const SlotRequest& r, const idemgate::Key& key) {
    return "slot-" + r.container + "-" + key.hex().substr(0, 8);
  }
  idemgate::LookupResult<std::string> lookup(const idemgate::Key&) { return idemgate::NotFound{}; }
};

/// A message of an at-least-once queue.
struct Message {
  void ack() {}
};

/// Parks a message for a human.
inline void dead_letter(Message&, std::string_view) {}

/// One turn of the application's consume loop: takes a message, runs it through the gate, acks.
template <class Gate>
void consume_one(Gate&) {}

/// The application's log.
inline void log(const std::string&) {}

}  // namespace snippet
