#pragma once

// A redelivery that takes one event of a batch over while the batch is still at the downstream:
// the moment a batch test needs to show that only that event loses its lease.

#include "fake_terminal.hpp"

#include <idemgate/batch.hpp>
#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/outcome.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

namespace idemgate::test {

/// When `terminal` has claimed `message`'s slot, `other` (another handle on the same gate's
/// rows: where the redelivery lands) gives the first attempt's lease back and reserves the event
/// again, under fence 2. The batch's own attempt then holds a fence that moved.
template <class Terminal, class Gate, class Handle, class Request>
void take_over_midway(Terminal& terminal, Gate& gate, Handle& other,
                      const BatchMessage<Request>& message) {
  terminal.after = [&gate, &other, key = message.key, request = message.request](
                       const Key& claimed,
                       const std::string&) -> std::optional<ClaimResult<std::string>> {
    if (claimed != key) return std::nullopt;
    EXPECT_TRUE(other.release(key, 1));
    const std::string bytes = gate.encode_request(request);
    EXPECT_EQ(other.reserve(key, detail::sha256(bytes), bytes, std::chrono::minutes(1)).fence, 2);
    return std::nullopt;
  };
}

}  // namespace idemgate::test
