#pragma once

// The TMS of the in-process tests: bookings written only when the gate's MemoryStore commits.

#include <idemgate/store/memory.hpp>

#include <map>
#include <mutex>
#include <string>

namespace idemgate::test {

/// Bookings per container, written by the gate's business write on commit only.
class MemoryBookings {
 public:
  /// Bookings so far.
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return rows_.size();
  }
  /// Bookings of one container.
  std::size_t for_container(const std::string& container) const {
    std::lock_guard lock(mutex_);
    return rows_.count(container);
  }
  /// The business write: one booking per committed event, staged in the store's transaction.
  auto writer() {
    return [this](MemoryStore::transaction& tx, const auto& request, const std::string& slot) {
      tx.on_commit([this, container = request.container, slot] {
        std::lock_guard lock(mutex_);
        rows_.emplace(container, slot);
      });
    };
  }

 private:
  mutable std::mutex mutex_;
  std::multimap<std::string, std::string> rows_;
};

}  // namespace idemgate::test
