// The NATS JetStream consumer (consumer/nats.hpp) over a real nats-server: every answer of the
// gate settles its message as disposition() says (ack, NakWithDelay, dead-letter stream), fetches
// go through process_batch, the stream and consumer carry AckWait and MaxDeliver, the server's
// MAX_DELIVERIES advisory lands in the dead-letter stream, InProgress keeps a slow message from
// redelivery, a stop hands the messages in hand back; and consumer processes killed mid-message,
// with the server restarted, book 1,000 notifications exactly once. scripts/test starts the
// server and exports IDEMGATE_TEST_NATS (and IDEMGATE_TEST_NATS_CONFIG, to restart it); without
// them these tests fail.

#include "support/fake_terminal.hpp"
#include "support/line_process.hpp"
#include "support/memory_bookings.hpp"
#include "support/pg_bookings.hpp"
#include "support/pg_terminal.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/consumer/nats.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/memory.hpp>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using idemgate::Gate;
using idemgate::MemoryStore;
using idemgate::Status;
using idemgate::consumer::Disposition;
using idemgate::consumer::JetStreamConsumer;
using idemgate::consumer::JetStreamEvent;
using idemgate::consumer::JetStreamOptions;
using idemgate::test::FakeTerminal;
using idemgate::test::LineProcess;
using idemgate::test::MemoryBookings;
using idemgate::test::SlotRequest;
namespace natsd = idemgate::detail::nats;

std::string nats_url() {
  const char* url = std::getenv("IDEMGATE_TEST_NATS");
  if (url == nullptr || *url == '\0') {
    ADD_FAILURE() << "IDEMGATE_TEST_NATS is not set. Run scripts/test, which starts a throwaway "
                     "nats-server with JetStream on loopback and exports its URL.";
    return {};
  }
  return url;
}

/// A name unique to this process and test, for streams, subjects and durables.
std::string unique_name(const std::string& stem) {
  std::string name = stem;
  for (char c : idemgate::test::unique_table("n"))
    name += static_cast<char>(std::isalnum(static_cast<unsigned char>(c)) ? std::toupper(c) : '_');
  return name;
}

/// "<id>|<container>|<window>" to its event; the key from the notification id only.
std::optional<JetStreamEvent<SlotRequest>> decode(std::string_view data) {
  const auto first = data.find('|');
  if (first == data.npos || first == 0) return std::nullopt;
  const auto second = data.find('|', first + 1);
  if (second == data.npos) return std::nullopt;
  return JetStreamEvent<SlotRequest>{
      idemgate::derive_key("ect.claim_slot", std::string(data.substr(0, first))),
      SlotRequest{std::string(data.substr(first + 1, second - first - 1)),
                  std::string(data.substr(second + 1))}};
}

/// A connection of the test's own, to publish and to look at streams and consumers.
class Broker {
 public:
  explicit Broker(const std::string& url)
      : connection_(natsd::connect(url, "idemgate test", 100ms, 30s)),
        js_(natsd::jetstream(connection_.get(), 5s)) {}

  /// Publishes `data` to `subject` and waits for the stream to store it. A publish retried after
  /// an unanswered attempt carries the same Nats-Msg-Id, so the stream stores it once.
  void publish(const std::string& subject, const std::string& data) {
    const std::string id = subject + "#" + std::to_string(++published_);
    jsPubOptions options;
    jsPubOptions_Init(&options);
    options.MsgId = id.c_str();
    // Patient: after a restart the server recovers its streams before it takes a publish, which
    // on a machine busy with disk work can take many seconds.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      jsPubAck* ack = nullptr;
      jsErrCode code = static_cast<jsErrCode>(0);
      const natsStatus s = js_Publish(&ack, js_.get(), subject.c_str(), data.data(),
                                      static_cast<int>(data.size()), &options, &code);
      jsPubAck_Destroy(ack);
      if (s == NATS_OK) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "publishing to " << subject << ": " << natsd::describe(s, code);
      std::this_thread::sleep_for(100ms);
    }
  }

  struct ConsumerState {
    std::int64_t ack_pending = -1;
    std::uint64_t pending = 0;
    std::int64_t redelivered = 0;
    std::int64_t ack_wait_ns = 0;
    std::int64_t max_deliver = 0;
    std::int64_t max_ack_pending = 0;
  };
  ConsumerState consumer(const std::string& stream, const std::string& durable) {
    jsConsumerInfo* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus s =
        js_GetConsumerInfo(&raw, js_.get(), stream.c_str(), durable.c_str(), nullptr, &code);
    natsd::ConsumerInfo info(raw);
    if (s != NATS_OK) {
      ADD_FAILURE() << "consumer info of " << durable << ": " << natsd::describe(s, code);
      return {};
    }
    return {info->NumAckPending,   info->NumPending,         info->NumRedelivered,
            info->Config->AckWait, info->Config->MaxDeliver, info->Config->MaxAckPending};
  }

  /// Messages stored in `stream`.
  std::uint64_t messages(const std::string& stream) {
    jsStreamInfo* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus s = js_GetStreamInfo(&raw, js_.get(), stream.c_str(), nullptr, &code);
    natsd::StreamInfo info(raw);
    if (s != NATS_OK) {
      ADD_FAILURE() << "stream info of " << stream << ": " << natsd::describe(s, code);
      return 0;
    }
    return info->State.Msgs;
  }

  struct Letter {
    std::string subject;
    std::string data;
    std::map<std::string, std::string> headers;
  };
  /// Every message of `stream`, in order.
  std::vector<Letter> letters(const std::string& stream) {
    std::vector<Letter> out;
    jsStreamInfo* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    if (js_GetStreamInfo(&raw, js_.get(), stream.c_str(), nullptr, &code) != NATS_OK) {
      ADD_FAILURE() << "no stream " << stream;
      return out;
    }
    natsd::StreamInfo info(raw);
    for (std::uint64_t seq = info->State.FirstSeq; seq != 0 && seq <= info->State.LastSeq; ++seq) {
      natsMsg* m = nullptr;
      if (js_GetMsg(&m, js_.get(), stream.c_str(), seq, nullptr, &code) != NATS_OK) continue;
      natsd::Message message(m);
      Letter letter{
          natsMsg_GetSubject(m),
          std::string(natsMsg_GetData(m), static_cast<std::size_t>(natsMsg_GetDataLength(m))),
          {}};
      const char** keys = nullptr;
      int count = 0;
      if (natsMsgHeader_Keys(m, &keys, &count) == NATS_OK) {
        for (int i = 0; i < count; ++i) {
          const char* value = nullptr;
          if (natsMsgHeader_Get(m, keys[i], &value) == NATS_OK) letter.headers[keys[i]] = value;
        }
        std::free(static_cast<void*>(keys));
      }
      out.push_back(std::move(letter));
    }
    return out;
  }

  void remove_stream(const std::string& stream) {
    js_DeleteStream(js_.get(), stream.c_str(), nullptr, nullptr);
  }

  jsCtx* js() { return js_.get(); }

 private:
  natsd::Connection connection_;
  natsd::Context js_;
  std::uint64_t published_ = 0;
};

/// Waits up to `timeout` for `done`; true when it came.
template <class Done>
bool eventually(Done done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

/// A raw pull subscription bound to the durable consumer of `options`: another replica, which
/// takes messages and never answers.
natsd::Subscription pull(Broker& broker, const JetStreamOptions& options) {
  jsSubOptions sub_options;
  jsSubOptions_Init(&sub_options);
  sub_options.Stream = options.stream.c_str();
  sub_options.Consumer = options.durable.c_str();
  sub_options.ManualAck = true;
  natsSubscription* raw = nullptr;
  const natsStatus s = js_PullSubscribe(&raw, broker.js(), options.subject.c_str(),
                                        options.durable.c_str(), nullptr, &sub_options, nullptr);
  EXPECT_EQ(s, NATS_OK) << natsd::describe(s);
  return natsd::Subscription(raw);
}

/// Throws from on_result while `failing` is set: `process_batch` then has no answer for its
/// batch, as when the database is down.
struct FailingObserver {
  std::atomic<bool> failing{false};
  void on_result(const idemgate::Key&, Status, std::chrono::nanoseconds) {
    if (failing) throw std::runtime_error("the log's database is down");
  }
  void on_reconciled(const idemgate::Key&, Status) {}
  void on_mismatch(const idemgate::Key&, std::string_view, std::string_view) {}
};

/// A stream, its dead-letter stream and a durable consumer of this test's own, on the test
/// server, with an in-process gate on MemoryStore in front of a fake terminal.
class NatsJetStream : public ::testing::Test {
 protected:
  void SetUp() override {
    url = nats_url();
    ASSERT_FALSE(url.empty());
    broker = std::make_unique<Broker>(url);
    options.url = url;
    options.stream = unique_name("T");
    options.subject = "test." + options.stream;
    options.durable = "d" + options.stream;
    options.ack_wait = 2s;
    options.retry_delay = 300ms;
    options.fetch_wait = 200ms;
    options.poison.max_deliveries = 3;
    options.file_storage = false;
  }
  void TearDown() override {
    if (broker) {
      broker->remove_stream(options.stream);
      broker->remove_stream(options.dead_letter_stream_name());
    }
  }

  /// Publishes notification `id` for `container`.
  void publish(const std::string& id, const std::string& container) {
    broker->publish(options.subject, id + "|" + container + "|2025-06-09T07:00");
  }

  /// Polls `consumer` until `done` or `timeout`.
  template <class Consumer, class Done>
  bool poll_until(Consumer& consumer, Done done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      consumer.poll_once();
    }
    return true;
  }

  /// Nothing delivered and unacknowledged, nothing left to deliver.
  void expect_nothing_left() {
    // Nak and Term have no confirmation: the server may take a moment to count them.
    eventually(
        [&] {
          const auto state = broker->consumer(options.stream, options.durable);
          return state.ack_pending == 0 && state.pending == 0;
        },
        2s);
    const auto state = broker->consumer(options.stream, options.durable);
    EXPECT_EQ(state.ack_pending, 0) << "messages delivered and never settled";
    EXPECT_EQ(state.pending, 0u) << "messages never delivered";
  }

  std::string url;
  std::unique_ptr<Broker> broker;
  JetStreamOptions options;
  MemoryStore store;
  FakeTerminal<> terminal;
  MemoryBookings bookings;
};

TEST_F(NatsJetStream, DeclareSetsAckWaitMaxDeliverAndMaxAckPendingOnTheDurableConsumer) {
  options.ack_wait = 7s;
  options.max_ack_pending = 40;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  consumer.declare();  // idempotent: every replica declares at start
  auto state = broker->consumer(options.stream, options.durable);
  EXPECT_EQ(state.ack_wait_ns, 7'000'000'000);
  EXPECT_EQ(state.max_deliver, 6) << "poison.max_deliveries + 3";
  EXPECT_EQ(state.max_ack_pending, 40);
  // Changed settings are applied to the existing consumer.
  options.ack_wait = 9s;
  options.max_deliver = 20;
  JetStreamConsumer changed{gate, options, decode};
  changed.declare();
  state = broker->consumer(options.stream, options.durable);
  EXPECT_EQ(state.ack_wait_ns, 9'000'000'000);
  EXPECT_EQ(state.max_deliver, 20);
  EXPECT_EQ(broker->messages(options.dead_letter_stream_name()), 0u);
}

TEST_F(NatsJetStream, AStreamJetStreamCannotChangeFailsDeclareSayingWhatToDo) {
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  options.file_storage = !options.file_storage;
  JetStreamConsumer other{gate, options, decode};
  try {
    other.declare();
    ADD_FAILURE() << "declare() changed the storage of an existing stream";
  } catch (const idemgate::NatsError& e) {
    EXPECT_NE(std::string(e.what()).find("creating the stream " + options.stream),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("storage and retention cannot be changed"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(NatsJetStream, AMaxDeliverNotAboveThePoisonLimitIsRefused) {
  options.max_deliver = 3;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  EXPECT_THROW((JetStreamConsumer{gate, options, decode}), std::invalid_argument);
}

TEST_F(NatsJetStream, ProcessedAndDuplicatesAreAckedInBatchesThroughProcessBatch) {
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  options.batch = 8;
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  for (int i = 0; i < 6; ++i) publish("N" + std::to_string(i), "MSKU" + std::to_string(i));
  for (int i = 0; i < 2; ++i) publish("N" + std::to_string(i), "MSKU" + std::to_string(i));
  std::map<std::string, int> statuses;
  consumer.on_settled([&](const idemgate::consumer::JetStreamSettled& s) {
    EXPECT_EQ(s.disposition, Disposition::ack);
    EXPECT_TRUE(s.settled);
    ++statuses[std::string(idemgate::to_string(*s.status))];
  });
  ASSERT_TRUE(poll_until(
      consumer, [&] { return consumer.stats().messages == 8; }, 10s));
  EXPECT_EQ(statuses["processed"], 6);
  EXPECT_EQ(statuses["duplicate"], 2);
  EXPECT_EQ(bookings.size(), 6u);
  EXPECT_EQ(consumer.stats().acked, 8u);
  EXPECT_LT(consumer.stats().batches, 8u) << "one fetch, one process_batch, several messages";
  expect_nothing_left();
  EXPECT_EQ(broker->messages(options.stream), 0u) << "a work queue keeps no acked message";
}

TEST_F(NatsJetStream, RetryIsRedeliveredAfterTheRetryDelayAndNeverAcked) {
  std::atomic<int> refusals{1};
  terminal.before = [&](const SlotRequest&,
                        const idemgate::Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (refusals.fetch_sub(1) > 0) return idemgate::TransientFailure{"terminal busy"};
    return std::nullopt;
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  std::vector<std::pair<std::uint64_t, std::chrono::steady_clock::time_point>> deliveries;
  std::vector<Disposition> dispositions;
  consumer.on_settled([&](const idemgate::consumer::JetStreamSettled& s) {
    deliveries.push_back({s.deliveries, std::chrono::steady_clock::now()});
    dispositions.push_back(s.disposition);
  });
  publish("N1", "MSKU1");
  ASSERT_TRUE(poll_until(
      consumer, [&] { return dispositions.size() == 2; }, 10s));
  EXPECT_EQ(dispositions[0], Disposition::redeliver);
  EXPECT_EQ(dispositions[1], Disposition::ack);
  EXPECT_EQ(deliveries[0].first, 1u);
  EXPECT_EQ(deliveries[1].first, 2u) << "the broker's own redelivery, counted";
  EXPECT_GE(deliveries[1].second - deliveries[0].second, 250ms)
      << "redelivered before the retry delay (NakWithDelay)";
  EXPECT_LT(deliveries[1].second - deliveries[0].second, 1500ms)
      << "redelivered after AckWait, not after the retry delay";
  EXPECT_EQ(bookings.size(), 1u);
  expect_nothing_left();
}

TEST_F(NatsJetStream, RetryAtThePoisonLimitIsDeadLetteredNotRequeuedForever) {
  terminal.before = [](const SlotRequest&,
                       const idemgate::Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    return idemgate::TransientFailure{"terminal refuses for now"};
  };
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  publish("N1", "MSKU1");
  const auto seen = [&] {
    const auto stats = consumer.stats();
    return "terminal calls " + std::to_string(terminal.calls()) + ", messages " +
           std::to_string(stats.messages) + ", acked " + std::to_string(stats.acked) +
           ", redelivered " + std::to_string(stats.redelivered) + ", dead-lettered " +
           std::to_string(stats.dead_lettered) + ", broker errors " +
           std::to_string(stats.broker_errors);
  };
  ASSERT_TRUE(poll_until(
      consumer, [&] { return consumer.stats().dead_lettered == 1; }, 15s))
      << seen();
  EXPECT_EQ(terminal.calls(), 3) << "poison.max_deliveries deliveries, then the dead letter; "
                                 << seen();
  EXPECT_EQ(consumer.stats().redelivered, 2u) << seen();
  // Nothing comes back.
  for (int i = 0; i < 4; ++i) consumer.poll_once();
  EXPECT_EQ(terminal.calls(), 3);
  const auto letters = broker->letters(options.dead_letter_stream_name());
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].subject, options.dead_letter_subject_name());
  EXPECT_EQ(letters[0].data, "N1|MSKU1|2025-06-09T07:00");
  EXPECT_EQ(letters[0].headers.at("Idemgate-Status"), "retry");
  EXPECT_EQ(letters[0].headers.at("Idemgate-Deliveries"), "3");
  EXPECT_EQ(letters[0].headers.at("Idemgate-Stream"), options.stream);
  EXPECT_EQ(letters[0].headers.at("Idemgate-Stream-Sequence"), "1");
  EXPECT_EQ(letters[0].headers.at("Idemgate-Subject"), options.subject);
  EXPECT_EQ(letters[0].headers.at("Idemgate-Reason"), "terminal refuses for now");
  EXPECT_EQ(letters[0].headers.at("Nats-Msg-Id"), options.stream + ":1");
  expect_nothing_left();
  EXPECT_EQ(broker->messages(options.stream), 0u) << "a terminated message leaves the work queue";
}

TEST_F(NatsJetStream, ConflictAndMalformedDataAreDeadLetteredAtOnce) {
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  publish("N1", "MSKU1");
  publish("N1", "TGHU2");  // the same notification id with another container
  broker->publish(options.subject, "not a notification");
  ASSERT_TRUE(poll_until(
      consumer, [&] { return consumer.stats().messages == 3; }, 10s));
  EXPECT_EQ(consumer.stats().dead_lettered, 2u);
  const auto letters = broker->letters(options.dead_letter_stream_name());
  ASSERT_EQ(letters.size(), 2u);
  std::set<std::string> answers;
  for (const auto& l : letters) answers.insert(l.headers.at("Idemgate-Status"));
  EXPECT_EQ(answers, (std::set<std::string>{"conflict", "none"}));
  for (const auto& l : letters) EXPECT_EQ(l.headers.at("Idemgate-Deliveries"), "1");
  EXPECT_EQ(bookings.size(), 1u);
  expect_nothing_left();
}

TEST_F(NatsJetStream, EscalatedIsDeadLettered) {
  FakeTerminal<false> no_keys;  // cannot take idempotency keys: every event goes to a human
  Gate gate{"ect.claim_slot", store, no_keys, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  publish("N1", "MSKU1");
  ASSERT_TRUE(poll_until(
      consumer, [&] { return consumer.stats().messages == 1; }, 10s));
  const auto letters = broker->letters(options.dead_letter_stream_name());
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].headers.at("Idemgate-Status"), "escalated");
  EXPECT_EQ(no_keys.calls(), 0);
  expect_nothing_left();
}

TEST_F(NatsJetStream, AGateThatThrowsHasItsBatchRedeliveredNeverAckedNorDeadLettered) {
  FailingObserver observer;
  observer.failing = true;
  Gate gate{"ect.claim_slot",        store,   terminal, bookings.writer(),
            idemgate::GateOptions{}, observer};
  options.poison.max_deliveries = 1;  // even past the poison limit: an outage is no poison
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  std::map<std::uint64_t, std::vector<std::chrono::steady_clock::time_point>> deliveries;
  consumer.on_settled([&](const idemgate::consumer::JetStreamSettled& s) {
    deliveries[s.stream_sequence].push_back(std::chrono::steady_clock::now());
  });
  publish("N1", "MSKU1");
  publish("N2", "MSKU2");
  ASSERT_TRUE(poll_until(
      consumer, [&] { return consumer.stats().redelivered >= 6; }, 10s));
  EXPECT_EQ(consumer.stats().acked, 0u);
  // The delay doubles while the outage lasts: 300 ms, then 600 ms.
  const auto& first = deliveries[1];
  ASSERT_GE(first.size(), 3u);
  EXPECT_GE(first[2] - first[1], 550ms) << "the outage delay did not grow";
  EXPECT_LT(first[1] - first[0], 550ms);
  EXPECT_EQ(consumer.stats().dead_lettered, 0u);
  observer.failing = false;
  ASSERT_TRUE(poll_until(
      consumer, [&] { return consumer.stats().acked == 2; }, 10s));
  EXPECT_EQ(bookings.size(), 2u);
  EXPECT_EQ(consumer.stats().dead_lettered, 0u);
  expect_nothing_left();
}

TEST_F(NatsJetStream, ASlowMessageIsKeptInProgressPastAckWait) {
  options.ack_wait = 1s;
  terminal.set_delay(2500ms);
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  publish("N1", "MSKU1");
  std::thread slow([&] {
    poll_until(
        consumer, [&] { return consumer.stats().acked == 1; }, 10s);
  });
  ASSERT_TRUE(eventually([&] { return terminal.calls() == 1; }, 5s));
  // Another replica asks for messages the whole time the gate works: the server would hand it
  // the message once AckWait ran out, had the consumer not kept it in progress.
  natsd::Subscription other = pull(*broker, options);
  int redelivered = 0;
  for (int i = 0; i < 2; ++i) {
    natsd::MessageList list;
    if (natsSubscription_Fetch(list.get(), other.get(), 1, 1200, nullptr) == NATS_OK)
      redelivered += list.size();
  }
  slow.join();
  EXPECT_EQ(redelivered, 0) << "the server redelivered a message the gate was still working on";
  EXPECT_EQ(consumer.stats().acked, 1u);
  EXPECT_EQ(bookings.size(), 1u);
  expect_nothing_left();
}

TEST_F(NatsJetStream, TheServersMaxDeliveriesAdvisoryLandsInTheDeadLetterStream) {
  options.ack_wait = 1s;
  options.max_deliver = 4;
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  publish("N1", "MSKU1");
  // A consumer that takes the message and dies before answering, four times over.
  natsd::Subscription sub = pull(*broker, options);
  int taken = 0;
  for (int i = 0; i < 12 && taken < 4; ++i) {
    natsd::MessageList list;
    if (natsSubscription_Fetch(list.get(), sub.get(), 1, 1500, nullptr) == NATS_OK)
      taken += list.size();
  }
  ASSERT_EQ(taken, 4);
  // The server gives up when it would deliver it a fifth time: while a replica asks again.
  int fifth = 0;
  for (int i = 0; i < 3 && broker->messages(options.dead_letter_stream_name()) == 0; ++i) {
    natsd::MessageList list;
    if (natsSubscription_Fetch(list.get(), sub.get(), 1, 1500, nullptr) == NATS_OK)
      fifth += list.size();
  }
  EXPECT_EQ(fifth, 0) << "delivered past MaxDeliver";
  ASSERT_TRUE(
      eventually([&] { return broker->messages(options.dead_letter_stream_name()) == 1; }, 3s));
  const auto letters = broker->letters(options.dead_letter_stream_name());
  EXPECT_EQ(letters[0].subject, options.max_deliveries_advisory());
  EXPECT_NE(letters[0].data.find("\"stream_seq\":1"), std::string::npos) << letters[0].data;
  EXPECT_EQ(broker->messages(options.stream), 1u) << "the message stays where a human reads it";
  EXPECT_EQ(bookings.size(), 0u);
}

TEST_F(NatsJetStream, AStopFinishesTheBatchInHandOrHandsItBackAtOnce) {
  // A stop whose grace outlasts the call: the message is finished and acked, then run returns.
  terminal.set_delay(600ms);
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  idemgate::StopSignal stop;
  publish("N1", "MSKU1");
  std::thread loop([&] { consumer.run(stop); });
  ASSERT_TRUE(eventually([&] { return terminal.calls() == 1; }, 10s));
  stop.request();
  const auto report = idemgate::stop_gracefully(5s, gate);
  loop.join();
  EXPECT_TRUE(report.clean());
  EXPECT_EQ(consumer.stats().acked, 1u);
  EXPECT_EQ(bookings.size(), 1u);
  expect_nothing_left();
}

TEST_F(NatsJetStream, AMessageStillInHandWhenTheGraceRunsOutIsHandedBackAtOnce) {
  terminal.set_delay(3s);
  options.retry_delay = 10s;  // a hand-back must not wait for it
  Gate gate{"ect.claim_slot", store, terminal, bookings.writer()};
  JetStreamConsumer consumer{gate, options, decode};
  consumer.declare();
  idemgate::StopSignal stop;
  publish("N1", "MSKU1");
  std::thread loop([&] { consumer.run(stop); });
  ASSERT_TRUE(eventually([&] { return terminal.calls() == 1; }, 10s));
  stop.request();
  const auto report = idemgate::stop_gracefully(100ms, gate);
  EXPECT_FALSE(report.clean());
  EXPECT_EQ(consumer.hand_back(), 1u);
  const auto handed = std::chrono::steady_clock::now();
  // Another consumer gets it at once, as its second delivery, and finishes the event.
  MemoryStore other_store;
  FakeTerminal<> other_terminal;
  MemoryBookings other_bookings;
  Gate other_gate{"ect.claim_slot", other_store, other_terminal, other_bookings.writer()};
  JetStreamConsumer other{other_gate, options, decode};
  std::vector<std::uint64_t> deliveries;
  other.on_settled(
      [&](const idemgate::consumer::JetStreamSettled& s) { deliveries.push_back(s.deliveries); });
  ASSERT_TRUE(poll_until(
      other, [&] { return other.stats().acked == 1; }, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - handed, 1500ms)
      << "waited for AckWait or the retry delay";
  EXPECT_EQ(deliveries, std::vector<std::uint64_t>{2});
  loop.join();
  EXPECT_EQ(consumer.stats().acked, 0u) << "a handed-back message is settled no more";
  expect_nothing_left();
}

// --- consumer processes over PostgreSQL, killed and restarted, with the server restarted ---

/// Restarts the server of scripts/test from its config, its JetStream store kept.
void restart_server() {
  const char* config = std::getenv("IDEMGATE_TEST_NATS_CONFIG");
  ASSERT_TRUE(config != nullptr && *config != '\0')
      << "IDEMGATE_TEST_NATS_CONFIG is not set; run scripts/test";
  const std::string dir = std::string(config).substr(0, std::string(config).rfind('/'));
  std::ifstream pid_file(dir + "/nats.pid");
  pid_t pid = 0;
  ASSERT_TRUE(pid_file >> pid) << "no pid file in " << dir;
  const std::string out = dir + "/server.out";  // built before fork: the child only execs
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_TRUE(eventually([&] { return ::kill(pid, 0) != 0; }, 20s)) << "nats-server did not stop";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Detached, like the server scripts/test started: it outlives this test.
    setsid();
    if (fork() != 0) _exit(0);
    const int log = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    execlp("nats-server", "nats-server", "-c", config, static_cast<char*>(nullptr));
    _exit(127);
  }
  waitpid(child, nullptr, 0);
}

class NatsKillAndRestart : public ::testing::Test {
 protected:
  void SetUp() override {
    url = nats_url();
    const std::string base = idemgate::test::pg_uri();
    ASSERT_FALSE(url.empty());
    ASSERT_FALSE(base.empty());
    database = idemgate::test::unique_table("nats");
    idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + database + " WITH (FORCE)");
    idemgate::test::pg_exec("CREATE DATABASE " + database);
    uri = base.substr(0, base.rfind('/') + 1) + database;
    idemgate::test::pg_exec_on(uri, idemgate::test::bookings_ddl("bookings"));
    idemgate::test::PgTerminal::create(uri, "terminal_slots");
    stream = unique_name("K");
    broker = std::make_unique<Broker>(url);
  }
  void TearDown() override {
    consumers.clear();
    if (broker) {
      broker->remove_stream(stream);
      broker->remove_stream(stream + "_DEAD");
    }
    if (!database.empty())
      idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + database + " WITH (FORCE)");
  }

  LineProcess& start_consumer(const std::string& stall_at = "0") {
    consumers.push_back(std::make_unique<LineProcess>(std::vector<std::string>{
        NATS_CONSUMER_PATH, "--nats", url, "--stream", stream, "--subject", "kill." + stream,
        "--durable", "booker", "--pg", uri, "--stall-at", stall_at}));
    EXPECT_TRUE(consumers.back()->wait_for_line("ready", 60s)) << "a consumer did not start";
    return *consumers.back();
  }

  std::int64_t count(const std::string& sql) { return idemgate::test::pg_count_on(uri, sql); }

  std::string url, uri, database, stream;
  std::unique_ptr<Broker> broker;
  std::vector<std::unique_ptr<LineProcess>> consumers;
};

TEST_F(NatsKillAndRestart, EveryNotificationIsBookedExactlyOnceAndPoisonIsDeadLettered) {
  const auto started = std::chrono::steady_clock::now();
  // Stalls in its 50th claim, mid-message: early enough that it gets there by the 600th
  // notification however unevenly the server splits the messages between the two consumers.
  LineProcess& doomed = start_consumer("50");
  start_consumer();
  const std::string subject = "kill." + stream;
  auto notification = [](int i) {
    return "CIS-" + std::to_string(i) + "|MSKU" + std::to_string(7'000'000 + i) + "|w";
  };
  // 1,000 notifications, every fifth published twice, five that the terminal refuses every
  // time, and five that reuse a notification id with another container (conflicts).
  for (int i = 0; i < 1000; ++i) {
    ASSERT_NO_FATAL_FAILURE(broker->publish(subject, notification(i)));
    if (i % 5 == 0 && i >= 10) {
      ASSERT_NO_FATAL_FAILURE(broker->publish(subject, notification(i - 10)));
    }
    if (i == 600) {
      if (!doomed.wait_for([](const std::string& l) { return l.rfind("stalled ", 0) == 0; }, 60s)) {
        for (std::size_t c = 0; c < consumers.size(); ++c) {
          const auto lines = consumers[c]->lines();
          std::string tail;
          for (std::size_t l = lines.size() > 10 ? lines.size() - 10 : 0; l < lines.size(); ++l)
            tail += "\n  " + lines[l].text;
          ADD_FAILURE() << "consumer " << c << " said " << lines.size()
                        << " lines, the last:" << tail;
        }
        FAIL() << "the first consumer never reached its 50th claim";
      }
      doomed.kill_now();  // SIGKILL between the terminal's slot and the gate's commit
      start_consumer();   // its replacement
    }
    if (i == 800) {
      restart_server();
      if (HasFatalFailure()) return;
    }
  }
  for (int i = 990; i < 1000; i += 5)
    ASSERT_NO_FATAL_FAILURE(broker->publish(subject, notification(i)));
  for (int i = 0; i < 5; ++i) {
    ASSERT_NO_FATAL_FAILURE(broker->publish(
        subject, "POISON-" + std::to_string(i) + "|POISON-" + std::to_string(i) + "|w"));
    ASSERT_NO_FATAL_FAILURE(broker->publish(
        subject, "CIS-" + std::to_string(100 + i) + "|TGHU" + std::to_string(i) + "|w"));
  }

  // The poison events stay in the log for the reconciler (in flight, then escalated after its
  // max_attempts); every other event must be finished.
  std::string poison_keys;
  for (int i = 0; i < 5; ++i)
    poison_keys += std::string(i == 0 ? "" : ", ") + "decode('" +
                   idemgate::derive_key("ect.claim_slot", "POISON-" + std::to_string(i)).hex() +
                   "', 'hex')";
  const std::string unfinished =
      "SELECT count(*) FROM idemgate_log WHERE status = 'in_flight'"
      " AND key NOT IN (" +
      poison_keys + ")";
  const bool settled = eventually(
      [&] {
        if (count("SELECT count(*) FROM bookings") < 1000) return false;
        if (count(unfinished) != 0) return false;
        const auto state = broker->consumer(stream, "booker");
        return state.ack_pending == 0 && state.pending == 0 &&
               broker->messages(stream + "_DEAD") >= 10;
      },
      90s);
  EXPECT_TRUE(settled) << "bookings " << count("SELECT count(*) FROM bookings") << ", in flight "
                       << count(unfinished) << ", unacknowledged "
                       << broker->consumer(stream, "booker").ack_pending << ", undelivered "
                       << broker->consumer(stream, "booker").pending << ", dead letters "
                       << broker->messages(stream + "_DEAD");
  if (!settled) {
    for (const auto& consumer : consumers)
      for (const auto& line : consumer->lines())
        if (line.text.find("POISON") != std::string::npos) ADD_FAILURE() << line.text;
  }
  EXPECT_EQ(count("SELECT count(*) FROM bookings"), 1000);
  EXPECT_EQ(count("SELECT count(DISTINCT source_event) FROM bookings"), 1000)
      << "a notification booked twice";
  EXPECT_EQ(count("SELECT count(*) FROM terminal_slots"), 1000) << "a slot claimed twice";
  idemgate::test::expect_no_half_state(uri, "idemgate_log", "bookings");
  const auto state = broker->consumer(stream, "booker");
  EXPECT_EQ(state.ack_pending, 0) << "messages delivered and never settled";
  EXPECT_EQ(state.pending, 0u) << "messages never delivered";
  EXPECT_EQ(broker->messages(stream), 0u) << "messages left in the work queue";

  // The poison: five refused to the end, five conflicts, each once.
  std::map<std::string, std::set<std::string>> dead;  // status -> stream sequences
  for (const auto& letter : broker->letters(stream + "_DEAD"))
    dead[letter.headers.at("Idemgate-Status")].insert(
        letter.headers.at("Idemgate-Stream-Sequence"));
  EXPECT_EQ(dead["retry"].size(), 5u);
  EXPECT_EQ(dead["conflict"].size(), 5u);
  EXPECT_EQ(dead.size(), 2u);
  EXPECT_EQ(count("SELECT count(*) FROM idemgate_log WHERE key IN (" + poison_keys +
                  ") AND status IN ('in_flight', 'escalated')"),
            5)
      << "a poison event left the log's hands";

  for (auto& consumer : consumers) consumer->signal(SIGTERM);
  for (auto& consumer : consumers) {
    if (consumer->pid() > 0) {
      EXPECT_EQ(consumer->wait_exit(30s), 0);
    }
  }
  RecordProperty("seconds", static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(
                                                 std::chrono::steady_clock::now() - started)
                                                 .count()));
}

}  // namespace
