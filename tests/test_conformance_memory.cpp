// The store conformance suite over MemoryStore. Needs neither SQLite nor PostgreSQL.

#include <idemgate/store/memory.hpp>
#include <idemgate/testing/store_conformance.hpp>

#include <chrono>
#include <memory>

/// MemoryStore: business rows are keys kept by `on_commit`; time is an injected clock.
struct MemoryTraits : idemgate::testing::OnCommitBusinessRows {
  using Store = idemgate::MemoryStore;

  void set_up() { store = std::make_unique<Store>(clock.fn()); }
  void tear_down() {}
  /// Lets `by` pass for every lease and timestamp in the store.
  void advance(std::chrono::milliseconds by) { clock.advance(by); }

  idemgate::testing::ShiftableClock clock;
  std::unique_ptr<Store> store;
};

// The traits contract accepts these traits and refuses a type that lacks a member of it.
static_assert(idemgate::testing::store_traits<MemoryTraits>);
static_assert(!idemgate::testing::transaction_breaking_store_traits<MemoryTraits>,
              "the memory store's transaction cannot be broken: it runs only StoreConformance");
struct MemoryTraitsWithoutAdvance : idemgate::testing::OnCommitBusinessRows {
  using Store = idemgate::MemoryStore;
  void set_up() {}
  void tear_down() {}
  std::unique_ptr<Store> store;
};
static_assert(!idemgate::testing::store_traits<MemoryTraitsWithoutAdvance>);

namespace idemgate::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(Memory, StoreConformance, MemoryTraits);
}  // namespace idemgate::testing
