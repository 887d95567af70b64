// SPDX-License-Identifier: MIT
// Saturating duration arithmetic and range checks for option values.
#pragma once

// Overflow-free duration arithmetic and range checks for option values. Every option that takes
// a duration or a count is checked at construction with `require_in_range`, and every store
// converts durations with the saturating helpers, so `duration::max()` ("forever") never wraps.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace idemgate::detail {

/// `d` in `To` units, truncated toward zero and clamped to `To`'s range instead of overflowing.
template <class To, class Rep, class Period>
[[nodiscard]] constexpr To saturating_cast(std::chrono::duration<Rep, Period> d) noexcept {
  using common = std::common_type_t<typename To::rep, Rep>;
  using ratio = std::ratio_divide<Period, typename To::period>;
  constexpr auto most = std::numeric_limits<typename To::rep>::max();
  constexpr auto least = std::numeric_limits<typename To::rep>::min();
  if constexpr (ratio::num == 1) {
    // Converting to a coarser or equal unit only divides: it cannot overflow the count, only
    // the target's narrower representation.
    const common count = static_cast<common>(d.count()) / static_cast<common>(ratio::den);
    if (count > static_cast<common>(most)) return To(most);
    if (count < static_cast<common>(least)) return To(least);
    return To(static_cast<typename To::rep>(count));
  } else {
    const common factor = static_cast<common>(ratio::num) / static_cast<common>(ratio::den);
    const common count = static_cast<common>(d.count());
    if (count > static_cast<common>(most) / factor) return To(most);
    if (count < static_cast<common>(least) / factor) return To(least);
    return To(static_cast<typename To::rep>(count * factor));
  }
}

/// Whole microseconds in `d`, clamped to the range of `std::int64_t`.
template <class Rep, class Period>
[[nodiscard]] constexpr std::int64_t saturating_micros(
    std::chrono::duration<Rep, Period> d) noexcept {
  return saturating_cast<std::chrono::microseconds>(d).count();
}

/// Whole milliseconds in `d`, clamped to the range of `std::int64_t`.
template <class Rep, class Period>
[[nodiscard]] constexpr std::int64_t saturating_millis(
    std::chrono::duration<Rep, Period> d) noexcept {
  return saturating_cast<std::chrono::milliseconds>(d).count();
}

/// `at + d`, clamped to the time points `Clock` can represent.
template <class Clock, class Duration, class Rep, class Period>
[[nodiscard]] constexpr std::chrono::time_point<Clock, Duration> saturating_add(
    std::chrono::time_point<Clock, Duration> at, std::chrono::duration<Rep, Period> d) noexcept {
  using tp = std::chrono::time_point<Clock, Duration>;
  const Duration step = saturating_cast<Duration>(d);
  const auto since = at.time_since_epoch().count();
  constexpr auto most = std::numeric_limits<typename Duration::rep>::max();
  constexpr auto least = std::numeric_limits<typename Duration::rep>::min();
  if (step.count() > 0 && since > most - step.count()) return tp(Duration(most));
  if (step.count() < 0 && since < least - step.count()) return tp(Duration(least));
  return at + step;
}

/// `at - d`, clamped like `saturating_add`.
template <class Clock, class Duration, class Rep, class Period>
[[nodiscard]] constexpr std::chrono::time_point<Clock, Duration> saturating_sub(
    std::chrono::time_point<Clock, Duration> at, std::chrono::duration<Rep, Period> d) noexcept {
  const Duration step = saturating_cast<Duration>(d);
  if (step.count() == std::numeric_limits<typename Duration::rep>::min())
    return saturating_add(saturating_add(at, Duration::max()), Duration(1));
  return saturating_add(at, -step);
}

/// A duration for an error message, in its own unit ("250 ms", "7 d", "forever").
template <class Rep, class Period>
[[nodiscard]] inline std::string describe(std::chrono::duration<Rep, Period> d) {
  using std::chrono::duration;
  if (d == duration<Rep, Period>::max()) return "forever";
  const std::string count = std::to_string(d.count());
  if constexpr (std::is_same_v<Period, std::nano>) return count + " ns";
  if constexpr (std::is_same_v<Period, std::micro>) return count + " us";
  if constexpr (std::is_same_v<Period, std::milli>) return count + " ms";
  if constexpr (std::is_same_v<Period, std::ratio<1>>) return count + " s";
  if constexpr (std::is_same_v<Period, std::ratio<60>>) return count + " min";
  if constexpr (std::is_same_v<Period, std::ratio<3600>>) return count + " h";
  if constexpr (std::is_same_v<Period, std::ratio<86400>>) return count + " d";
  return std::to_string(saturating_millis(d)) + " ms";
}

/// Throws `std::invalid_argument` unless `least <= value <= most`; the message names the option,
/// the allowed range and what to do (`advice`).
template <class Rep, class Period, class R1, class P1, class R2, class P2>
void require_in_range(std::string_view option, std::chrono::duration<Rep, Period> value,
                      std::chrono::duration<R1, P1> least, std::chrono::duration<R2, P2> most,
                      std::string_view advice) {
  if (value >= least && value <= most) return;
  throw std::invalid_argument("idemgate: " + std::string(option) + " is " + describe(value) +
                              "; it must be between " + describe(least) + " and " + describe(most) +
                              ". " + std::string(advice));
}

/// Throws `std::invalid_argument` unless `least <= value <= most` (a count).
inline void require_in_range(std::string_view option, std::size_t value, std::size_t least,
                             std::size_t most, std::string_view advice) {
  if (value >= least && value <= most) return;
  throw std::invalid_argument("idemgate: " + std::string(option) + " is " + std::to_string(value) +
                              "; it must be between " + std::to_string(least) + " and " +
                              std::to_string(most) + ". " + std::string(advice));
}

}  // namespace idemgate::detail
