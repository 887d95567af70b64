#pragma once

/// The ledger's HTTP face, on cpp-httplib behind the edge of http_edge.hpp: the signed webhook
/// endpoint and the admin views.
///
/// Every request first passes the edge (bounded head, a required and bounded Content-Length, a
/// deadline per request, header values exactly as sent). `POST /webhooks` then checks, in this
/// order, and nothing touches the database before the third:
///   1. the Standard Webhooks signature and replay window (401 / 400),
///   2. the body and the event contract (400 malformed / 422 unknown_event_type),
///   3. the gate, keyed by `webhook-id` alone (200 accepted / duplicate, 402, 409, 503).
/// The admin views need `Authorization: Bearer <admin token>` (401 without it; 404 when no token
/// is configured): `GET /accounts/{account}` shows the balance, the debits, the inbox and the
/// event records; `GET /stats` counts the answers given (a duplicate ratio of zero under real
/// traffic means the key derivation is broken; a high one means the sender misbehaves).

#include <common/json.hpp>
#include "http_edge.hpp"
#include "ledger.hpp"

#include <idemgate/detail/crypto/hmac.hpp>
#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/webhook/standard.hpp>

#include <httplib.h>

#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace prepaid {

/// The shortest admin token accepted: long enough that guessing it is hopeless.
inline constexpr std::size_t min_admin_token_size = 16;

/// Tuning of a `Server`.
struct ServerOptions {
  /// What a request and a connection may take before a handler runs.
  EdgeLimits edge;
  /// The bearer token of `GET /accounts/{account}` and `GET /stats`; empty turns them off.
  std::string admin_token;
};

/// An HTTP answer: status code and JSON body.
struct Reply {
  /// The HTTP status.
  int status = 200;
  /// The JSON body.
  std::string body;
  /// Whether to ask the sender to retry shortly (`Retry-After: 1`).
  bool retry_later = false;
  /// Whether to name the scheme the request must authenticate with (`WWW-Authenticate`).
  bool bearer_challenge = false;
};

/// The reply for a delivery refused at the signed edge; nothing was written.
[[nodiscard]] inline Reply edge_reply(idemgate::WebhookRejection rejection) {
  switch (rejection) {
    case idemgate::WebhookRejection::missing_header:
      return {401, R"({"error":"missing_header"})"};
    case idemgate::WebhookRejection::bad_signature:
      return {401, R"({"error":"bad_signature"})"};
    case idemgate::WebhookRejection::malformed_timestamp:
      return {400, R"({"error":"malformed"})"};
    case idemgate::WebhookRejection::stale:
      return {400, R"({"error":"stale_timestamp"})"};
    case idemgate::WebhookRejection::future:
      return {400, R"({"error":"future_timestamp"})"};
    case idemgate::WebhookRejection::unusable_secret:
      break;
  }
  return {500, R"({"error":"unusable_secret"})"};
}

/// The reply for an event the gate saw.
[[nodiscard]] inline Reply answer_reply(Answer answer) {
  switch (answer) {
    case Answer::accepted:
      return {200, R"({"status":"accepted"})"};
    case Answer::duplicate:
      return {200, R"({"status":"duplicate"})"};
    case Answer::insufficient_balance:
      return {402, R"({"error":"insufficient_balance"})"};
    case Answer::message_conflict:
      return {409, R"({"error":"message_conflict"})"};
    case Answer::event_conflict:
      return {409, R"({"error":"event_conflict"})"};
    case Answer::in_flight:
      return {409, R"({"error":"in_flight"})", true};
    case Answer::escalated:
      return {202, R"({"status":"escalated"})"};
    case Answer::unavailable:
      break;
  }
  return {503, R"({"error":"unavailable"})", true};
}

/// The JSON of an account, as `GET /accounts/{account}` answers it.
[[nodiscard]] inline std::string account_json(const Account& account) {
  json::Json debits = json::Json::array();
  for (const DebitRow& d : account.debits)
    debits.push_back({{"debit_id", d.debit_id},
                      {"event_id", d.event_id},
                      {"message_id", d.message_id},
                      {"cost_cents", d.cost_cents}});
  json::Json inbox = json::Json::array();
  for (const InboxRow& r : account.inbox)
    inbox.push_back({{"inbox_id", r.inbox_id},
                     {"event_id", r.event_id},
                     {"message_id", r.message_id},
                     {"from", r.from}});
  json::Json events = json::Json::array();
  for (const EventRow& e : account.events)
    events.push_back({{"event_id", e.event_id},
                      {"kind", e.kind},
                      {"entry_id", e.entry_id},
                      {"message_id", e.message_id},
                      {"reused", e.reused}});
  return json::Json{{"balance_cents", account.balance_cents},
                    {"debits", std::move(debits)},
                    {"inbox", std::move(inbox)},
                    {"events", std::move(events)}}
      .dump();
}

/**
 * The HTTP server in front of a `PrepaidLedger`, bound to 127.0.0.1 only.
 *
 * Example:
 *   prepaid::Server server{service, verifier};
 *   int port = server.bind(0);   // 0: an ephemeral port
 *   server.listen();             // until stop()
 */
template <class Service>
class Server {
 public:
  /// A server for `service`, verifying deliveries with `verifier`.
  /// Throws `std::invalid_argument` for an admin token shorter than `min_admin_token_size` or
  /// an edge bound out of range.
  Server(Service& service, const idemgate::StandardWebhookVerifier& verifier,
         ServerOptions options = {})
      : service_(service),
        verifier_(verifier),
        admin_token_(std::move(options.admin_token)),
        http_(options.edge) {
    if (!admin_token_.empty() && admin_token_.size() < min_admin_token_size)
      throw std::invalid_argument("the admin token has " + std::to_string(admin_token_.size()) +
                                  " characters; use at least " +
                                  std::to_string(min_admin_token_size) +
                                  " random ones (e.g. openssl rand -hex 32)");
    // Headers and body go out in separate writes: without this, Nagle's algorithm and delayed
    // ACKs hold every answer on a keep-alive connection back by about 40 ms.
    http_.set_tcp_nodelay(true);
    http_.Post("/webhooks", [this](const httplib::Request& req, httplib::Response& res) {
      send(res, webhook(req));
    });
    http_.Get(R"(/accounts/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::optional<Reply> refused = admin(req);
      send(res, refused ? *refused : account(req.matches[1].str()));
    });
    http_.Get("/stats", [this](const httplib::Request& req, httplib::Response& res) {
      const std::optional<Reply> refused = admin(req);
      send(res, refused ? *refused : stats());
    });
  }

  /// Binds 127.0.0.1:`port` (0: an ephemeral port); the port bound. Throws when it cannot.
  int bind(int port) {
    const int bound = port == 0 ? http_.bind_to_any_port("127.0.0.1")
                                : (http_.bind_to_port("127.0.0.1", port) ? port : -1);
    if (bound <= 0)
      throw std::runtime_error("cannot listen on 127.0.0.1:" + std::to_string(port) +
                               "; is the port in use?");
    return bound;
  }

  /// Serves until `stop()`.
  void listen() { http_.listen(); }

  /// Stops serving; `listen()` returns.
  void stop() { http_.stop(); }

  /// One webhook delivery: the signed edge, the contract, then the gate.
  Reply webhook(const httplib::Request& req) {
    const idemgate::WebhookVerification verified = verifier_.verify(req.headers, req.body);
    if (!verified.ok()) return edge_reply(verified.rejection());

    const std::optional<json::Json> document = json::parse(req.body);
    if (!document || !document->is_object()) return malformed();
    const std::optional<std::string> type = json::string_member(*document, "type");
    if (!type) return malformed();
    if (!contract().check(*type)) return {422, R"({"error":"unknown_event_type"})"};
    const std::optional<Event> event = event_from(*document, *type, verified.id());
    if (!event) return malformed();

    // The key comes from what the sender controls: its event id, never a transport detail.
    const idemgate::Key key = idemgate::derive_key(key_scope, verified.id());
    try {
      return answer_reply(service_.handle(key, *event));
    } catch (const idemgate::RequestError&) {
      return malformed();
    }
  }

  /// The refusal of an admin request, or nullopt when it carries the admin token.
  [[nodiscard]] std::optional<Reply> admin(const httplib::Request& req) const {
    // Without a token the admin views do not exist, for anyone.
    if (admin_token_.empty()) return Reply{404, R"({"error":"not_found"})"};
    constexpr std::string_view scheme = "Bearer ";
    const std::string authorization = req.get_header_value("Authorization");
    if (authorization.size() > scheme.size() &&
        idemgate::detail::header_name_equal(
            std::string_view(authorization).substr(0, scheme.size()), scheme) &&
        // Digests of equal size, compared in constant time: the comparison says nothing about
        // how much of a guess was right.
        idemgate::detail::mac_equal(idemgate::detail::sha256(authorization.substr(scheme.size())),
                                    idemgate::detail::sha256(admin_token_)))
      return std::nullopt;
    return Reply{401, R"({"error":"unauthorized"})", false, true};
  }

  /// `GET /accounts/{account}`.
  Reply account(const std::string& id) {
    if (!usable_account(id)) return {404, R"({"error":"unknown_account"})"};
    try {
      const std::optional<Account> found = service_.account(id);
      if (!found) return {404, R"({"error":"unknown_account"})"};
      return {200, account_json(*found)};
    } catch (const std::exception&) {
      return {503, R"({"error":"unavailable"})", true};
    }
  }

  /// `GET /stats`: the answers given since start.
  Reply stats() {
    json::Json out = json::Json::object();
    for (const auto& [name, count] : service_.counts()) out[name] = count;
    return {200, out.dump()};
  }

 private:
  static Reply malformed() { return {400, R"({"error":"malformed"})"}; }

  static void send(httplib::Response& res, const Reply& reply) {
    res.status = reply.status;
    if (reply.retry_later) res.set_header("Retry-After", "1");
    if (reply.bearer_challenge)
      res.set_header("WWW-Authenticate", R"(Bearer realm="prepaid_ledger")");
    res.set_content(reply.body, "application/json");
  }

  Service& service_;
  const idemgate::StandardWebhookVerifier& verifier_;
  std::string admin_token_;
  EdgeServer http_;
};

}  // namespace prepaid
