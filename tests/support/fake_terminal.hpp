#pragma once

// A fake slot API that honours idempotency keys and counts what it was asked, in process.
// Tests of HTTP behaviour use the real server in examples/; this one isolates the gate.

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

namespace idemgate::test {

/// Counts claims; the same key always gets the slot it got first (like a terminal's
/// idempotency cache), so a repeated claim never hands out a second slot.
template <bool HonoursKeys = true>
class FakeTerminal {
 public:
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = HonoursKeys;

  /// Runs before each claim; may throw or sleep. Returning a failure replaces the answer.
  std::function<std::optional<ClaimResult<std::string>>(const SlotRequest&, const Key&)> before;

  /// Runs after the slot is committed at the terminal, before the answer leaves; may throw
  /// (a lost answer) or return a failure that replaces the answer.
  std::function<std::optional<ClaimResult<std::string>>(const Key&, const std::string&)> after;

  ClaimResult<std::string> claim(const SlotRequest& request, const Key& key) {
    calls_.fetch_add(1);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (before) {
      if (auto replaced = before(request, key)) return *replaced;
    }
    std::string slot;
    {
      std::lock_guard lock(mutex_);
      auto it = by_key_.find(key);
      if (it != by_key_.end()) {
        slot = it->second;
      } else {
        slot = "slot-" + std::to_string(++issued_);
        by_key_.emplace(key, slot);
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
  /// Distinct slots handed out.
  int slots_issued() const {
    std::lock_guard lock(mutex_);
    return issued_;
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
