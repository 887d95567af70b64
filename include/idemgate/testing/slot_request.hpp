// SPDX-License-Identifier: MIT
// The slot claim the conformance suite (and the library's own tests) send through the gate: a
// container and its preferred window, with its codec. Not part of the API.
#pragma once

#include "../codec.hpp"
#include "../errors.hpp"

#include <string>
#include <string_view>

/// @cond
namespace idemgate::testing::detail {

/// A slot claim at the terminal: a container and its preferred window.
struct SlotRequest {
  std::string container;
  std::string window;
  friend bool operator==(const SlotRequest&, const SlotRequest&) = default;
};

}  // namespace idemgate::testing::detail

/// Canonical encoding of the slot claim: container, newline, window.
template <>
struct idemgate::codec<idemgate::testing::detail::SlotRequest> {
  /// Writes `container\nwindow`.
  static void encode(const idemgate::testing::detail::SlotRequest& r, std::string& out) {
    if (r.container.find('\n') != std::string::npos)
      throw idemgate::CodecError("container holds a newline");
    out = r.container + '\n' + r.window;
  }
  /// Reads what `encode` wrote.
  static idemgate::testing::detail::SlotRequest decode(std::string_view in) {
    const auto split = in.find('\n');
    if (split == std::string_view::npos) throw idemgate::CodecError("no newline in slot request");
    return {std::string(in.substr(0, split)), std::string(in.substr(split + 1))};
  }
};
/// @endcond
