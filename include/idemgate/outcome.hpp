// SPDX-License-Identifier: MIT
// What a caller gets back from the gate, and whether to ack the message.
#pragma once

#include "key.hpp"

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace idemgate {

/// What the gate did with one delivery.
enum class Status {
  processed,   ///< This delivery did the work: outcome and business write are committed. Ack.
  duplicate,   ///< The event was already processed; the stored outcome is returned. Ack.
  in_flight,   ///< Another worker holds the event under a live lease and will finish it. Ack.
  conflict,    ///< Same key, different request: a key derivation bug or a forged replay. Ack
               ///< and dead-letter it; never treated as a duplicate.
  failed,      ///< The downstream rejected the event for good; stored, so duplicates get the
               ///< same answer. Ack.
  retry,       ///< Transient failure (the reservation was released), a lease this worker's
               ///< heartbeat lost before its commit was refused, or a gate that is stopping
               ///< (nothing reserved). Do not ack: redeliver.
  escalated,   ///< Parked for a human (the downstream cannot take keys). Ack.
  lost_lease,  ///< This worker's lease was taken over; its commit was rolled back. Ack: the
               ///< new owner finishes the event.
};

/// The lowercase name of a status, as used in logs and metrics.
[[nodiscard]] constexpr std::string_view to_string(Status status) noexcept {
  switch (status) {
    case Status::processed:
      return "processed";
    case Status::duplicate:
      return "duplicate";
    case Status::in_flight:
      return "in_flight";
    case Status::conflict:
      return "conflict";
    case Status::failed:
      return "failed";
    case Status::retry:
      return "retry";
    case Status::escalated:
      return "escalated";
    case Status::lost_lease:
      return "lost_lease";
  }
  return "unknown";
}

/// Whether the message that carried the event should be acknowledged (deleted from the queue,
/// answered 2xx). Only `retry` asks for a redelivery.
[[nodiscard]] constexpr bool should_ack(Status status) noexcept {
  return status != Status::retry;
}

/**
 * What a caller gets back from `Gate::process`.
 *
 * Example:
 *   auto result = gate.process(key, request);
 *   if (result.should_ack()) message.ack();
 *   if (result.status() == idemgate::Status::conflict) dead_letter(message, result.reason());
 */
template <class Outcome>
class Result {
 public:
  /// A result with an outcome (processed, duplicate).
  [[nodiscard]] static Result with(Status status, Outcome outcome) {
    Result result(status);
    result.outcome_ = std::move(outcome);
    return result;
  }
  /// A result without an outcome (in flight, conflict, retry, escalated, lost lease, failed).
  [[nodiscard]] static Result because(Status status, std::string reason) {
    Result result(status);
    result.reason_ = std::move(reason);
    return result;
  }

  /// What the gate did.
  [[nodiscard]] Status status() const noexcept { return status_; }
  /// Whether to acknowledge the message; false only for `retry`.
  [[nodiscard]] bool should_ack() const noexcept { return idemgate::should_ack(status_); }
  /// Whether an outcome is present (`processed` and `duplicate`).
  [[nodiscard]] bool has_outcome() const noexcept { return outcome_.has_value(); }
  /// The outcome; throws `std::logic_error` when there is none.
  [[nodiscard]] const Outcome& outcome() const {
    if (!outcome_)
      throw std::logic_error("idemgate: a '" + std::string(to_string(status_)) +
                             "' result has no outcome; check has_outcome() first");
    return *outcome_;
  }
  /// Why there is no outcome: the downstream's rejection, the escalation reason, and so on.
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }
  /// True when this delivery took the event over from a worker whose lease had expired.
  [[nodiscard]] bool took_over() const noexcept { return took_over_; }
  /// Marks the result as coming from a lease takeover.
  Result& set_took_over(bool value = true) noexcept {
    took_over_ = value;
    return *this;
  }

 private:
  explicit Result(Status status) : status_(status) {}

  Status status_;
  std::optional<Outcome> outcome_;
  std::string reason_;
  bool took_over_ = false;
};

/// A downstream's permanent rejection: retrying cannot help (a 4xx, an unknown container).
struct PermanentFailure {
  /// Why, in words an operator can act on.
  std::string reason;
};

/// A downstream's transient failure: the same call may succeed later (a 5xx, a timeout).
struct TransientFailure {
  /// Why, in words an operator can act on.
  std::string reason;
};

/// What a downstream answers to a claim: an outcome, a permanent or a transient failure.
template <class Outcome>
class ClaimResult {
 public:
  /// The downstream did the work.
  ClaimResult(Outcome outcome) : value_(std::move(outcome)) {}
  /// The downstream refused for good.
  ClaimResult(PermanentFailure failure) : value_(std::move(failure)) {}
  /// The downstream failed for now.
  ClaimResult(TransientFailure failure) : value_(std::move(failure)) {}

  /// True when the downstream did the work.
  [[nodiscard]] bool ok() const noexcept { return value_.index() == 0; }
  /// True for a permanent refusal.
  [[nodiscard]] bool permanent() const noexcept { return value_.index() == 1; }
  /// True for a transient failure.
  [[nodiscard]] bool transient() const noexcept { return value_.index() == 2; }
  /// The outcome; only when `ok()`.
  [[nodiscard]] const Outcome& outcome() const { return std::get<0>(value_); }
  /// The failure's reason; empty when `ok()`.
  [[nodiscard]] std::string_view reason() const noexcept {
    if (permanent()) return std::get<1>(value_).reason;
    if (transient()) return std::get<2>(value_).reason;
    return {};
  }

 private:
  std::variant<Outcome, PermanentFailure, TransientFailure> value_;
};

/// What the downstream holds under a key when asked by `lookup`.
struct NotFound {};

/// What a downstream answers to a lookup: the outcome it already has, nothing, or a failure.
template <class Outcome>
class LookupResult {
 public:
  /// The downstream has an outcome under the key.
  LookupResult(Outcome outcome) : value_(std::move(outcome)) {}
  /// The downstream has nothing under the key.
  LookupResult(NotFound) : value_(NotFound{}) {}
  /// The lookup itself failed; try again later.
  LookupResult(TransientFailure failure) : value_(std::move(failure)) {}

  /// True when the downstream has an outcome under the key.
  [[nodiscard]] bool found() const noexcept { return value_.index() == 0; }
  /// True when the downstream has nothing under the key.
  [[nodiscard]] bool not_found() const noexcept { return value_.index() == 1; }
  /// True when the lookup failed.
  [[nodiscard]] bool transient() const noexcept { return value_.index() == 2; }
  /// The outcome; only when `found()`.
  [[nodiscard]] const Outcome& outcome() const { return std::get<0>(value_); }
  /// The failure's reason; empty otherwise.
  [[nodiscard]] std::string_view reason() const noexcept {
    return transient() ? std::string_view(std::get<2>(value_).reason) : std::string_view();
  }

 private:
  std::variant<Outcome, NotFound, TransientFailure> value_;
};

}  // namespace idemgate
