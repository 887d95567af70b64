// SPDX-License-Identifier: MIT
// What a broker consumer does with a message once the gate has answered: the one decision every
// consumer loop makes, shared by the RabbitMQ, NATS JetStream and Redis Streams consumers.
#pragma once

#include "../outcome.hpp"

#include <cstdint>
#include <string_view>

namespace idemgate::consumer {

/// What a consumer does with a message once the gate has answered.
enum class Disposition {
  ack,          ///< Done: processed, a duplicate, stored as failed, or finished by another holder.
  redeliver,    ///< Not done: the broker delivers it again (after its own redelivery delay).
  dead_letter,  ///< Poison: moved where a human looks (a dead-letter queue, stream or subject),
                ///< never redelivered by itself.
};

/// The lowercase name of a disposition, for logs.
[[nodiscard]] constexpr std::string_view to_string(Disposition disposition) noexcept {
  switch (disposition) {
    case Disposition::ack:
      return "ack";
    case Disposition::redeliver:
      return "redeliver";
    case Disposition::dead_letter:
      return "dead-letter";
  }
  return "unknown";
}

/// When a message counts as poison.
struct PoisonPolicy {
  /// A message whose delivery count (as the broker reports it, the first delivery being 1)
  /// reached this many and that still asks for a redelivery is dead-lettered instead (1 to
  /// 1000). The event is not lost with it: its row stays in the log, in flight with its lease
  /// given back, and the reconciler finishes it.
  std::uint32_t max_deliveries = 10;
};

/**
 * The disposition of the gate's answer to one delivery of a message.
 *
 * - `retry` asks for a redelivery, until the delivery count reaches
 *   `PoisonPolicy::max_deliveries`: then the message is dead-lettered (its event stays in the log
 *   for the reconciler).
 * - `escalated` (parked for a human: the downstream cannot take keys, or the business write keeps
 *   throwing) and `conflict` (the same key with a different request: a key-derivation bug or a
 *   forged replay) are dead-lettered: redelivering them changes nothing.
 * - Everything else is acknowledged: `processed` and `duplicate` are done, `failed` is stored (its
 *   duplicates get the same answer), and `in_flight` and `lost_lease` are finished by the attempt
 *   that holds the event or by the reconciler.
 *
 * Example:
 *   auto result = gate.process(key, request);
 *   const std::uint32_t deliveries = 1;  // as the broker counts them, the first being 1
 *   if (idemgate::consumer::disposition(result.status(), deliveries) ==
 *       idemgate::consumer::Disposition::ack)
 *     message.ack();
 */
[[nodiscard]] constexpr Disposition disposition(Status status, std::uint32_t deliveries,
                                                PoisonPolicy policy = {}) noexcept {
  switch (status) {
    case Status::retry:
      return deliveries >= policy.max_deliveries ? Disposition::dead_letter
                                                 : Disposition::redeliver;
    case Status::escalated:
    case Status::conflict:
      return Disposition::dead_letter;
    case Status::processed:
    case Status::duplicate:
    case Status::in_flight:
    case Status::failed:
    case Status::lost_lease:
      return Disposition::ack;
  }
  return Disposition::redeliver;
}

}  // namespace idemgate::consumer
