// The control: a store with one defect must fail the installed suite, so a consumer whose store
// is wrong never sees its conformance run pass.

#include "tally_store.hpp"

#include <idemgate/testing/store_conformance.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>

/// A TallyStore whose `release` forgets to check the fence: it releases whoever holds the key.
class ForgetfulStore : public TallyStore {
 public:
  using TallyStore::TallyStore;
  explicit ForgetfulStore(TallyStore log) : TallyStore(std::move(log)) {}
  /// A handle on the same log that sees only the rows of gate `name`, as forgetful.
  [[nodiscard]] ForgetfulStore for_gate(const idemgate::GateName& name) const {
    return ForgetfulStore(TallyStore::for_gate(name));
  }
  bool release(const idemgate::Key& key, std::int64_t) {
    const auto row = find(key);
    return row.has_value() && TallyStore::release(key, row->fence);
  }
};

struct ForgetfulStoreTraits : idemgate::testing::OnCommitBusinessRows {
  using Store = ForgetfulStore;
  void set_up() { store = std::make_unique<Store>(clock.fn()); }
  void tear_down() {}
  void advance(std::chrono::milliseconds by) { clock.advance(by); }
  idemgate::testing::ShiftableClock clock;
  std::unique_ptr<Store> store;
};

namespace idemgate::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(ForgetfulStore, StoreConformance, ForgetfulStoreTraits);
}  // namespace idemgate::testing
