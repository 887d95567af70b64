// Never built by default: the test conformance_refuses_traits_that_miss_a_member builds it and
// expects the compiler to name the traits contract.

#include <idemgate/store/memory.hpp>
#include <idemgate/testing/store_conformance.hpp>

#include <memory>

/// Misses `advance`: the suite cannot let time pass for this store.
struct TraitsWithoutAdvance : idemgate::testing::OnCommitBusinessRows {
  using Store = idemgate::MemoryStore;
  void set_up() { store = std::make_unique<Store>(); }
  void tear_down() {}
  std::unique_ptr<Store> store;
};

namespace idemgate::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(WithoutAdvance, StoreConformance, TraitsWithoutAdvance);
}  // namespace idemgate::testing
