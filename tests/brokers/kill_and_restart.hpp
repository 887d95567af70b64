#pragma once

// The kill-and-restart run every broker consumer passes, over a real broker: 1,000
// notifications (a third of them published twice), five conflicting twins, five poison
// notifications and three malformed messages through consumer processes (booking_consumer) on
// one PostgreSQL database; one consumer killed by SIGKILL while the downstream is called for a
// message, the broker restarted once. At the end every notification is booked exactly once,
// nothing is left unsettled, and the poison, conflicting and malformed messages are in the
// dead-letter place. Each broker's test provides a `BrokerDriver`.

#include <support/line_process.hpp>
#include <support/postgres.hpp>

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::test {

/// What the run needs of a broker: feed it, look into it, restart it.
class BrokerDriver {
 public:
  virtual ~BrokerDriver() = default;
  /// The broker's name for booking_consumer's --broker.
  [[nodiscard]] virtual std::string broker() const = 0;
  /// The broker's host:port.
  [[nodiscard]] virtual std::string address() const = 0;
  /// The queue or stream the consumers read.
  [[nodiscard]] virtual std::string queue() const = 0;
  /// Publishes one message.
  virtual void publish(const std::string& body) = 0;
  /// Publishes each body in turn; a broker that can await many at once does so.
  virtual void publish_all(const std::vector<std::string>& bodies) {
    for (const auto& body : bodies) publish(body);
  }
  /// Messages published and not yet settled (ready, delivered and unacked, or pending).
  [[nodiscard]] virtual std::size_t unsettled() = 0;
  /// Every body in the dead-letter place, read without removing them.
  [[nodiscard]] virtual std::vector<std::string> dead_letters() = 0;
  /// Stops the broker and starts it again on the same port and files; false when that failed.
  virtual bool restart() = 0;
};

/// Runs `restart`, a script that the test run exported in `variable`.
inline bool run_restart_script(const char* variable) {
  const char* script = std::getenv(variable);
  if (script == nullptr || *script == '\0') {
    ADD_FAILURE() << variable << " is not set: scripts/test exports it with the broker";
    return false;
  }
  return std::system(script) == 0;
}

/// The run itself; `consumer_path` is booking_consumer's path.
inline void kill_and_restart(BrokerDriver& broker, const std::string& consumer_path,
                             const std::vector<std::string>& extra_options = {}) {
  using namespace std::chrono_literals;
  const std::string base = pg_uri();
  ASSERT_FALSE(base.empty());
  const std::string database = unique_table("brokers");
  pg_exec("DROP DATABASE IF EXISTS " + database + " WITH (FORCE)");
  pg_exec("CREATE DATABASE " + database);
  const std::string uri = base.substr(0, base.rfind('/') + 1) + database;
  auto count = [&](const std::string& sql) { return pg_count_on(uri, sql); };

  char id[32];
  std::vector<std::string> bodies;
  std::set<std::string> expected_dead;
  std::vector<std::string> twins;
  for (int i = 0; i < 1000; ++i) {
    std::snprintf(id, sizeof id, "n%04d", i);
    bodies.push_back(std::string(id) + "|v1");
    if (i % 3 == 0) bodies.push_back(std::string(id) + "|v1");  // published twice
    if (i % 200 == 1) {  // a conflicting twin: the same notification, another payload
      bodies.push_back(std::string(id) + "|v2");
      twins.push_back(id);
    }
  }
  for (int i = 0; i < 5; ++i) {
    bodies.push_back("poison" + std::to_string(i) + "|v1");
    expected_dead.insert("poison" + std::to_string(i) + "|v1");
  }
  for (int i = 0; i < 3; ++i) {
    bodies.push_back("malformed" + std::to_string(i));
    expected_dead.insert("malformed" + std::to_string(i));
  }
  std::shuffle(bodies.begin(), bodies.end(), std::mt19937(26));
  broker.publish_all(bodies);
  // A quorum queue or a stream on a busy machine may count what it took a while after the
  // publishes returned.
  const auto published_by = std::chrono::steady_clock::now() + 180s;
  while (broker.unsettled() < bodies.size() && std::chrono::steady_clock::now() < published_by)
    std::this_thread::sleep_for(50ms);
  ASSERT_EQ(broker.unsettled(), bodies.size()) << "the broker did not take every message";

  std::vector<std::unique_ptr<LineProcess>> consumers;
  auto start = [&] {
    std::vector<std::string> argv{consumer_path,
                                  "--broker",
                                  broker.broker(),
                                  "--address",
                                  broker.address(),
                                  "--queue",
                                  broker.queue(),
                                  "--pg",
                                  uri,
                                  "--latency-ms",
                                  "3"};
    argv.insert(argv.end(), extra_options.begin(), extra_options.end());
    consumers.push_back(std::make_unique<LineProcess>(argv));
    EXPECT_TRUE(consumers.back()->wait_for_line("ready", 60s)) << "a consumer did not start";
  };
  auto booked = [&] { return count("SELECT count(DISTINCT notification) FROM bookings"); };
  auto wait_booked = [&](std::int64_t n, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (count("SELECT count(*) FROM pg_tables WHERE tablename = 'bookings'") == 1 &&
          booked() >= n)
        return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  };
  start();
  start();

  // A SIGKILL while the first consumer's downstream is called for a message.
  ASSERT_TRUE(wait_booked(150, 180s));
  LineProcess& victim = *consumers.front();
  const std::size_t from = victim.lines().size();
  const auto claiming =
      victim.wait_for([](const std::string& l) { return l.rfind("claim ", 0) == 0; }, 30s, from);
  ASSERT_TRUE(claiming) << "the consumer to kill called no downstream";
  victim.kill_now();
  start();

  // The broker restarted once, with consumers at work.
  ASSERT_TRUE(wait_booked(450, 180s));
  ASSERT_TRUE(broker.restart()) << "the broker did not restart";

  // Everything settles: every notification booked, nothing in flight, nothing unsettled, every
  // expected dead letter there.
  const std::size_t dead_wanted = expected_dead.size() + twins.size();
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  bool settled = false;
  while (!settled && std::chrono::steady_clock::now() < deadline) {
    const auto dead = broker.dead_letters();
    settled = booked() >= 1000 &&
              count("SELECT count(*) FROM idemgate_log WHERE status = 'in_flight'") == 0 &&
              broker.unsettled() == 0 &&
              std::set<std::string>(dead.begin(), dead.end()).size() >= dead_wanted;
    if (!settled) std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(settled) << "booked " << booked() << " of 1000, unsettled " << broker.unsettled()
                       << ", dead letters " << broker.dead_letters().size();
  for (std::size_t i = 1; i < consumers.size(); ++i) {
    consumers[i]->signal(SIGTERM);
    EXPECT_EQ(consumers[i]->wait_exit(60s), std::optional<int>(0)) << "consumer " << i;
  }

  EXPECT_EQ(count("SELECT count(*) FROM bookings"), 1000);
  EXPECT_EQ(count("SELECT count(*) FROM (SELECT notification FROM bookings GROUP BY notification "
                  "HAVING count(*) <> 1) AS twice"),
            0);
  EXPECT_EQ(count("SELECT count(*) FROM bookings WHERE notification NOT LIKE 'n%'"), 0);
  EXPECT_EQ(broker.unsettled(), 0u) << "messages left unsettled once the consumers stopped";
  // The dead letters: the poison and malformed messages, and of each conflicting pair the one
  // that was not booked.
  for (const auto& twin : twins) {
    const auto payload =
        pg_exec_on(uri, "SELECT payload FROM bookings WHERE notification = '" + twin + "'")[0][0]
            .as<std::string>();
    expected_dead.insert(twin + (payload == "v1" ? "|v2" : "|v1"));
  }
  const auto dead = broker.dead_letters();
  EXPECT_EQ(std::set<std::string>(dead.begin(), dead.end()), expected_dead);
  // The killed consumer's messages came again, counted as second deliveries.
  bool redelivered = false;
  for (std::size_t i = 1; i < consumers.size(); ++i)
    redelivered = redelivered ||
                  consumers[i]->wait_for(
                      [](const std::string& l) {
                        std::istringstream words(l);
                        std::string done, notification;
                        int deliveries = 0;
                        words >> done >> notification >> deliveries;
                        return done == "done" && notification.rfind("n", 0) == 0 && deliveries > 1;
                      },
                      0s);
  EXPECT_TRUE(redelivered) << "no message was delivered twice";
  consumers.clear();
  pg_exec("DROP DATABASE IF EXISTS " + database + " WITH (FORCE)");
}

}  // namespace idemgate::test
