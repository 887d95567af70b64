#pragma once

// What the in-process tests of the broker consumers share: a gate on a MemoryStore over a
// downstream that counts its claims, the bodies' format ("<notification>|<payload>") and its
// decode function, a gate that records the batches it was given, and a consumer loop run on a
// thread of its own until the test has seen what it waits for.

#include <idemgate/batch.hpp>
#include <idemgate/consumer/event.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/shutdown.hpp>
#include <idemgate/store/memory.hpp>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace idemgate::test::brokers {

/// A downstream that answers by the request alone (it honours the key) and counts its claims;
/// a notification whose id starts with "poison" always fails for now.
struct CountingLedger {
  using request_type = std::string;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  ClaimResult<std::string> claim(const std::string& request, const Key&) {
    const std::string id = request.substr(0, request.find('|'));
    {
      std::lock_guard lock(mutex);
      ++claims[id];
    }
    if (id.rfind("poison", 0) == 0) return TransientFailure{"poison"};
    return "booked:" + request;
  }
  /// Claims of one notification so far.
  int claims_of(const std::string& id) {
    std::lock_guard lock(mutex);
    return claims[id];
  }

  std::mutex mutex;
  std::map<std::string, int> claims;
};

/// The event of a body "<notification>|<payload>": the key is the notification id's.
inline std::optional<consumer::Event<std::string>> decode(std::string_view body) {
  const auto bar = body.find('|');
  if (bar == std::string_view::npos || bar == 0) return std::nullopt;
  return consumer::Event<std::string>{derive_key("test.booking", body.substr(0, bar)),
                                      std::string(body)};
}
using Decode = decltype(&decode);

/// A gate on a MemoryStore that also records the size of every batch it was given.
class RecordingGate {
 public:
  using request_type = std::string;
  using inner_type = Gate<MemoryStore, CountingLedger>;

  RecordingGate()
      : gate_("test.booking", store_, ledger_, [](auto&, const auto&, const auto&) {}) {}

  /// Forwards to the gate, recording the batch's size.
  BatchResult<std::string> process_batch(std::span<const BatchMessage<std::string>> messages) {
    {
      std::lock_guard lock(mutex_);
      batches_.push_back(messages.size());
    }
    return gate_.process_batch(messages);
  }
  /// Forwards to the gate.
  [[nodiscard]] bool stopping() const { return gate_.stopping(); }
  /// The gate itself.
  inner_type& gate() { return gate_; }
  /// The downstream.
  CountingLedger& ledger() { return ledger_; }
  /// Batch sizes so far.
  std::vector<std::size_t> batches() {
    std::lock_guard lock(mutex_);
    return batches_;
  }

 private:
  MemoryStore store_;
  CountingLedger ledger_;
  inner_type gate_;
  std::mutex mutex_;
  std::vector<std::size_t> batches_;
};

/// Settlements seen by a consumer's hook, waited on by the test.
class Settlements {
 public:
  /// The hook to give the consumer.
  auto hook() {
    return [this](const consumer::Settlement& s) {
      std::lock_guard lock(mutex_);
      seen_.push_back({std::string(s.body), s.deliveries, s.status, s.disposition});
      changed_.notify_all();
    };
  }
  /// One settlement, with its body copied.
  struct Seen {
    std::string body;
    std::uint32_t deliveries;
    std::optional<Status> status;
    consumer::Disposition disposition;
  };
  /// Waits until `n` settlements were seen; all of them so far.
  std::vector<Seen> wait(std::size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, timeout, [&] { return seen_.size() >= n; });
    return seen_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Seen> seen_;
};

/// Runs `consumer.run(stop)` on a thread; stops and joins it when destroyed.
template <class Consumer>
class Running {
 public:
  Running(Consumer& consumer, StopSignal& stop)
      : stop_(stop), thread_([&consumer, &stop] { consumer.run(stop); }) {}
  ~Running() { finish(); }
  /// Requests the stop and waits for the loop to return.
  void finish() {
    stop_.request();
    if (thread_.joinable()) thread_.join();
  }

 private:
  StopSignal& stop_;
  std::thread thread_;
};

}  // namespace idemgate::test::brokers
