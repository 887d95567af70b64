// SPDX-License-Identifier: MIT
// The event contract: which event types a consumer handles, and why others are refused.
#pragma once

/// The event contract: which event types a consumer handles. Everything else is refused with a
/// reason, never passed off as processed.

#include "verification.hpp"

#include <concepts>
#include <functional>
#include <initializer_list>
#include <optional>
#include <ranges>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace idemgate {

/// Why an event was refused by an `EventContract`.
enum class ContractRejection {
  unknown_event_type,  ///< The type is not one the consumer declared (or the event has none).
};

/// The lowercase name of a contract rejection, as used in logs and metrics.
[[nodiscard]] constexpr std::string_view to_string(ContractRejection reason) noexcept {
  switch (reason) {
    case ContractRejection::unknown_event_type:
      return "unknown_event_type";
  }
  return "unknown";
}

/// What `EventContract::check` answers: accepted, or rejected with a reason and a message.
class ContractCheck {
 public:
  /// The event type is in the contract.
  [[nodiscard]] static ContractCheck accepted() { return ContractCheck(); }
  /// The event type is not in the contract.
  [[nodiscard]] static ContractCheck rejected(ContractRejection reason, std::string message) {
    ContractCheck check;
    check.rejection_ = reason;
    check.message_ = std::move(message);
    return check;
  }

  /// Whether the consumer handles this event type.
  [[nodiscard]] bool ok() const noexcept { return !rejection_.has_value(); }
  /// Same as `ok()`.
  explicit operator bool() const noexcept { return ok(); }
  /// Why the event was refused; throws `std::logic_error` when it was accepted.
  [[nodiscard]] ContractRejection rejection() const {
    if (!rejection_)
      throw std::logic_error(
          "idemgate: the event type was accepted, so there is no rejection; check ok() first");
    return *rejection_;
  }
  /// What was refused and why, for logs and dead letters; empty when accepted.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

 private:
  ContractCheck() = default;

  std::optional<ContractRejection> rejection_;
  std::string message_;
};

/**
 * The event types a consumer accepts, declared up front. An event of any other type is
 * refused as `unknown_event_type`: the consumer never reports work it did not do. Types are
 * compared exactly (case-sensitive), as senders define them.
 *
 * Example:
 *   idemgate::EventContract contract{"message.sent", "message.received"};
 *   if (auto check = contract.check(event.type); !check) return dead_letter(check.message());
 */
class EventContract {
 public:
  /// The set of accepted types, sorted.
  using types_type = std::set<std::string, std::less<>>;

  /// Declares the accepted types; throws `std::invalid_argument` when the list is empty or a
  /// type is empty. Repeated types are kept once.
  EventContract(std::initializer_list<std::string_view> types) { add_all(types); }

  /// Declares the accepted types from any range of strings (e.g. read from configuration).
  template <std::ranges::input_range Types>
  requires std::convertible_to<std::ranges::range_reference_t<const Types&>, std::string_view>
  explicit EventContract(const Types& types) { add_all(types); }

  /// Accepted, or rejected as `unknown_event_type` with the offending type and the accepted
  /// ones in the message.
  [[nodiscard]] ContractCheck check(std::string_view type) const {
    if (accepts(type)) return ContractCheck::accepted();
    std::string accepted;
    for (const std::string& known : types_) {
      if (!accepted.empty()) accepted += ", ";
      accepted += known;
    }
    const std::string what = type.empty() ? std::string("an event without a type")
                                          : "event type " + detail::quoted_excerpt(type, 80);
    return ContractCheck::rejected(
        ContractRejection::unknown_event_type,
        what + " is not in this consumer's contract (accepted: " + accepted +
            "); it was not processed. Add the type to the contract if this consumer should "
            "handle it");
  }

  /// Whether `type` is one of the declared types.
  [[nodiscard]] bool accepts(std::string_view type) const noexcept {
    return types_.find(type) != types_.end();
  }

  /// The declared types, sorted.
  [[nodiscard]] const types_type& types() const noexcept { return types_; }

 private:
  template <class Types>
  void add_all(const Types& types) {
    for (const auto& type : types) {
      const std::string_view name(type);
      if (name.empty())
        throw std::invalid_argument(
            "idemgate: an event contract lists an empty event type; list the exact type names "
            "the sender uses, e.g. \"message.sent\"");
      types_.emplace(name);
    }
    if (types_.empty())
      throw std::invalid_argument(
          "idemgate: an event contract must accept at least one event type; list the types "
          "this consumer handles, e.g. EventContract{\"message.sent\"}");
  }

  types_type types_;
};

}  // namespace idemgate
