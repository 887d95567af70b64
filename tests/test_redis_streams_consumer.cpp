// The Redis Streams consumer (idemgate::consumer::RedisStreamsConsumer) over a real server:
// acks only what the gate settled, reads the stream in batches of COUNT, leaves a retry
// pending and claims it again (XAUTOCLAIM) with its times-delivered until the poison limit, then
// dead-letters it (XADD to the dead-letter stream, XACK); dead-letters conflicts and malformed
// entries; claims the pending entries of a consumer that died; and the kill-and-restart run
// (tests/brokers/kill_and_restart.hpp). scripts/test starts the server and exports
// IDEMGATE_TEST_REDIS and IDEMGATE_TEST_REDIS_RESTART; without them these tests fail.

#include <brokers/in_process.hpp>
#include <brokers/kill_and_restart.hpp>
#include <idemgate/consumer/redis_streams.hpp>

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
using idemgate::consumer::Disposition;
using idemgate::consumer::RedisStreamsConsumer;
using idemgate::consumer::RedisStreamsOptions;
using idemgate::detail::redis::Connection;
using idemgate::detail::redis::Endpoint;
using idemgate::detail::redis::Reply;
namespace brokers = idemgate::test::brokers;

std::string redis_address() {
  const char* address = std::getenv("IDEMGATE_TEST_REDIS");
  if (address == nullptr || *address == '\0') {
    ADD_FAILURE() << "IDEMGATE_TEST_REDIS is not set. Run scripts/test, which starts a throwaway "
                     "Redis on loopback and exports its host:port.";
    return {};
  }
  return address;
}

std::string unique_stream(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return "idemgate." + stem + "." + std::to_string(::getpid()) + "." + info->name();
}

/// The server side of a test: a stream and consumer group of its own.
class RedisBroker : public idemgate::test::BrokerDriver {
 public:
  explicit RedisBroker(std::string stream) : address_(redis_address()), stream_(std::move(stream)) {
    if (address_.empty()) return;
    endpoint_.host = address_.substr(0, address_.rfind(':'));
    endpoint_.port = std::stoi(address_.substr(address_.rfind(':') + 1));
    connection().create_group(stream_, group());
  }
  [[nodiscard]] bool usable() const { return !address_.empty(); }
  [[nodiscard]] std::string group() const { return "bookers"; }
  [[nodiscard]] std::string broker() const override { return "redis"; }
  [[nodiscard]] std::string address() const override { return address_; }
  [[nodiscard]] std::string queue() const override { return stream_; }
  void publish(const std::string& body) override { connection().add(stream_, {{"body", body}}); }
  /// Entries not yet delivered to the group (its lag) and entries pending (delivered, unacked).
  [[nodiscard]] std::size_t unsettled() override {
    const Reply groups = connection().checked({"XINFO", "GROUPS", stream_});
    for (const Reply& g : groups.elements) {
      long long pending = -1, lag = -1;
      std::string name;
      for (std::size_t i = 0; i + 1 < g.elements.size(); i += 2) {
        if (g.elements[i].text == "name") name = g.elements[i + 1].text;
        if (g.elements[i].text == "pending") pending = g.elements[i + 1].integer;
        if (g.elements[i].text == "lag") lag = g.elements[i + 1].integer;
      }
      if (name == group()) return static_cast<std::size_t>(pending + lag);
    }
    ADD_FAILURE() << "no group " << group() << " on " << stream_;
    return 0;
  }
  /// Pending entries of the group.
  [[nodiscard]] std::size_t pending() {
    return static_cast<std::size_t>(
        connection().checked({"XPENDING", stream_, group()}).elements.at(0).integer);
  }
  /// Every body in the dead-letter stream, in order.
  [[nodiscard]] std::vector<std::string> dead_letters() override {
    std::vector<std::string> bodies;
    const Reply entries = connection().checked({"XRANGE", stream_ + ".dead", "-", "+"});
    for (const auto& e : idemgate::detail::redis::entries_of(entries))
      bodies.push_back(e.fields.at("body"));
    return bodies;
  }
  bool restart() override {
    connection_.reset();
    return idemgate::test::run_restart_script("IDEMGATE_TEST_REDIS_RESTART");
  }
  /// A connection of the test's own.
  Connection& connection() {
    if (!connection_) connection_ = std::make_unique<Connection>(endpoint_, 10s);
    return *connection_;
  }

 private:
  std::string address_, stream_;
  Endpoint endpoint_;
  std::unique_ptr<Connection> connection_;
};

class RedisStreamsConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(broker_.usable()); }

  RedisStreamsOptions options() {
    RedisStreamsOptions o;
    o.address = broker_.address();
    o.stream = broker_.queue();
    o.group = broker_.group();
    o.consumer = "c1";
    o.count = 8;
    o.poison.max_deliveries = 3;
    o.claim_idle = 100ms;
    o.claim_interval = 20ms;
    o.poll = 50ms;
    o.on_settled = settlements_.hook();
    o.on_error = [](std::string_view what) { ADD_FAILURE() << what; };
    return o;
  }

  RedisBroker broker_{unique_stream("consumer")};
  brokers::RecordingGate gate_;
  brokers::Settlements settlements_;
};

TEST_F(RedisStreamsConsumerTest, AcksWhatTheGateSettledAndReadsCountEntriesAsOneBatch) {
  for (const char* body : {"n1|v", "n2|v", "n1|v", "n3|v", "n4|v", "n2|v", "n5|v", "n6|v"})
    broker_.publish(body);
  idemgate::StopSignal stop;
  RedisStreamsConsumer consumer{gate_, &brokers::decode, options()};
  {
    brokers::Running running{consumer, stop};
    const auto seen = settlements_.wait(8, 20s);
    ASSERT_EQ(seen.size(), 8u);
    int processed = 0, duplicates = 0;
    for (const auto& s : seen) {
      EXPECT_EQ(s.disposition, Disposition::ack) << s.body;
      EXPECT_EQ(s.deliveries, 1u);
      processed += s.status == Status::processed;
      duplicates += s.status == Status::duplicate;
    }
    EXPECT_EQ(processed, 6);
    EXPECT_EQ(duplicates, 2);
  }
  EXPECT_EQ(gate_.batches(), std::vector<std::size_t>{8}) << "XREADGROUP COUNT 8: one batch";
  EXPECT_EQ(broker_.unsettled(), 0u);
  EXPECT_TRUE(broker_.dead_letters().empty());
}

TEST_F(RedisStreamsConsumerTest,
       RetryStaysPendingIsClaimedAgainUntilThePoisonLimitThenDeadLettered) {
  broker_.publish("poison1|v");
  idemgate::StopSignal stop;
  RedisStreamsConsumer consumer{gate_, &brokers::decode, options()};
  brokers::Running running{consumer, stop};
  const auto seen = settlements_.wait(3, 20s);
  ASSERT_EQ(seen.size(), 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].deliveries, i + 1) << "XPENDING's times-delivered";
    EXPECT_EQ(seen[i].status, Status::retry);
    EXPECT_EQ(seen[i].disposition, i < 2 ? Disposition::redeliver : Disposition::dead_letter);
  }
  running.finish();
  EXPECT_EQ(gate_.ledger().claims_of("poison1"), 3);
  EXPECT_EQ(broker_.dead_letters(), std::vector<std::string>{"poison1|v"});
  EXPECT_EQ(broker_.unsettled(), 0u) << "the poison entry is still pending";
}

TEST_F(RedisStreamsConsumerTest, ConflictsAndMalformedEntriesAreDeadLetteredAndAcked) {
  broker_.publish("n1|v1");
  idemgate::StopSignal stop;
  RedisStreamsConsumer consumer{gate_, &brokers::decode, options()};
  brokers::Running running{consumer, stop};
  ASSERT_EQ(settlements_.wait(1, 20s).size(), 1u);
  broker_.publish("n1|v2");
  broker_.publish("no bar, no event");
  const auto seen = settlements_.wait(3, 20s);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].status, Status::conflict);
  EXPECT_EQ(seen[1].disposition, Disposition::dead_letter);
  EXPECT_EQ(seen[2].status, std::nullopt);
  EXPECT_EQ(seen[2].disposition, Disposition::dead_letter);
  running.finish();
  EXPECT_EQ(broker_.dead_letters(), (std::vector<std::string>{"n1|v2", "no bar, no event"}));
  EXPECT_EQ(broker_.unsettled(), 0u);
}

TEST_F(RedisStreamsConsumerTest, TheIdlePendingEntriesOfADeadConsumerAreClaimedAndSettled) {
  broker_.publish("n1|v");
  broker_.publish("n2|v");
  // A consumer that read both and died before settling them.
  const auto read =
      broker_.connection().read_new(broker_.queue(), broker_.group(), "dead", 10, 100ms);
  ASSERT_EQ(read.size(), 2u);
  ASSERT_EQ(broker_.pending(), 2u);
  idemgate::StopSignal stop;
  RedisStreamsConsumer consumer{gate_, &brokers::decode, options()};
  brokers::Running running{consumer, stop};
  const auto seen = settlements_.wait(2, 20s);
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& s : seen) {
    EXPECT_EQ(s.status, Status::processed);
    EXPECT_EQ(s.deliveries, 2u) << "a claimed entry is a second delivery";
    EXPECT_EQ(s.disposition, Disposition::ack);
  }
  running.finish();
  EXPECT_EQ(broker_.pending(), 0u);
}

TEST_F(RedisStreamsConsumerTest, WhatAStoppingGateTurnsAwayStaysPendingNeverDeadLettered) {
  auto o = options();
  o.poison.max_deliveries = 1;
  gate_.gate().begin_stop();
  broker_.publish("n1|v");
  idemgate::StopSignal stop;
  RedisStreamsConsumer consumer{gate_, &brokers::decode, o};
  {
    brokers::Running running{consumer, stop};
    const auto seen = settlements_.wait(1, 20s);
    ASSERT_GE(seen.size(), 1u);
    EXPECT_EQ(seen[0].status, Status::retry);
    EXPECT_EQ(seen[0].disposition, Disposition::redeliver);
  }
  EXPECT_EQ(broker_.pending(), 1u);
  EXPECT_TRUE(broker_.dead_letters().empty());
}

TEST(RedisStreamsConsumer, KillAndServerRestartBookEveryNotificationExactlyOnce) {
  RedisBroker broker{unique_stream("kill")};
  ASSERT_TRUE(broker.usable());
  idemgate::test::kill_and_restart(broker, BOOKING_CONSUMER_PATH, {"--claim-idle-ms", "2000"});
}

}  // namespace
