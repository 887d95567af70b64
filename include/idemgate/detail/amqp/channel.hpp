// SPDX-License-Identifier: MIT
// One AMQP 0-9-1 connection with one channel over rabbitmq-c (librabbitmq): connect, declare a
// quorum queue with its dead-letter exchange and queue, consume with manual acknowledgements
// and a prefetch limit, read each delivery's count, settle, publish, and read a queue back.
// Only consumer/amqp.hpp (and the tests of it) use it.
#pragma once

#include "../../errors.hpp"

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail::amqp {

/// Where the broker is and who logs in.
struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 5672;
  std::string user = "guest";
  std::string password = "guest";
  std::string vhost = "/";
};

/// One message handed to this consumer.
struct Delivery {
  std::uint64_t tag = 0;
  /// The broker's count of deliveries, the first being 1: a quorum queue's `x-delivery-count`
  /// header (the returns so far) plus one; without it (a classic queue), 2 when `redelivered`.
  std::uint32_t deliveries = 1;
  bool redelivered = false;
  std::string body;
};

/// How a delivery is settled.
enum class Settle { ack, requeue, reject };

inline std::string bytes_text(amqp_bytes_t bytes) {
  return bytes.len == 0 ? std::string()
                        : std::string(static_cast<const char*>(bytes.bytes), bytes.len);
}

/// The `x-delivery-count` header's value in `properties`, if any.
inline std::optional<std::uint64_t> delivery_count(const amqp_basic_properties_t& properties) {
  if ((properties._flags & AMQP_BASIC_HEADERS_FLAG) == 0) return std::nullopt;
  for (int i = 0; i < properties.headers.num_entries; ++i) {
    const amqp_table_entry_t& entry = properties.headers.entries[i];
    if (bytes_text(entry.key) != "x-delivery-count") continue;
    const amqp_field_value_t& v = entry.value;
    switch (v.kind) {
      case AMQP_FIELD_KIND_I8:
        return v.value.i8 < 0 ? 0 : static_cast<std::uint64_t>(v.value.i8);
      case AMQP_FIELD_KIND_U8:
        return v.value.u8;
      case AMQP_FIELD_KIND_I16:
        return v.value.i16 < 0 ? 0 : static_cast<std::uint64_t>(v.value.i16);
      case AMQP_FIELD_KIND_U16:
        return v.value.u16;
      case AMQP_FIELD_KIND_I32:
        return v.value.i32 < 0 ? 0 : static_cast<std::uint64_t>(v.value.i32);
      case AMQP_FIELD_KIND_U32:
        return v.value.u32;
      case AMQP_FIELD_KIND_I64:
        return v.value.i64 < 0 ? 0 : static_cast<std::uint64_t>(v.value.i64);
      case AMQP_FIELD_KIND_U64:
        return v.value.u64;
      default:
        return std::nullopt;
    }
  }
  return std::nullopt;
}

/// An AMQP table entry holding a string.
inline amqp_table_entry_t text_entry(const char* key, const std::string& value) {
  amqp_table_entry_t entry;
  entry.key = amqp_cstring_bytes(key);
  entry.value.kind = AMQP_FIELD_KIND_UTF8;
  entry.value.value.bytes = amqp_cstring_bytes(value.c_str());
  return entry;
}

/// One connection, one channel. Not thread-safe: its owner serialises the calls.
class Channel {
 public:
  explicit Channel(const Endpoint& endpoint) : state_(amqp_new_connection()) {
    if (state_ == nullptr) throw BrokerError("idemgate: cannot allocate an AMQP connection");
    amqp_socket_t* socket = amqp_tcp_socket_new(state_);
    if (socket == nullptr) {
      amqp_destroy_connection(state_);
      throw BrokerError("idemgate: cannot create a TCP socket for AMQP");
    }
    timeval connect_timeout{5, 0};
    const int opened =
        amqp_socket_open_noblock(socket, endpoint.host.c_str(), endpoint.port, &connect_timeout);
    if (opened != AMQP_STATUS_OK) {
      amqp_destroy_connection(state_);
      throw BrokerError("idemgate: cannot connect to RabbitMQ at " + endpoint.host + ":" +
                        std::to_string(endpoint.port) + " (" + amqp_error_string2(opened) +
                        "); check that the broker runs and the address is right");
    }
    const auto login =
        amqp_login(state_, endpoint.vhost.c_str(), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                   endpoint.user.c_str(), endpoint.password.c_str());
    if (login.reply_type != AMQP_RESPONSE_NORMAL) {
      amqp_destroy_connection(state_);
      throw BrokerError("idemgate: RabbitMQ refused the login of '" + endpoint.user +
                        "'; check the user, password and virtual host");
    }
    amqp_channel_open(state_, channel_);
    try {
      check(amqp_get_rpc_reply(state_), "opening a channel");
    } catch (...) {
      amqp_destroy_connection(state_);
      throw;
    }
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  /// Closes the channel and the connection: the broker requeues what was not settled.
  ~Channel() {
    if (open_) {
      amqp_channel_close(state_, channel_, AMQP_REPLY_SUCCESS);
      amqp_connection_close(state_, AMQP_REPLY_SUCCESS);
    }
    amqp_destroy_connection(state_);
  }

  /// Declares the durable quorum queue `queue`, whose rejected messages go through the fanout
  /// exchange `dead_exchange` to the durable quorum queue `dead_queue`, at least once
  /// (`x-dead-letter-strategy`, which needs `x-overflow = reject-publish`). Idempotent.
  void declare_quorum_with_dead_letter(const std::string& queue, const std::string& dead_exchange,
                                       const std::string& dead_queue) {
    amqp_exchange_declare(state_, channel_, amqp_cstring_bytes(dead_exchange.c_str()),
                          amqp_cstring_bytes("fanout"), 0, 1, 0, 0, amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "declaring the dead-letter exchange " + dead_exchange);
    const std::string quorum = "quorum";
    amqp_table_entry_t dead_args[] = {text_entry("x-queue-type", quorum)};
    amqp_queue_declare(state_, channel_, amqp_cstring_bytes(dead_queue.c_str()), 0, 1, 0, 0,
                       amqp_table_t{1, dead_args});
    check(amqp_get_rpc_reply(state_), "declaring the dead-letter queue " + dead_queue +
                                          " (a queue of that name declared with other arguments "
                                          "must be deleted first)");
    amqp_queue_bind(state_, channel_, amqp_cstring_bytes(dead_queue.c_str()),
                    amqp_cstring_bytes(dead_exchange.c_str()), amqp_cstring_bytes(""),
                    amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "binding " + dead_queue + " to " + dead_exchange);
    const std::string at_least_once = "at-least-once", reject_publish = "reject-publish";
    amqp_table_entry_t args[] = {text_entry("x-queue-type", quorum),
                                 text_entry("x-dead-letter-exchange", dead_exchange),
                                 text_entry("x-dead-letter-strategy", at_least_once),
                                 text_entry("x-overflow", reject_publish)};
    amqp_queue_declare(state_, channel_, amqp_cstring_bytes(queue.c_str()), 0, 1, 0, 0,
                       amqp_table_t{4, args});
    check(amqp_get_rpc_reply(state_),
          "declaring the quorum queue " + queue +
              " (a queue of that name declared with other arguments must be deleted first)");
  }

  /// Publishes `body` to `queue` through the default exchange, persistent, and waits until the
  /// broker confirms it holds the message (publisher confirms): a quorum queue may drop an
  /// unconfirmed publish while it is busy, and a nacked one is published again. For a channel
  /// that only publishes: deliveries arriving meanwhile would be dropped.
  void publish(const std::string& queue, std::string_view body,
               std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    publish_all(queue, std::vector<std::string_view>{body}, timeout);
  }

  /// Publishes every body as `publish` does, up to 256 awaiting their confirms at a time.
  template <class Bodies>
  void publish_all(const std::string& queue, const Bodies& bodies,
                   std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (!confirming_) {
      amqp_confirm_select(state_, channel_);
      check(amqp_get_rpc_reply(state_), "turning on publisher confirms");
      confirming_ = true;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::deque<std::string_view> to_send(std::begin(bodies), std::end(bodies));
    std::map<std::uint64_t, std::string_view> awaiting;  // delivery tag -> body
    while (!to_send.empty() || !awaiting.empty()) {
      while (!to_send.empty() && awaiting.size() < 256) {
        send(queue, to_send.front());
        awaiting.emplace(++published_, to_send.front());
        to_send.pop_front();
      }
      const Confirm confirm = next_confirm(deadline, queue);
      auto last = confirm.multiple ? awaiting.upper_bound(confirm.tag) : awaiting.find(confirm.tag);
      auto first = confirm.multiple ? awaiting.begin() : last;
      if (!confirm.multiple) {
        if (last == awaiting.end()) continue;
        ++last;
      }
      for (auto it = first; it != last; ++it)
        if (!confirm.ack) to_send.push_back(it->second);
      awaiting.erase(first, last);
    }
  }

  /// Messages ready in `queue` (not counting those delivered and not yet settled).
  [[nodiscard]] std::uint32_t ready(const std::string& queue) {
    const auto* ok = amqp_queue_declare(state_, channel_, amqp_cstring_bytes(queue.c_str()), 1, 0,
                                        0, 0, amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "looking up the queue " + queue);
    return ok->message_count;
  }

  /// Takes one message from `queue` and acknowledges it at once; none when it is empty.
  [[nodiscard]] std::optional<std::string> take(const std::string& queue) {
    const auto reply = amqp_basic_get(state_, channel_, amqp_cstring_bytes(queue.c_str()), 1);
    check(reply, "reading from " + queue);
    if (reply.reply.id != AMQP_BASIC_GET_OK_METHOD) return std::nullopt;
    amqp_message_t message;
    check(amqp_read_message(state_, channel_, &message, 0), "reading a message of " + queue);
    std::string body = bytes_text(message.body);
    amqp_destroy_message(&message);
    return body;
  }

  /// Consumes `queue` with manual acknowledgements, at most `prefetch` messages delivered and
  /// not yet settled at a time (basic.qos).
  void consume(const std::string& queue, std::uint16_t prefetch) {
    amqp_basic_qos(state_, channel_, 0, prefetch, 0);
    check(amqp_get_rpc_reply(state_), "setting the prefetch to " + std::to_string(prefetch));
    amqp_basic_consume(state_, channel_, amqp_cstring_bytes(queue.c_str()), amqp_empty_bytes, 0, 0,
                       0, amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "consuming " + queue);
  }

  /// The next delivery, waiting at most `timeout` (zero: only what already arrived).
  [[nodiscard]] std::optional<Delivery> next(std::chrono::milliseconds timeout) {
    amqp_maybe_release_buffers(state_);
    timeval wait{static_cast<decltype(timeval::tv_sec)>(timeout.count() / 1000),
                 static_cast<decltype(timeval::tv_usec)>((timeout.count() % 1000) * 1000)};
    amqp_envelope_t envelope;
    const auto reply = amqp_consume_message(state_, &envelope, &wait, 0);
    if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        reply.library_error == AMQP_STATUS_TIMEOUT)
      return std::nullopt;
    check(reply, "waiting for a delivery");
    Delivery delivery;
    delivery.tag = envelope.delivery_tag;
    delivery.redelivered = envelope.redelivered != 0;
    delivery.body = bytes_text(envelope.message.body);
    if (const auto returned = delivery_count(envelope.message.properties))
      delivery.deliveries =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(*returned, 1u << 30)) + 1;
    else
      delivery.deliveries = delivery.redelivered ? 2 : 1;
    amqp_destroy_envelope(&envelope);
    return delivery;
  }

  /// Acks, nacks with requeue, or rejects (to the dead-letter exchange) a delivery.
  void settle(std::uint64_t tag, Settle how) {
    int sent = AMQP_STATUS_OK;
    switch (how) {
      case Settle::ack:
        sent = amqp_basic_ack(state_, channel_, tag, 0);
        break;
      case Settle::requeue:
        sent = amqp_basic_nack(state_, channel_, tag, 0, 1);
        break;
      case Settle::reject:
        sent = amqp_basic_reject(state_, channel_, tag, 0);
        break;
    }
    if (sent != AMQP_STATUS_OK) {
      open_ = false;
      throw BrokerError(std::string("idemgate: settling a delivery failed (") +
                        amqp_error_string2(sent) + "); the broker delivers the message again");
    }
  }

 private:
  void check(const amqp_rpc_reply_t& reply, const std::string& what) {
    switch (reply.reply_type) {
      case AMQP_RESPONSE_NORMAL:
        return;
      case AMQP_RESPONSE_NONE:
        open_ = false;
        throw BrokerError("idemgate: RabbitMQ sent no reply while " + what);
      case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        open_ = false;
        throw BrokerError("idemgate: AMQP failed while " + what + ": " +
                          amqp_error_string2(reply.library_error));
      case AMQP_RESPONSE_SERVER_EXCEPTION:
        open_ = false;
        if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
          const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
          throw BrokerError("idemgate: RabbitMQ closed the channel while " + what + ": " +
                            bytes_text(close->reply_text));
        }
        if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
          const auto* close = static_cast<const amqp_connection_close_t*>(reply.reply.decoded);
          throw BrokerError("idemgate: RabbitMQ closed the connection while " + what + ": " +
                            bytes_text(close->reply_text));
        }
        throw BrokerError("idemgate: RabbitMQ closed the connection while " + what);
    }
  }

  /// One persistent publish to `queue` through the default exchange.
  void send(const std::string& queue, std::string_view body) {
    amqp_basic_properties_t properties{};
    properties._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
    properties.delivery_mode = 2;
    amqp_bytes_t bytes{body.size(), const_cast<char*>(body.data())};
    const int sent =
        amqp_basic_publish(state_, channel_, amqp_empty_bytes, amqp_cstring_bytes(queue.c_str()), 0,
                           0, &properties, bytes);
    if (sent != AMQP_STATUS_OK) {
      open_ = false;
      throw BrokerError("idemgate: publishing to " + queue +
                        " failed: " + amqp_error_string2(sent));
    }
  }

  /// The broker's answer to publishes: up to `tag` when `multiple`, else `tag` alone.
  struct Confirm {
    std::uint64_t tag = 0;
    bool multiple = false;
    bool ack = false;
  };

  /// The next ack or nack of a publish on this channel.
  Confirm next_confirm(std::chrono::steady_clock::time_point deadline, const std::string& queue) {
    for (;;) {
      amqp_maybe_release_buffers(state_);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw BrokerError("idemgate: RabbitMQ did not confirm publishes to " + queue +
                          " in time; they may or may not be in the queue");
      timeval wait{static_cast<decltype(timeval::tv_sec)>(left.count() / 1000),
                   static_cast<decltype(timeval::tv_usec)>((left.count() % 1000) * 1000)};
      amqp_frame_t frame;
      const int got = amqp_simple_wait_frame_noblock(state_, &frame, &wait);
      if (got == AMQP_STATUS_TIMEOUT) continue;
      if (got != AMQP_STATUS_OK) {
        open_ = false;
        throw BrokerError("idemgate: waiting for RabbitMQ's confirms of publishes to " + queue +
                          " failed: " + amqp_error_string2(got));
      }
      if (frame.frame_type != AMQP_FRAME_METHOD) continue;
      switch (frame.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
          const auto* ack = static_cast<const amqp_basic_ack_t*>(frame.payload.method.decoded);
          return {ack->delivery_tag, ack->multiple != 0, true};
        }
        case AMQP_BASIC_NACK_METHOD: {
          const auto* nack = static_cast<const amqp_basic_nack_t*>(frame.payload.method.decoded);
          return {nack->delivery_tag, nack->multiple != 0, false};
        }
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD:
          open_ = false;
          throw BrokerError("idemgate: RabbitMQ closed the channel while publishes to " + queue +
                            " waited for their confirms");
        default:
          break;
      }
    }
  }

  amqp_connection_state_t state_;
  amqp_channel_t channel_ = 1;
  bool open_ = true;
  bool confirming_ = false;
  std::uint64_t published_ = 0;
};

}  // namespace idemgate::detail::amqp
