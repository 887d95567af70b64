// SPDX-License-Identifier: MIT
// A consumer that stops cleanly when its deployment sends SIGTERM: it stops taking messages, lets
// the call in progress finish within a grace period, hands on the leases of what it will not
// finish (a redelivery takes those events over at once), and stops its reconciler and retention.
//
//   graceful_stop --db FILE [--events N] [--call-ms MS] [--grace-ms MS]
//
// It works through a feed of N events (a stand-in for the queue), each claimed from a slot API
// whose calls take MS milliseconds, then waits for SIGTERM (or Ctrl-C). It prints what it does:
// "calling C", "acked N STATUS" or "not acked N STATUS", and at the end "stopped clean" or
// "stopped unclean given_back=K".

#include "consumer.hpp"

#include <idemgate/idemgate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/retention.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/sqlite.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace {

// A stand-in for the queue: messages that were not acked go back to it.
class Feed {
 public:
  explicit Feed(int events) {
    for (int n = 1; n <= events; ++n) waiting_.push_back(n);
  }
  // The next message, or 0 when there is none.
  int receive() {
    std::lock_guard lock(mutex_);
    if (waiting_.empty()) return 0;
    const int n = waiting_.front();
    waiting_.pop_front();
    return n;
  }
  void give_back(int n) {
    std::lock_guard lock(mutex_);
    waiting_.push_back(n);
  }

 private:
  std::mutex mutex_;
  std::deque<int> waiting_;
};

long number(const char* flag, const char* value) {
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || n < 0) {
    std::fprintf(stderr, "graceful_stop: %s wants a non-negative number\n", flag);
    std::exit(2);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string db;
  int events = 1;
  std::chrono::milliseconds call{1000};
  std::chrono::milliseconds grace{20'000};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--db")
      db = argv[i + 1];
    else if (flag == "--events")
      events = static_cast<int>(number(argv[i], argv[i + 1]));
    else if (flag == "--call-ms")
      call = std::chrono::milliseconds(number(argv[i], argv[i + 1]));
    else if (flag == "--grace-ms")
      grace = std::chrono::milliseconds(number(argv[i], argv[i + 1]));
  }
  if (db.empty()) {
    std::fprintf(stderr,
                 "usage: graceful_stop --db FILE [--events N] [--call-ms MS] [--grace-ms MS]\n");
    return 2;
  }

  // Hooked first, before any thread starts: from here on SIGTERM only sets a flag.
  idemgate::StopSignal sigterm;

  idemgate::SqliteStore store{db};
  graceful_stop::prepare(store, db);
  graceful_stop::SlowTerminal terminal{call};
  idemgate::Gate gate{"ect.claim_slot", store, terminal, graceful_stop::book};  // default options
  idemgate::Reconciler reconciler{gate};
  idemgate::Retention retention{gate.store()};  // purges this gate's rows
  reconciler.start();
  retention.start();

  Feed feed(events);
  std::thread consumer([&] {
    while (!sigterm.requested()) {
      const int n = feed.receive();
      if (n == 0) {
        sigterm.wait_for(std::chrono::milliseconds(50));
        continue;
      }
      const auto result = gate.process(graceful_stop::key_of(n), graceful_stop::container_of(n));
      const std::string status(idemgate::to_string(result.status()));
      if (result.should_ack()) {
        std::printf("acked %d %s\n", n, status.c_str());
      } else {
        std::printf("not acked %d %s\n", n, status.c_str());
        feed.give_back(n);
      }
      std::fflush(stdout);
    }
  });

  sigterm.wait();
  const auto report = idemgate::stop_gracefully(grace, gate, reconciler, retention);
  if (report.clean()) {
    consumer.join();
    std::printf("stopped clean\n");
    std::fflush(stdout);
    return 0;
  }
  // A downstream call is still running and cannot be interrupted; its lease was given back, so
  // the redelivery of its message takes the event over at once. Leave without waiting for it.
  std::printf("stopped unclean given_back=%zu\n", report.given_back);
  std::fflush(stdout);
  std::_Exit(0);
}
