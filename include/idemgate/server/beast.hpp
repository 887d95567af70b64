// SPDX-License-Identifier: MIT
// The server side on Boost.Beast: maps its request and response onto an Endpoint's.
#pragma once

#include "endpoint.hpp"

#include <boost/beast/http.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace idemgate::server {

/// A Beast request with a string body, as the adapter takes it.
using BeastRequest = boost::beast::http::request<boost::beast::http::string_body>;
/// A Beast response with a string body, as the adapter answers.
using BeastResponse = boost::beast::http::response<boost::beast::http::string_body>;

/// The endpoint's request for a Beast request, from `client` (the target is the path; the query
/// is taken as it was sent). Several `Idempotency-Key` lines are combined into one value, which
/// `Endpoint` refuses with 400.
[[nodiscard]] inline Request to_request(const BeastRequest& req, std::string client) {
  Request out;
  out.method = std::string(req.method_string());
  const std::string_view target(req.target().data(), req.target().size());
  const std::size_t mark = target.find('?');
  out.target = std::string(target.substr(0, mark));
  if (mark != std::string_view::npos) out.query = std::string(target.substr(mark + 1));
  const auto [first, last] = req.equal_range("Idempotency-Key");
  for (auto it = first; it != last; ++it) {
    const std::string value(it->value().data(), it->value().size());
    if (!out.idempotency_key)
      out.idempotency_key = value;
    else
      *out.idempotency_key += ", " + value;
  }
  const auto type = req[boost::beast::http::field::content_type];
  out.content_type = std::string(type.data(), type.size());
  out.body = req.body();
  out.client = std::move(client);
  return out;
}

/// The Beast response for the endpoint's `response`, answering `req` (its version and
/// keep-alive).
[[nodiscard]] inline BeastResponse to_beast_response(const Response& response,
                                                     const BeastRequest& req) {
  BeastResponse res{static_cast<boost::beast::http::status>(response.status), req.version()};
  for (const Header& h : response.headers) res.insert(h.name, h.value);
  res.body() = response.body;
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  return res;
}

/**
 * Answers `req` through `endpoint` from `client`: `handler(transaction&, const Request&) ->
 * Response` runs once per key. Call it from your Beast session where the route matches.
 *
 * Example:
 *   auto response = idemgate::server::answer(orders, req, account_of(req), place_order);
 */
template <class Store, class Handler>
[[nodiscard]] BeastResponse answer(Endpoint<Store>& endpoint, const BeastRequest& req,
                                   std::string client, Handler& handler) {
  return to_beast_response(endpoint.handle(to_request(req, std::move(client)), handler), req);
}

/**
 * Answers the lookup a consumer's reconciler makes (`HttpDownstream`'s `lookup_call`):
 * `GET <path>?<parameter>=<key>` (the key percent-decoded) gets what `endpoint` stored for the
 * request `method target` under that key from `client`, or 404 (400 without the parameter).
 */
template <class Store>
[[nodiscard]] BeastResponse answer_lookup(Endpoint<Store>& endpoint, const BeastRequest& req,
                                          std::string_view parameter, std::string_view method,
                                          std::string_view target, std::string_view client) {
  const std::string_view full(req.target().data(), req.target().size());
  const auto query_at = full.find('?');
  std::string_view query = query_at == std::string_view::npos ? "" : full.substr(query_at + 1);
  while (!query.empty()) {
    const auto end = query.find('&');
    const std::string_view pair = query.substr(0, end);
    const auto eq = pair.find('=');
    if (eq != std::string_view::npos && pair.substr(0, eq) == parameter)
      return to_beast_response(
          endpoint.lookup(client, method, target, detail::percent_decoded(pair.substr(eq + 1))),
          req);
    query = end == std::string_view::npos ? "" : query.substr(end + 1);
  }
  return to_beast_response(
      problem(400, endpoint.options().problem_type_prefix + "idempotency-key-missing",
              "The key to look up is missing",
              "Name the key in the " + std::string(parameter) + " query parameter."),
      req);
}

}  // namespace idemgate::server
