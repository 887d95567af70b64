#pragma once

// The ECT Delta slot claim as idemgate sees it: the request, its canonical encoding, and the
// mapping that turns it into calls on the terminal's HTTP API.

#include "terminal_server.hpp"

#include <idemgate/codec.hpp>
#include <idemgate/downstream/http.hpp>
#include <idemgate/key.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace ect_delta {

/// A slot claim: a container (equipment number) and the window it should be picked up in.
struct SlotRequest {
  /// The container's equipment number, e.g. "MSKU7000037".
  std::string container;
  /// The preferred pick-up window.
  std::string window;
  friend bool operator==(const SlotRequest&, const SlotRequest&) = default;
};

/// `POST /slots` to claim, `GET /slots?idempotency_key=…` to look up; the slot id is the
/// outcome.
struct SlotApi {
  /// What the gate passes to `claim`.
  using request_type = SlotRequest;
  /// The terminal's slot id.
  using outcome_type = std::string;

  /// The claim call.
  idemgate::HttpCall claim_call(const SlotRequest& r) const {
    return {"POST", "/slots", json::Json{{"container", r.container}, {"window", r.window}}.dump()};
  }
  /// The lookup call for a key.
  idemgate::HttpCall lookup_call(const idemgate::Key& key) const {
    return {"GET", "/slots?idempotency_key=" + key.hex()};
  }
  /// The slot id from a 2xx body.
  std::optional<std::string> parse_outcome(std::string_view body) const {
    const std::optional<json::Json> document = json::parse(body);
    return document ? json::string_member(*document, "slot") : std::nullopt;
  }
};

}  // namespace ect_delta

/// Canonical encoding: the two fields as a JSON object in a fixed order (nlohmann-json writes
/// members sorted by name, without spaces). A field holding a control character or bytes that are
/// not UTF-8 cannot be a container or a window and is refused.
template <>
struct idemgate::codec<ect_delta::SlotRequest> {
  /// Writes `{"container":…,"window":…}`.
  static void encode(const ect_delta::SlotRequest& r, std::string& out) {
    for (const std::string* field : {&r.container, &r.window})
      for (char c : *field)
        if (static_cast<unsigned char>(c) < 0x20)
          throw idemgate::CodecError("a slot request field holds a control character");
    try {
      out = ect_delta::json::Json{{"container", r.container}, {"window", r.window}}.dump();
    } catch (const ect_delta::json::Json::type_error&) {
      throw idemgate::CodecError("a slot request field is not UTF-8");
    }
  }
  /// Reads the object `encode` wrote.
  static ect_delta::SlotRequest decode(std::string_view in) {
    const auto document = ect_delta::json::parse(in);
    auto container =
        document ? ect_delta::json::string_member(*document, "container") : std::nullopt;
    auto window = document ? ect_delta::json::string_member(*document, "window") : std::nullopt;
    if (!container || !window)
      throw idemgate::CodecError("a stored slot request lacks its container or window");
    return {std::move(*container), std::move(*window)};
  }
};
