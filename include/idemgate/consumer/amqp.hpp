// SPDX-License-Identifier: MIT
// A RabbitMQ consumer over one gate (CMake: idemgate::amqp, needs librabbitmq): takes batches
// of deliveries from a quorum queue (the prefetch), puts them through the gate, and acks,
// requeues or dead-letters each by the gate's answer. See docs/brokers/rabbitmq.md.
#pragma once

#include "../detail/amqp/channel.hpp"
#include "../errors.hpp"
#include "../shutdown.hpp"
#include "decide.hpp"
#include "disposition.hpp"
#include "event.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::consumer {

/// Where the RabbitMQ consumer reads, and how it settles.
struct AmqpOptions {
  /// The broker's "host:port" (port 5672 when left out).
  std::string address = "127.0.0.1:5672";
  /// User name.
  std::string user = "guest";
  /// Password.
  std::string password = "guest";
  /// Virtual host.
  std::string vhost = "/";
  /// The queue to consume (required).
  std::string queue{};
  /// The fanout exchange dead letters go through; empty: `<queue>.dlx`.
  std::string dead_letter_exchange{};
  /// The queue dead letters land in; empty: `<queue>.dead`.
  std::string dead_letter_queue{};
  /// Declare the queue (a durable quorum queue with the dead-letter exchange, at-least-once
  /// dead-lettering) and the dead-letter exchange and queue before consuming. Off: they exist
  /// already, declared the same way.
  bool declare = true;
  /// Deliveries handed over and not yet settled at a time (basic.qos), and so the largest batch
  /// put through the gate at once (1 to 65535).
  std::uint16_t prefetch = 16;
  /// When a `retry` becomes a dead letter (the quorum queue's delivery count).
  PoisonPolicy poison{};
  /// How long a message to redeliver is held before it is requeued: RabbitMQ requeues at once,
  /// so this is the redelivery delay. Cut short by a stop.
  std::chrono::milliseconds redelivery_delay{1000};
  /// The pause before connecting again after the broker went away.
  std::chrono::milliseconds reconnect_delay{1000};
  /// How long one wait for a delivery lasts before the loop looks at the stop signal again.
  std::chrono::milliseconds poll{200};
  /// Called once per delivery taken, before the gate sees it (for logs); none by default.
  std::function<void(const Received&)> on_received{};
  /// Called once per message settled (for logs); none by default. Runs on the loop's thread.
  std::function<void(const Settlement&)> on_settled{};
  /// Called when the broker went away or refused something, before reconnecting (for logs).
  std::function<void(std::string_view)> on_error{};
};

/// The dead-letter queue of `options`: `dead_letter_queue`, or `<queue>.dead`.
[[nodiscard]] inline std::string dead_letter_queue(const AmqpOptions& options) {
  return options.dead_letter_queue.empty() ? options.queue + ".dead" : options.dead_letter_queue;
}

/// The dead-letter exchange of `options`: `dead_letter_exchange`, or `<queue>.dlx`.
[[nodiscard]] inline std::string dead_letter_exchange(const AmqpOptions& options) {
  return options.dead_letter_exchange.empty() ? options.queue + ".dlx"
                                              : options.dead_letter_exchange;
}

/**
 * A RabbitMQ consumer over one gate: manual acknowledgements, each only once the gate has
 * answered, by `disposition`: ack; redeliver (nack with requeue after `redelivery_delay`); or
 * dead-letter (reject without requeue: the quorum queue moves it to the dead-letter queue).
 * A message that does not decode is dead-lettered; when the store fails the whole batch is
 * requeued. It reconnects by itself when the broker goes away (what was not settled then is
 * delivered again, counted by the quorum queue).
 *
 * Example:
 *   idemgate::StopSignal stop;
 *   idemgate::consumer::AmqpOptions options;
 *   options.queue = "notifications";
 *   idemgate::consumer::AmqpConsumer consumer{gate, decode, options};
 *   std::thread loop([&] { consumer.run(stop); });
 *   stop.wait();
 *   const auto report = idemgate::stop_gracefully(std::chrono::seconds(20), gate, reconciler);
 *   if (!report.clean()) consumer.requeue_in_hand();
 *   loop.join();
 */
template <class GateType, class Decode>
requires event_decoder<Decode, typename GateType::request_type>
class AmqpConsumer {
 public:
  /// A consumer of `options.queue` into `gate`; `decode` makes the event of a body. Checks the
  /// options; connects only in `run`.
  AmqpConsumer(GateType& gate, Decode decode, AmqpOptions options)
      : gate_(gate), decode_(std::move(decode)), options_(std::move(options)) {
    if (options_.queue.empty())
      throw std::invalid_argument(
          "idemgate: AmqpOptions::queue is empty; name the queue to consume");
    if (options_.prefetch == 0)
      throw std::invalid_argument(
          "idemgate: AmqpOptions::prefetch is 0, which RabbitMQ reads as no limit; give the "
          "largest batch to take at once (default 16)");
    if (options_.poison.max_deliveries < 1 || options_.poison.max_deliveries > 1000)
      throw std::invalid_argument(
          "idemgate: PoisonPolicy::max_deliveries must be from 1 to 1000 (default 10)");
    const auto colon = options_.address.rfind(':');
    endpoint_.host = options_.address.substr(0, colon);
    if (colon != std::string::npos) {
      try {
        std::size_t used = 0;
        endpoint_.port = std::stoi(options_.address.substr(colon + 1), &used);
        if (used != options_.address.size() - colon - 1) throw std::invalid_argument("port");
      } catch (const std::exception&) {
        throw std::invalid_argument("idemgate: the AMQP address '" + options_.address +
                                    "' has no numeric port; write it as host:port");
      }
    }
    endpoint_.user = options_.user;
    endpoint_.password = options_.password;
    endpoint_.vhost = options_.vhost;
  }
  AmqpConsumer(const AmqpConsumer&) = delete;
  AmqpConsumer& operator=(const AmqpConsumer&) = delete;

  /// Consumes until `stop` is requested: connects (again after the broker went away, every
  /// `reconnect_delay`), takes up to `prefetch` deliveries, puts them through the gate and
  /// settles each. On return the connection is closed and the broker requeues what is unsettled.
  void run(const StopSignal& stop) {
    while (!stop.requested()) {
      try {
        std::vector<detail::amqp::Delivery> batch = receive();
        if (!batch.empty()) handle(batch, stop);
      } catch (const BrokerError& e) {
        disconnect();
        if (options_.on_error) options_.on_error(e.what());
        (void)stop.wait_for(options_.reconnect_delay);
      }
    }
    disconnect();
  }

  /// Requeues every delivery taken and not yet settled, at once; how many. For a stop whose
  /// grace ran out (`stop_gracefully` not clean): their leases were given back, so a redelivery
  /// takes their events over now. Safe from another thread than `run`'s.
  std::size_t requeue_in_hand() {
    std::lock_guard lock(mutex_);
    std::size_t requeued = 0;
    if (channel_) {
      try {
        for (std::uint64_t tag : in_hand_) {
          channel_->settle(tag, detail::amqp::Settle::requeue);
          ++requeued;
        }
      } catch (const BrokerError&) {
        // The connection is gone: the broker requeues them itself.
      }
    }
    in_hand_.clear();
    return requeued;
  }

  /// True while connected to the broker and consuming.
  [[nodiscard]] bool connected() const {
    std::lock_guard lock(mutex_);
    return channel_ != nullptr;
  }

  /// The options in use.
  [[nodiscard]] const AmqpOptions& options() const noexcept { return options_; }

 private:
  std::vector<detail::amqp::Delivery> receive() {
    std::lock_guard lock(mutex_);
    if (!channel_) {
      auto channel = std::make_unique<detail::amqp::Channel>(endpoint_);
      if (options_.declare)
        channel->declare_quorum_with_dead_letter(options_.queue, dead_letter_exchange(options_),
                                                 dead_letter_queue(options_));
      channel->consume(options_.queue, options_.prefetch);
      channel_ = std::move(channel);
    }
    std::vector<detail::amqp::Delivery> batch;
    auto first = channel_->next(options_.poll);
    if (!first) return batch;
    batch.push_back(std::move(*first));
    // The rest of the prefetch that already arrived joins the batch; nothing is waited for.
    while (batch.size() < options_.prefetch) {
      auto more = channel_->next(std::chrono::milliseconds(0));
      if (!more) break;
      batch.push_back(std::move(*more));
    }
    for (const auto& d : batch) in_hand_.push_back(d.tag);
    return batch;
  }

  void handle(const std::vector<detail::amqp::Delivery>& batch, const StopSignal& stop) {
    std::vector<Received> received;
    received.reserve(batch.size());
    for (const auto& d : batch) {
      received.push_back({d.body, d.deliveries});
      if (options_.on_received) options_.on_received(received.back());
    }
    std::vector<Settlement> settled =
        decide(gate_, decode_, std::span<const Received>(received), options_.poison);
    // Acks and dead letters first; what is redelivered waits out the delay, unless stopping.
    bool redeliver = false;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (settled[i].disposition == Disposition::redeliver) {
        redeliver = true;
        continue;
      }
      settle(batch[i].tag, settled[i]);
    }
    if (!redeliver) return;
    if (!stop.requested()) (void)stop.wait_for(options_.redelivery_delay);
    for (std::size_t i = 0; i < batch.size(); ++i)
      if (settled[i].disposition == Disposition::redeliver) settle(batch[i].tag, settled[i]);
  }

  // Settles one delivery, unless `requeue_in_hand` did already.
  void settle(std::uint64_t tag, const Settlement& settlement) {
    {
      std::lock_guard lock(mutex_);
      const auto held = std::find(in_hand_.begin(), in_hand_.end(), tag);
      if (held == in_hand_.end() || !channel_) return;
      in_hand_.erase(held);
      switch (settlement.disposition) {
        case Disposition::ack:
          channel_->settle(tag, detail::amqp::Settle::ack);
          break;
        case Disposition::redeliver:
          channel_->settle(tag, detail::amqp::Settle::requeue);
          break;
        case Disposition::dead_letter:
          channel_->settle(tag, detail::amqp::Settle::reject);
          break;
      }
    }
    if (options_.on_settled) options_.on_settled(settlement);
  }

  void disconnect() {
    std::lock_guard lock(mutex_);
    channel_.reset();
    in_hand_.clear();
  }

  GateType& gate_;
  Decode decode_;
  AmqpOptions options_;
  detail::amqp::Endpoint endpoint_;
  mutable std::mutex mutex_;  // guards channel_ and in_hand_
  std::unique_ptr<detail::amqp::Channel> channel_;
  std::vector<std::uint64_t> in_hand_;
};

}  // namespace idemgate::consumer
