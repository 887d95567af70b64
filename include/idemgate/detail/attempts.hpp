// SPDX-License-Identifier: MIT
// What an event's used-up attempts are called: the reason the gate and the reconciler store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace idemgate::detail {

/// The reason of an event escalated after `made` attempts, `allowed` being the bound `option`
/// names, with the last attempt's error (`last`, "nothing" when it left none).
inline std::string gave_up_reason(std::int64_t made, std::size_t allowed, std::string_view option,
                                  std::string_view last) {
  return "gave up after " + std::to_string(made) + (made == 1 ? " attempt" : " attempts") + " (" +
         std::string(option) + " = " + std::to_string(allowed) +
         "); the last one said: " + (last.empty() ? std::string("nothing") : std::string(last));
}

}  // namespace idemgate::detail
