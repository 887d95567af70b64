#pragma once

// A fake slot API that honours idempotency keys (or, switched, ignores them) and counts what it
// was asked, in process. Tests of HTTP behaviour use the real server in examples/; this one
// isolates the gate.

#include "slot_request.hpp"

#include <idemgate/key.hpp>
#include <idemgate/outcome.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::test {

/// One claim as the terminal received it.
struct ReceivedClaim {
  std::string container;
  Key key;
};

/// Counts claims; the same key always gets the slot it got first (like a terminal's
/// idempotency cache), so a repeated claim never hands out a second slot. With `ignores_keys`
/// set it behaves like the terminal of the incident instead: every claim that gets through
/// hands out a new slot, so a second claim for one event shows as a second slot.
template <bool HonoursKeys = true>
class FakeTerminal {
 public:
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = HonoursKeys;

  /// While set, a claim under a key seen before hands out a new slot instead of the first one
  /// (the gate is not told: it still believes keys are honoured). Lookups still find the first
  /// slot handed out under a key.
  std::atomic<bool> ignores_keys{false};

  /// Runs before each claim; may throw or sleep. Returning a failure replaces the answer.
  std::function<std::optional<ClaimResult<std::string>>(const SlotRequest&, const Key&)> before;

  /// Runs after the slot is committed at the terminal, before the answer leaves; may throw
  /// (a lost answer) or return a failure that replaces the answer.
  std::function<std::optional<ClaimResult<std::string>>(const Key&, const std::string&)> after;

  ClaimResult<std::string> claim(const SlotRequest& request, const Key& key) {
    calls_.fetch_add(1);
    {
      std::lock_guard lock(mutex_);
      received_.push_back({request.container, key});
    }
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (before) {
      if (auto replaced = before(request, key)) return *replaced;
    }
    std::string slot;
    {
      std::lock_guard lock(mutex_);
      auto it = by_key_.find(key);
      if (it != by_key_.end() && !ignores_keys.load()) {
        slot = it->second;
      } else {
        slot = "slot-" + std::to_string(++issued_);
        by_key_.emplace(key, slot);  // keeps the first slot of a key
        slots_by_key_[key].insert(slot);
        containers_[request.container].insert(slot);
      }
    }
    if (after) {
      if (auto replaced = after(key, slot)) return *replaced;
    }
    return slot;
  }

  /// Makes lookups fail transiently while set.
  std::atomic<bool> lookup_down{false};

  LookupResult<std::string> lookup(const Key& key) {
    lookups_.fetch_add(1);
    if (lookup_down.load()) return TransientFailure{"lookup endpoint unavailable"};
    std::lock_guard lock(mutex_);
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return NotFound{};
    return it->second;
  }

  /// Claims made (including failed ones).
  int calls() const { return calls_.load(); }
  /// Lookups made.
  int lookups() const { return lookups_.load(); }
  /// Slots handed out: with keys honoured one per key claimed, so a repeated claim does not
  /// show here (count `calls()` for that); with `ignores_keys` one per claim that got through.
  int slots_issued() const {
    std::lock_guard lock(mutex_);
    return issued_;
  }
  /// Distinct slots handed out under one key: 1 for an event claimed once, or claimed again
  /// under its key at a terminal that honours keys.
  std::size_t distinct_slots_for(const Key& key) const {
    std::lock_guard lock(mutex_);
    auto it = slots_by_key_.find(key);
    return it == slots_by_key_.end() ? 0 : it->second.size();
  }
  /// Every claim received (including failed ones), in order.
  std::vector<ReceivedClaim> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }
  /// The key of every claim received, in order.
  std::vector<Key> keys_claimed() const {
    std::lock_guard lock(mutex_);
    std::vector<Key> keys;
    for (const ReceivedClaim& c : received_) keys.push_back(c.key);
    return keys;
  }
  /// Slots handed out for one container.
  std::size_t slots_for(const std::string& container) const {
    std::lock_guard lock(mutex_);
    auto it = containers_.find(container);
    return it == containers_.end() ? 0 : it->second.size();
  }
  /// Makes every claim sleep first, to widen race windows.
  void set_delay(std::chrono::milliseconds delay) { delay_ = delay; }

 private:
  std::atomic<int> calls_{0};
  std::atomic<int> lookups_{0};
  std::chrono::milliseconds delay_{0};
  mutable std::mutex mutex_;
  int issued_ = 0;
  std::map<Key, std::string> by_key_;
  std::map<Key, std::set<std::string>> slots_by_key_;
  std::vector<ReceivedClaim> received_;
  std::map<std::string, std::set<std::string>> containers_;
};

/// Wraps a terminal, hiding its lookup: a downstream that honours keys but cannot look up.
template <class Terminal>
struct WithoutLookup {
  using request_type = typename Terminal::request_type;
  using outcome_type = typename Terminal::outcome_type;
  static constexpr bool honours_idempotency_key = Terminal::honours_idempotency_key;
  Terminal& terminal;
  ClaimResult<outcome_type> claim(const request_type& r, const Key& k) {
    return terminal.claim(r, k);
  }
};

/// Thrown to simulate a worker dying at a step: not a `std::exception`, so nothing in the gate
/// mistakes it for a downstream failure and cleans up after it, exactly like a real crash.
struct SimulatedCrash {};

}  // namespace idemgate::test
