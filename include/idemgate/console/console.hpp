// SPDX-License-Identifier: MIT
// The operator console of one gate, framework-neutral: requests in, responses out. Mounting it
// on a cpp-httplib server is console/httplib.hpp's job.
#pragma once

#include "../codec.hpp"
#include "../concepts.hpp"
#include "../detail/console/json.hpp"
#include "../detail/console/page.hpp"
#include "../detail/crypto/base64.hpp"
#include "../detail/crypto/hex.hpp"
#include "../detail/crypto/hmac.hpp"
#include "../detail/crypto/sha256.hpp"
#include "../errors.hpp"
#include "../key.hpp"
#include "../record.hpp"
#include "../signals.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace idemgate::console {

/// How a console is served. `bearer_token` is required; the rest have defaults.
struct ConsoleOptions {
  /// The secret every request must present (at least 16 characters; 32 random bytes in hex or
  /// base64 is right): as `Authorization: Bearer <token>`, or through the session cookie that
  /// opening `<prefix>/?token=<token>` sets.
  std::string bearer_token;
  /// The window the signals are read over.
  std::chrono::seconds signal_window = std::chrono::hours(1);
  /// When the signals raise an alarm.
  SignalThresholds thresholds{};
  /// Most rows a list returns (the manual queue, a cause's rows).
  std::size_t list_limit = 100;
  /// Most failed rows one "re-drive this cause" puts back in flight.
  std::size_t redrive_limit = 10'000;
  /// Whether the session cookie is `Secure` (sent over HTTPS only). Leave it on wherever the
  /// console is reached over HTTPS (also behind a TLS-terminating proxy); turn it off only for a
  /// console reached over plain HTTP on loopback.
  bool secure_cookie = true;
  /// How long the session cookie lasts.
  std::chrono::seconds session_lifetime = std::chrono::hours(8);
};

/// One HTTP request, as a server adapter hands it over.
struct ConsoleRequest {
  /// "GET", "POST", ...
  std::string method;
  /// The path below the console's prefix, decoded: "" or "/" for the page, "/api/..." for the
  /// JSON API.
  std::string path;
  /// The query's parameters, decoded.
  std::multimap<std::string, std::string> query;
  /// The headers, names in lower case.
  std::multimap<std::string, std::string> headers;
  /// The body.
  std::string body;

  /// The first value of header `name` (lower case), or "" when absent.
  [[nodiscard]] std::string header(std::string_view name) const {
    const auto found = headers.find(std::string(name));
    return found == headers.end() ? std::string() : found->second;
  }
  /// The first value of query parameter `name`, if present.
  [[nodiscard]] std::optional<std::string> parameter(std::string_view name) const {
    const auto found = query.find(std::string(name));
    if (found == query.end()) return std::nullopt;
    return found->second;
  }
};

/// One HTTP response, for a server adapter to send.
struct ConsoleResponse {
  /// The status code.
  int status = 200;
  /// The body's media type.
  std::string content_type = "application/json";
  /// The body.
  std::string body;
  /// Headers besides Content-Type.
  std::vector<std::pair<std::string, std::string>> headers;
};

/// The session cookie's name.
inline constexpr std::string_view session_cookie = "idemgate_console";
/// The header every state-changing request authenticated by the cookie must carry (any value);
/// a page on another site cannot send it without a CORS preflight, which the console never
/// answers.
inline constexpr std::string_view request_header = "X-Idemgate-Console";

}  // namespace idemgate::console

namespace idemgate::detail::console {

// The gate's store type, as `gate.store()` returns it.
template <class GateT>
using store_of = std::remove_reference_t<decltype(std::declval<GateT&>().store())>;

inline std::string json_bool(bool value) {
  return value ? "true" : "false";
}

inline bool equal_secrets(std::string_view a, std::string_view b) noexcept {
  // Compared as digests: the time taken depends neither on where they differ nor on a length.
  const auto da = idemgate::detail::sha256(a);
  const auto db = idemgate::detail::sha256(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

inline std::string base64_sha256(std::string_view text) {
  const auto digest = idemgate::detail::sha256(text);
  return idemgate::detail::base64_encode(digest.data(), digest.size());
}

// A cookie header's value of `name`, or "".
inline std::string cookie_value(std::string_view header, std::string_view name) {
  while (!header.empty()) {
    const std::size_t end = header.find(';');
    std::string_view pair = header.substr(0, end);
    header = end == std::string_view::npos ? std::string_view() : header.substr(end + 1);
    while (!pair.empty() && pair.front() == ' ') pair.remove_prefix(1);
    const std::size_t eq = pair.find('=');
    if (eq != std::string_view::npos && pair.substr(0, eq) == name)
      return std::string(pair.substr(eq + 1));
  }
  return {};
}

}  // namespace idemgate::detail::console

namespace idemgate::console {

/**
 * The operator console of one gate: its three signals, the causes of its failed and escalated
 * rows, the manual queue, one row with its label and history, resolving an escalated event
 * through the gate (the business write included) and re-driving failed rows (one, or a cause's).
 * Serves one self-contained HTML page and a JSON API; errors are `application/problem+json`.
 * Nothing is served without the bearer token.
 *
 * A `Console` is framework-neutral: `handle` takes a `ConsoleRequest` whose path is relative to
 * where the console is mounted and returns a `ConsoleResponse`. `console/httplib.hpp` mounts it
 * on a cpp-httplib server (`idemgate::console::mount`); docs/console.md has the rest.
 *
 * The gate must outlive the console. The outcome an operator enters is decoded with the gate's
 * `codec<outcome_type>`, so it is typed in the form the gate stores outcomes in.
 */
template <class GateT>
class Console {
 public:
  /// The gate's store type.
  using store_type = detail::console::store_of<GateT>;
  /// What the gate's downstream answers; what an operator enters to resolve.
  using outcome_type = typename GateT::outcome_type;

  /// A console of `gate` mounted at `prefix` (e.g. "/ops/console": starts with '/', does not end
  /// with one). Throws `std::invalid_argument` for a prefix of another form or a token shorter
  /// than 16 characters.
  Console(GateT& gate, std::string prefix, ConsoleOptions options)
      : gate_(gate), prefix_(std::move(prefix)), options_(std::move(options)) {
    if (prefix_.size() < 2 || prefix_.front() != '/' || prefix_.back() == '/' ||
        !std::all_of(prefix_.begin(), prefix_.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '-' || c == '_' ||
                 c == '.';
        }))
      throw std::invalid_argument(
          "idemgate: the console's prefix \"" + prefix_ +
          "\" must start with '/', not end with one, and hold only letters, digits and "
          "'/', '-', '_', '.' (e.g. \"/ops/console\")");
    if (options_.bearer_token.size() < 16)
      throw std::invalid_argument(
          "idemgate: ConsoleOptions::bearer_token must be at least 16 characters (the console "
          "serves nothing without it); use 32 random bytes, e.g. `openssl rand -hex 32`");
    if (options_.list_limit < 1 || options_.list_limit > 10'000)
      throw std::invalid_argument("idemgate: ConsoleOptions::list_limit must be from 1 to 10000");
    if (options_.redrive_limit < 1 || options_.redrive_limit > 1'000'000)
      throw std::invalid_argument(
          "idemgate: ConsoleOptions::redrive_limit must be from 1 to 1000000");
    options_.thresholds.validate();
    const auto mac =
        idemgate::detail::hmac_sha256(options_.bearer_token, {"idemgate console session v1"});
    session_.clear();
    idemgate::detail::append_hex(
        session_, std::string_view(reinterpret_cast<const char*>(mac.data()), mac.size()));
    page_ = idemgate::detail::console::page_html();
    csp_ = "default-src 'none'; script-src 'sha256-" +
           detail::console::base64_sha256(idemgate::detail::console::page_script) +
           "'; style-src 'sha256-" +
           detail::console::base64_sha256(idemgate::detail::console::page_style) +
           "'; connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "
           "frame-ancestors 'none'";
  }

  /// Where the console is mounted.
  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }

  /// Answers one request (path relative to the prefix). Never throws for a request: a failure
  /// becomes a problem response.
  [[nodiscard]] ConsoleResponse handle(const ConsoleRequest& request) {
    ConsoleResponse response;
    try {
      response = route(request);
    } catch (const StoreError& e) {
      response = problem(
          503, "store-unavailable", "The store failed",
          std::string("The store could not answer: ") + e.what() + ". Try again once it answers.");
    } catch (const std::exception& e) {
      response = problem(500, "internal", "The console failed",
                         std::string("The console could not answer: ") + e.what() +
                             ". Nothing was changed by this request unless it says so.");
    }
    secure(response);
    return response;
  }

 private:
  using Response = ConsoleResponse;

  // --- Responses. ---

  static Response json(int status, std::string body) {
    Response r;
    r.status = status;
    r.body = std::move(body);
    return r;
  }

  static Response problem(int status, std::string_view type, std::string_view title,
                          std::string_view detail) {
    Response r;
    r.status = status;
    r.content_type = "application/problem+json";
    r.body = "{\"type\":" +
             idemgate::detail::console::quote("urn:idemgate:console:" + std::string(type)) +
             ",\"title\":" + idemgate::detail::console::quote(title) +
             ",\"status\":" + std::to_string(status) +
             ",\"detail\":" + idemgate::detail::console::quote(detail) + "}";
    return r;
  }

  void secure(Response& r) const {
    r.headers.emplace_back("Cache-Control", "no-store");
    r.headers.emplace_back("X-Content-Type-Options", "nosniff");
    r.headers.emplace_back("Referrer-Policy", "no-referrer");
    r.headers.emplace_back("X-Frame-Options", "DENY");
    r.headers.emplace_back("Content-Security-Policy", csp_);
    r.headers.emplace_back("Cross-Origin-Resource-Policy", "same-origin");
  }

  std::string cookie(std::string_view value, std::chrono::seconds max_age) const {
    return std::string(session_cookie) + "=" + std::string(value) + "; Path=" + prefix_ +
           "/; Max-Age=" + std::to_string(max_age.count()) + "; HttpOnly; SameSite=Strict" +
           (options_.secure_cookie ? "; Secure" : "");
  }

  // --- Authentication and cross-site safety. ---

  enum class Credential { none, bearer, cookie };

  Credential credential(const ConsoleRequest& request) const {
    const std::string authorization = request.header("authorization");
    if (authorization.size() > 7 && (authorization.compare(0, 7, "Bearer ") == 0 ||
                                     authorization.compare(0, 7, "bearer ") == 0)) {
      return detail::console::equal_secrets(std::string_view(authorization).substr(7),
                                            options_.bearer_token)
                 ? Credential::bearer
                 : Credential::none;
    }
    const std::string value =
        detail::console::cookie_value(request.header("cookie"), session_cookie);
    if (!value.empty() && detail::console::equal_secrets(value, session_))
      return Credential::cookie;
    return Credential::none;
  }

  Response unauthorized() const {
    Response r = problem(401, "unauthorized", "The console needs its token",
                         "Open " + prefix_ +
                             "/?token=<token> in a browser (the token is the service's "
                             "console token), or send \"Authorization: Bearer <token>\".");
    r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"idemgate console\"");
    return r;
  }

  // A state change through the session cookie must come from the console's own page.
  std::optional<Response> refuse_cross_site(const ConsoleRequest& request,
                                            Credential credential) const {
    const std::string site = request.header("sec-fetch-site");
    if (!site.empty() && site != "same-origin")
      return problem(403, "cross-site", "Cross-site request refused",
                     "This request came from another site (Sec-Fetch-Site: " + site +
                         "); the console changes nothing for another site's page.");
    if (credential == Credential::cookie && request.header("x-idemgate-console").empty())
      return problem(403, "cross-site", "Cross-site request refused",
                     "A request that changes something and is signed in by the session cookie "
                     "must carry the header X-Idemgate-Console (the console's page sends it); "
                     "scripts send \"Authorization: Bearer <token>\" instead.");
    return std::nullopt;
  }

  // --- Routing. ---

  Response route(const ConsoleRequest& request) {
    const std::string& path = request.path;
    const bool get = request.method == "GET" || request.method == "HEAD";
    const bool post = request.method == "POST";
    if ((path.empty() || path == "/") && get) {
      if (const auto token = request.parameter("token")) {
        if (!detail::console::equal_secrets(*token, options_.bearer_token)) return unauthorized();
        // The token leaves the address bar at once: the cookie carries a MAC of it instead.
        Response r = json(303, "{}");
        r.headers.emplace_back("Location", prefix_ + "/");
        r.headers.emplace_back("Set-Cookie", cookie(session_, options_.session_lifetime));
        return r;
      }
    }
    const Credential who = credential(request);
    if (who == Credential::none) return unauthorized();
    if (!get && !post) return not_allowed(path);
    if (post) {
      if (auto refused = refuse_cross_site(request, who)) return std::move(*refused);
    }
    if (path.empty() || path == "/") {
      if (!get) return not_allowed(path);
      if (path.empty()) {
        Response r = json(308, "{}");
        r.headers.emplace_back("Location", prefix_ + "/");
        return r;
      }
      Response r;
      r.content_type = "text/html; charset=utf-8";
      r.body = page_;
      return r;
    }
    if (path == "/logout") {
      if (!post) return not_allowed(path);
      Response r = json(200, "{\"signed_out\":true}");
      r.headers.emplace_back("Set-Cookie", cookie("", std::chrono::seconds(0)));
      return r;
    }
    if (path == "/api/signals") return get ? signals(request) : not_allowed(path);
    if (path == "/api/escalated") return get ? escalated(request) : not_allowed(path);
    if (path == "/api/causes") return get ? causes() : not_allowed(path);
    if (path == "/api/causes/redrive") return post ? redrive_cause(request) : not_allowed(path);
    if (path == "/api/rows") return get ? rows(request) : not_allowed(path);
    constexpr std::string_view rows = "/api/rows/";
    if (path.starts_with(rows)) {
      std::string_view rest = std::string_view(path).substr(rows.size());
      std::string_view action;
      if (const std::size_t slash = rest.find('/'); slash != std::string_view::npos) {
        action = rest.substr(slash + 1);
        rest = rest.substr(0, slash);
      }
      const std::optional<Key> key = Key::from_hex(rest);
      if (!key)
        return problem(400, "bad-key", "Not a key",
                       "A row is named by its key: 64 hex digits, as the console lists them.");
      if (action.empty()) return get ? row(*key) : not_allowed(path);
      if (action == "resolve") return post ? resolve(*key, request) : not_allowed(path);
      if (action == "redrive") return post ? redrive(*key) : not_allowed(path);
    }
    return problem(404, "not-found", "No such page",
                   "The console serves " + prefix_ + "/ and its API under " + prefix_ +
                       "/api/ (see docs/console.md).");
  }

  static Response not_allowed(const std::string& path) {
    return problem(405, "method-not-allowed", "Method not allowed",
                   "The console's pages are read with GET and changed with POST; " + path +
                       " does not take this method.");
  }

  // --- The API. ---

  Response signals(const ConsoleRequest&) {
    if constexpr (monitored_store<store_type>) {
      const StoreSignals s = gate_.store().signals(options_.signal_window);
      const Health h = evaluate(s, options_.thresholds);
      namespace j = idemgate::detail::console;
      std::string body = "{\"gate\":" + j::quote(gate_.name().view());
      body += ",\"window_seconds\":" + std::to_string(s.window.count());
      body += ",\"events\":" + std::to_string(s.events);
      body += ",\"duplicates\":" + std::to_string(s.duplicates);
      body += ",\"duplicate_ratio\":" + number(s.duplicate_ratio());
      body += ",\"in_flight\":" + std::to_string(s.in_flight);
      body += ",\"oldest_in_flight_seconds\":" +
              (s.oldest_in_flight ? std::to_string(s.oldest_in_flight->count()) : "null");
      body += ",\"escalated\":" + std::to_string(s.escalated);
      body += ",\"mismatched_keys\":" + std::to_string(s.mismatched_keys);
      body += ",\"mismatches_total\":" + std::to_string(s.mismatches_total);
      body += ",\"retrying\":" + std::to_string(s.retrying);
      body += ",\"oldest_snapshot_seconds\":" +
              (s.oldest_snapshot ? std::to_string(s.oldest_snapshot->count()) : "null");
      body += ",\"oldest_snapshot_holder\":" +
              (s.oldest_snapshot ? j::quote(s.oldest_snapshot_holder) : "null");
      body += ",\"health\":{\"key_derivation_suspect\":" +
              detail::console::json_bool(h.key_derivation_suspect) +
              ",\"upstream_misbehaving\":" + detail::console::json_bool(h.upstream_misbehaving) +
              ",\"stranded_work\":" + detail::console::json_bool(h.stranded_work) +
              ",\"result_mismatch\":" + detail::console::json_bool(h.result_mismatch) +
              ",\"old_snapshot\":" + detail::console::json_bool(h.old_snapshot) +
              ",\"healthy\":" + detail::console::json_bool(h.healthy()) + "}}";
      return json(200, std::move(body));
    } else {
      return problem(501, "not-supported", "No signals",
                     "This gate's store does not report signals (it is not a monitored_store).");
    }
  }

  static std::string number(double value) {
    char text[32];
    const auto [end, error] = std::to_chars(text, text + sizeof text, value);
    return error == std::errc() ? std::string(text, end) : std::string("0");
  }

  Response escalated(const ConsoleRequest&) {
    const std::vector<Record> parked = gate_.store().escalated(options_.list_limit);
    std::string body = "{\"rows\":[";
    for (std::size_t i = 0; i < parked.size(); ++i) {
      if (i > 0) body += ',';
      body += row_json(parked[i]);
    }
    body += "]}";
    return json(200, std::move(body));
  }

  Response row(const Key& key) {
    const std::optional<Record> found = gate_.store().find(key);
    if (!found) return unknown(key);
    return json(200, row_json(*found));
  }

  Response unknown(const Key& key) const {
    return problem(404, "unknown-row", "No such row",
                   "Gate \"" + gate_.name().str() + "\" holds no row under key " + key.hex() +
                       " (it was never reserved, it was purged, or it belongs to another gate).");
  }

  static std::string row_json(const Record& r) {
    namespace j = idemgate::detail::console;
    std::string body = "{\"key\":" + j::quote(r.key.hex());
    body += ",\"gate\":" + j::quote(r.gate);
    body += ",\"status\":" + j::quote(to_string(r.status));
    body += ",\"reason\":" + j::quote(r.reason);
    body += ",\"fence\":" + std::to_string(r.fence);
    body += ",\"attempts\":" + std::to_string(r.attempts);
    body += ",\"duplicates\":" + std::to_string(r.duplicates);
    if (j::is_utf8(r.request)) {
      body += ",\"request\":" + j::quote(r.request);
    } else {
      body += ",\"request\":null,\"request_base64\":" +
              j::quote(idemgate::detail::base64_encode(r.request));
    }
    body += ",\"result\":" + (r.result ? j::quote(*r.result) : std::string("null"));
    body += ",\"created_at\":" + j::quote(j::format_time(r.created_at));
    body += ",\"updated_at\":" + j::quote(j::format_time(r.updated_at));
    body += ",\"label\":" + j::quote(r.label);
    body += ",\"history\":[";
    for (std::size_t i = 0; i < r.history.size(); ++i) {
      const HistoryEntry& h = r.history[i];
      if (i > 0) body += ',';
      body += "{\"attempt\":" + std::to_string(h.attempt) + ",\"outcome\":" + j::quote(h.outcome) +
              ",\"reason\":" + j::quote(h.reason) + ",\"at\":" + j::quote(j::format_time(h.at)) +
              "}";
    }
    body += "]";
    body += "}";
    return body;
  }

  Response resolve(const Key& key, const ConsoleRequest& request) {
    std::map<std::string, std::string> fields;
    try {
      fields = idemgate::detail::console::parse_flat_object(request.body);
    } catch (const std::exception& e) {
      return problem(400, "bad-body", "The request body is not understood",
                     std::string("Send a JSON object {\"outcome\": \"...\"}: ") + e.what() + ".");
    }
    const auto entered = fields.find("outcome");
    if (entered == fields.end())
      return problem(400, "bad-body", "No outcome",
                     "Send a JSON object {\"outcome\": \"...\"} holding the outcome, as text in "
                     "the form the gate stores outcomes in.");
    const std::optional<Record> found = gate_.store().find(key);
    if (!found) return unknown(key);
    if (found->status != RecordStatus::escalated) return not_escalated(key, found->status);
    std::optional<outcome_type> outcome;
    try {
      outcome.emplace(codec<outcome_type>::decode(entered->second));
    } catch (const std::exception& e) {
      return problem(422, "outcome-does-not-parse", "The outcome does not parse",
                     std::string("The gate's outcome codec refused the text entered: ") + e.what() +
                         ". Enter the outcome in the form the gate stores outcomes in (the "
                         "outcome column of a committed row of this gate shows it). Nothing was "
                         "changed.");
    }
    try {
      (void)gate_.decode_request(found->request);
    } catch (const std::exception& e) {
      return problem(409, "stored-request-does-not-decode", "The stored request no longer decodes",
                     std::string("The gate cannot decode this row's stored request (") + e.what() +
                         "), so its business write cannot run here. Resolve it from code with "
                         "Gate::resolve_stored, whose business write takes the stored bytes as "
                         "they are. Nothing was changed.");
    }
    bool resolved = false;
    std::string failure;
    try {
      resolved = gate_.resolve(key, *outcome);
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an exception that is not a std::exception";
    }
    if (!failure.empty()) return resolve_failed(key, failure);
    if (!resolved) {
      const std::optional<Record> now = gate_.store().find(key);
      return not_escalated(key, now ? now->status : RecordStatus::committed);
    }
    const std::optional<Record> now = gate_.store().find(key);
    return json(200, "{\"resolved\":true,\"row\":" + (now ? row_json(*now) : "null") + "}");
  }

  // The business write (or the store) threw while resolving: says so, and what the row is now.
  Response resolve_failed(const Key& key, const std::string& what) {
    std::optional<Record> now;
    try {
      now = gate_.store().find(key);
    } catch (const std::exception& e) {
      return problem(503, "store-unavailable", "Resolving failed, and the row cannot be read",
                     "Resolving threw: " + what + ". Reading the row back failed too (" + e.what() +
                         "): reload it once the store answers, before trying again.");
    }
    if (!now || now->status != RecordStatus::escalated)
      return problem(409, "not-escalated", "Resolving failed, and the row changed meanwhile",
                     "Resolving threw: " + what + ". The row is now " +
                         (now ? std::string(to_string(now->status)) : std::string("gone")) +
                         ": reload it.");
    return problem(
        422, "business-write-failed", "The business write failed: nothing was committed",
        "The service's business write threw while committing this outcome: " + what +
            ". The transaction was rolled back: the row is still escalated, and neither the "
            "outcome nor any business row was committed. Fix what the message names (the "
            "business data, or the outcome entered) and resolve again. A row whose business "
            "write can never succeed is resolved from code with Gate::resolve_stored and a "
            "business write of its own (docs/console.md).");
  }

  Response not_escalated(const Key& key, RecordStatus status) const {
    return problem(
        409, "not-escalated", "The row is not escalated",
        "Only an escalated row can be resolved; row " + key.hex() + " is " +
            std::string(to_string(status)) +
            (status == RecordStatus::committed ? " (resolved already, or finished by the gate)."
             : status == RecordStatus::failed  ? " (re-drive it instead)."
                                               : " (a worker or the reconciler holds it)."));
  }

  // --- Causes and queries (stores an operator works with: `operable_store`). ---

  static Response not_operable() {
    return problem(501, "not-supported", "Not supported by this store",
                   "This gate's store cannot group rows by cause or list them by query (it is "
                   "not an operable_store).");
  }

  Response causes() {
    if constexpr (operable_store<store_type>) {
      namespace j = idemgate::detail::console;
      const std::vector<Cause> found = gate_.store().causes(options_.list_limit);
      std::string body = "{\"causes\":[";
      for (std::size_t i = 0; i < found.size(); ++i) {
        const Cause& c = found[i];
        if (i > 0) body += ',';
        body += "{\"id\":" + j::quote(c.id()) + ",\"status\":" + j::quote(to_string(c.status)) +
                ",\"cause\":" + j::quote(c.reason) + ",\"reason\":" + j::quote(c.reason) +
                ",\"rows\":" + std::to_string(c.rows) +
                ",\"first_seen\":" + j::quote(j::format_time(c.first_seen)) +
                ",\"last_seen\":" + j::quote(j::format_time(c.last_seen)) + "}";
      }
      body += "]}";
      return json(200, std::move(body));
    } else {
      return not_operable();
    }
  }

  Response rows(const ConsoleRequest& request) {
    if constexpr (operable_store<store_type>) {
      RowQuery query;
      query.limit = options_.list_limit;
      if (const auto status = request.parameter("status"); status && !status->empty()) {
        try {
          query.status = parse_record_status(*status);
        } catch (const std::exception&) {
          return problem(400, "bad-query", "Unknown status",
                         "status is one of in_flight, committed, failed, escalated.");
        }
      }
      if (const auto reason = request.parameter("reason")) query.reason = *reason;
      if (const auto label = request.parameter("label")) query.label_contains = *label;
      const std::vector<Record> found = gate_.store().rows(query);
      const std::int64_t total = gate_.store().count(query);
      std::string body = "{\"count\":" + std::to_string(total) + ",\"rows\":[";
      for (std::size_t i = 0; i < found.size(); ++i) {
        if (i > 0) body += ',';
        body += row_json(found[i]);
      }
      body += "]}";
      return json(200, std::move(body));
    } else {
      return not_operable();
    }
  }

  Response redrive_cause(const ConsoleRequest& request) {
    if constexpr (operable_store<store_type>) {
      std::map<std::string, std::string> fields;
      try {
        fields = idemgate::detail::console::parse_flat_object(request.body);
      } catch (const std::exception& e) {
        return problem(400, "bad-body", "The request body is not understood",
                       std::string("Send a JSON object {\"cause\": \"...\"}: ") + e.what() + ".");
      }
      auto given = fields.find("cause");
      if (given == fields.end()) given = fields.find("reason");
      if (given == fields.end())
        return problem(400, "bad-body", "No cause",
                       "Send a JSON object {\"cause\": \"...\"} holding the failed rows' cause "
                       "or its id, as the causes list them.");
      const std::string cause =
          failed_cause_with_id(gate_.store().causes(options_.list_limit), given->second)
              .value_or(given->second);
      const std::size_t redriven = gate_.store().redrive_cause(cause, options_.redrive_limit);
      if (redriven == 0)
        return problem(409, "not-failed", "No failed row has this cause",
                       "Nothing was re-driven: no failed row of gate \"" + gate_.name().str() +
                           "\" has this cause or reason (escalated rows are resolved, not "
                           "re-driven; or the rows were re-driven already). GET /api/causes "
                           "lists the causes there are.");
      RowQuery left;
      left.status = RecordStatus::failed;
      left.reason = cause;
      return json(200, "{\"redriven\":" + std::to_string(redriven) +
                           ",\"still_failed\":" + std::to_string(gate_.store().count(left)) + "}");
    } else {
      return not_operable();
    }
  }

  Response redrive(const Key& key) {
    if constexpr (redrivable_store<store_type>) {
      const std::optional<Record> found = gate_.store().find(key);
      if (!found) return unknown(key);
      if (gate_.store().redrive_failed(key) == 0)
        return problem(
            409, "not-failed", "The row is not failed",
            "Only a failed row can be re-driven; row " + key.hex() + " is " +
                std::string(to_string(found->status)) +
                (found->status == RecordStatus::escalated ? " (resolve it instead)." : "."));
      const std::optional<Record> now = gate_.store().find(key);
      return json(200, "{\"redriven\":1,\"row\":" + (now ? row_json(*now) : "null") + "}");
    } else {
      return problem(501, "not-supported", "No re-drive",
                     "This gate's store cannot re-drive failed rows (it is not a "
                     "redrivable_store).");
    }
  }

  GateT& gate_;
  std::string prefix_;
  ConsoleOptions options_;
  std::string session_;  // the cookie's value: a MAC of the token, never the token
  std::string page_;
  std::string csp_;
};

}  // namespace idemgate::console
