// SPDX-License-Identifier: MIT
// A request's query string: its values decoded, and one canonical form of it, so that two
// queries that ask the same (names and values in another order, escapes written differently)
// compare equal wherever an `Endpoint` counts the query (`EndpointOptions::query`).
#pragma once

#include "../detail/crypto/hex.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::server {

/// Where a request's query string counts for an `Endpoint`.
enum class QueryRole {
  /// Nowhere: requests that differ only in their query are one request. The default, as before
  /// the option existed: a log written then holds no query anywhere.
  ignored,
  /// In the fingerprint: the same key with another query is answered `422` (a conflict), as a
  /// key reused with another body is. A request without a query keeps the fingerprint of its body
  /// alone, so turning this on leaves such requests' keys as they were.
  fingerprint,
  /// In the key's scope, beside the client, the method and the path: the same key with another
  /// query is another request, with a response of its own.
  scope,
};

namespace detail {

/// A query name or value with its %XX escapes (and '+' as a space) decoded; a malformed escape
/// is kept as written.
inline std::string percent_decoded(std::string_view in) {
  using idemgate::detail::hex_value;
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size() && hex_value(in[i + 1]) >= 0 &&
        hex_value(in[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(in[i + 1]) * 16 + hex_value(in[i + 2]));
      i += 2;
    } else {
      out += in[i] == '+' ? ' ' : in[i];
    }
  }
  return out;
}

/// `in` with every byte but RFC 3986's unreserved characters written as %XX (uppercase).
inline std::string percent_encoded(std::string_view in) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : in) {
    const auto b = static_cast<unsigned char>(c);
    if ((b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || b == '-' ||
        b == '.' || b == '_' || b == '~')
      out += c;
    else
      out += {'%', hex[b >> 4], hex[b & 0xF]};
  }
  return out;
}

}  // namespace detail

/// The canonical form of a query string (without its `?`): each `name=value` pair decoded, then
/// written again with one escaping (`percent_encoded`), the pairs sorted, empty pairs dropped, a
/// pair without `=` kept as a name with no value. `b=2&a=%41` and `a=A&b=2` have one form.
[[nodiscard]] inline std::string canonical_query(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> pairs;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    pairs.emplace_back(
        detail::percent_decoded(pair.substr(0, eq)),
        eq == std::string_view::npos
            ? std::string()
            : "=" + detail::percent_encoded(detail::percent_decoded(pair.substr(eq + 1))));
  }
  for (auto& [name, value] : pairs) name = detail::percent_encoded(name);
  std::sort(pairs.begin(), pairs.end());
  std::string out;
  for (const auto& [name, value] : pairs) {
    if (!out.empty()) out += '&';
    out += name + value;
  }
  return out;
}

}  // namespace idemgate::server
