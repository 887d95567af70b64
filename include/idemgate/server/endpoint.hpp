// SPDX-License-Identifier: MIT
// Endpoint: the server side of Idempotency-Key, framework-neutral, over an idempotency log.
#pragma once

#include "../concepts.hpp"
#include "../detail/crypto/sha256.hpp"
#include "../errors.hpp"
#include "../gate_name.hpp"
#include "../key.hpp"
#include "../record.hpp"
#include "canonical_json.hpp"
#include "key_header.hpp"
#include "message.hpp"
#include "query.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace idemgate::server {

/// Stands in for a handler when checking a store's `commit_computed`.
template <class Transaction>
struct ProduceProbe {
  /// Produces an empty result.
  std::string operator()(Transaction&) const { return {}; }
};

/// Concept: a store whose commit can store a result computed inside its transaction
/// (`commit_computed`): the handler's writes and its response commit together; and whose keys
/// end (`expire` one key, `purge_abandoned` the attempts that never completed).
template <class S>
concept answering_store = store<S> && expiring_store<S> &&
    requires(S& s, const Key& key, std::int64_t fence, ProduceProbe<typename S::transaction> p) {
  { s.commit_computed(key, fence, p) } -> std::same_as<CommitStatus>;
};

/// What a request's fingerprint is taken over: its canonical bytes, or why it has none.
using Canonicalizer = std::function<CanonicalJson(const Request&)>;

/// The body's bytes as they are: two requests match only when their bodies are byte for byte
/// the same.
[[nodiscard]] inline CanonicalJson by_bytes(const Request& request) {
  return {true, request.body, {}};
}

/// The body's canonical JSON (`canonical_json`): member order and whitespace do not matter; a
/// body that is not JSON, or has a duplicate member name, is refused with 400.
[[nodiscard]] inline CanonicalJson by_json(const Request& request) {
  return canonical_json(request.body);
}

/// `by_json` for a JSON media type (`application/json`, `…+json`), `by_bytes` for any other.
[[nodiscard]] inline CanonicalJson by_media_type(const Request& request) {
  std::string_view type = request.content_type;
  type = type.substr(0, type.find(';'));
  while (!type.empty() && type.back() == ' ') type.remove_suffix(1);
  std::string lower(type);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool json = lower == "application/json" ||
                    (lower.size() > 5 && lower.compare(lower.size() - 5, 5, "+json") == 0);
  return json ? by_json(request) : by_bytes(request);
}

/// How an `Endpoint` reads keys, keeps responses and answers what it does not run.
struct EndpointOptions {
  /// Answer `400` to a request without `Idempotency-Key`. When false such a request runs once,
  /// under a key of its own that nobody can repeat.
  bool key_required = true;
  /// How the header is read: bare values accepted or not, the longest key.
  KeyHeaderRules key_rules;
  /// How long a key lives: a stored response answers it this long after it was stored, and a key
  /// whose requests never completed (the handler failed, the server died mid-request) stays
  /// bound to its request this long after its last attempt. After that the key is free again:
  /// the next request under it, of any body, runs the handler anew. `purge_expired` (or
  /// `Retention`) deletes such rows.
  std::chrono::seconds key_lifetime = std::chrono::hours(24);
  /// How long a request holds its key while its handler runs. A handler still running after it
  /// may be taken over by a repeat of the request; its writes then roll back and it answers 409.
  std::chrono::milliseconds lease = std::chrono::seconds(60);
  /// The `Retry-After` (seconds) of a `409` for a key whose first request is being processed.
  std::chrono::seconds retry_after = std::chrono::seconds(1);
  /// The response header fields stored and replayed with status and body (case-insensitive).
  /// Others (Date, Set-Cookie, tracing headers) go out with the first answer only.
  std::vector<std::string> stored_headers = {
      "Content-Type", "Content-Location", "Location", "ETag", "Last-Modified",
      "Link",         "Content-Language"};
  /// The largest request body the endpoint takes, in bytes: a larger one is answered `413`
  /// (problem+json) and runs nothing. The log keeps a request's canonical form with its key for
  /// the key's lifetime, so this bounds what one key may keep. From 1 to `max_max_body_bytes`.
  /// Set the HTTP server's own limit too (cpp-httplib: `set_payload_max_length`), so a larger body
  /// is not read whole first.
  std::size_t max_body_bytes = std::size_t{1} << 20;
  /// Store a 5xx answer of the handler, with its writes, like any other. Off by default: a 5xx
  /// rolls the handler's writes back and stores nothing, so a retry runs the handler again.
  bool store_server_errors = false;
  /// What the fingerprint compares: `by_media_type` (the default), `by_json`, `by_bytes`, or a
  /// projection of your own (say, a body without its `request_id` member).
  Canonicalizer canonical = by_media_type;
  /// Where the query string counts: `ignored` (the default, as before the option existed),
  /// `fingerprint` (another query under the key is a conflict) or `scope` (another query is
  /// another request). Queries compare in their canonical form (`canonical_query`).
  QueryRole query = QueryRole::ignored;
  /// The prefix of the `type` URIs of the endpoint's own problems.
  std::string problem_type_prefix = "urn:idemgate:problem:";
  /// Where the endpoint reports what no response says: a key it could not give back after a
  /// failed request (tried three times), which then stays held until its lease runs out.
  /// Standard error by default; an empty function silences it.
  std::function<void(std::string_view)> log = [](std::string_view line) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  };

  /// Largest `max_body_bytes`.
  static constexpr std::size_t max_max_body_bytes = std::size_t{64} << 20;
};

/**
 * The server side of `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header), over an
 * idempotency log: runs a handler once per key and answers a repeat of the key with the stored
 * response, marked `Idempotent-Replayed: true`. The handler's writes (through the store's
 * transaction) and the stored response commit in one transaction.
 *
 * A key is scoped per client, method and target: `derive_key(gate, client, method, target,
 * key)`. The request's fingerprint is SHA-256 over its canonical form (`EndpointOptions::
 * canonical`). What it answers itself, as `application/problem+json`: `400` for a missing or
 * malformed key or an unreadable body, `422` for a key reused with another request, `409` with
 * `Retry-After` while the first request runs, `503` when the store fails, `500` when the handler
 * throws. Handler answers below 500 are stored; a 5xx or a throw rolls back and stores nothing.
 *
 * Thread-safe as its store is.
 *
 * Example:
 *   idemgate::server::Endpoint orders{"orders.api", store};
 *   const auto response = orders.handle(request, [](idemgate::SqliteTransaction& tx,
 *                                                    const idemgate::server::Request& r) {
 *     tx.exec("INSERT INTO orders (body) VALUES (?)", r.body);
 *     return idemgate::server::Response{201, {{"Content-Type", "application/json"}}, "{}"};
 *   });
 */
template <answering_store Store>
class Endpoint {
 public:
  /// The store's transaction, which handlers write through.
  using transaction = typename Store::transaction;

  /// An endpoint whose keys live in `store`'s log under gate `name` (its own gate: a consumer's
  /// gates on the same log never see its rows). Throws `std::invalid_argument` for an option out
  /// of range.
  Endpoint(const GateName& name, const Store& store, EndpointOptions options = {})
      : name_(name.str()), store_(store.for_gate(name)), options_(std::move(options)) {
    if (options_.key_rules.max_length < 1 || options_.key_rules.max_length > 4096)
      throw std::invalid_argument(
          "idemgate: EndpointOptions::key_rules.max_length must be 1 to 4096");
    if (options_.key_lifetime.count() < 1)
      throw std::invalid_argument("idemgate: EndpointOptions::key_lifetime must be at least 1 s");
    if (options_.lease.count() < 1)
      throw std::invalid_argument("idemgate: EndpointOptions::lease must be positive");
    if (options_.max_body_bytes < 1 ||
        options_.max_body_bytes > EndpointOptions::max_max_body_bytes)
      throw std::invalid_argument(
          "idemgate: EndpointOptions::max_body_bytes must be 1 to 67108864 (64 MiB); keep larger "
          "payloads elsewhere and send a reference");
    if (!options_.canonical) options_.canonical = by_media_type;
  }

  /// Keys this endpoint (and its copies) could not give back after a failed request: each stayed
  /// held until its lease ran out, and its retries were answered `409` meanwhile.
  [[nodiscard]] std::uint64_t keys_not_given_back() const noexcept {
    return not_given_back_->load();
  }

  /// Deletes up to `batch` rows per statement of this endpoint's keys past their lifetime:
  /// stored responses older than `key_lifetime`, and attempts that never completed whose lease
  /// ended that long ago; returns how many. Off the request path: call it from a timer, or run
  /// `Retention` over `store()` with `keep` and `abandoned_after` set to `key_lifetime`.
  std::size_t purge_expired(std::size_t batch = 1000) {
    return store_.purge(options_.key_lifetime, batch) +
           store_.purge_abandoned(options_.key_lifetime, batch);
  }

  /// The store handle, scoped to this endpoint's gate (for `purge`, `find`, signals).
  [[nodiscard]] Store& store() noexcept { return store_; }
  /// The options.
  [[nodiscard]] const EndpointOptions& options() const noexcept { return options_; }

  /// The log key of a request: `derive_key(gate, client, method, target, key)`. With
  /// `QueryRole::scope` a query in `target` ("path?query") takes part in its canonical form;
  /// otherwise only the path does.
  [[nodiscard]] Key log_key(std::string_view client, std::string_view method,
                            std::string_view target, std::string_view key) const {
    const std::size_t mark = target.find('?');
    return key_of(client, method, target.substr(0, mark),
                  mark == target.npos ? std::string_view{} : target.substr(mark + 1), key);
  }

  /**
   * Answers `request`: runs `handler(transaction&, const Request&) -> Response` once for its key,
   * inside the transaction that stores the response, or answers what the key already has.
   */
  template <class Handler>
  requires std::invocable<Handler&, transaction&, const Request&>
  [[nodiscard]] Response handle(const Request& request, Handler&& handler) {
    std::string key_text;
    if (!request.idempotency_key) {
      if (options_.key_required)
        return problem(400, "idempotency-key-missing", "Idempotency-Key is missing",
                       "This request needs an Idempotency-Key header: a unique value (a UUID) "
                       "per operation, sent again unchanged on every retry of it.");
      key_text = "unrepeatable:" + random_token();
    } else {
      const KeyHeader header = read_key_header(*request.idempotency_key, options_.key_rules);
      if (!header.ok)
        return problem(400, "idempotency-key-malformed", "Idempotency-Key is malformed",
                       header.error);
      key_text = header.key;
    }
    if (request.body.size() > options_.max_body_bytes)
      return problem(413, "request-too-large", "The request body is too large",
                     "This endpoint takes bodies of at most " +
                         std::to_string(options_.max_body_bytes) + " bytes; this one has " +
                         std::to_string(request.body.size()) +
                         ". Send a smaller body, or a reference to the data.");
    const CanonicalJson canonical = options_.canonical(request);
    if (!canonical.ok)
      return problem(400, "body-unreadable", "The request body cannot be read",
                     canonical.error + ". Fix the body and send it again under a new key.");
    const Key key = key_of(request.client, request.method, request.target, request.query, key_text);
    // With the query in the fingerprint, the log keeps it before the body ("?a=1&b=2\n{…}"); a
    // request without one keeps its body alone, as before.
    const std::string query =
        options_.query == QueryRole::fingerprint ? canonical_query(request.query) : std::string();
    const std::string with_query =
        query.empty() ? std::string() : '?' + query + '\n' + canonical.text;
    const std::string& compared = query.empty() ? canonical.text : with_query;
    const auto digest = idemgate::detail::sha256(compared);
    Fingerprint fingerprint{};
    std::copy(digest.begin(), digest.end(), fingerprint.begin());
    try {
      for (int round = 0;; ++round) {
        const Reservation r = store_.reserve(key, fingerprint, compared, options_.lease);
        if (r.kind != Reservation::Kind::existing) return run(key, r.fence, request, handler);
        // A key past its lifetime is free: its row (a stored response, or attempts that never
        // completed) is deleted, this one only, and the key reserved anew.
        if (round == 0 && may_have_expired(r) && expired(key) &&
            store_.expire(key, options_.key_lifetime))
          continue;
        if (!r.same_request)
          return problem(422, "idempotency-key-reused", "Idempotency-Key reused",
                         "This Idempotency-Key was already used with a different request. Send "
                         "a new key for a new request, or the first request unchanged.");
        if (r.status == RecordStatus::in_flight) return in_progress();
        if (r.status != RecordStatus::committed)
          return problem(500, "idempotency-key-unusable", "The key's record is not a response",
                         "The key is held by something other than this endpoint. Send a new "
                         "key.");
        return replayed(decode_response(r.result));
      }
    } catch (const StoreError& e) {
      return store_failed(e);
    }
  }

  /**
   * The lookup by key that a consumer's reconciler makes (`HttpDownstream::lookup`): the
   * response stored for `key` (the `Idempotency-Key` value, unquoted) of the request `method
   * target` from `client`, marked `Idempotent-Replayed: true`, or `404` when the key has none
   * (never seen, still running, expired, or its handler failed).
   */
  [[nodiscard]] Response lookup(std::string_view client, std::string_view method,
                                std::string_view target, std::string_view key) {
    const auto not_found = [this] {
      return problem(404, "idempotency-key-unknown", "No response under this key",
                     "No request under this Idempotency-Key has completed (or it expired). "
                     "Send the request again under the same key.");
    };
    if (key.empty() || key.size() > options_.key_rules.max_length) return not_found();
    try {
      const auto row = store_.find(log_key(client, method, target, key));
      if (!row || row->status != RecordStatus::committed || !row->result ||
          past_lifetime(row->updated_at))
        return not_found();
      return replayed(decode_response(*row->result));
    } catch (const StoreError& e) {
      return store_failed(e);
    }
  }

 private:
  // The log key of a request to `path` with `query` (as sent): the query takes part, in its
  // canonical form, only with `QueryRole::scope`.
  [[nodiscard]] Key key_of(std::string_view client, std::string_view method, std::string_view path,
                           std::string_view query, std::string_view key) const {
    const std::string scoped =
        options_.query == QueryRole::scope ? canonical_query(query) : std::string();
    const std::string target =
        scoped.empty() ? std::string(path) : std::string(path) + '?' + scoped;
    return derive_key(name_, "client:" + std::string(client), method, target, key);
  }

  struct NotStored {
    Response response;
  };

  template <class Handler>
  Response run(const Key& key, std::int64_t fence, const Request& request, Handler& handler) {
    Response first;
    try {
      const CommitStatus status = store_.commit_computed(key, fence, [&](transaction& tx) {
        first = handler(tx, request);
        if (first.status >= 500 && !options_.store_server_errors) throw NotStored{first};
        return encode_response(first, options_.stored_headers);
      });
      if (status == CommitStatus::lost_lease) return in_progress();
      return first;
    } catch (const NotStored& not_stored) {
      Response answer = not_stored.response;
      if (!give_back(key, fence, "the handler answered " + std::to_string(answer.status)))
        held_until_lease(answer);
      return answer;
    } catch (const StoreError& e) {
      (void)give_back(key, fence, e.what());
      return store_failed(e);
    } catch (const std::exception& e) {
      const bool free = give_back(key, fence, e.what());
      Response answer = problem(500, "handler-failed", "The request failed",
                                free ? "The request was not carried out and nothing was stored; "
                                       "it may be sent again under the same key."
                                     : "The request was not carried out and nothing was stored; "
                                       "it may be sent again under the same key after the "
                                       "Retry-After delay, when its key is free again.");
      if (!free) held_until_lease(answer);
      return answer;
    } catch (...) {
      give_back(key, fence, "the handler threw");
      throw;
    }
  }

  // The reservation is given back: its lease ends now, so a retry of the request takes the key
  // over at once and runs the handler again (the row keeps the request's fingerprint). A release
  // that fails is tried twice more; if it still fails, it is logged and counted, and false tells
  // the caller the key stays held until its lease runs out (a retry meanwhile gets 409).
  bool give_back(const Key& key, std::int64_t fence, const std::string& reason) noexcept {
    std::string why;
    for (int attempt = 1; attempt <= 3; ++attempt) {
      try {
        (void)store_.release(key, fence, reason);  // false: the fence moved on, nothing to free
        return true;
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
        why = "an unknown error";
      }
      if (attempt < 3) std::this_thread::sleep_for(std::chrono::milliseconds(20 * attempt));
    }
    not_given_back_->fetch_add(1);
    if (options_.log) {
      try {
        options_.log("idemgate: endpoint " + name_ + " could not give back key " + key.hex() +
                     " after a failed request (3 tries): " + why + ". The key stays held until " +
                     "its lease runs out (" + std::to_string(lease_seconds()) +
                     " s); retries meanwhile are answered 409.");
      } catch (...) {
        // A log that throws is ignored.
      }
    }
    return false;
  }

  // The lease in whole seconds, rounded up: when a key that could not be given back is free.
  std::int64_t lease_seconds() const { return (options_.lease.count() + 999) / 1000; }

  // Tells the client of a key that could not be given back when to retry: once its lease ran out.
  void held_until_lease(Response& answer) const {
    answer.set_header("Retry-After", std::to_string(lease_seconds()));
  }

  bool past_lifetime(std::chrono::system_clock::time_point finished) const {
    return std::chrono::system_clock::now() - finished >= options_.key_lifetime;
  }

  // Whether the key's row may be past its life: a stored response, or an attempt of another
  // request that is not running (the same request's would have been taken over).
  static bool may_have_expired(const Reservation& r) {
    return r.status == RecordStatus::committed || r.status == RecordStatus::failed ||
           (r.status == RecordStatus::in_flight && !r.same_request);
  }

  // Whether the key's row is past its life: finished, or its last attempt's lease ended, more
  // than the key's lifetime ago. Read before the delete, so a replay within the lifetime costs
  // a read, not a write.
  bool expired(const Key& key) {
    const auto row = store_.find(key);
    if (!row || !past_lifetime(row->updated_at)) return false;
    if (row->status == RecordStatus::in_flight)
      return row->lease_until < std::chrono::system_clock::now();
    return row->status == RecordStatus::committed || row->status == RecordStatus::failed;
  }

  Response in_progress() const {
    Response r =
        problem(409, "idempotency-key-in-progress", "A request with this key is in progress",
                "The first request under this Idempotency-Key is still being "
                "processed. Retry after the Retry-After delay; it will be answered "
                "with that request's response.");
    r.set_header("Retry-After", std::to_string(options_.retry_after.count()));
    return r;
  }

  Response problem(int status, std::string_view name, std::string_view title,
                   std::string_view detail) const {
    return server::problem(status, options_.problem_type_prefix + std::string(name), title, detail);
  }

  Response store_failed(const StoreError& e) const {
    Response r = problem(503, "store-unavailable", "The request could not be recorded",
                         std::string(e.what()) + " Retry the request under the same key.");
    r.set_header("Retry-After", std::to_string(options_.retry_after.count()));
    return r;
  }

  static Response replayed(Response r) {
    r.set_header("Idempotent-Replayed", "true");
    return r;
  }

  static std::string random_token() {
    thread_local std::mt19937_64 bits{std::random_device{}()};
    return std::to_string(bits()) + "-" + std::to_string(bits());
  }

  std::string name_;
  Store store_;
  EndpointOptions options_;
  std::shared_ptr<std::atomic<std::uint64_t>> not_given_back_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
};

}  // namespace idemgate::server
