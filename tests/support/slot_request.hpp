#pragma once

// The seed's slot claim: a container and its preferred window, with its codec. The conformance
// suite sends the same claim; the tests use its type.

#include <idemgate/testing/slot_request.hpp>

namespace idemgate::test {

/// A slot claim at the terminal.
using SlotRequest = idemgate::testing::detail::SlotRequest;

}  // namespace idemgate::test
