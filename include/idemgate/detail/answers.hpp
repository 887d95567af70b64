// SPDX-License-Identifier: MIT
// What every gate answers from a stored row, and how it encodes a request for the log.
#pragma once

#include "../codec.hpp"
#include "../errors.hpp"
#include "../outcome.hpp"
#include "../record.hpp"

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>

namespace idemgate::detail {

/// The reason a row of an event run as one transaction holds until its outcome is stored (with
/// it, in the same transaction). A committed row that still holds it committed because its
/// business write ended the transaction itself, before the outcome: it is answered `escalated`.
inline constexpr std::string_view unfinished_outcome =
    "the business write ended its own transaction before the outcome was stored";

/// The answer to a delivery whose key the log already holds (`found`, of kind existing).
template <class Outcome>
[[nodiscard]] Result<Outcome> answer_existing(const Reservation& found) {
  using result_type = Result<Outcome>;
  if (!found.same_request)
    return result_type::because(Status::conflict,
                                "this key was first used with a different request; the key "
                                "derivation is not stable or two events share a key");
  switch (found.status) {
    case RecordStatus::committed:
      if (found.reason == unfinished_outcome)
        return result_type::because(
            Status::escalated,
            "idemgate: " + found.reason +
                " (a COMMIT of its own): what it wrote before that committed, without an "
                "outcome. Check the event's business rows and settle it by hand");
      return result_type::with(Status::duplicate, codec<Outcome>::decode(found.result));
    case RecordStatus::failed:
      return result_type::because(Status::failed, found.reason);
    case RecordStatus::escalated:
      return result_type::because(Status::escalated, found.reason);
    case RecordStatus::in_flight:
      if (found.held)
        return result_type::because(
            Status::retry,
            "the key is held for the back-off after a transient failure (GateOptions::"
            "retry_backoff); nothing was called. Do not ack: a redelivery after the hold "
            "takes the event over");
      break;
  }
  return result_type::because(Status::in_flight,
                              "another worker holds this key under a live lease");
}

/// A request encoded as the log keeps it; throws `RequestError` when it does not encode or its
/// bytes are over `max_bytes` (the option `limit` names).
template <class Request>
[[nodiscard]] std::string encode_request(const Request& request, std::size_t max_bytes,
                                         std::string_view limit) {
  std::string bytes;
  try {
    codec<Request>::encode(request, bytes);
  } catch (const std::exception& e) {
    throw RequestError(std::string("idemgate: the request could not be encoded (") + e.what() +
                       "); nothing was reserved. Fix the request or its codec.");
  }
  if (bytes.size() > max_bytes)
    throw RequestError("idemgate: the encoded request is " + std::to_string(bytes.size()) +
                       " bytes, over the limit of " + std::to_string(max_bytes) +
                       "; nothing was reserved. Send a smaller request or raise " +
                       std::string(limit) + ".");
  return bytes;
}

}  // namespace idemgate::detail
