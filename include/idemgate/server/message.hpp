// SPDX-License-Identifier: MIT
// The server side's framework-neutral request and response, how a response is stored, and
// problem details (RFC 9457) for its own answers.
#pragma once

#include "../errors.hpp"

#include <cctype>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::server {

/// An HTTP request as an adapter hands it to an `Endpoint`, whatever the framework.
struct Request {
  /// The method, e.g. "POST".
  std::string method;
  /// The target as routed: the path (the adapters leave the query out).
  std::string target;
  /// The `Idempotency-Key` field value as received, or nullopt when the header is absent.
  std::optional<std::string> idempotency_key;
  /// The `Content-Type` field value ("" when absent).
  std::string content_type;
  /// The body.
  std::string body;
  /// Who sends it (an account id, an API key's id, a certificate's subject): keys are scoped per
  /// client, so one client never sees another's response. "" puts every client in one scope.
  std::string client;
  /// The query after `?` as received, escapes and all ("" when none). Where it counts is
  /// `EndpointOptions::query` (nowhere by default).
  std::string query;
};

/// One header field of a response.
struct Header {
  /// The field name as the handler wrote it.
  std::string name;
  /// The field value.
  std::string value;
};

/// An HTTP response, as a handler gives it and as an `Endpoint` answers it.
struct Response {
  /// The status code.
  int status = 200;
  /// The header fields, in order.
  std::vector<Header> headers;
  /// The body.
  std::string body;

  /// The first value of header `name` (case-insensitive), if any.
  [[nodiscard]] std::optional<std::string> header(std::string_view name) const {
    for (const Header& h : headers)
      if (same_name(h.name, name)) return h.value;
    return std::nullopt;
  }
  /// Sets header `name` to `value`, replacing every earlier value of it.
  Response& set_header(std::string_view name, std::string value) {
    std::erase_if(headers, [&](const Header& h) { return same_name(h.name, name); });
    headers.push_back({std::string(name), std::move(value)});
    return *this;
  }
  /// Whether two field names are the same (they are case-insensitive).
  [[nodiscard]] static bool same_name(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(a[i])) !=
          std::tolower(static_cast<unsigned char>(b[i])))
        return false;
    return true;
  }
};

/**
 * An `application/problem+json` response (RFC 9457): `type` is a URI naming the problem,
 * `title` a short summary, `detail` what to do about it.
 */
[[nodiscard]] inline Response problem(int status, std::string_view type, std::string_view title,
                                      std::string_view detail) {
  const auto quoted = [](std::string_view text) {
    std::string out = "\"";
    for (const char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        out += '\\';
        out += ch;
      } else if (c < 0x20) {
        static constexpr char hex[] = "0123456789abcdef";
        out += "\\u00";
        out += hex[c >> 4];
        out += hex[c & 0xF];
      } else {
        out += ch;
      }
    }
    return out + '"';
  };
  Response r;
  r.status = status;
  r.set_header("Content-Type", "application/problem+json");
  r.body = "{\"type\":" + quoted(type) + ",\"title\":" + quoted(title) +
           ",\"status\":" + std::to_string(status) + ",\"detail\":" + quoted(detail) + "}";
  return r;
}

namespace detail {

inline void put_field(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

inline std::string_view take_field(std::string_view& in) {
  const auto colon = in.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon > 10)
    throw CodecError("idemgate: a stored response is damaged (no length)");
  std::size_t size = 0;
  for (std::size_t i = 0; i < colon; ++i) {
    if (in[i] < '0' || in[i] > '9')
      throw CodecError("idemgate: a stored response is damaged (a length is not a number)");
    size = size * 10 + static_cast<std::size_t>(in[i] - '0');
  }
  if (in.size() - colon - 1 < size)
    throw CodecError("idemgate: a stored response is damaged (cut short)");
  const std::string_view field = in.substr(colon + 1, size);
  in.remove_prefix(colon + 1 + size);
  return field;
}

}  // namespace detail

/// The bytes a response is stored as in the log: its status, the header fields named in
/// `kept` (case-insensitive) and its body, each length-prefixed.
[[nodiscard]] inline std::string encode_response(const Response& response,
                                                 const std::vector<std::string>& kept) {
  std::string out = "r1 ";
  detail::put_field(out, std::to_string(response.status));
  std::vector<const Header*> stored;
  for (const Header& h : response.headers)
    for (const std::string& name : kept)
      if (Response::same_name(h.name, name)) stored.push_back(&h);
  detail::put_field(out, std::to_string(stored.size()));
  for (const Header* h : stored) {
    detail::put_field(out, h->name);
    detail::put_field(out, h->value);
  }
  detail::put_field(out, response.body);
  return out;
}

/// The response `encode_response` stored; throws `CodecError` when the bytes are not one.
[[nodiscard]] inline Response decode_response(std::string_view in) {
  if (in.substr(0, 3) != "r1 ") throw CodecError("idemgate: the log holds no stored response");
  in.remove_prefix(3);
  const auto number = [&] {
    const std::string_view text = detail::take_field(in);
    int n = 0;
    for (const char c : text) {
      if (c < '0' || c > '9' || n > 100000000)
        throw CodecError("idemgate: a stored response is damaged");
      n = n * 10 + (c - '0');
    }
    return n;
  };
  Response r;
  r.status = number();
  const int headers = number();
  for (int i = 0; i < headers; ++i) {
    std::string name(detail::take_field(in));
    r.headers.push_back({std::move(name), std::string(detail::take_field(in))});
  }
  r.body = std::string(detail::take_field(in));
  if (!in.empty()) throw CodecError("idemgate: a stored response has trailing bytes");
  return r;
}

}  // namespace idemgate::server
