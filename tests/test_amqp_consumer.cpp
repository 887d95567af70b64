// The RabbitMQ consumer (idemgate::consumer::AmqpConsumer) over a real broker: acks only what
// the gate settled, takes the arrived prefetch as one batch, redelivers a retry with the quorum
// queue's delivery count until the poison limit and then dead-letters it, dead-letters
// conflicts and malformed messages, never dead-letters what a stopping gate turned away; and the
// kill-and-restart run (tests/brokers/kill_and_restart.hpp). scripts/test starts the broker and
// exports IDEMGATE_TEST_AMQP and IDEMGATE_TEST_AMQP_RESTART; without them these tests fail.

#include <brokers/in_process.hpp>
#include <brokers/kill_and_restart.hpp>
#include <idemgate/consumer/amqp.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using idemgate::Status;
using idemgate::consumer::AmqpConsumer;
using idemgate::consumer::AmqpOptions;
using idemgate::consumer::Disposition;
using idemgate::detail::amqp::Channel;
using idemgate::detail::amqp::Endpoint;
namespace brokers = idemgate::test::brokers;

std::string amqp_address() {
  const char* address = std::getenv("IDEMGATE_TEST_AMQP");
  if (address == nullptr || *address == '\0') {
    ADD_FAILURE() << "IDEMGATE_TEST_AMQP is not set. Run scripts/test, which starts a throwaway "
                     "RabbitMQ on loopback and exports its host:port.";
    return {};
  }
  return address;
}

Endpoint endpoint_of(const std::string& address) {
  Endpoint e;
  e.host = address.substr(0, address.rfind(':'));
  e.port = std::stoi(address.substr(address.rfind(':') + 1));
  return e;
}

std::string unique_queue(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return "idemgate." + stem + "." + std::to_string(::getpid()) + "." + info->name();
}

/// The broker side of a test: a queue of its own, declared as the consumer declares it.
class AmqpBroker : public idemgate::test::BrokerDriver {
 public:
  explicit AmqpBroker(std::string queue) : address_(amqp_address()), queue_(std::move(queue)) {
    if (address_.empty()) return;
    channel().declare_quorum_with_dead_letter(queue_, queue_ + ".dlx", queue_ + ".dead");
  }
  [[nodiscard]] bool usable() const { return !address_.empty(); }
  [[nodiscard]] std::string broker() const override { return "amqp"; }
  [[nodiscard]] std::string address() const override { return address_; }
  [[nodiscard]] std::string queue() const override { return queue_; }
  void publish(const std::string& body) override { channel().publish(queue_, body); }
  void publish_all(const std::vector<std::string>& bodies) override {
    channel().publish_all(queue_, bodies);
  }
  /// Ready messages: while consumers run, those they hold are not counted; once they stopped,
  /// the broker has put back whatever they held, so zero then means nothing was left unacked.
  [[nodiscard]] std::size_t unsettled() override { return fresh().ready(queue_); }
  /// The dead letters so far: taken from the dead-letter queue and kept here.
  [[nodiscard]] std::vector<std::string> dead_letters() override {
    Channel c{endpoint_of(address_)};
    while (auto body = c.take(queue_ + ".dead")) dead_.push_back(*body);
    return dead_;
  }
  /// The dead letters once there are `n` of them: the quorum queue dead-letters at least once,
  /// through a worker of its own, a moment after the reject.
  std::vector<std::string> dead_letters_within(std::size_t n, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto dead = dead_letters();
    while (dead.size() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
      dead = dead_letters();
    }
    return dead;
  }
  bool restart() override {
    channel_.reset();
    return idemgate::test::run_restart_script("IDEMGATE_TEST_AMQP_RESTART");
  }
  /// Waits until the queue holds `n` ready messages.
  bool ready_within(std::uint32_t n, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (unsettled() != n) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }

 private:
  Channel& channel() {
    if (!channel_) channel_ = std::make_unique<Channel>(endpoint_of(address_));
    return *channel_;
  }
  Channel& fresh() {
    channel_.reset();
    return channel();
  }

  std::string address_, queue_;
  std::unique_ptr<Channel> channel_;
  std::vector<std::string> dead_;
};

/// A consumer of the test's queue over a RecordingGate, its settlements seen by the test.
class AmqpConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(broker_.usable()); }

  AmqpOptions options() {
    AmqpOptions o;
    o.address = broker_.address();
    o.queue = broker_.queue();
    o.prefetch = 8;
    o.poison.max_deliveries = 3;
    o.redelivery_delay = 50ms;
    o.poll = 50ms;
    o.on_settled = settlements_.hook();
    o.on_error = [](std::string_view what) { ADD_FAILURE() << what; };
    return o;
  }

  AmqpBroker broker_{unique_queue("consumer")};
  brokers::RecordingGate gate_;
  brokers::Settlements settlements_;
};

TEST_F(AmqpConsumerTest, AcksWhatTheGateSettledAndTakesTheArrivedPrefetchAsOneBatch) {
  for (const char* body : {"n1|v", "n2|v", "n1|v", "n3|v", "n4|v", "n2|v", "n5|v", "n6|v"})
    broker_.publish(body);
  ASSERT_TRUE(broker_.ready_within(8, 10s));
  idemgate::StopSignal stop;
  AmqpConsumer consumer{gate_, &brokers::decode, options()};
  {
    brokers::Running running{consumer, stop};
    const auto seen = settlements_.wait(8, 20s);
    ASSERT_EQ(seen.size(), 8u);
    int processed = 0, duplicates = 0;
    for (const auto& s : seen) {
      EXPECT_EQ(s.disposition, Disposition::ack) << s.body;
      processed += s.status == Status::processed;
      duplicates += s.status == Status::duplicate;
    }
    EXPECT_EQ(processed, 6);
    EXPECT_EQ(duplicates, 2);
  }
  // The eight were waiting: they came as one prefetch and went through the gate as one batch.
  const auto batches = gate_.batches();
  ASSERT_FALSE(batches.empty());
  EXPECT_GT(*std::max_element(batches.begin(), batches.end()), 1u);
  EXPECT_EQ(broker_.unsettled(), 0u) << "an acked message came back";
  EXPECT_TRUE(broker_.dead_letters().empty());
}

TEST_F(AmqpConsumerTest, RetryIsRedeliveredWithTheBrokersCountUntilThePoisonLimitThenDeadLettered) {
  broker_.publish("poison1|v");
  idemgate::StopSignal stop;
  AmqpConsumer consumer{gate_, &brokers::decode, options()};
  brokers::Running running{consumer, stop};
  const auto seen = settlements_.wait(3, 20s);
  ASSERT_EQ(seen.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].deliveries, i + 1) << "the quorum queue's x-delivery-count";
    EXPECT_EQ(seen[i].status, Status::retry);
    EXPECT_EQ(seen[i].disposition, i < 2 ? Disposition::redeliver : Disposition::dead_letter);
  }
  running.finish();
  EXPECT_EQ(gate_.ledger().claims_of("poison1"), 3) << "retried more than the limit allows";
  EXPECT_EQ(broker_.dead_letters_within(1, 10s), std::vector<std::string>{"poison1|v"});
  EXPECT_EQ(broker_.unsettled(), 0u) << "the poison message is still in the queue";
}

TEST_F(AmqpConsumerTest, ConflictsAndMalformedMessagesAreDeadLetteredNeverRequeued) {
  broker_.publish("n1|v1");
  idemgate::StopSignal stop;
  AmqpConsumer consumer{gate_, &brokers::decode, options()};
  brokers::Running running{consumer, stop};
  ASSERT_EQ(settlements_.wait(1, 20s).size(), 1u);
  broker_.publish("n1|v2");             // the same notification, another request
  broker_.publish("no bar, no event");  // does not decode
  const auto seen = settlements_.wait(3, 20s);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].status, Status::conflict);
  EXPECT_EQ(seen[1].disposition, Disposition::dead_letter);
  EXPECT_EQ(seen[2].status, std::nullopt);
  EXPECT_EQ(seen[2].disposition, Disposition::dead_letter);
  running.finish();
  auto dead = broker_.dead_letters_within(2, 10s);
  std::sort(dead.begin(), dead.end());
  EXPECT_EQ(dead, (std::vector<std::string>{"n1|v2", "no bar, no event"}));
  EXPECT_EQ(broker_.unsettled(), 0u);
}

TEST_F(AmqpConsumerTest, WhatAStoppingGateTurnsAwayIsRequeuedNeverDeadLettered) {
  auto o = options();
  o.poison.max_deliveries = 1;  // a retry of the message's own would be dead-lettered at once
  gate_.gate().begin_stop();
  broker_.publish("n1|v");
  idemgate::StopSignal stop;
  AmqpConsumer consumer{gate_, &brokers::decode, o};
  {
    brokers::Running running{consumer, stop};
    const auto seen = settlements_.wait(1, 20s);
    ASSERT_GE(seen.size(), 1u);
    EXPECT_EQ(seen[0].status, Status::retry);
    EXPECT_EQ(seen[0].disposition, Disposition::redeliver);
  }
  EXPECT_TRUE(broker_.ready_within(1, 10s)) << "the message is not back in the queue";
  EXPECT_TRUE(broker_.dead_letters().empty());
  EXPECT_EQ(gate_.ledger().claims_of("n1"), 0);
}

TEST_F(AmqpConsumerTest, StoppingReturnsFromRunAndTheBrokerKeepsWhatWasNotSettled) {
  idemgate::StopSignal stop;
  AmqpConsumer consumer{gate_, &brokers::decode, options()};
  brokers::Running running{consumer, stop};
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!consumer.connected() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(consumer.connected());
  running.finish();  // returns: the loop looks at the stop signal between waits
  EXPECT_FALSE(consumer.connected());
  broker_.publish("n1|v");
  EXPECT_TRUE(broker_.ready_within(1, 10s));
}

TEST(AmqpConsumer, KillAndBrokerRestartBookEveryNotificationExactlyOnce) {
  AmqpBroker broker{unique_queue("kill")};
  ASSERT_TRUE(broker.usable());
  idemgate::test::kill_and_restart(broker, BOOKING_CONSUMER_PATH);
}

}  // namespace
