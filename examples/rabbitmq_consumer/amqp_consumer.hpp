#pragma once

// A small adapter over rabbitmq-c (librabbitmq) for the RabbitMQ consumer example: connect,
// declare a queue with a dead-letter exchange, consume with manual acknowledgements and a
// prefetch limit, and settle each delivery by ack, nack-with-requeue or dead-letter. It also
// publishes and reads back, which the tests and the chaos run use to feed the queue.

#include <idemgate/outcome.hpp>

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include <sys/time.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace amqp_example {

/// What a consumer does with a delivery once the gate has answered.
enum class Disposition {
  ack,          ///< basic.ack: the message is done (processed, a duplicate, or settled elsewhere).
  requeue,      ///< basic.nack with requeue: the broker delivers it again.
  dead_letter,  ///< basic.reject without requeue: the broker moves it to the dead-letter queue.
};

/// The disposition of a gate status. `retry` is the only status that asks for a redelivery;
/// `conflict` (same key, different request: a key-derivation bug or a forged replay) goes to
/// the dead-letter queue for a human; everything else is acknowledged: `failed` and `escalated`
/// are stored by the gate, and `in_flight` and `lost_lease` are finished by the worker that
/// holds the event or by the reconciler.
[[nodiscard]] constexpr Disposition disposition(idemgate::Status status) noexcept {
  switch (status) {
    case idemgate::Status::retry:
      return Disposition::requeue;
    case idemgate::Status::conflict:
      return Disposition::dead_letter;
    case idemgate::Status::processed:
    case idemgate::Status::duplicate:
    case idemgate::Status::in_flight:
    case idemgate::Status::failed:
    case idemgate::Status::escalated:
    case idemgate::Status::lost_lease:
      return Disposition::ack;
  }
  return Disposition::requeue;
}

/// The lowercase name of a disposition, as the example prints it.
[[nodiscard]] constexpr std::string_view to_string(Disposition disposition) noexcept {
  switch (disposition) {
    case Disposition::ack:
      return "ack";
    case Disposition::requeue:
      return "requeue";
    case Disposition::dead_letter:
      return "dead-letter";
  }
  return "unknown";
}

/// A broker error: the connection, a declaration or a settlement failed.
class AmqpError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where the broker is.
struct Endpoint {
  /// Host name or address.
  std::string host = "127.0.0.1";
  /// AMQP port.
  int port = 5672;
  /// User name.
  std::string user = "guest";
  /// Password.
  std::string password = "guest";
  /// Virtual host.
  std::string vhost = "/";

  /// Parses "host:port" (or "host", port 5672).
  [[nodiscard]] static Endpoint parse(std::string_view host_port) {
    Endpoint endpoint;
    const auto colon = host_port.rfind(':');
    endpoint.host = std::string(host_port.substr(0, colon));
    if (colon != std::string_view::npos) {
      try {
        endpoint.port = std::stoi(std::string(host_port.substr(colon + 1)));
      } catch (const std::exception&) {
        throw AmqpError("the AMQP address '" + std::string(host_port) +
                        "' has no numeric port; write it as host:port");
      }
    }
    return endpoint;
  }
};

/// One message handed to this consumer.
struct Delivery {
  /// The broker's delivery tag, to settle the message with.
  std::uint64_t tag = 0;
  /// True when the broker delivered this message before (to this or another consumer).
  bool redelivered = false;
  /// The message body.
  std::string body;
};

/// The name of the dead-letter queue of `queue`.
[[nodiscard]] inline std::string dead_letter_queue(const std::string& queue) {
  return queue + ".dead";
}

/**
 * One AMQP connection with one channel. Not thread-safe: one thread uses it.
 *
 * Example:
 *   amqp_example::Channel channel{amqp_example::Endpoint::parse("127.0.0.1:5672")};
 *   channel.declare_with_dead_letter("notifications");
 *   channel.consume("notifications", 4);
 *   while (auto delivery = channel.next(std::chrono::milliseconds(200)))
 *     channel.settle(delivery->tag, amqp_example::disposition(status));
 */
class Channel {
 public:
  /// Connects, logs in and opens channel 1. Throws `AmqpError` when the broker cannot be reached.
  explicit Channel(const Endpoint& endpoint) : state_(amqp_new_connection()) {
    if (state_ == nullptr) throw AmqpError("cannot allocate an AMQP connection: out of memory");
    amqp_socket_t* socket = amqp_tcp_socket_new(state_);
    if (socket == nullptr) {
      amqp_destroy_connection(state_);
      throw AmqpError("cannot create a TCP socket for AMQP");
    }
    timeval connect_timeout{5, 0};
    const int opened =
        amqp_socket_open_noblock(socket, endpoint.host.c_str(), endpoint.port, &connect_timeout);
    if (opened != AMQP_STATUS_OK) {
      amqp_destroy_connection(state_);
      throw AmqpError("cannot connect to RabbitMQ at " + endpoint.host + ":" +
                      std::to_string(endpoint.port) + " (" + amqp_error_string2(opened) +
                      "); check that the broker runs and the address is right");
    }
    const auto login =
        amqp_login(state_, endpoint.vhost.c_str(), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                   endpoint.user.c_str(), endpoint.password.c_str());
    if (login.reply_type != AMQP_RESPONSE_NORMAL) {
      amqp_destroy_connection(state_);
      throw AmqpError("RabbitMQ refused the login of '" + endpoint.user +
                      "'; check the user, password and virtual host");
    }
    amqp_channel_open(state_, channel_);
    check(amqp_get_rpc_reply(state_), "opening a channel");
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  /// Closes the channel and the connection; unacknowledged deliveries go back to their queue.
  ~Channel() {
    amqp_channel_close(state_, channel_, AMQP_REPLY_SUCCESS);
    amqp_connection_close(state_, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(state_);
  }

  /// Declares a durable `queue` whose rejected messages go to the fanout exchange
  /// "<queue>.dlx" and from there to the durable queue "<queue>.dead". Idempotent.
  void declare_with_dead_letter(const std::string& queue) {
    const std::string exchange = queue + ".dlx";
    const std::string dead = dead_letter_queue(queue);
    amqp_exchange_declare(state_, channel_, amqp_cstring_bytes(exchange.c_str()),
                          amqp_cstring_bytes("fanout"), 0, 1, 0, 0, amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "declaring the dead-letter exchange " + exchange);
    amqp_queue_declare(state_, channel_, amqp_cstring_bytes(dead.c_str()), 0, 1, 0, 0,
                       amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "declaring the dead-letter queue " + dead);
    amqp_queue_bind(state_, channel_, amqp_cstring_bytes(dead.c_str()),
                    amqp_cstring_bytes(exchange.c_str()), amqp_cstring_bytes(""), amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "binding " + dead + " to " + exchange);
    amqp_table_entry_t entry;
    entry.key = amqp_cstring_bytes("x-dead-letter-exchange");
    entry.value.kind = AMQP_FIELD_KIND_UTF8;
    entry.value.value.bytes = amqp_cstring_bytes(exchange.c_str());
    const amqp_table_t arguments{1, &entry};
    amqp_queue_declare(state_, channel_, amqp_cstring_bytes(queue.c_str()), 0, 1, 0, 0, arguments);
    check(amqp_get_rpc_reply(state_),
          "declaring the queue " + queue +
              " (a queue of that name declared with other arguments must be deleted first)");
  }

  /// Publishes `body` to `queue` through the default exchange, persistent.
  void publish(const std::string& queue, std::string_view body) {
    amqp_basic_properties_t properties{};
    properties._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
    properties.delivery_mode = 2;
    properties.content_type = amqp_cstring_bytes("application/json");
    amqp_bytes_t bytes{body.size(), const_cast<char*>(body.data())};
    const int sent =
        amqp_basic_publish(state_, channel_, amqp_empty_bytes, amqp_cstring_bytes(queue.c_str()), 0,
                           0, &properties, bytes);
    if (sent != AMQP_STATUS_OK)
      throw AmqpError(std::string("publishing to ") + queue +
                      " failed: " + amqp_error_string2(sent));
  }

  /// Messages ready in `queue` (not counting those delivered and not yet settled).
  [[nodiscard]] std::uint32_t ready(const std::string& queue) {
    const auto* ok = amqp_queue_declare(state_, channel_, amqp_cstring_bytes(queue.c_str()), 1, 0,
                                        0, 0, amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "looking up the queue " + queue);
    return ok->message_count;
  }

  /// Takes one message from `queue` and acknowledges it at once (basic.get); none when empty.
  [[nodiscard]] std::optional<std::string> take(const std::string& queue) {
    const auto reply = amqp_basic_get(state_, channel_, amqp_cstring_bytes(queue.c_str()), 1);
    check(reply, "reading from " + queue);
    if (reply.reply.id != AMQP_BASIC_GET_OK_METHOD) return std::nullopt;
    amqp_message_t message;
    check(amqp_read_message(state_, channel_, &message, 0), "reading a message of " + queue);
    std::string body(static_cast<const char*>(message.body.bytes), message.body.len);
    amqp_destroy_message(&message);
    return body;
  }

  /// Starts consuming `queue` with manual acknowledgements, at most `prefetch` messages
  /// delivered and not yet settled at a time (basic.qos).
  void consume(const std::string& queue, std::uint16_t prefetch) {
    amqp_basic_qos(state_, channel_, 0, prefetch, 0);
    check(amqp_get_rpc_reply(state_), "setting the prefetch to " + std::to_string(prefetch));
    amqp_basic_consume(state_, channel_, amqp_cstring_bytes(queue.c_str()), amqp_empty_bytes, 0, 0,
                       0, amqp_empty_table);
    check(amqp_get_rpc_reply(state_), "consuming " + queue);
  }

  /// The next delivery, waiting at most `timeout`; none when nothing came.
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
    Delivery delivery{envelope.delivery_tag, envelope.redelivered != 0,
                      std::string(static_cast<const char*>(envelope.message.body.bytes),
                                  envelope.message.body.len)};
    amqp_destroy_envelope(&envelope);
    return delivery;
  }

  /// Settles a delivery: ack, nack with requeue, or reject to the dead-letter exchange.
  void settle(std::uint64_t tag, Disposition disposition) {
    int sent = AMQP_STATUS_OK;
    switch (disposition) {
      case Disposition::ack:
        sent = amqp_basic_ack(state_, channel_, tag, 0);
        break;
      case Disposition::requeue:
        sent = amqp_basic_nack(state_, channel_, tag, 0, 1);
        break;
      case Disposition::dead_letter:
        sent = amqp_basic_reject(state_, channel_, tag, 0);
        break;
    }
    if (sent != AMQP_STATUS_OK)
      throw AmqpError(std::string("settling a delivery (") + std::string(to_string(disposition)) +
                      ") failed: " + amqp_error_string2(sent) +
                      "; the broker delivers the message again");
  }

 private:
  void check(const amqp_rpc_reply_t& reply, const std::string& what) {
    switch (reply.reply_type) {
      case AMQP_RESPONSE_NORMAL:
        return;
      case AMQP_RESPONSE_NONE:
        throw AmqpError("RabbitMQ sent no reply while " + what);
      case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        throw AmqpError("AMQP failed while " + what + ": " +
                        amqp_error_string2(reply.library_error));
      case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
          const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
          throw AmqpError("RabbitMQ closed the channel while " + what + ": " +
                          std::string(static_cast<const char*>(close->reply_text.bytes),
                                      close->reply_text.len));
        }
        throw AmqpError("RabbitMQ closed the connection while " + what);
    }
  }

  amqp_connection_state_t state_;
  amqp_channel_t channel_ = 1;
};

}  // namespace amqp_example
