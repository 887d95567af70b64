// What the webhook headers' examples use: a request with headers and a body, a reply, a parsed
// event, a secret. Included by the webhook headers' preludes.
#pragma once

#include <idemgate/idemgate.hpp>
#include <idemgate/webhook/contract.hpp>
#include <idemgate/webhook/standard.hpp>
#include <idemgate/webhook/stripe.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace snippet {

/// An incoming HTTP request.
struct Request {
  std::map<std::string, std::string, std::less<>> headers;
  std::string body;
};

/// An answer to the sender.
struct Response {
  int status = 200;
  std::string body;
};

inline Response respond(int status, std::string body) {
  return {status, std::move(body)};
}
inline Response dead_letter(std::string reason) {
  return {202, std::move(reason)};
}

/// The event, parsed from the body.
struct Event {
  std::string id, type;
};
Event parse(std::string_view body);

}  // namespace snippet
