// SPDX-License-Identifier: MIT
// The server side on cpp-httplib: maps its request and response onto an Endpoint's.
#pragma once

#include "endpoint.hpp"

#include <httplib.h>

#include <string>
#include <utility>

namespace idemgate::server {

/// The endpoint's request for a cpp-httplib request, from `client` (the target is the path; the
/// query is taken as it was sent). Several `Idempotency-Key` lines are combined into one value,
/// which `Endpoint` refuses with 400.
[[nodiscard]] inline Request to_request(const httplib::Request& req, std::string client) {
  Request out;
  out.method = req.method;
  out.target = req.path;
  if (const std::size_t mark = req.target.find('?'); mark != std::string::npos)
    out.query = req.target.substr(mark + 1);
  // Several field lines are combined as HTTP combines them ("a, b"), which no key reads as:
  // the draft allows one per request.
  const std::size_t lines = req.get_header_value_count("Idempotency-Key");
  for (std::size_t i = 0; i < lines; ++i) {
    if (!out.idempotency_key)
      out.idempotency_key = req.get_header_value("Idempotency-Key", i);
    else
      *out.idempotency_key += ", " + req.get_header_value("Idempotency-Key", i);
  }
  out.content_type = req.get_header_value("Content-Type");
  out.body = req.body;
  out.client = std::move(client);
  return out;
}

/// Writes the endpoint's `response` into a cpp-httplib response.
inline void write_response(const Response& response, httplib::Response& res) {
  res.status = response.status;
  std::string content_type;
  for (const Header& h : response.headers) {
    if (Response::same_name(h.name, "Content-Type"))
      content_type = h.value;
    else
      res.set_header(h.name, h.value);
  }
  res.set_content(response.body, content_type.empty() ? "application/octet-stream" : content_type);
}

/**
 * Serves `method pattern` on `server` through `endpoint`: `client_of(const httplib::Request&)`
 * names the client (return "" to scope every client together), and `handler(transaction&,
 * const Request&) -> Response` runs once per key.
 *
 * Example:
 *   auto account = [](const httplib::Request& r) { return r.get_header_value("X-Account"); };
 *   idemgate::server::serve(http, "POST", "/orders", orders, account, place_order);
 */
template <class Store, class ClientOf, class Handler>
void serve(httplib::Server& server, const std::string& method, const std::string& pattern,
           Endpoint<Store>& endpoint, ClientOf client_of, Handler handler) {
  auto route = [&endpoint, client_of = std::move(client_of), handler = std::move(handler)](
                   const httplib::Request& req, httplib::Response& res) mutable {
    write_response(endpoint.handle(to_request(req, std::string(client_of(req))), handler), res);
  };
  if (method == "POST")
    server.Post(pattern, std::move(route));
  else if (method == "PUT")
    server.Put(pattern, std::move(route));
  else if (method == "PATCH")
    server.Patch(pattern, std::move(route));
  else if (method == "DELETE")
    server.Delete(pattern, std::move(route));
  else
    throw std::invalid_argument("idemgate: serve() takes POST, PUT, PATCH or DELETE, not " +
                                method);
}

/**
 * Serves the lookup a consumer's reconciler makes (`HttpDownstream`'s `lookup_call`):
 * `GET lookup_path?<parameter>=<key>` answers what `endpoint` stored for the request `method
 * target` under that key from the same client, or 404.
 */
template <class Store, class ClientOf>
void serve_lookup(httplib::Server& server, const std::string& lookup_path,
                  const std::string& parameter, std::string method, std::string target,
                  Endpoint<Store>& endpoint, ClientOf client_of) {
  server.Get(lookup_path, [&endpoint, parameter, method = std::move(method),
                           target = std::move(target), client_of = std::move(client_of)](
                              const httplib::Request& req, httplib::Response& res) {
    if (!req.has_param(parameter))
      return write_response(
          problem(400, endpoint.options().problem_type_prefix + "idempotency-key-missing",
                  "The key to look up is missing",
                  "Name the key in the " + parameter + " query parameter."),
          res);
    write_response(endpoint.lookup(std::string(client_of(req)), method, target,
                                   req.get_param_value(parameter)),
                   res);
  });
}

}  // namespace idemgate::server
