// SPDX-License-Identifier: MIT
// GateName: which gate a row of a shared log belongs to.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate {

/**
 * The name of a gate: every row a gate writes carries it, and every operation that reads more
 * than one row (the reconciler's scan, the manual queue, re-drives, signals, retention) sees only
 * the rows of its own gate. Two gates on one log (two services on one database, or `claim_slot`
 * and `cancel_slot` in one process) never touch each other's rows, even for the same key.
 *
 * 1 to 64 characters: ASCII letters, digits, `.`, `_`, `-` and `:`. Name a gate after the service
 * and the side effect it guards (`payments.credit`, `ect.claim_slot`), and keep the name once
 * chosen: rows written under another name belong to another gate.
 *
 * Example:
 *   idemgate::Gate claims{"ect.claim_slot", store, terminal, book};
 */
class GateName {
 public:
  /// The longest name.
  static constexpr std::size_t max_size = 64;

  /// A checked name; throws `std::invalid_argument` saying what is wrong with it.
  GateName(std::string_view name) : value_(checked(name)) {}  // NOLINT: implicit by design
  /// A checked name; throws `std::invalid_argument` saying what is wrong with it.
  GateName(const char* name) : GateName(std::string_view(name ? name : "")) {}  // NOLINT
  /// A checked name; throws `std::invalid_argument` saying what is wrong with it.
  GateName(const std::string& name) : GateName(std::string_view(name)) {}  // NOLINT

  /// The name as stored in the log's `gate` column.
  [[nodiscard]] std::string_view view() const noexcept { return value_; }
  /// The name as a string.
  [[nodiscard]] const std::string& str() const noexcept { return value_; }

  /// Names are equal when their characters are.
  friend bool operator==(const GateName&, const GateName&) = default;

  /// Whether `name` is a usable gate name.
  [[nodiscard]] static bool valid(std::string_view name) noexcept {
    if (name.empty() || name.size() > max_size) return false;
    for (char c : name)
      if (!allowed(c)) return false;
    return true;
  }

 private:
  static constexpr bool allowed(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == ':';
  }

  static std::string checked(std::string_view name) {
    if (valid(name)) return std::string(name);
    if (name.empty())
      throw std::invalid_argument(
          "idemgate: a gate needs a name (for example \"payments.credit\"): every row it writes "
          "carries it, so that gates sharing one log never touch each other's rows");
    if (name.size() > max_size)
      throw std::invalid_argument("idemgate: the gate name \"" + std::string(name.substr(0, 80)) +
                                  "...\" is " + std::to_string(name.size()) +
                                  " characters long; use at most 64");
    throw std::invalid_argument("idemgate: the gate name \"" + std::string(name) +
                                "\" has a character other than ASCII letters, digits, '.', '_', "
                                "'-' and ':'; name the gate like \"payments.credit\"");
  }

  std::string value_;
};

namespace detail {

/// Throws `std::logic_error` when `gate` (a store handle's scope) names no gate: `operation`
/// works on one gate's rows, so it needs a handle from `for_gate`.
inline void require_named_scope(std::string_view gate, std::string_view operation) {
  if (gate.empty())
    throw std::logic_error("idemgate: " + std::string(operation) +
                           " needs the gate whose rows it works on: call it on "
                           "store.for_gate(\"<gate name>\")");
}

}  // namespace detail
}  // namespace idemgate
