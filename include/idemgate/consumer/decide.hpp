// SPDX-License-Identifier: MIT
// What a broker consumer does with a batch of deliveries: decode each into an event, put the
// events through the gate in one `process_batch`, and give each delivery its disposition. The
// RabbitMQ and Redis Streams consumers share it; each only tells its broker.
#pragma once

#include "../batch.hpp"
#include "disposition.hpp"
#include "event.hpp"

#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::consumer {

/// One delivery as a consumer received it.
struct Received {
  /// The message body.
  std::string_view body;
  /// The broker's count of deliveries of this message, the first being 1.
  std::uint32_t deliveries = 1;
};

/**
 * Decides what to do with each delivery of a batch, in order.
 *
 * - A body that `decode` refuses (nothing, or an exception) is dead-lettered: it never becomes
 *   an event, and redelivering it changes nothing.
 * - The others go through `gate.process_batch` together, and each answer becomes a disposition
 *   by `disposition(status, deliveries, policy)`.
 * - When `process_batch` throws (the store failed: no answer for any message), every one of
 *   them is redelivered, whatever its delivery count: the failure is not the message's, and a
 *   dead letter would leave its event out of the log. So is a `retry` of a gate that is
 *   stopping (`Gate::stop`): it reserved nothing.
 *
 * Example:
 *   auto settled = idemgate::consumer::decide(
 *       gate, decode, std::span<const idemgate::consumer::Received>(received), policy);
 *   for (std::size_t i = 0; i < settled.size(); ++i) tell_broker(tags[i], settled[i].disposition);
 */
template <class GateType, class Decode>
requires event_decoder<Decode, typename GateType::request_type>
[[nodiscard]] std::vector<Settlement> decide(GateType& gate, Decode& decode,
                                             std::span<const Received> batch,
                                             PoisonPolicy policy = {}) {
  using Request = typename GateType::request_type;
  std::vector<Settlement> settled(batch.size());
  std::vector<BatchMessage<Request>> messages;
  std::vector<std::size_t> gated;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    settled[i].body = batch[i].body;
    settled[i].deliveries = batch[i].deliveries;
    std::optional<Event<Request>> event;
    try {
      event = decode(batch[i].body);
      if (!event)
        settled[i].reason = "the message is not an event (the decode function refused it)";
    } catch (const std::exception& e) {
      settled[i].reason = std::string("the message is not an event: ") + e.what();
    }
    if (!event) {
      settled[i].disposition = Disposition::dead_letter;
      continue;
    }
    messages.push_back({std::to_string(i), std::move(event->key), std::move(event->request)});
    gated.push_back(i);
  }
  if (messages.empty()) return settled;
  try {
    const auto answers = gate.process_batch(std::span<const BatchMessage<Request>>(messages));
    for (std::size_t j = 0; j < gated.size(); ++j) {
      Settlement& s = settled[gated[j]];
      const Status status = answers.items()[j].result.status();
      s.status = status;
      s.disposition = disposition(status, s.deliveries, policy);
      // A stopping gate answers retry without looking: that is no attempt of the message's.
      if constexpr (requires { gate.stopping(); })
        if (status == Status::retry && gate.stopping()) s.disposition = Disposition::redeliver;
    }
  } catch (const std::exception& e) {
    for (std::size_t i : gated) {
      settled[i].disposition = Disposition::redeliver;
      settled[i].reason = std::string("the gate could not answer: ") + e.what();
    }
  }
  return settled;
}

}  // namespace idemgate::consumer
