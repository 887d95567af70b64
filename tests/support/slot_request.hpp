#pragma once

// The seed's slot claim: a container and its preferred window, with its codec.

#include <idemgate/codec.hpp>

#include <string>
#include <string_view>

namespace idemgate::test {

/// A slot claim at the terminal.
struct SlotRequest {
  std::string container;
  std::string window;
  friend bool operator==(const SlotRequest&, const SlotRequest&) = default;
};

}  // namespace idemgate::test

/// Canonical encoding: container, newline, window.
template <>
struct idemgate::codec<idemgate::test::SlotRequest> {
  static void encode(const idemgate::test::SlotRequest& r, std::string& out) {
    if (r.container.find('\n') != std::string::npos)
      throw idemgate::CodecError("container holds a newline");
    out = r.container + '\n' + r.window;
  }
  static idemgate::test::SlotRequest decode(std::string_view in) {
    const auto split = in.find('\n');
    if (split == std::string_view::npos) throw idemgate::CodecError("no newline in slot request");
    return {std::string(in.substr(0, split)), std::string(in.substr(split + 1))};
  }
};
