// SPDX-License-Identifier: MIT
// Mounting the operator console on a cpp-httplib server: maps its requests and responses.
#pragma once

/// The console on a cpp-httplib server. Opt-in: including this header pulls in cpp-httplib;
/// link `idemgate::console`.

#include "console.hpp"

#include <httplib.h>

#include <cctype>
#include <memory>
#include <string>
#include <utility>

namespace idemgate::console {

/**
 * Mounts the console of `gate` on `server` under `prefix` (e.g. "/ops/console"): the page at
 * `<prefix>/`, the JSON API under `<prefix>/api/`. Every method on every path under the prefix
 * is the console's; nothing is served without `options.bearer_token`. The gate must outlive the
 * server's handling of requests. Throws `std::invalid_argument` for an unusable prefix or token
 * (see `Console`). Returns the console (the server's handlers share it).
 *
 * Example:
 *   httplib::Server server;
 *   idemgate::console::mount(server, "/ops/console", gate,
 *                            {.bearer_token = "a-long-random-secret-from-the-vault"});
 */
template <class GateT>
std::shared_ptr<Console<GateT>> mount(httplib::Server& server, std::string prefix, GateT& gate,
                                      ConsoleOptions options) {
  auto console = std::make_shared<Console<GateT>>(gate, std::move(prefix), std::move(options));
  std::string pattern;
  for (const char c : console->prefix()) {
    if (c == '.') pattern += '\\';
    pattern += c;
  }
  pattern += "(/.*)?";
  const auto handler = [console](const httplib::Request& req, httplib::Response& res) {
    ConsoleRequest request;
    request.method = req.method;
    request.path = req.matches.size() > 1 ? std::string(req.matches[1]) : std::string();
    for (const auto& [name, value] : req.params) request.query.emplace(name, value);
    for (const auto& [name, value] : req.headers) {
      std::string lower = name;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      request.headers.emplace(std::move(lower), value);
    }
    request.body = req.body;
    ConsoleResponse response = console->handle(request);
    res.status = response.status;
    for (const auto& [name, value] : response.headers) res.set_header(name.c_str(), value);
    res.set_content(std::move(response.body), response.content_type.c_str());
  };
  server.Get(pattern, handler);
  server.Post(pattern, handler);
  server.Put(pattern, handler);
  server.Patch(pattern, handler);
  server.Delete(pattern, handler);
  server.Options(pattern, handler);
  return console;
}

}  // namespace idemgate::console
