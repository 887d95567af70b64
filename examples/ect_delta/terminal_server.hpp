#pragma once

/// A fake ECT Delta slot API over real HTTP on 127.0.0.1, for the example and the tests.
///
/// `POST /slots` with `{"container": "...", "window": "..."}` claims a slot and answers 201 with
/// `{"slot": "ECTD-000001", "container": "...", "window": "..."}`. It honours `Idempotency-Key`
/// through idemgate's own server side (`idemgate::server::Endpoint`, over a `MemoryStore`), as
/// the IETF draft describes: the same key within its retention replays the original answer
/// (with `Idempotent-Replayed: true`), the same key with a different body is 422, a key whose
/// first request is still running is 409, and a claim without a key is 400.
/// `GET /slots?idempotency_key=<key>` answers the slot claimed under the key, or 404.
///
/// It counts what it was asked and has fault switches: lost responses, error bursts, latency,
/// and a mode that ignores keys, like the terminal in the incident this library comes from.

#include <httplib.h>
#include <common/json.hpp>
#include <idemgate/server/httplib.hpp>
#include <idemgate/store/memory.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ect_delta {

/// The examples' JSON (common/json.hpp, over nlohmann-json).
namespace json = example::json;

/// One claimed slot.
struct Slot {
  /// The terminal's slot id, e.g. "ECTD-000123".
  std::string id;
  /// The container (equipment number) the slot is for.
  std::string container;
  /// The time window asked for.
  std::string window;

  /// The JSON the API answers with.
  [[nodiscard]] std::string to_json() const {
    return json::Json{{"slot", id}, {"container", container}, {"window", window}}.dump();
  }
};

/// Tuning of a `TerminalServer`.
struct TerminalServerOptions {
  /// How long a key is remembered (whole seconds, at least one); a key reused after that claims
  /// a new slot.
  std::chrono::seconds key_retention = std::chrono::hours(24);
  /// False: every claim gets a new slot, whatever its key (see `set_honours_keys`).
  bool honours_keys = true;
  /// How long a kept-alive connection may stay idle before the server closes it (whole
  /// seconds; 0 closes it as soon as no next request is waiting, after about 10 ms). `stop()`
  /// waits up to this long for a connection a client keeps idle.
  std::chrono::seconds keep_alive_timeout = std::chrono::seconds(1);
  /// Requests served on one connection before the server closes it.
  std::size_t keep_alive_max_requests = 1000;
};

/**
 * The fake slot API, served on 127.0.0.1 at an ephemeral port from a background thread.
 *
 * Thread-safe: counters and switches may be used while requests are being served. Slots and keys
 * survive `stop()` and a later `start()` (which binds the same port again), like a terminal
 * restarting over its database.
 *
 * Example:
 *   ect_delta::TerminalServer terminal;
 *   terminal.start();
 *   idemgate::HttpDownstream<SlotApi> downstream{terminal.base_url()};
 *   ...
 *   std::cout << terminal.slots_issued() << " slots for " << containers << " containers\n";
 */
class TerminalServer {
 public:
  /// A server that is not yet listening; call `start()`.
  explicit TerminalServer(TerminalServerOptions options = {})
      : endpoint_("ect.slots", store_, endpoint_options(options)),
        honours_keys_(options.honours_keys),
        keep_alive_timeout_(options.keep_alive_timeout),
        keep_alive_max_requests_(options.keep_alive_max_requests) {}
  TerminalServer(const TerminalServer&) = delete;
  TerminalServer& operator=(const TerminalServer&) = delete;
  /// Stops the server.
  ~TerminalServer() { stop(); }

  /// Binds 127.0.0.1 (an ephemeral port the first time, the same port after a `stop()`) and
  /// serves from a background thread; returns once it accepts connections. Throws
  /// `std::runtime_error` when it cannot bind.
  void start() {
    std::lock_guard lifecycle(lifecycle_mutex_);
    if (server_) return;
    auto server = std::make_unique<httplib::Server>();
    server->set_keep_alive_timeout(static_cast<time_t>(keep_alive_timeout_.count()));
    server->set_keep_alive_max_count(keep_alive_max_requests_);
    // Status line, headers and body leave in separate writes: on a kept-alive connection, Nagle
    // and the client's delayed ACK would hold each answer's last write for ~40 ms.
    server->set_tcp_nodelay(true);
    // Each kept-alive connection holds a worker while it waits for its next request: more
    // workers than any client here keeps open.
    server->new_task_queue = [] { return new httplib::ThreadPool(32); };
    server->Post("/slots", [this](const httplib::Request& req, httplib::Response& res) {
      handle_claim(req, res);
    });
    server->Get("/slots", [this](const httplib::Request& req, httplib::Response& res) {
      handle_lookup(req, res);
    });
    if (port_ == 0) {
      const int port = server->bind_to_any_port("127.0.0.1");
      if (port <= 0) throw std::runtime_error("TerminalServer: cannot bind 127.0.0.1");
      port_ = port;
    } else if (!server->bind_to_port("127.0.0.1", port_)) {
      throw std::runtime_error("TerminalServer: cannot bind 127.0.0.1:" + std::to_string(port_) +
                               " again");
    }
    stopping_ = false;
    thread_ = std::thread([s = server.get()] { s->listen_after_bind(); });
    // stop() is a no-op until the accept loop runs, so wait for it.
    while (!server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    server_ = std::move(server);
  }

  /// Stops listening, wakes handlers held by `set_latency`, and waits for them to finish.
  void stop() {
    std::lock_guard lifecycle(lifecycle_mutex_);
    if (!server_) return;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    server_->stop();
    thread_.join();
    server_.reset();
  }

  /// The port; 0 before the first `start()`.
  [[nodiscard]] int port() const {
    std::lock_guard lifecycle(lifecycle_mutex_);
    return port_;
  }
  /// "http://127.0.0.1:<port>".
  [[nodiscard]] std::string base_url() const {
    return "http://127.0.0.1:" + std::to_string(port());
  }

  /// `POST /slots` requests received, whatever was answered.
  [[nodiscard]] int claims_received() const { return claims_received_.load(); }
  /// `GET /slots` requests received.
  [[nodiscard]] int lookups_received() const { return lookups_received_.load(); }
  /// Client connections that carried a request (told apart by their source port).
  [[nodiscard]] std::size_t connections_used() const {
    std::lock_guard lock(mutex_);
    return connections_.size();
  }
  /// Claims that have reserved their key and not yet answered (see `set_latency`).
  [[nodiscard]] int claims_in_progress() const { return claims_in_progress_.load(); }
  /// Slots handed out.
  [[nodiscard]] int slots_issued() const {
    std::lock_guard lock(mutex_);
    return issued_;
  }
  /// Distinct slots handed out for one container.
  [[nodiscard]] std::size_t slots_for(const std::string& container) const {
    std::lock_guard lock(mutex_);
    const auto it = by_container_.find(container);
    return it == by_container_.end() ? 0 : it->second.size();
  }
  /// Distinct slots handed out under one key (unquoted). Healthy: at most one.
  [[nodiscard]] std::size_t distinct_slots_for_key(const std::string& key) const {
    std::lock_guard lock(mutex_);
    const auto it = by_key_.find(key);
    return it == by_key_.end() ? 0 : it->second.size();
  }
  /// The most distinct slots any one key got. Healthy: 1 (0 before any claim).
  [[nodiscard]] std::size_t max_distinct_slots_per_key() const {
    std::lock_guard lock(mutex_);
    std::size_t most = 0;
    for (const auto& [key, slots] : by_key_) most = std::max(most, slots.size());
    return most;
  }
  /// The `Idempotency-Key` header of every claim, as received (quotes included); an empty
  /// string for a claim without one.
  [[nodiscard]] std::vector<std::string> key_headers_received() const {
    std::lock_guard lock(mutex_);
    return key_headers_;
  }
  /// The slot the terminal holds under a key (unquoted), if any.
  [[nodiscard]] std::optional<Slot> slot_for_key(const std::string& key) const {
    std::lock_guard lock(mutex_);
    const auto it = slot_by_key_.find(key);
    if (it == slot_by_key_.end()) return std::nullopt;
    return it->second;
  }

  /// Lost acknowledgements: the next `n` claims do their work (claim or replay), then the
  /// connection is closed after the status line and headers, before the body. The client sees
  /// a read error and no response.
  void drop_next_responses(int n) {
    std::lock_guard lock(mutex_);
    drops_left_ = n;
  }
  /// Error bursts: the next `n` claims answer `status` (503 by default; 429 and 503 carry
  /// `Retry-After: 1`) without claiming or looking at their key.
  void fail_next_claims(int n, int status = 503) {
    std::lock_guard lock(mutex_);
    failures_left_ = n;
    failure_status_ = status;
  }
  /// Makes every claim wait `latency` after reserving its key and before claiming the slot.
  void set_latency(std::chrono::milliseconds latency) {
    std::lock_guard lock(mutex_);
    latency_ = latency;
  }
  /// False: every claim gets a new slot and lookups find nothing, whatever the key (the keys
  /// are still counted).
  void set_honours_keys(bool honours) {
    std::lock_guard lock(mutex_);
    honours_keys_ = honours;
  }

 private:
  static idemgate::server::EndpointOptions endpoint_options(const TerminalServerOptions& o) {
    idemgate::server::EndpointOptions options;
    options.key_lifetime = o.key_retention;
    return options;
  }

  static std::string unquote(std::string_view header) {
    while (!header.empty() && header.front() == ' ') header.remove_prefix(1);
    while (!header.empty() && header.back() == ' ') header.remove_suffix(1);
    if (header.size() >= 2 && header.front() == '"' && header.back() == '"')
      header = header.substr(1, header.size() - 2);
    return std::string(header);
  }

  static void answer_error(httplib::Response& res, int status, std::string_view message) {
    res.status = status;
    if (status == 429 || status == 503) res.set_header("Retry-After", "1");
    res.set_content(json::Json{{"error", message}}.dump(), "application/json");
  }

  // The endpoint's answer, or with `drop` its status line and headers only: the connection is
  // closed mid-response, which the client cannot tell from a lost acknowledgement.
  static void answer(httplib::Response& res, const idemgate::server::Response& response,
                     bool drop) {
    if (!drop) return idemgate::server::write_response(response, res);
    res.status = response.status;
    for (const auto& h : response.headers)
      if (!idemgate::server::Response::same_name(h.name, "Content-Type"))
        res.set_header(h.name, h.value);
    res.set_content_provider(response.body.size(), "application/json",
                             [](std::size_t, std::size_t, httplib::DataSink&) { return false; });
  }

  bool take_drop() {
    std::lock_guard lock(mutex_);
    if (drops_left_ <= 0) return false;
    --drops_left_;
    return true;
  }

  // Claims a slot, in the endpoint's transaction: what the terminal records of it (the slot
  // under its key and container) happens only if the answer is stored with it.
  idemgate::server::Response claim_slot(idemgate::MemoryStore::transaction& tx,
                                        const std::string& key, const std::string& container,
                                        const std::string& window) {
    std::unique_lock lock(mutex_);
    claims_in_progress_.fetch_add(1);
    wake_.wait_for(lock, latency_, [this] { return stopping_; });
    Slot slot{next_slot_id(), container, window};
    claims_in_progress_.fetch_sub(1);
    tx.on_commit([this, slot, key] {
      std::lock_guard recorded(mutex_);
      record(slot, key);
      slot_by_key_[key] = slot;
    });
    return {201, {{"Content-Type", "application/json"}}, slot.to_json()};
  }

  void record(const Slot& slot, const std::string& key) {
    by_container_[slot.container].insert(slot.id);
    if (!key.empty()) by_key_[key].insert(slot.id);
  }

  void handle_claim(const httplib::Request& req, httplib::Response& res) {
    claims_received_.fetch_add(1);
    const std::string header = req.get_header_value("Idempotency-Key");
    bool honours = false;
    {
      std::lock_guard lock(mutex_);
      connections_.insert(req.remote_port);
      key_headers_.push_back(header);
      if (failures_left_ > 0) {
        --failures_left_;
        return answer_error(res, failure_status_, "injected failure");
      }
      honours = honours_keys_;
    }
    const std::optional<json::Json> body = json::parse(req.body);
    const auto container = body ? json::string_member(*body, "container") : std::nullopt;
    const auto window = body ? json::string_member(*body, "window") : std::nullopt;
    if (!container || container->empty() || !window || window->empty())
      return answer_error(res, 400, "body needs non-empty string fields container and window");

    if (!honours) {
      // The terminal of the incident: every claim is a new slot, whatever its key.
      std::unique_lock lock(mutex_);
      claims_in_progress_.fetch_add(1);
      wake_.wait_for(lock, latency_, [this] { return stopping_; });
      Slot slot{next_slot_id(), *container, *window};
      record(slot, unquote(header));
      claims_in_progress_.fetch_sub(1);
      lock.unlock();
      return answer(res, {201, {{"Content-Type", "application/json"}}, slot.to_json()},
                    take_drop());
    }
    const std::string key = unquote(header);
    const auto response = endpoint_.handle(
        idemgate::server::to_request(req, ""),
        [&](idemgate::MemoryStore::transaction& tx, const idemgate::server::Request&) {
          return claim_slot(tx, key, *container, *window);
        });
    const bool worked = response.status == 201;
    answer(res, response, worked && take_drop());
  }

  void handle_lookup(const httplib::Request& req, httplib::Response& res) {
    lookups_received_.fetch_add(1);
    if (!req.has_param("idempotency_key"))
      return answer_error(res, 400, "GET /slots needs the idempotency_key query parameter");
    bool honours = false;
    {
      std::lock_guard lock(mutex_);
      connections_.insert(req.remote_port);
      honours = honours_keys_;
    }
    if (!honours) return answer_error(res, 404, "no slot under this Idempotency-Key");
    idemgate::server::write_response(
        endpoint_.lookup("", "POST", "/slots", unquote(req.get_param_value("idempotency_key"))),
        res);
  }

  std::string next_slot_id() {
    char id[24];
    std::snprintf(id, sizeof id, "ECTD-%06d", ++issued_);
    return id;
  }

  mutable std::mutex lifecycle_mutex_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;

  idemgate::MemoryStore store_;
  idemgate::server::Endpoint<idemgate::MemoryStore> endpoint_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool honours_keys_;
  std::chrono::seconds keep_alive_timeout_;
  std::size_t keep_alive_max_requests_;
  std::set<int> connections_;
  std::chrono::milliseconds latency_{0};
  int drops_left_ = 0;
  int failures_left_ = 0;
  int failure_status_ = 503;
  int issued_ = 0;
  std::map<std::string, Slot> slot_by_key_;
  std::map<std::string, std::set<std::string>> by_container_;
  std::map<std::string, std::set<std::string>> by_key_;
  std::vector<std::string> key_headers_;

  std::atomic<int> claims_received_{0};
  std::atomic<int> lookups_received_{0};
  std::atomic<int> claims_in_progress_{0};
};

}  // namespace ect_delta
