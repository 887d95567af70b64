// SPDX-License-Identifier: MIT
// A bounded, thread-safe LRU map: the gate's cache of committed outcomes.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace idemgate::detail {

/// A size-bounded, thread-safe least-recently-used map from keys to values.
template <class Key, class Value, class Hash = std::hash<Key>>
class LruCache {
 public:
  /// A cache of at most `capacity` entries (0: never holds anything).
  explicit LruCache(std::size_t capacity) : capacity_(capacity) {}

  /// The value under `key`, marked as recently used; nullopt when absent.
  std::optional<Value> get(const Key& key) {
    if (capacity_ == 0) return std::nullopt;
    std::lock_guard lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  /// Stores `value` under `key`, evicting the least recently used entry when full.
  void put(const Key& key, Value value) {
    if (capacity_ == 0) return;
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    if (index_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  /// Entries held.
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mutex_);
    return index_.size();
  }

 private:
  using Entry = std::pair<Key, Value>;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;
  std::unordered_map<Key, typename std::list<Entry>::iterator, Hash> index_;
};

}  // namespace idemgate::detail
