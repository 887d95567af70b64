// SPDX-License-Identifier: MIT
// A Redis Streams consumer over one gate (CMake: idemgate::redis_streams, needs hiredis): reads
// batches through a consumer group (XREADGROUP COUNT), claims the idle pending entries of dead
// consumers (XAUTOCLAIM), puts them through the gate, and acks (XACK), leaves pending, or
// dead-letters (XADD to a dead-letter stream, then XACK) each by the gate's answer. See
// docs/brokers/redis-streams.md.
#pragma once

#include "../detail/redis/connection.hpp"
#include "../errors.hpp"
#include "../shutdown.hpp"
#include "decide.hpp"
#include "disposition.hpp"
#include "event.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::consumer {

/// Where the Redis Streams consumer reads, and how it settles.
struct RedisStreamsOptions {
  /// The server's "host:port" (port 6379 when left out).
  std::string address = "127.0.0.1:6379";
  /// The stream to consume (required).
  std::string stream{};
  /// The consumer group (created at the stream's start, with the stream, when missing).
  std::string group = "idemgate";
  /// This consumer's name in the group (required): stable across restarts of one deployment
  /// slot, or unique per process; a dead consumer's pending entries are claimed by the others
  /// either way.
  std::string consumer{};
  /// The entry field holding the message body.
  std::string field = "body";
  /// The stream dead letters are added to; empty: `<stream>.dead`.
  std::string dead_letter_stream{};
  /// The largest batch read at once (XREADGROUP and XAUTOCLAIM COUNT; 1 to 10000).
  std::uint32_t count = 16;
  /// When a `retry` becomes a dead letter (the entry's times-delivered).
  PoisonPolicy poison{};
  /// An entry pending this long is claimed (XAUTOCLAIM): one a dead consumer held, or one left
  /// pending for a redelivery. This is the redelivery delay; keep it above the gate's lease, so
  /// that the claimer takes a dead consumer's event over instead of finding it in flight.
  std::chrono::milliseconds claim_idle{30'000};
  /// How often idle pending entries are looked for.
  std::chrono::milliseconds claim_interval{1000};
  /// The pause before connecting again after the server went away.
  std::chrono::milliseconds reconnect_delay{1000};
  /// How long one blocking read lasts before the loop looks at the stop signal again.
  std::chrono::milliseconds poll{200};
  /// Called once per entry taken, before the gate sees it (for logs); none by default.
  std::function<void(const Received&)> on_received{};
  /// Called once per entry settled (for logs); none by default. Runs on the loop's thread.
  std::function<void(const Settlement&)> on_settled{};
  /// Called when the server went away or refused something, before reconnecting (for logs).
  std::function<void(std::string_view)> on_error{};
};

/// The dead-letter stream of `options`: `dead_letter_stream`, or `<stream>.dead`.
[[nodiscard]] inline std::string dead_letter_stream(const RedisStreamsOptions& options) {
  return options.dead_letter_stream.empty() ? options.stream + ".dead" : options.dead_letter_stream;
}

/**
 * A Redis Streams consumer over one gate. Each entry is acknowledged (XACK) only once the gate
 * has answered, by `disposition`: ack; redeliver (left pending: claimed again after
 * `claim_idle`, its times-delivered one higher); or dead-letter (XADD of the body, the entry id
 * and the delivery count to the dead-letter stream, then XACK). An entry that does not decode is
 * dead-lettered; when the store fails the batch stays pending. It reconnects by itself.
 *
 * Between the XADD of a dead letter and its XACK a crash leaves the entry pending: it is
 * claimed again, the gate answers as before (conflict, escalated, or retry past the limit), and
 * it is dead-lettered a second time. That is safe: a dead letter is for a human to look at, and
 * the gate makes any repeat of the event harmless.
 *
 * Example:
 *   idemgate::StopSignal stop;
 *   idemgate::consumer::RedisStreamsOptions options;
 *   options.stream = "notifications";
 *   options.consumer = "booker-1";
 *   idemgate::consumer::RedisStreamsConsumer consumer{gate, decode, options};
 *   std::thread loop([&] { consumer.run(stop); });
 *   stop.wait();
 *   idemgate::stop_gracefully(std::chrono::seconds(20), gate, reconciler);
 *   loop.join();
 */
template <class GateType, class Decode>
requires event_decoder<Decode, typename GateType::request_type>
class RedisStreamsConsumer {
 public:
  /// A consumer of `options.stream` into `gate`; `decode` makes the event of a body. Checks the
  /// options; connects only in `run`.
  RedisStreamsConsumer(GateType& gate, Decode decode, RedisStreamsOptions options)
      : gate_(gate), decode_(std::move(decode)), options_(std::move(options)) {
    if (options_.stream.empty())
      throw std::invalid_argument(
          "idemgate: RedisStreamsOptions::stream is empty; name the stream to consume");
    if (options_.consumer.empty())
      throw std::invalid_argument(
          "idemgate: RedisStreamsOptions::consumer is empty; give this consumer a name in the "
          "group (the host name, or the pod's)");
    if (options_.group.empty())
      throw std::invalid_argument("idemgate: RedisStreamsOptions::group is empty");
    if (options_.count < 1 || options_.count > 10'000)
      throw std::invalid_argument("idemgate: RedisStreamsOptions::count must be from 1 to 10000");
    if (options_.poison.max_deliveries < 1 || options_.poison.max_deliveries > 1000)
      throw std::invalid_argument(
          "idemgate: PoisonPolicy::max_deliveries must be from 1 to 1000 (default 10)");
    if (options_.claim_idle < std::chrono::milliseconds(1))
      throw std::invalid_argument(
          "idemgate: RedisStreamsOptions::claim_idle must be positive; keep it above the gate's "
          "lease");
    const auto colon = options_.address.rfind(':');
    endpoint_.host = options_.address.substr(0, colon);
    if (colon != std::string::npos) {
      try {
        std::size_t used = 0;
        endpoint_.port = std::stoi(options_.address.substr(colon + 1), &used);
        if (used != options_.address.size() - colon - 1) throw std::invalid_argument("port");
      } catch (const std::exception&) {
        throw std::invalid_argument("idemgate: the Redis address '" + options_.address +
                                    "' has no numeric port; write it as host:port");
      }
    }
  }
  RedisStreamsConsumer(const RedisStreamsConsumer&) = delete;
  RedisStreamsConsumer& operator=(const RedisStreamsConsumer&) = delete;

  /// Consumes until `stop` is requested: connects (again after the server went away, every
  /// `reconnect_delay`), claims idle pending entries every `claim_interval`, reads new ones,
  /// puts each batch through the gate and settles each entry. What is unsettled on return stays
  /// pending, for this consumer's next run or another's claim.
  void run(const StopSignal& stop) {
    while (!stop.requested()) {
      try {
        connect();
        const auto now = std::chrono::steady_clock::now();
        if (now >= next_claim_) {
          next_claim_ = now + options_.claim_interval;
          std::vector<detail::redis::Entry> claimed = claim();
          if (!claimed.empty()) {
            handle(claimed, true);
            // More may be idle: look again at once.
            if (claimed.size() == options_.count) next_claim_ = now;
            continue;
          }
        }
        std::vector<detail::redis::Entry> fresh = connection_->read_new(
            options_.stream, options_.group, options_.consumer, options_.count, options_.poll);
        if (!fresh.empty()) handle(fresh, false);
      } catch (const BrokerError& e) {
        disconnect();
        if (options_.on_error) options_.on_error(e.what());
        (void)stop.wait_for(options_.reconnect_delay);
      }
    }
    disconnect();
  }

  /// True while connected to the server.
  [[nodiscard]] bool connected() const {
    std::lock_guard lock(mutex_);
    return connection_ != nullptr;
  }

  /// The options in use.
  [[nodiscard]] const RedisStreamsOptions& options() const noexcept { return options_; }

 private:
  void connect() {
    if (connection_) return;
    auto connection = std::make_unique<detail::redis::Connection>(
        endpoint_, options_.poll + std::chrono::seconds(5));
    connection->create_group(options_.stream, options_.group);
    std::lock_guard lock(mutex_);
    connection_ = std::move(connection);
  }

  void disconnect() {
    std::lock_guard lock(mutex_);
    connection_.reset();
  }

  // Idle pending entries, now this consumer's, with their delivery counts in `deliveries_`.
  std::vector<detail::redis::Entry> claim() {
    std::vector<detail::redis::Entry> claimed =
        connection_->claim_idle(options_.stream, options_.group, options_.consumer,
                                options_.claim_idle, cursor_, options_.count);
    std::vector<std::string> gone;
    std::vector<detail::redis::Entry> present;
    for (auto& e : claimed) {
      if (e.present)
        present.push_back(std::move(e));
      else
        gone.push_back(e.id);  // trimmed away while pending: nothing to deliver
    }
    connection_->ack(options_.stream, options_.group, gone);
    deliveries_.clear();
    if (!present.empty())
      deliveries_ = connection_->delivery_counts(
          options_.stream, options_.group, options_.consumer, present.front().id, present.back().id,
          static_cast<std::uint32_t>(present.size()) * 2 + 16);
    return present;
  }

  void handle(const std::vector<detail::redis::Entry>& batch, bool claimed) {
    std::vector<Received> received;
    received.reserve(batch.size());
    for (const auto& e : batch) {
      const auto body = e.fields.find(options_.field);
      std::uint32_t deliveries = 1;
      if (claimed) {
        const auto known = deliveries_.find(e.id);
        // Claimed: delivered at least twice, whatever XPENDING still says.
        deliveries = known != deliveries_.end() ? std::max<std::uint32_t>(known->second, 2) : 2;
      }
      received.push_back(
          {body != e.fields.end() ? std::string_view(body->second) : std::string_view(),
           deliveries});
      if (options_.on_received) options_.on_received(received.back());
    }
    std::vector<Settlement> settled =
        decide(gate_, decode_, std::span<const Received>(received), options_.poison);
    std::vector<std::string> acks;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      switch (settled[i].disposition) {
        case Disposition::ack:
          acks.push_back(batch[i].id);
          break;
        case Disposition::redeliver:
          break;  // left pending: claimed again after claim_idle
        case Disposition::dead_letter:
          // First the dead letter, then the ack: a crash between them dead-letters it twice,
          // never loses it.
          connection_->add(dead_letter_stream(options_),
                           {{options_.field, std::string(received[i].body)},
                            {"source-id", batch[i].id},
                            {"deliveries", std::to_string(received[i].deliveries)}});
          acks.push_back(batch[i].id);
          break;
      }
    }
    connection_->ack(options_.stream, options_.group, acks);
    if (options_.on_settled)
      for (const auto& s : settled) options_.on_settled(s);
  }

  GateType& gate_;
  Decode decode_;
  RedisStreamsOptions options_;
  detail::redis::Endpoint endpoint_;
  mutable std::mutex mutex_;  // guards connection_ for connected()
  std::unique_ptr<detail::redis::Connection> connection_;
  std::string cursor_ = "0-0";
  std::chrono::steady_clock::time_point next_claim_{};
  std::map<std::string, std::uint32_t> deliveries_;
};

}  // namespace idemgate::consumer
