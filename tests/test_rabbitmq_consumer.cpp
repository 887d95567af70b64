// The RabbitMQ consumer example (examples/rabbitmq_consumer/, the application's part over the
// idemgate::amqp component) against a real broker: duplicated deliveries and a consumer killed
// mid-message book each container once; `retry` is redelivered, never acked; conflicts and
// malformed messages land in the dead-letter queue. scripts/test starts the broker and exports
// IDEMGATE_TEST_AMQP; without it these tests fail.

#include <ect_delta/portbase.hpp>
#include <ect_delta/terminal_server.hpp>
#include <idemgate/detail/amqp/channel.hpp>
#include <support/line_process.hpp>
#include <support/postgres.hpp>

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using idemgate::test::LineProcess;
using Channel = idemgate::detail::amqp::Channel;

std::string amqp_address() {
  const char* address = std::getenv("IDEMGATE_TEST_AMQP");
  if (address == nullptr || *address == '\0') {
    ADD_FAILURE() << "IDEMGATE_TEST_AMQP is not set. Run scripts/test, which starts a throwaway "
                     "RabbitMQ on loopback and exports its host:port.";
    return {};
  }
  return address;
}

idemgate::detail::amqp::Endpoint endpoint_of(const std::string& address) {
  idemgate::detail::amqp::Endpoint e;
  e.host = address.substr(0, address.rfind(':'));
  e.port = std::stoi(address.substr(address.rfind(':') + 1));
  return e;
}

/// True for the line of a delivery of `id` that is not its first.
bool redelivery_of(const std::string& line, const std::string& id) {
  const std::string begin = "begin " + id + " ";
  return line.rfind(begin, 0) == 0 && std::stoi(line.substr(begin.size())) > 1;
}

std::string message(const ect_delta::Notification& n) {
  return "{\"notification_id\":\"" + n.notification_id + "\",\"equipment_number\":\"" +
         n.equipment_number + "\",\"preferred_window\":\"" + n.preferred_window + "\"}";
}

/// A database, a queue and a fake terminal of this test's own, and consumer processes on them.
class RabbitMqConsumer : public ::testing::Test {
 protected:
  void SetUp() override {
    amqp_ = amqp_address();
    const std::string base = idemgate::test::pg_uri();
    ASSERT_FALSE(amqp_.empty());
    ASSERT_FALSE(base.empty());
    const std::string name = idemgate::test::unique_table("rabbit");
    idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)");
    idemgate::test::pg_exec("CREATE DATABASE " + name);
    database_ = name;
    uri_ = base.substr(0, base.rfind('/') + 1) + name;
    queue_ = "portbase." + name;
    terminal_.start();
    channel_ = std::make_unique<Channel>(endpoint_of(amqp_));
    channel_->declare_quorum_with_dead_letter(queue_, queue_ + ".dlx", queue_ + ".dead");
  }
  void TearDown() override {
    consumers_.clear();
    channel_.reset();
    if (!database_.empty())
      idemgate::test::pg_exec("DROP DATABASE IF EXISTS " + database_ + " WITH (FORCE)");
  }

  /// Starts a consumer with a short lease and a fast reconciler, so what a kill strands is
  /// finished within seconds.
  /// `options` replace those options.
  LineProcess& start_consumer(std::vector<std::string> options = {
                                  "--lease-ms", "1500", "--reconcile-interval-ms", "300",
                                  "--stale-after-ms", "0", "--requeue-delay-ms", "100"}) {
    std::vector<std::string> argv{
        RABBITMQ_CONSUMER_PATH, "--amqp",     amqp_, "--queue", queue_, "--pg", uri_, "--terminal",
        terminal_.base_url(),   "--prefetch", "2"};
    argv.insert(argv.end(), options.begin(), options.end());
    consumers_.push_back(std::make_unique<LineProcess>(argv));
    EXPECT_TRUE(consumers_.back()->wait_for_line("ready", 60s)) << "the consumer did not start";
    return *consumers_.back();
  }

  std::int64_t count(const std::string& sql) { return idemgate::test::pg_count_on(uri_, sql); }

  /// Waits until `bookings` containers are booked and nothing is in flight.
  bool settled(std::int64_t bookings, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (count("SELECT count(DISTINCT container) FROM tms_bookings") >= bookings &&
          count("SELECT count(*) FROM idemgate_log WHERE status = 'in_flight'") == 0 &&
          channel_->ready(queue_) == 0)
        return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  /// Waits until `queue` holds `messages` ready messages. The broker puts a nacked or orphaned
  /// message back asynchronously, after the consumer that held it is gone.
  bool ready_within(const std::string& queue, std::uint32_t messages,
                    std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (channel_->ready(queue) != messages) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }

  std::string amqp_, uri_, queue_, database_;
  ect_delta::TerminalServer terminal_;
  std::unique_ptr<Channel> channel_;
  std::vector<std::unique_ptr<LineProcess>> consumers_;
};

TEST_F(RabbitMqConsumer, DuplicatedDeliveriesAndAConsumerKilledMidMessageBookEachContainerOnce) {
  auto notifications = ect_delta::monday_notifications();
  notifications.resize(12);
  std::vector<ect_delta::Notification> deliveries;
  for (std::size_t i = 0; i < notifications.size(); ++i)
    for (std::size_t copy = 0; copy <= i % 3; ++copy) deliveries.push_back(notifications[i]);
  std::shuffle(deliveries.begin(), deliveries.end(), std::mt19937(7));
  // Every claim takes a while at the terminal, so the kill lands inside one.
  terminal_.set_latency(300ms);
  LineProcess& first = start_consumer();
  for (const auto& n : deliveries) channel_->publish(queue_, message(n));

  const auto begun =
      first.wait_for([](const std::string& l) { return l.rfind("begin ", 0) == 0; }, 30s);
  ASSERT_TRUE(begun);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (terminal_.claims_in_progress() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  ASSERT_GT(terminal_.claims_in_progress(), 0) << "no claim in progress to kill the consumer in";
  first.kill_now();
  // The notification it was working on: the last one begun and not done.
  std::string stranded;
  for (const auto& line : first.lines()) {
    if (line.text.rfind("begin ", 0) == 0)
      stranded = line.text.substr(6, line.text.find(' ', 6) - 6);
    if (line.text.rfind("done " + stranded + " ", 0) == 0) stranded.clear();
  }
  ASSERT_FALSE(stranded.empty());

  LineProcess& second = start_consumer();
  LineProcess& third = start_consumer();
  ASSERT_TRUE(settled(12, 60s)) << "not every container was booked within a minute";

  EXPECT_EQ(count("SELECT count(*) FROM tms_bookings"), 12);
  EXPECT_EQ(count("SELECT count(*) FROM (SELECT container FROM tms_bookings GROUP BY container "
                  "HAVING count(*) <> 1) AS twice"),
            0);
  for (const auto& n : notifications) EXPECT_EQ(terminal_.slots_for(n.equipment_number), 1u);
  EXPECT_EQ(terminal_.max_distinct_slots_per_key(), 1u);
  // The broker handed the killed consumer's message to another consumer, marked redelivered.
  const auto redelivered = [&](const std::string& l) { return redelivery_of(l, stranded); };
  EXPECT_TRUE(second.wait_for(redelivered, 0s) || third.wait_for(redelivered, 0s))
      << stranded << " was not redelivered";
  EXPECT_EQ(channel_->ready(queue_ + ".dead"), 0u);
}

TEST_F(RabbitMqConsumer, SigtermFinishesTheMessageInHandWithinTheGraceAndAcksIt) {
  const auto n = ect_delta::monday_notifications().front();
  terminal_.set_latency(1s);
  LineProcess& consumer = start_consumer({"--grace-ms", "20000"});
  channel_->publish(queue_, message(n));
  ASSERT_TRUE(consumer.wait_for_line("begin " + n.notification_id + " 1", 30s));
  // SIGTERM once the claim is at the terminal: the message is then in hand, its key reserved.
  // (A SIGTERM between "begin" and the reservation is answered retry and requeued instead.)
  const auto claim_deadline = std::chrono::steady_clock::now() + 30s;
  while (terminal_.claims_received() == 0 && std::chrono::steady_clock::now() < claim_deadline)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(terminal_.claims_received(), 1);
  consumer.signal(SIGTERM);
  EXPECT_EQ(consumer.wait_exit(30s), std::optional<int>(0));
  EXPECT_TRUE(consumer.wait_for_line("done " + n.notification_id + " processed ack", 0s));
  EXPECT_TRUE(consumer.wait_for_line("stopped", 0s));
  EXPECT_EQ(count("SELECT count(*) FROM tms_bookings"), 1);
  EXPECT_EQ(count("SELECT count(*) FROM idemgate_log WHERE status = 'in_flight'"), 0);
  EXPECT_EQ(channel_->ready(queue_), 0u);
}

TEST_F(RabbitMqConsumer, AMessageSlowerThanTheGraceIsRequeuedWithItsLeaseGivenBack) {
  const auto n = ect_delta::monday_notifications().front();
  // The claim outlasts the grace; the lease is the library's default (10 s).
  terminal_.set_latency(4s);
  LineProcess& first = start_consumer({"--grace-ms", "300", "--no-reconciler"});
  channel_->publish(queue_, message(n));
  ASSERT_TRUE(first.wait_for_line("begin " + n.notification_id + " 1", 30s));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (terminal_.claims_in_progress() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  ASSERT_GT(terminal_.claims_in_progress(), 0);
  first.signal(SIGTERM);
  EXPECT_EQ(first.wait_exit(30s), std::optional<int>(0));
  EXPECT_TRUE(first.wait_for_line("requeue in-hand", 0s));
  EXPECT_TRUE(first.wait_for_line("stopped", 0s));
  EXPECT_FALSE(first.wait_for_line("done " + n.notification_id + " processed ack", 0s))
      << "an unfinished message was acked";
  EXPECT_TRUE(ready_within(queue_, 1, 10s)) << "the unfinished message is not back in the queue";

  // The redelivery takes the event over at once: its lease was given back, so the next consumer
  // processes it instead of finding it in flight under a live lease.
  terminal_.set_latency(0ms);
  // The terminal still holds the first consumer's claim of that key for up to 4 s and answers the
  // second's claims retry meanwhile: each is a delivery, so the poison limit must outlast them.
  LineProcess& second = start_consumer({"--no-reconciler", "--max-deliveries", "1000"});
  ASSERT_TRUE(second.wait_for(
      [&](const std::string& l) { return redelivery_of(l, n.notification_id); }, 30s));
  EXPECT_TRUE(second.wait_for_line("done " + n.notification_id + " processed ack", 30s)) << [&] {
    std::string all;
    for (const auto& line : second.lines()) all += line.text + '\n';
    return all;
  }();
  ASSERT_TRUE(settled(1, 30s));
  EXPECT_EQ(count("SELECT count(*) FROM tms_bookings"), 1);
  EXPECT_EQ(terminal_.max_distinct_slots_per_key(), 1u);
}

TEST_F(RabbitMqConsumer, RetryIsRequeuedAndRedeliveredNeverAcked) {
  const auto n = ect_delta::monday_notifications().front();
  terminal_.fail_next_claims(1, 503);  // a transient failure: the gate answers retry
  LineProcess& consumer = start_consumer();
  channel_->publish(queue_, message(n));
  const auto retried = consumer.wait_for(
      [&](const std::string& l) { return l == "done " + n.notification_id + " retry redeliver"; },
      30s);
  ASSERT_TRUE(retried);
  const auto again = consumer.wait_for(
      [&](const std::string& l) { return redelivery_of(l, n.notification_id); }, 30s, *retried);
  ASSERT_TRUE(again) << "the retried message was not redelivered";
  EXPECT_TRUE(consumer.wait_for(
      [&](const std::string& l) { return l == "done " + n.notification_id + " processed ack"; },
      30s, *again));
  ASSERT_TRUE(settled(1, 30s));
  EXPECT_EQ(count("SELECT count(*) FROM tms_bookings"), 1);
  EXPECT_EQ(terminal_.claims_received(), 2);
}

TEST_F(RabbitMqConsumer, ConflictsAndMalformedMessagesGoToTheDeadLetterQueue) {
  const auto n = ect_delta::monday_notifications().front();
  LineProcess& consumer = start_consumer();
  channel_->publish(queue_, message(n));
  ASSERT_TRUE(consumer.wait_for_line("done " + n.notification_id + " processed ack", 30s));
  auto changed = n;
  changed.preferred_window = "2025-06-10T09:00";  // same notification, another request
  const std::string conflicting = message(changed);
  channel_->publish(queue_, conflicting);
  channel_->publish(queue_, "{\"equipment_number\":\"MSKU1\"}");
  ASSERT_TRUE(consumer.wait_for_line("done " + n.notification_id + " conflict dead-letter", 30s));
  ASSERT_TRUE(consumer.wait_for_line("done - malformed dead-letter", 30s));

  const std::string dead = queue_ + ".dead";
  std::vector<std::string> dead_lettered;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (dead_lettered.size() < 2 && std::chrono::steady_clock::now() < deadline)
    if (auto body = channel_->take(dead))
      dead_lettered.push_back(*body);
    else
      std::this_thread::sleep_for(50ms);
  ASSERT_EQ(dead_lettered.size(), 2u);
  std::vector<std::string> expected{conflicting, "{\"equipment_number\":\"MSKU1\"}"};
  std::sort(dead_lettered.begin(), dead_lettered.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(dead_lettered, expected);
  EXPECT_EQ(count("SELECT count(*) FROM tms_bookings"), 1);
  EXPECT_EQ(terminal_.slots_issued(), 1);
}

}  // namespace
