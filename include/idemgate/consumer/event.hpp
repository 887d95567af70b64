// SPDX-License-Identifier: MIT
// What a broker consumer makes of a message (the upstream event's key and request, through a
// function the application passes) and what it reports once it settled the message.
#pragma once

#include "../key.hpp"
#include "../outcome.hpp"
#include "disposition.hpp"

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::consumer {

/**
 * What the application's decode function makes of a message body: the event's idempotency key
 * and the request for the downstream.
 *
 * The key comes from the upstream event's own fields (a notification id, an order number and
 * its version), never from the broker's message id, delivery tag or stream entry id: those are
 * new on every publish and on every redelivery, so a key made of them never sees a duplicate.
 *
 * Example:
 *   auto decode = [](std::string_view body)
 *       -> std::optional<idemgate::consumer::Event<SlotRequest>> {
 *     auto n = parse_notification(body);
 *     if (!n) return std::nullopt;  // not an event: dead-lettered
 *     return idemgate::consumer::Event<SlotRequest>{
 *         idemgate::derive_key("ect.claim_slot", n->notification_id, n->equipment_number),
 *         {n->equipment_number, n->preferred_window}};
 *   };
 */
template <class Request>
struct Event {
  /// The event's idempotency key, derived from the upstream's fields.
  Key key;
  /// What the downstream is asked to do.
  Request request;
};

/// Concept: a function that makes an `Event` of a message body, or nothing when the body is not
/// an event (then the message is dead-lettered).
template <class F, class Request>
concept event_decoder = std::invocable<F&, std::string_view> &&
    std::convertible_to<std::invoke_result_t<F&, std::string_view>, std::optional<Event<Request>>>;

/// What a consumer did with one message, reported to its `on_settled` hook (for logs).
struct Settlement {
  /// The message body as the broker delivered it.
  std::string_view body;
  /// The broker's count of deliveries of this message, the first being 1.
  std::uint32_t deliveries = 1;
  /// The gate's answer; none when the message never reached the gate (it did not decode, the
  /// store failed, the consumer was stopping).
  std::optional<Status> status;
  /// What the consumer told the broker.
  Disposition disposition = Disposition::ack;
  /// Why, when the gate was not asked or failed: empty otherwise.
  std::string reason;
};

}  // namespace idemgate::consumer
