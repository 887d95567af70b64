#pragma once

// A store of this consumer project, not one idemgate ships: the log of an `idemgate::MemoryStore`
// behind a front that counts the calls made to it, by kind (what a service exports as metrics).

#include <idemgate/store/memory.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

/// An in-process idempotency log that counts every call made to it. A copy, and `for_gate`, is a
/// handle on the same log whose calls count with this one's.
class TallyStore {
 public:
  /// What the business write receives: stage effects with `on_commit`.
  using transaction = idemgate::MemoryStore::transaction;

  /// A store on `clock`.
  explicit TallyStore(idemgate::WallClock clock)
      : log_(std::move(clock)), tallies_(std::make_shared<Tallies>()) {}

  /// A handle on the same log that sees only the rows of gate `name`.
  [[nodiscard]] TallyStore for_gate(const idemgate::GateName& name) const {
    return TallyStore(log_.for_gate(name), tallies_);
  }
  /// The gate whose rows this handle sees.
  [[nodiscard]] const std::string& gate() const noexcept { return log_.gate(); }

  idemgate::Reservation reserve(const idemgate::Key& key, const idemgate::Fingerprint& fingerprint,
                                std::string_view request, std::chrono::milliseconds lease) {
    tally("reserve");
    return log_.reserve(key, fingerprint, request, lease);
  }
  template <class BusinessWrite>
  idemgate::CommitStatus commit(const idemgate::Key& key, std::int64_t fence,
                                std::string_view result, BusinessWrite&& business) {
    tally("commit");
    return log_.commit(key, fence, result, std::forward<BusinessWrite>(business));
  }
  idemgate::CommitStatus fail(const idemgate::Key& key, std::int64_t fence,
                              std::string_view reason) {
    tally("fail");
    return log_.fail(key, fence, reason);
  }
  idemgate::CommitStatus escalate(const idemgate::Key& key, std::int64_t fence,
                                  std::string_view reason) {
    tally("escalate");
    return log_.escalate(key, fence, reason);
  }
  bool release(const idemgate::Key& key, std::int64_t fence) {
    tally("release");
    return log_.release(key, fence);
  }
  std::optional<idemgate::Record> find(const idemgate::Key& key) {
    tally("find");
    return log_.find(key);
  }
  std::vector<idemgate::Stranded> take_stale(std::size_t limit,
                                             std::chrono::milliseconds stale_after,
                                             std::chrono::milliseconds lease) {
    tally("take_stale");
    return log_.take_stale(limit, stale_after, lease);
  }
  std::vector<idemgate::Record> escalated(std::size_t limit) {
    tally("escalated");
    return log_.escalated(limit);
  }
  template <class BusinessWrite>
  bool resolve(const idemgate::Key& key, std::string_view result, BusinessWrite&& business) {
    tally("resolve");
    return log_.resolve(key, result, std::forward<BusinessWrite>(business));
  }
  idemgate::StoreSignals signals(std::chrono::seconds window) {
    tally("signals");
    return log_.signals(window);
  }
  void record_mismatch(const idemgate::Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    tally("record_mismatch");
    log_.record_mismatch(key, stored, observed, source);
  }
  std::vector<idemgate::Mismatch> mismatches(std::size_t limit) {
    tally("mismatches");
    return log_.mismatches(limit);
  }
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    tally("purge");
    return log_.purge(older_than, batch);
  }
  std::size_t redrive_failed(const idemgate::Key& key) {
    tally("redrive_failed");
    return log_.redrive_failed(key);
  }
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    tally("redrive_failed");
    return log_.redrive_failed(from, to, limit);
  }

  /// How many calls of one kind (`"reserve"`, `"commit"`, …) were made.
  std::int64_t calls(const std::string& kind) const {
    std::lock_guard lock(tallies_->mutex);
    const auto it = tallies_->calls.find(kind);
    return it == tallies_->calls.end() ? 0 : it->second;
  }

 private:
  // The counts every handle on one log adds to.
  struct Tallies {
    std::mutex mutex;
    std::map<std::string, std::int64_t> calls;
  };

  TallyStore(idemgate::MemoryStore log, std::shared_ptr<Tallies> tallies)
      : log_(std::move(log)), tallies_(std::move(tallies)) {}

  void tally(const char* kind) {
    std::lock_guard lock(tallies_->mutex);
    ++tallies_->calls[kind];
  }

  idemgate::MemoryStore log_;
  std::shared_ptr<Tallies> tallies_;
};

static_assert(idemgate::store<TallyStore>);
static_assert(idemgate::monitored_store<TallyStore>);
static_assert(idemgate::redrivable_store<TallyStore>);
