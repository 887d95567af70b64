// SPDX-License-Identifier: MIT
// A NATS JetStream consumer over one gate: pull batches from a durable consumer, put them through
// the gate, and ack, redeliver or dead-letter each message by the gate's answer.
#pragma once

#include "../batch.hpp"
#include "../detail/nats/client.hpp"
#include "../errors.hpp"
#include "../key.hpp"
#include "../outcome.hpp"
#include "../shutdown.hpp"
#include "disposition.hpp"

#include <nats/nats.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace idemgate::consumer {

/// Where a JetStream consumer takes its messages from, and how the broker treats them. The
/// stream, the dead-letter stream and the durable consumer are created with these settings by
/// `JetStreamConsumer::declare` (or changed to them, where JetStream allows).
struct JetStreamOptions {
  /// The server, as `nats://host:port`.
  std::string url = "nats://127.0.0.1:4222";
  /// The stream that holds the messages.
  std::string stream = "NOTIFICATIONS";
  /// The subject the stream captures, where producers publish (wildcards allowed).
  std::string subject = "notifications";
  /// The durable pull consumer; every replica of the consumer process uses the same one, and
  /// JetStream spreads the messages among them.
  std::string durable = "idemgate";
  /// The stream's retention: true for a work queue (a message is removed once acknowledged or
  /// dead-lettered), false to keep messages until `max_age`.
  bool work_queue = true;
  /// How long the stream keeps a message at most; 0 keeps it until it is acknowledged (work
  /// queue) or forever.
  std::chrono::milliseconds max_age{0};
  /// File storage (kept across server restarts) or memory storage (lost with the server).
  bool file_storage = true;
  /// AckWait: how long the server waits for an answer to a delivery before it delivers the
  /// message again. The consumer tells the server it is still working every third of it while
  /// the gate holds the message, so it bounds how long a message of a killed consumer waits, not
  /// how long the gate may take.
  std::chrono::milliseconds ack_wait{30'000};
  /// MaxDeliver: after this many deliveries the server gives up on a message and publishes a
  /// MAX_DELIVERIES advisory, which the dead-letter stream captures. 0 means
  /// `poison.max_deliveries + 3`: above the consumer's own limit, so the consumer dead-letters a
  /// message the gate keeps retrying, and the server stops only a message that keeps killing
  /// consumers (or that a long outage of the database kept from an answer).
  std::uint32_t max_deliver = 0;
  /// MaxAckPending: how many messages the durable consumer hands out unacknowledged at a time,
  /// over all consumer processes. At least `batch` times the number of processes.
  std::uint32_t max_ack_pending = 256;
  /// When a message counts as poison (`disposition`).
  PoisonPolicy poison;
  /// The delay of a redelivery asked for by `retry` (NakWithDelay): the broker's own delay, so
  /// that a failing downstream is not asked again at once. Keep `poison.max_deliveries` times it
  /// below the reconciler's `ReconcilerOptions::stale_after` (10 s by default): a transient
  /// failure gives the event's lease back, and once the reconciler takes the event, its
  /// redeliveries are answered `in_flight` and acked, and the reconciler (not the dead-letter
  /// stream) ends up with a poison event, escalating it after `max_attempts`.
  std::chrono::milliseconds retry_delay{500};
  /// How many messages one fetch takes at most; they go through `Gate::process_batch` together.
  std::uint32_t batch = 16;
  /// How long one fetch waits for messages; also how soon a stop is noticed while idle.
  std::chrono::milliseconds fetch_wait{500};
  /// The stream of dead letters; empty means the stream's name followed by `_DEAD`.
  std::string dead_letter_stream;
  /// The subject dead letters are published to; empty means the stream's name after the prefix
  /// "idemgate.dead.". It must not be captured by `stream`.
  std::string dead_letter_subject;
  /// How long the dead-letter stream keeps a letter; 0 keeps it until a human deletes it.
  std::chrono::milliseconds dead_letter_max_age{0};
  /// Reconnection: the pause between attempts (the client reconnects forever).
  std::chrono::milliseconds reconnect_wait{250};
  /// How long the constructor waits for a server that is not up yet.
  std::chrono::milliseconds startup_wait{60'000};
  /// How long a JetStream API request (a declaration, a synchronous ack, a dead-letter publish)
  /// waits for its answer.
  std::chrono::milliseconds request_wait{5'000};

  /// The dead-letter stream's name.
  [[nodiscard]] std::string dead_letter_stream_name() const {
    return dead_letter_stream.empty() ? stream + "_DEAD" : dead_letter_stream;
  }
  /// The dead-letter subject.
  [[nodiscard]] std::string dead_letter_subject_name() const {
    return dead_letter_subject.empty() ? "idemgate.dead." + stream : dead_letter_subject;
  }
  /// The subject of the server's MAX_DELIVERIES advisories for this durable consumer.
  [[nodiscard]] std::string max_deliveries_advisory() const {
    return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + durable;
  }
  /// MaxDeliver as set on the durable consumer.
  [[nodiscard]] std::uint32_t max_deliver_setting() const {
    return max_deliver != 0 ? max_deliver : poison.max_deliveries + 3;
  }
};

/// What the user's function makes of a message's data: the event's idempotency key, derived
/// from the upstream's fields, and the request for the downstream.
template <class Request>
struct JetStreamEvent {
  /// `derive_key(scope, upstream fields...)`: never the stream sequence or any other id of the
  /// message, which is new for every publish of the same event.
  Key key;
  /// What the downstream is asked to do.
  Request request;
};

/// What the consumer did with one message, reported to `JetStreamConsumer::on_settled`.
struct JetStreamSettled {
  /// The message's data.
  std::string_view data;
  /// Its place in the stream.
  std::uint64_t stream_sequence = 0;
  /// This delivery's count, the first being 1.
  std::uint64_t deliveries = 1;
  /// The gate's answer; none when the data did not decode, or the gate threw.
  std::optional<Status> status;
  /// What was done with the message.
  Disposition disposition = Disposition::ack;
  /// Why, when there is more to say: the gate's reason, the exception's text, "malformed".
  std::string_view reason;
  /// False when the broker did not take the settlement (disconnected): the message comes again
  /// after `AckWait`, and the gate answers it again.
  bool settled = true;
};

/// Counts of what a consumer did since it started.
struct JetStreamStats {
  /// Fetches that returned messages.
  std::uint64_t batches = 0;
  /// Messages taken.
  std::uint64_t messages = 0;
  /// Messages acknowledged.
  std::uint64_t acked = 0;
  /// Messages handed back for a redelivery (NakWithDelay, or Nak when stopping).
  std::uint64_t redelivered = 0;
  /// Messages published to the dead-letter subject and terminated.
  std::uint64_t dead_lettered = 0;
  /// Settlements the broker did not take, and failed fetches.
  std::uint64_t broker_errors = 0;
};

/**
 * A consumer loop over one gate and one durable JetStream pull consumer. It fetches up to
 * `batch` messages, derives each one's key and request with the function given (which sees the
 * message's data only, never its sequence or subject), puts the batch through
 * `Gate::process_batch`, and settles each message by `disposition(status, deliveries, poison)`:
 *
 * - `ack`: `AckSync` (the server confirms it);
 * - `redeliver`: `NakWithDelay(retry_delay)`, or a plain `Nak` when the gate is stopping, so that
 *   another consumer takes the message at once;
 * - `dead_letter`: the message is published to the dead-letter subject (with the headers
 *   `Idemgate-Stream`, `Idemgate-Stream-Sequence`, `Idemgate-Subject`, `Idemgate-Deliveries`,
 *   `Idemgate-Status` and `Idemgate-Reason`, and a `Nats-Msg-Id` of the stream's name, a colon
 *   and the sequence, so that the dead-letter stream drops a second copy within its duplicate
 *   window), then terminated (`Term`). Data the function cannot decode is dead-lettered the same
 *   way.
 *
 * When the gate throws (the database is down), no message of the batch is acked or
 * dead-lettered: each is redelivered after `retry_delay`, doubled for each earlier delivery, at
 * most `ack_wait`. While the gate holds a batch, the
 * messages are kept from redelivery by `InProgress` every third of `AckWait`.
 *
 * One thread runs the loop (`run` or `poll_once`); `hand_back` and `stats` may be called from
 * another. Not copyable.
 *
 * Example:
 *   idemgate::consumer::JetStreamConsumer consumer{gate, options, [](std::string_view data) {
 *     const ect_delta::Notification n = parse(data);
 *     return std::optional(idemgate::consumer::JetStreamEvent<SlotRequest>{
 *         idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number),
 *         SlotRequest{n.equipment_number, n.preferred_window}});
 *   }};
 *   consumer.declare();
 *   std::thread loop([&] { consumer.run(sigterm); });
 *   sigterm.wait();
 *   // stop_gracefully (found by argument-dependent lookup) stops the gate first:
 *   if (!stop_gracefully(std::chrono::seconds(20), gate).clean()) consumer.hand_back();
 *   loop.join();
 */
template <class GateType>
class JetStreamConsumer {
 public:
  /// What the gate's downstream is asked to do.
  using request_type = typename GateType::request_type;
  /// The event a message's data decodes to.
  using event_type = JetStreamEvent<request_type>;
  /// The user's function: a message's data to its event; none (or an exception) for data that
  /// is not an event, which is dead-lettered.
  using Decode = std::function<std::optional<event_type>(std::string_view data)>;

  /// Connects to `options.url` (waiting up to `startup_wait` for the server). Nothing is
  /// declared yet: call `declare`, or bind to what an operator declared. Throws `NatsError`.
  JetStreamConsumer(GateType& gate, JetStreamOptions options, Decode decode)
      : gate_(gate), options_(std::move(options)), decode_(std::move(decode)) {
    if (!decode_)
      throw std::invalid_argument(
          "idemgate: JetStreamConsumer needs a function from a message's data to its event");
    if (options_.batch < 1 || options_.batch > 10'000)
      throw std::invalid_argument("idemgate: JetStreamOptions::batch must be from 1 to 10000");
    if (options_.poison.max_deliveries < 1 || options_.poison.max_deliveries > 1000)
      throw std::invalid_argument("idemgate: PoisonPolicy::max_deliveries must be from 1 to 1000");
    if (options_.max_deliver != 0 && options_.max_deliver <= options_.poison.max_deliveries)
      throw std::invalid_argument(
          "idemgate: JetStreamOptions::max_deliver must be above PoisonPolicy::max_deliveries, "
          "or the server gives up on a message before the consumer can dead-letter it; leave it "
          "0 for max_deliveries + 3");
    if (options_.max_ack_pending < options_.batch)
      throw std::invalid_argument(
          "idemgate: JetStreamOptions::max_ack_pending must be at least batch");
    if (options_.ack_wait < std::chrono::milliseconds(300))
      throw std::invalid_argument("idemgate: JetStreamOptions::ack_wait must be 300 ms or more");
    connection_ = detail::nats::connect(options_.url, "idemgate " + options_.durable,
                                        options_.reconnect_wait, options_.startup_wait);
    js_ = detail::nats::jetstream(connection_.get(), options_.request_wait);
  }
  JetStreamConsumer(const JetStreamConsumer&) = delete;
  JetStreamConsumer& operator=(const JetStreamConsumer&) = delete;
  /// Closes the connection; messages taken and not settled are delivered again after `AckWait`.
  ~JetStreamConsumer() = default;

  /// Creates the stream, the dead-letter stream and the durable consumer with the options'
  /// settings, or updates them to those settings; idempotent, so every replica may call it at
  /// start. Throws `NatsError` when JetStream refuses (a setting it cannot change, a subject
  /// another stream captures).
  void declare() {
    const std::string dead_stream = options_.dead_letter_stream_name();
    const std::string dead_subject = options_.dead_letter_subject_name();
    const std::string advisory = options_.max_deliveries_advisory();

    const char* subjects[] = {options_.subject.c_str()};
    jsStreamConfig stream;
    jsStreamConfig_Init(&stream);
    stream.Name = options_.stream.c_str();
    stream.Subjects = subjects;
    stream.SubjectsLen = 1;
    stream.Retention = options_.work_queue ? js_WorkQueuePolicy : js_LimitsPolicy;
    stream.Storage = options_.file_storage ? js_FileStorage : js_MemoryStorage;
    stream.MaxAge = nanoseconds(options_.max_age);
    put_stream(stream);

    const char* dead_subjects[] = {dead_subject.c_str(), advisory.c_str()};
    jsStreamConfig dead;
    jsStreamConfig_Init(&dead);
    dead.Name = dead_stream.c_str();
    dead.Subjects = dead_subjects;
    dead.SubjectsLen = 2;
    dead.Retention = js_LimitsPolicy;
    dead.Storage = options_.file_storage ? js_FileStorage : js_MemoryStorage;
    dead.MaxAge = nanoseconds(options_.dead_letter_max_age);
    put_stream(dead);

    jsConsumerConfig consumer;
    jsConsumerConfig_Init(&consumer);
    consumer.Durable = options_.durable.c_str();
    consumer.DeliverPolicy = js_DeliverAll;
    consumer.AckPolicy = js_AckExplicit;
    consumer.AckWait = nanoseconds(options_.ack_wait);
    consumer.MaxDeliver = options_.max_deliver_setting();
    consumer.MaxAckPending = options_.max_ack_pending;
    consumer.FilterSubject = options_.subject.c_str();
    jsConsumerInfo* info = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    natsStatus status =
        js_AddConsumer(&info, js_.get(), options_.stream.c_str(), &consumer, nullptr, &code);
    if (status != NATS_OK) {
      // It exists with other settings: AckWait, MaxDeliver and MaxAckPending can be changed.
      const std::string added = detail::nats::describe(status, code);
      code = static_cast<jsErrCode>(0);
      status =
          js_UpdateConsumer(&info, js_.get(), options_.stream.c_str(), &consumer, nullptr, &code);
      detail::nats::check(
          status,
          "creating the durable consumer " + options_.durable + " (" + added + ") and updating it",
          "delete the consumer (nats consumer rm) if it was made with another "
          "deliver or ack policy or filter subject, or use another durable name",
          code);
    }
    jsConsumerInfo_Destroy(info);
  }

  /// Takes messages and settles them until `stop` is requested; the batch in hand is finished
  /// (the gate answers `retry` once it is stopping: those messages go back at once). Broker
  /// errors do not end it: it retries after `fetch_wait` and counts them in `stats()`.
  void run(const StopSignal& stop) {
    while (!stop.requested()) {
      if (poll_once() == 0 && broker_trouble_) (void)stop.wait_for(options_.fetch_wait);
    }
  }

  /**
   * One fetch: waits up to `fetch_wait` for up to `batch` messages, puts them through the gate
   * and settles each. Returns how many messages it took (0 when none came or the fetch failed).
   * Throws `NatsError` only when the durable consumer cannot be bound at all.
   */
  std::size_t poll_once() {
    broker_trouble_ = false;
    if (!subscription_) bind();
    detail::nats::MessageList list;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus fetched =
        natsSubscription_Fetch(list.get(), subscription_.get(), static_cast<int>(options_.batch),
                               options_.fetch_wait.count(), &code);
    if (fetched == NATS_TIMEOUT) return 0;
    if (fetched != NATS_OK) {
      // Disconnected, or the server restarting: the client reconnects; the next fetch retries.
      report_error("fetching from " + options_.durable + ": " +
                   detail::nats::describe(fetched, code));
      broker_trouble_ = true;
      return 0;
    }
    const int n = list.size();
    if (n == 0) return 0;
    stats_.batches.fetch_add(1);
    stats_.messages.fetch_add(static_cast<std::uint64_t>(n));
    {
      std::lock_guard lock(hand_mutex_);
      hand_.clear();
      for (int i = 0; i < n; ++i) hand_.push_back({list[i], false});
    }
    keeper_wake_.notify_all();
    process(list);
    {
      std::lock_guard lock(hand_mutex_);
      hand_.clear();
    }
    // Nak and Term are not confirmed: once the server answered this ping it has them.
    natsConnection_FlushTimeout(connection_.get(), options_.request_wait.count());
    return static_cast<std::size_t>(n);
  }

  /// Hands the messages in hand back to the broker at once (`Nak`), for a stop whose grace ran
  /// out (`StopReport::clean()` false): their leases were given back, so the redelivery on
  /// another consumer takes their events over now instead of after `AckWait`. The loop then
  /// settles them no more. Returns how many it handed back.
  std::size_t hand_back() {
    std::lock_guard lock(hand_mutex_);
    std::size_t handed = 0;
    for (Held& held : hand_) {
      if (held.done) continue;
      held.done = true;
      if (natsMsg_Nak(held.message, nullptr) == NATS_OK) {
        ++handed;
        stats_.redelivered.fetch_add(1);
      } else {
        stats_.broker_errors.fetch_add(1);
      }
    }
    return handed;
  }

  /// Called with every message once settled (for logs and metrics), on the loop's thread.
  void on_settled(std::function<void(const JetStreamSettled&)> report) {
    on_settled_ = std::move(report);
  }
  /// Called with a broker error the loop survived (a failed fetch or settlement), on the loop's
  /// thread.
  void on_error(std::function<void(const std::string&)> report) { on_error_ = std::move(report); }

  /// What the consumer did so far.
  [[nodiscard]] JetStreamStats stats() const {
    return {stats_.batches.load(),     stats_.messages.load(),      stats_.acked.load(),
            stats_.redelivered.load(), stats_.dead_lettered.load(), stats_.broker_errors.load()};
  }

  /// The options, with their defaults filled in where the consumer computes them.
  [[nodiscard]] const JetStreamOptions& options() const noexcept { return options_; }

  /// The connection, for publishing beside the consumer (tests, a relay).
  [[nodiscard]] natsConnection* connection() const noexcept { return connection_.get(); }
  /// The JetStream context of the connection.
  [[nodiscard]] jsCtx* jetstream() const noexcept { return js_.get(); }

 private:
  struct Held {
    natsMsg* message;
    bool done;  // settled, or handed back by `hand_back`
  };
  struct Counters {
    std::atomic<std::uint64_t> batches{0}, messages{0}, acked{0}, redelivered{0}, dead_lettered{0},
        broker_errors{0};
  };
  // One message of a fetch on its way through the gate.
  struct Item {
    natsMsg* message;
    std::size_t index;
    detail::nats::Delivery delivery;
    std::string_view data;
    std::optional<std::size_t> batch_index;  // in `messages`, once decoded
  };

  static std::int64_t nanoseconds(std::chrono::milliseconds d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  void put_stream(jsStreamConfig& config) {
    jsStreamInfo* info = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    natsStatus status = js_AddStream(&info, js_.get(), &config, nullptr, &code);
    if (status != NATS_OK) {
      const std::string added = detail::nats::describe(status, code);
      code = static_cast<jsErrCode>(0);
      status = js_UpdateStream(&info, js_.get(), &config, nullptr, &code);
      detail::nats::check(
          status,
          std::string("creating the stream ") + config.Name + " (" + added + ") and updating it",
          "check that JetStream is on (nats-server -js) and that no other stream "
          "captures its subjects; storage and retention cannot be changed on an "
          "existing stream",
          code);
    }
    jsStreamInfo_Destroy(info);
  }

  void bind() {
    jsSubOptions sub_options;
    jsSubOptions_Init(&sub_options);
    sub_options.Stream = options_.stream.c_str();
    sub_options.Consumer = options_.durable.c_str();
    sub_options.ManualAck = true;
    natsSubscription* sub = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    detail::nats::check(
        js_PullSubscribe(&sub, js_.get(), options_.subject.c_str(), options_.durable.c_str(),
                         nullptr, &sub_options, &code),
        "binding to the durable consumer " + options_.durable + " of " + options_.stream,
        "call declare() first, or create the consumer as docs/brokers/"
        "nats-jetstream.md shows",
        code);
    subscription_.reset(sub);
  }

  void process(detail::nats::MessageList& list) {
    const int n = list.size();
    std::vector<Item> items;
    items.reserve(static_cast<std::size_t>(n));
    std::vector<BatchMessage<request_type>> messages;
    for (int i = 0; i < n; ++i) {
      natsMsg* message = list[i];
      Item item{message, static_cast<std::size_t>(i), {}, {}, std::nullopt};
      detail::nats::delivery_of(message, item.delivery);
      item.data = std::string_view(natsMsg_GetData(message),
                                   static_cast<std::size_t>(natsMsg_GetDataLength(message)));
      std::optional<event_type> event;
      try {
        event = decode_(item.data);
      } catch (const std::exception&) {
        event.reset();
      }
      if (event) {
        item.batch_index = messages.size();
        messages.push_back({std::to_string(item.delivery.stream_sequence), std::move(event->key),
                            std::move(event->request)});
      }
      items.push_back(item);
    }
    std::optional<BatchResult<typename GateType::outcome_type>> results;
    std::string failure;
    if (!messages.empty()) {
      try {
        results.emplace(gate_.process_batch(
            std::span<const BatchMessage<request_type>>(messages.data(), messages.size())));
      } catch (const std::exception& e) {
        // No answer for any message: none is acked or dead-lettered; the redeliveries (or the
        // reconciler) finish the events, or answer them from the log where a commit landed.
        failure = e.what();
      }
    }
    for (const Item& item : items) {
      if (!item.batch_index) {
        settle(item, std::nullopt, Disposition::dead_letter, "malformed");
      } else if (!results) {
        settle(item, std::nullopt, Disposition::redeliver, failure);
      } else {
        const auto& result = results->items()[*item.batch_index].result;
        const Status status = result.status();
        Disposition disposition =
            consumer::disposition(status,
                                  static_cast<std::uint32_t>(std::min<std::uint64_t>(
                                      item.delivery.deliveries, UINT32_MAX)),
                                  options_.poison);
        // A stopping gate reserved nothing: that is no failure of the message, never poison.
        if (status == Status::retry && gate_.stopping()) disposition = Disposition::redeliver;
        settle(item, status, disposition, result.reason());
      }
    }
  }

  void settle(const Item& item, std::optional<Status> status, Disposition disposition,
              std::string_view reason) {
    std::unique_lock lock(hand_mutex_);
    Held& held = hand_[item.index];
    if (held.done) return;  // handed back by `hand_back`
    held.done = true;
    bool settled = false;
    switch (disposition) {
      case Disposition::ack: {
        jsErrCode code = static_cast<jsErrCode>(0);
        const natsStatus s = natsMsg_AckSync(item.message, nullptr, &code);
        settled = s == NATS_OK;
        if (settled)
          stats_.acked.fetch_add(1);
        else
          error_ = "acknowledging stream sequence " +
                   std::to_string(item.delivery.stream_sequence) + ": " +
                   detail::nats::describe(s, code);
        break;
      }
      case Disposition::redeliver: {
        const bool at_once = gate_.stopping();
        // No answer (the gate threw): the delay doubles with each delivery, up to AckWait, so
        // that a database outage does not use up MaxDeliver in seconds.
        const auto delay = status ? options_.retry_delay : outage_delay(item.delivery.deliveries);
        const natsStatus s = at_once ? natsMsg_Nak(item.message, nullptr)
                                     : natsMsg_NakWithDelay(item.message, delay.count(), nullptr);
        settled = s == NATS_OK;
        if (settled)
          stats_.redelivered.fetch_add(1);
        else
          error_ = "handing back stream sequence " + std::to_string(item.delivery.stream_sequence) +
                   ": " + detail::nats::describe(s);
        break;
      }
      case Disposition::dead_letter:
        settled = dead_letter(item, status, reason);
        if (settled) stats_.dead_lettered.fetch_add(1);
        break;
    }
    if (!settled) stats_.broker_errors.fetch_add(1);
    std::string error = settled ? std::string() : std::exchange(error_, std::string());
    lock.unlock();
    if (!settled) report_error(error);
    if (on_settled_)
      on_settled_({item.data, item.delivery.stream_sequence, item.delivery.deliveries, status,
                   disposition, reason, settled});
  }

  // Publishes a copy to the dead-letter subject, then terminates the message. A crash between
  // the two redelivers the message, and the gate answers it as before: it is dead-lettered again,
  // and the dead-letter stream drops the second copy by its Nats-Msg-Id within its duplicate
  // window (two minutes by default).
  bool dead_letter(const Item& item, std::optional<Status> status, std::string_view reason) {
    const std::string subject = options_.dead_letter_subject_name();
    natsMsg* raw = nullptr;
    natsStatus s = natsMsg_Create(&raw, subject.c_str(), nullptr, item.data.data(),
                                  static_cast<int>(item.data.size()));
    if (s != NATS_OK) {
      error_ = "creating a dead letter: " + detail::nats::describe(s);
      return false;
    }
    detail::nats::Message copy(raw);
    const std::string sequence = std::to_string(item.delivery.stream_sequence);
    const std::string deliveries = std::to_string(item.delivery.deliveries);
    const std::string answer = status ? std::string(to_string(*status)) : std::string("none");
    const char* original_subject = natsMsg_GetSubject(item.message);
    natsMsgHeader_Set(copy.get(), "Idemgate-Stream", options_.stream.c_str());
    natsMsgHeader_Set(copy.get(), "Idemgate-Stream-Sequence", sequence.c_str());
    natsMsgHeader_Set(copy.get(), "Idemgate-Subject",
                      original_subject != nullptr ? original_subject : "");
    natsMsgHeader_Set(copy.get(), "Idemgate-Deliveries", deliveries.c_str());
    natsMsgHeader_Set(copy.get(), "Idemgate-Status", answer.c_str());
    natsMsgHeader_Set(copy.get(), "Idemgate-Reason", header_value(reason).c_str());
    const std::string id = options_.stream + ":" + sequence;
    const std::string dead_stream = options_.dead_letter_stream_name();
    jsPubOptions publish;
    jsPubOptions_Init(&publish);
    publish.MsgId = id.c_str();
    publish.ExpectStream = dead_stream.c_str();
    jsPubAck* ack = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    s = js_PublishMsg(&ack, js_.get(), copy.get(), &publish, &code);
    detail::nats::PubAck owned(ack);
    if (s != NATS_OK) {
      // Never terminated without its copy: it comes back after the delay and is dead-lettered
      // then.
      error_ = "publishing stream sequence " + sequence + " to the dead-letter subject " + subject +
               ": " + detail::nats::describe(s, code);
      natsMsg_NakWithDelay(item.message, options_.retry_delay.count(), nullptr);
      return false;
    }
    s = natsMsg_Term(item.message, nullptr);
    if (s != NATS_OK) {
      error_ = "terminating stream sequence " + sequence +
               " after dead-lettering it: " + detail::nats::describe(s);
      return false;
    }
    return true;
  }

  // retry_delay doubled for each delivery after the first, at most AckWait.
  std::chrono::milliseconds outage_delay(std::uint64_t deliveries) const {
    auto delay = options_.retry_delay;
    for (std::uint64_t d = 1; d < deliveries && delay < options_.ack_wait; ++d) delay *= 2;
    return std::min(delay, options_.ack_wait);
  }

  // A header value on one line, of bounded length.
  static std::string header_value(std::string_view text) {
    std::string value(text.substr(0, 512));
    for (char& c : value)
      if (c == '\r' || c == '\n') c = ' ';
    return value;
  }

  void report_error(const std::string& what) {
    if (on_error_) on_error_(what);
  }

  // Keeps the messages in hand from redelivery while the gate works on them: InProgress every
  // third of AckWait.
  void keep_in_progress() {
    std::unique_lock lock(hand_mutex_);
    const auto every = std::max(options_.ack_wait / 3, std::chrono::milliseconds(100));
    while (!keeper_stop_) {
      keeper_wake_.wait_for(lock, every);
      if (keeper_stop_) break;
      for (const Held& held : hand_)
        if (!held.done) natsMsg_InProgress(held.message, nullptr);
    }
  }

  GateType& gate_;
  JetStreamOptions options_;
  Decode decode_;
  detail::nats::Connection connection_;
  detail::nats::Context js_;
  detail::nats::Subscription subscription_;
  std::function<void(const JetStreamSettled&)> on_settled_;
  std::function<void(const std::string&)> on_error_;
  Counters stats_;
  bool broker_trouble_ = false;
  std::string error_;  // the last settlement's error, under hand_mutex_

  std::mutex hand_mutex_;
  std::vector<Held> hand_;
  std::condition_variable keeper_wake_;
  bool keeper_stop_ = false;
  // Declared last: it starts once everything it uses is constructed, and stops first.
  struct Keeper {
    JetStreamConsumer* owner;
    std::thread thread;
    explicit Keeper(JetStreamConsumer* o) : owner(o), thread([o] { o->keep_in_progress(); }) {}
    Keeper(const Keeper&) = delete;
    Keeper& operator=(const Keeper&) = delete;
    ~Keeper() {
      {
        std::lock_guard lock(owner->hand_mutex_);
        owner->keeper_stop_ = true;
      }
      owner->keeper_wake_.notify_all();
      thread.join();
    }
  } keeper_{this};
};

}  // namespace idemgate::consumer
