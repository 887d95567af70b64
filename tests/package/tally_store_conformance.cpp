#include "tally_store.hpp"

#include <idemgate/testing/store_conformance.hpp>

#include <chrono>
#include <memory>

struct TallyStoreTraits : idemgate::testing::OnCommitBusinessRows {  // business rows in memory
  using Store = TallyStore;
  void set_up() { store = std::make_unique<Store>(clock.fn()); }
  void tear_down() {}
  void advance(std::chrono::milliseconds by) { clock.advance(by); }
  idemgate::testing::ShiftableClock clock;
  std::unique_ptr<Store> store;
};

namespace idemgate::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(TallyStore, StoreConformance, TallyStoreTraits);
}  // namespace idemgate::testing
