// SPDX-License-Identifier: MIT
// HttpDownstream: calls an HTTP API with an Idempotency-Key header (cpp-httplib).
#pragma once

/// A downstream over HTTP that forwards the idempotency key as an `Idempotency-Key` header.
/// Opt-in: including this header pulls in cpp-httplib; link `idemgate::http`.

#include "../codec.hpp"
#include "../concepts.hpp"
#include "../detail/durations.hpp"
#include "../detail/http/client_pool.hpp"
#include "../detail/http/problem.hpp"
#include "../key.hpp"
#include "../outcome.hpp"
#include "../version.hpp"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate {

/// One HTTP call, as a mapping describes it.
struct HttpCall {
  /// A call of `verb` ("POST", "PUT", "PATCH", "GET", "DELETE") on `target` (relative to the
  /// base URL's path, optionally with a query), carrying `payload` (empty for none) of
  /// `media_type`.
  HttpCall(std::string verb, std::string target, std::string payload = {},
           std::string media_type = "application/json")
      : method(std::move(verb)),
        path(std::move(target)),
        body(std::move(payload)),
        content_type(std::move(media_type)) {}

  /// The method.
  std::string method;
  /// Path and query, e.g. "/slots" or "/slots?idempotency_key=<hex>".
  std::string path;
  /// The request body; empty for none.
  std::string body;
  /// The body's media type; ignored when the body is empty.
  std::string content_type;
  /// The route the call belongs to, as a failure's cause names it, e.g. "/slots/{id}"; empty:
  /// the path without its query. Set it when the path holds an event's own values, so that the
  /// failures of one route group as one cause.
  std::string route;
};

/// Concept: how requests become HTTP calls and 2xx response bodies become outcomes.
/// `parse_outcome` returns nullopt (or throws) when the body is not an outcome.
template <class M>
concept http_mapping = codable<typename M::request_type> && codable<typename M::outcome_type> &&
    requires(const M& m, const typename M::request_type& request, std::string_view body) {
  { m.claim_call(request) } -> std::same_as<HttpCall>;
  { m.parse_outcome(body) } -> std::same_as<std::optional<typename M::outcome_type>>;
};

/// Concept: an `http_mapping` that can also ask what the far side holds under a key.
template <class M>
concept http_lookup_mapping = http_mapping<M> && requires(const M& m, const Key& key) {
  { m.lookup_call(key) } -> std::same_as<HttpCall>;
};

/// How the key is written in the `Idempotency-Key` header.
enum class KeyHeaderForm {
  structured,  ///< An RFC 8941 string, as the IETF draft specifies: `"<64 hex>"`.
  bare,        ///< The 64 hex digits alone, as Stripe and many older APIs expect.
};

/// Tuning of an `HttpDownstream`. Its constructor refuses values outside the ranges below with
/// `std::invalid_argument`.
struct HttpOptions {
  /// How long to wait for the TCP (and TLS) connection: from 1 ms to `max_timeout`.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(3);
  /// How long to wait for each read of the response: from 1 ms to `max_timeout`. Keep it well
  /// under the gate's lease.
  std::chrono::milliseconds read_timeout = std::chrono::seconds(10);
  /// How long to wait for each write of the request: from 1 ms to `max_timeout`.
  std::chrono::milliseconds write_timeout = std::chrono::seconds(10);
  /// How the key is written in the header.
  KeyHeaderForm key_header_form = KeyHeaderForm::structured;
  /// Headers sent with every call, e.g. `{"Authorization", "Bearer <token>"}`.
  std::vector<std::pair<std::string, std::string>> headers;
  /// A PEM file of trusted CA certificates for https; empty uses the system's store.
  std::string ca_cert_file;
  /// How many bytes of an error response's body are quoted in a failure's reason: from 0 (none)
  /// to `max_reason_excerpt_bytes`.
  std::size_t reason_excerpt_bytes = 200;
  /// 4xx answers to a claim that mean "our set-up is wrong", not "this event is wrong": a
  /// credential that expired or lacks a permission (401, 403, 407), a wrong URL or method (404,
  /// 405, 421). They are transient, so that a configuration error never fails every event that
  /// arrives meanwhile for good; the reconciler escalates an event after
  /// `ReconcilerOptions::max_attempts`. Every other 4xx except 408, 409, 425 and 429 (always
  /// transient) is a permanent failure. Remove a status here to have it stored as permanent.
  std::vector<int> configuration_statuses = {401, 403, 404, 405, 407, 421};
  /// Keep connections open after a call and reuse them for the next ones (HTTP/1.1 keep-alive),
  /// sparing a TCP (and TLS) handshake per call. False opens a new connection for every call
  /// and closes it after the answer.
  bool keep_alive = true;
  /// Most connections open at once, shared by every thread calling this downstream (and its
  /// copies): from 1 to `max_connections_limit`. A call that finds all of them busy waits up to
  /// `connect_timeout` for one, then fails transiently with nothing sent.
  std::size_t max_connections = 16;
  /// A kept-alive connection idle this long is closed instead of reused: from 1 ms to
  /// `max_timeout`. Keep it below the far side's own keep-alive timeout (5 s in many servers),
  /// so that the far side rarely closes a connection just as it is reused.
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(4);
  /// The cause of a failure the far side answered, the first line of its reason (see
  /// `idemgate::cause_of`): what `idemgate causes` groups by. Empty, or answering "": the method,
  /// the URL of the call's route, the status, and the problem's `type` (else `title`) when the
  /// body is `application/problem+json`, e.g. `POST https://terminal.example/slots answered 422
  /// (https://terminal.example/problems/container-not-announced)`. The lines after it say the
  /// rest (the headers that explain the answer and an excerpt of its body).
  std::function<std::string(const HttpCall&, const httplib::Response&)> cause;

  /// Longest timeout. The HTTP client waits in milliseconds held in an `int`, which a timeout
  /// past about 24 days would overflow.
  static constexpr std::chrono::hours max_timeout{24};
  /// Largest `reason_excerpt_bytes`; reasons are stored with failed rows.
  static constexpr std::size_t max_reason_excerpt_bytes = 64 * 1024;
  /// Largest `max_connections`.
  static constexpr std::size_t max_connections_limit = 1024;
};

/// A parsed base URL: `http[s]://host[:port][/path]`.
struct BaseUrl {
  /// "http" or "https".
  std::string scheme;
  /// Host name or address; IPv6 addresses keep their brackets.
  std::string host;
  /// Port; 80 or 443 when the URL names none.
  int port = 0;
  /// Path prefix without a trailing slash; empty for none.
  std::string path;

  /// The scheme, host and port, as cpp-httplib's `Client` takes them.
  [[nodiscard]] std::string origin() const {
    return scheme + "://" + host + ':' + std::to_string(port);
  }

  /// Parses `url`; throws `std::invalid_argument` saying what is wrong with it.
  [[nodiscard]] static BaseUrl parse(std::string_view url) {
    const auto fail = [url](std::string_view what) -> BaseUrl {
      throw std::invalid_argument("idemgate: base URL \"" + std::string(url) + "\" " +
                                  std::string(what) +
                                  "; expected http[s]://host[:port][/path], e.g. "
                                  "https://slots.example.com/v1");
    };
    BaseUrl out;
    const auto scheme_end = url.find("://");
    if (scheme_end == std::string_view::npos) return fail("has no scheme");
    out.scheme = std::string(url.substr(0, scheme_end));
    std::transform(out.scheme.begin(), out.scheme.end(), out.scheme.begin(),
                   [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; });
    if (out.scheme != "http" && out.scheme != "https")
      return fail("has scheme \"" + out.scheme + "\", which is neither http nor https");
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
    if (out.scheme == "https")
      return fail("is https, but cpp-httplib was built without CPPHTTPLIB_OPENSSL_SUPPORT");
#endif
    std::string_view rest = url.substr(scheme_end + 3);
    const auto path_start = rest.find_first_of("/?#");
    std::string_view authority = rest.substr(0, path_start);
    if (path_start != std::string_view::npos) {
      const std::string_view suffix = rest.substr(path_start);
      if (suffix.find_first_of("?#") != std::string_view::npos)
        return fail("has a query or fragment; give those in the mapping's paths");
      out.path = std::string(suffix);
      while (!out.path.empty() && out.path.back() == '/') out.path.pop_back();
    }
    if (authority.find('@') != std::string_view::npos)
      return fail("holds credentials; pass them in HttpOptions::headers instead");

    std::optional<std::string_view> port_text;
    if (!authority.empty() && authority.front() == '[') {
      const auto close = authority.find(']');
      if (close == std::string_view::npos) return fail("has an unclosed IPv6 bracket");
      out.host = std::string(authority.substr(0, close + 1));
      const std::string_view after = authority.substr(close + 1);
      if (!after.empty() && after.front() != ':') return fail("has junk after the IPv6 address");
      if (!after.empty()) port_text = after.substr(1);
    } else {
      const auto colon = authority.find(':');
      out.host = std::string(authority.substr(0, colon));
      if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
    }
    if (out.host.empty() || out.host == "[]") return fail("has no host");
    const bool host_ok = std::all_of(out.host.begin(), out.host.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '-' || c == '_' || c == '[' || c == ']' || c == ':';
    });
    if (!host_ok) return fail("has a host with characters a host name cannot hold");

    if (!port_text) {
      out.port = out.scheme == "https" ? 443 : 80;
    } else {
      int port = 0;
      const char* first = port_text->data();
      const char* last = first + port_text->size();
      const auto [end, error] = std::from_chars(first, last, port);
      if (port_text->empty() || error != std::errc() || end != last || port < 1 || port > 65535)
        return fail("has port \"" + std::string(*port_text) + "\", not a number from 1 to 65535");
      out.port = port;
    }
    return out;
  }
};

/**
 * A downstream over HTTP: sends each claim with the key as an `Idempotency-Key` header and maps
 * the answer to an outcome, a permanent or a transient failure.
 *
 * `Mapping` (an `http_mapping`) says how a request becomes a call and a 2xx body an outcome; an
 * `http_lookup_mapping` also enables `lookup`. Set `HonoursKeys` to false for a far side that
 * ignores the header: the gate then escalates instead of calling it.
 *
 * Answers: 2xx with a parsable body is the outcome. 408, 409 ("a request with this key is in
 * progress"), 425 and 429 are transient, and so are the statuses that mean the set-up is wrong
 * (`HttpOptions::configuration_statuses`: 401, 403, 404, 405, 407, 421 by default); any other
 * 4xx is permanent, with the status and a body excerpt in the reason. 5xx, timeouts, refused or
 * reset connections and anything else unexpected (1xx, 3xx) are transient, since storing a
 * permanent failure cannot be undone. A 2xx whose body does not parse is transient too: the far
 * side did the work, and a retry or lookup under the same key returns it. Exceptions thrown by the
 * mapping's `claim_call` propagate (the gate treats them as transient).
 *
 * Connections: kept alive and reused across calls and threads (`HttpOptions::keep_alive`). Each
 * connection is an `httplib::Client` that one thread uses at a time; a pool holds at most
 * `HttpOptions::max_connections` of them, reuses the most recently used first, and closes those
 * idle longer than `HttpOptions::idle_timeout`. The far side may close an idle connection just
 * as a call reuses it; the call then fails before any answer arrives, and the downstream sends it
 * once more on a new connection, but only when resending cannot do the work twice: a claim when
 * the far side honours keys (`HonoursKeys`; the resend carries the same `Idempotency-Key`, so
 * the far side answers with the first request's outcome, or 409 while it is still running), and
 * a lookup, which changes nothing. A timeout, a failure on a new connection and any answer are
 * never resent. For the gate this only turns a `retry` (a transient failure, redelivered later)
 * into the answer the redelivery would have got; it never adds a status.
 *
 * Thread safety: one `HttpDownstream` may be shared by all of a gate's worker threads, provided
 * the mapping's const members are thread-safe. Copies share their connections.
 *
 * Example (docs/http-downstream.md has the whole of it):
 *   struct SlotApi {  // a request becomes a call, a 2xx body an outcome
 *     using request_type = std::string;  // the container
 *     using outcome_type = std::string;  // the slot id
 *     idemgate::HttpCall claim_call(const std::string& container) const {
 *       return {"POST", "/slots", "{\"container\":\"" + container + "\"}"};
 *     }
 *     idemgate::HttpCall lookup_call(const idemgate::Key& key) const {
 *       return {"GET", "/slots?idempotency_key=" + key.hex()};
 *     }
 *     std::optional<std::string> parse_outcome(std::string_view body) const {
 *       if (body.empty()) return std::nullopt;  // not an outcome: transient
 *       return std::string(body);               // this terminal answers the bare slot id
 *     }
 *   };
 *   idemgate::HttpDownstream<SlotApi> terminal{"https://slots.ectdelta.example/v1"};
 *   idemgate::Gate gate{"ect.claim_slot", store, terminal, book_in_tms};
 */
template <http_mapping Mapping, bool HonoursKeys = true>
class HttpDownstream {
 public:
  /// What a claim asks for.
  using request_type = typename Mapping::request_type;
  /// What a successful claim answers.
  using outcome_type = typename Mapping::outcome_type;
  /// Whether the far side returns the original outcome for a key it has seen.
  static constexpr bool honours_idempotency_key = HonoursKeys;

  /// A downstream at `base_url` (`http[s]://host[:port][/path]`); throws `std::invalid_argument`
  /// when the URL is malformed or an option is out of its range.
  explicit HttpDownstream(std::string_view base_url, HttpOptions options = {}, Mapping mapping = {})
      : base_(BaseUrl::parse(base_url)),
        origin_(base_.origin()),
        options_(std::move(options)),
        mapping_(std::move(mapping)) {
    const auto timeout = [](std::string_view option, std::chrono::milliseconds value) {
      detail::require_in_range(option, value, std::chrono::milliseconds(1),
                               HttpOptions::max_timeout,
                               "A call that waits longer belongs to a queue, not to a request.");
    };
    timeout("HttpOptions::connect_timeout", options_.connect_timeout);
    timeout("HttpOptions::read_timeout", options_.read_timeout);
    timeout("HttpOptions::write_timeout", options_.write_timeout);
    detail::require_in_range("HttpOptions::reason_excerpt_bytes", options_.reason_excerpt_bytes,
                             std::size_t{0}, HttpOptions::max_reason_excerpt_bytes,
                             "It is how much of an error body a failure's reason quotes "
                             "(default 200).");
    for (int status : options_.configuration_statuses)
      detail::require_in_range("an entry of HttpOptions::configuration_statuses",
                               static_cast<std::size_t>(status < 0 ? 0 : status), std::size_t{400},
                               std::size_t{499},
                               "Only client errors (4xx) can mean the set-up is wrong.");
    detail::require_in_range("HttpOptions::max_connections", options_.max_connections,
                             std::size_t{1}, HttpOptions::max_connections_limit,
                             "It bounds the connections open at once to the far side "
                             "(default 16).");
    detail::require_in_range("HttpOptions::idle_timeout", options_.idle_timeout,
                             std::chrono::milliseconds(1), HttpOptions::max_timeout,
                             "Keep it below the far side's keep-alive timeout (default 4 s).");
    pool_ = std::make_shared<Pool>(options_.max_connections, options_.idle_timeout);
  }

  /// Sends `request` with `key` in the `Idempotency-Key` header.
  [[nodiscard]] ClaimResult<outcome_type> claim(const request_type& request, const Key& key) const {
    const HttpCall call = mapping_.claim_call(request);
    const Exchange exchange = send(call, &key);
    if (!exchange.answered()) return TransientFailure{transport_reason(call, exchange)};
    const httplib::Response& response = exchange.response();
    const int status = response.status;
    if (status >= 200 && status < 300) {
      if (auto outcome = parse(response.body)) return std::move(*outcome);
      return TransientFailure{route(call) + " answered " + std::to_string(status) +
                              " but the body is not an outcome; the work may be done, so retry "
                              "or look it up under the same key\n" +
                              excerpt(response.body)};
    }
    if (status == 408)
      return TransientFailure{status_reason(call, response, "the far side timed out reading it")};
    if (status == 409)
      return TransientFailure{
          status_reason(call, response, "a request with this key is still in progress")};
    if (status == 425 || status == 429)
      return TransientFailure{status_reason(call, response, "rate limited or too early")};
    if (std::find(options_.configuration_statuses.begin(), options_.configuration_statuses.end(),
                  status) != options_.configuration_statuses.end())
      return TransientFailure{status_reason(
          call, response,
          "the set-up looks wrong (credentials, permissions, URL or method); fix it, the event "
          "is retried")};
    if (status >= 400 && status < 500) return PermanentFailure{status_reason(call, response)};
    return TransientFailure{status_reason(call, response)};
  }

  /// Asks what the far side holds under `key` (the call carries no `Idempotency-Key` header):
  /// 2xx with a parsable body is found, 404 is not found, anything else is a transient failure.
  [[nodiscard]] LookupResult<outcome_type> lookup(const Key& key) const requires
      http_lookup_mapping<Mapping> {
    const HttpCall call = mapping_.lookup_call(key);
    const Exchange exchange = send(call, nullptr);
    if (!exchange.answered()) return TransientFailure{transport_reason(call, exchange)};
    const httplib::Response& response = exchange.response();
    if (response.status == 404) return NotFound{};
    if (response.status >= 200 && response.status < 300) {
      if (auto outcome = parse(response.body)) return std::move(*outcome);
      return TransientFailure{route(call) + " answered " + std::to_string(response.status) +
                              " but the body is not an outcome\n" + excerpt(response.body)};
    }
    return TransientFailure{status_reason(call, response)};
  }

  /// The parsed base URL.
  [[nodiscard]] const BaseUrl& base_url() const noexcept { return base_; }
  /// The options.
  [[nodiscard]] const HttpOptions& options() const noexcept { return options_; }
  /// The mapping.
  [[nodiscard]] const Mapping& mapping() const noexcept { return mapping_; }

  /// The `Idempotency-Key` header value for `key` in `form`.
  [[nodiscard]] static std::string key_header_value(const Key& key, KeyHeaderForm form) {
    return form == KeyHeaderForm::structured ? '"' + key.hex() + '"' : key.hex();
  }

 private:
  using Pool = detail::http::ClientPool<httplib::Client>;

  // One call as it went: the last attempt's result (none when no connection came free), how long
  // that attempt took, and the error of a first attempt that was resent.
  struct Exchange {
    std::optional<httplib::Result> result;
    std::chrono::milliseconds elapsed{0};
    std::optional<httplib::Error> resent_after;

    bool answered() const { return result.has_value() && static_cast<bool>(*result); }
    const httplib::Response& response() const { return result->value(); }
  };

  std::unique_ptr<httplib::Client> make_client() const {
    auto client = std::make_unique<httplib::Client>(origin_);
    client->set_connection_timeout(options_.connect_timeout);
    client->set_read_timeout(options_.read_timeout);
    client->set_write_timeout(options_.write_timeout);
    client->set_keep_alive(options_.keep_alive);
    // Headers and body leave in separate writes: without this, Nagle and delayed ACKs add ~40 ms.
    client->set_tcp_nodelay(true);
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
    if (!options_.ca_cert_file.empty()) client->set_ca_cert_path(options_.ca_cert_file);
#endif
    return client;
  }

  // A failure that a connection closed by the far side while idle explains: the request could
  // not be written, or the connection ended before the answer (not a read timeout).
  bool closed_while_idle(const httplib::Result& result, std::chrono::milliseconds elapsed) const {
    return result.error() == httplib::Error::Write ||
           (result.error() == httplib::Error::Read && elapsed < options_.read_timeout);
  }

  Exchange send(const HttpCall& call, const Key* key) const {
    httplib::Request request;
    request.method = call.method;
    request.path = base_.path + call.path;
    request.set_header("User-Agent", user_agent());
    request.set_header("Accept", "application/json");
    for (const auto& [name, value] : options_.headers) request.set_header(name, value);
    if (key != nullptr)
      request.set_header("Idempotency-Key", key_header_value(*key, options_.key_header_form));
    if (!call.body.empty()) {
      request.body = call.body;
      request.set_header("Content-Type", call.content_type);
    }
    // A claim is resent only where the far side honours its key; a lookup changes nothing.
    const bool resendable = key == nullptr || HonoursKeys;

    Exchange exchange;
    for (;;) {
      std::optional<Pool::Lease> lease = pool_->acquire(options_.connect_timeout);
      if (!lease) {
        exchange.result.reset();
        return exchange;
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        // A resend goes on a new connection: the idle ones may have been closed together.
        if (!lease->client || exchange.resent_after) {
          lease->client = make_client();
          lease->reused = false;
        }
        exchange.result.emplace(lease->client->send(request));
      } catch (...) {
        pool_->release(nullptr, false);
        throw;
      }
      exchange.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      const bool ok = static_cast<bool>(*exchange.result);
      const bool keep = ok && options_.keep_alive && lease->client->is_socket_open();
      pool_->release(std::move(lease->client), keep);
      if (ok || !lease->reused || !resendable || exchange.resent_after ||
          !closed_while_idle(*exchange.result, exchange.elapsed))
        return exchange;
      exchange.resent_after = exchange.result->error();
    }
  }

  std::optional<outcome_type> parse(std::string_view body) const {
    try {
      return mapping_.parse_outcome(body);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  std::string describe(const HttpCall& call) const {
    return call.method + ' ' + origin_ + base_.path + call.path;
  }

  /// The method and the URL of the call's route (its path without the query, or `call.route`).
  std::string route(const HttpCall& call) const {
    const std::string_view path = call.route.empty()
                                      ? std::string_view(call.path).substr(0, call.path.find('?'))
                                      : std::string_view(call.route);
    return call.method + ' ' + origin_ + base_.path + std::string(path);
  }

  /// A far side's answer as a reason: its cause on the first line (`HttpOptions::cause`, or the
  /// route, the status, the problem's class and `meaning`), then the call's whole target when it
  /// differs from the route, the headers that explain the answer, and an excerpt of the body.
  std::string status_reason(const HttpCall& call, const httplib::Response& response,
                            std::string_view meaning = {}) const {
    const std::string routed = route(call);
    std::string reason;
    if (options_.cause) reason = options_.cause(call, response);
    if (reason.empty()) {
      reason = routed + " answered " + std::to_string(response.status);
      if (detail::http::is_problem_json(response.get_header_value("Content-Type")))
        if (const auto problem = detail::http::problem_class(response.body))
          reason += " (" + *problem + ')';
      if (!meaning.empty()) reason += ": " + std::string(meaning);
    }
    std::replace(reason.begin(), reason.end(), '\n', ' ');  // a cause is one line
    if (const std::string target = describe(call); target != routed) reason += "\n" + target;
    std::string notes;
    for (const char* header : {"Retry-After", "Location"})
      if (response.has_header(header))
        notes += (notes.empty() ? "" : "; ") + std::string(header) + ": " +
                 response.get_header_value(header);
    if (!notes.empty()) reason += "\n" + notes;
    if (!response.body.empty()) reason += "\n" + excerpt(response.body);
    return reason;
  }

  std::string transport_reason(const HttpCall& call, const Exchange& exchange) const {
    std::string reason = attempt_reason(call, exchange);
    if (exchange.resent_after)
      reason += " (a first attempt on a kept-alive connection failed too: " +
                httplib::to_string(*exchange.resent_after) + "; it may have been processed)";
    return reason;
  }

  std::string attempt_reason(const HttpCall& call, const Exchange& exchange) const {
    const std::string prefix = route(call) + ": ";
    if (!exchange.result)
      return prefix + "all " + std::to_string(options_.max_connections) + " connections to " +
             base_.host + ':' + std::to_string(base_.port) + " stayed busy for " +
             std::to_string(options_.connect_timeout.count()) +
             " ms; nothing was sent. Raise HttpOptions::max_connections if the far side can take "
             "more calls at once";
    const std::string maybe_done =
        "; the request may have been processed, so retry or look it up under the same key";
    const auto ms = [](std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; };
    switch (exchange.result->error()) {
      case httplib::Error::Connection:
        return prefix + "could not connect to " + base_.host + ':' + std::to_string(base_.port) +
               " (connection refused or host unreachable); nothing was sent";
      case httplib::Error::ConnectionTimeout:
        return prefix + "connect timed out after " + ms(options_.connect_timeout) +
               "; nothing was sent";
      case httplib::Error::Read:
        if (exchange.elapsed >= options_.read_timeout)
          return prefix + "read timed out: no response within " + ms(options_.read_timeout) +
                 maybe_done;
        return prefix + "the connection was closed or reset before a complete response" +
               maybe_done + "\nafter " + ms(exchange.elapsed);
      case httplib::Error::Write:
        return prefix + "sending the request failed (write error or timeout after " +
               ms(options_.write_timeout) + ')' + maybe_done;
      case httplib::Error::SSLConnection:
        return prefix + "the TLS handshake failed (is the far side speaking https?)";
      case httplib::Error::SSLLoadingCerts:
        return prefix + "the CA certificates could not be loaded (check ca_cert_file)";
      case httplib::Error::SSLServerVerification:
        return prefix + "the server's TLS certificate did not verify";
      default:
        return prefix + "the call failed (" + httplib::to_string(exchange.result->error()) + ')' +
               maybe_done;
    }
  }

  std::string excerpt(std::string_view body) const {
    std::string out;
    const std::size_t n = std::min(body.size(), options_.reason_excerpt_bytes);
    out.reserve(n + 3);
    for (std::size_t i = 0; i < n; ++i) {
      const char c = body[i];
      out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
    }
    if (n < body.size()) out += "...";
    return out.empty() ? std::string("empty body") : out;
  }

  static std::string user_agent() {
    return "idemgate/" + std::to_string(IDEMGATE_VERSION_MAJOR) + '.' +
           std::to_string(IDEMGATE_VERSION_MINOR) + '.' + std::to_string(IDEMGATE_VERSION_PATCH);
  }

  BaseUrl base_;
  std::string origin_;
  HttpOptions options_;
  Mapping mapping_;
  std::shared_ptr<Pool> pool_;
};

namespace detail {
/// The smallest mapping: text in, text out. Exists to check the concepts below.
struct PlainTextMapping {
  using request_type = std::string;
  using outcome_type = std::string;
  HttpCall claim_call(const std::string& text) const { return {"POST", "/", text, "text/plain"}; }
  HttpCall lookup_call(const Key& key) const { return {"GET", "/?idempotency_key=" + key.hex()}; }
  std::optional<std::string> parse_outcome(std::string_view body) const {
    return std::string(body);
  }
};
}  // namespace detail

static_assert(lookup_downstream<HttpDownstream<detail::PlainTextMapping>>);
static_assert(!HttpDownstream<detail::PlainTextMapping, false>::honours_idempotency_key);

}  // namespace idemgate
