// SPDX-License-Identifier: MIT
// The second conformance suite, for stores whose business write runs SQL in the store's own
// transaction: a business write that breaks that transaction never commits the log.
#pragma once

/**
 * @file
 * Instantiate it beside `StoreConformance`, with traits that also meet
 * `transaction_breaking_store_traits` (they can break the store's transaction). Example:
 *
 *     namespace idemgate::testing {
 *     INSTANTIATE_TYPED_TEST_SUITE_P(MyStore, StoreConformance, MyStoreTraits);
 *     INSTANTIATE_TYPED_TEST_SUITE_P(MyStore, SqlStoreConformance, MyStoreTraits);
 *     }
 */

#include "../errors.hpp"
#include "../record.hpp"
#include "store_conformance.hpp"
#include "store_traits.hpp"

#include <gtest/gtest.h>

namespace idemgate::testing {

/**
 * The fixture of the SQL suite: the conformance fixture, plus a business write that ends the
 * store's transaction early. (A transaction that only stages effects, like `MemoryStore`'s,
 * cannot be ended early: such stores do not run this suite.)
 */
template <class Traits>
class SqlStoreConformance : public StoreConformance<Traits> {
  static_assert(transaction_breaking_store_traits<Traits>,
                "the traits type does not meet idemgate::testing::"
                "transaction_breaking_store_traits: give it break_transaction(tx) as "
                "<idemgate/testing/store_traits.hpp> describes");

 protected:
  /// Books, breaks the transaction (first, in the middle or last) and books again.
  auto breaking_writer(const Key& key, int where) {
    return [this, key, where](auto& tx) {
      if (where == 0) this->traits_.break_transaction(tx);
      this->traits_.write_business(tx, key);
      if (where == 1) this->traits_.break_transaction(tx);
      this->traits_.write_business(tx, key);
      if (where == 2) this->traits_.break_transaction(tx);
    };
  }
};

/// @cond
// The tests. Their names, as GoogleTest prints them, say what each one checks.
TYPED_TEST_SUITE_P(SqlStoreConformance);

TYPED_TEST_P(SqlStoreConformance, ABusinessWriteThatBreaksTheTransactionNeverCommitsTheLog) {
  for (int where = 0; where < 3; ++where) {
    const Key key = detail::key_of("broken", where);
    const Reservation r = this->reserve(key);
    EXPECT_THROW(
        (void)this->store().commit(key, r.fence, "slot", this->breaking_writer(key, where)),
        idemgate::BusinessWriteError)
        << "where " << where;
    EXPECT_EQ(this->status_of(key), RecordStatus::in_flight) << "where " << where;
    // The log is never committed without the whole business write: nothing of it here, or (with
    // libpqxx, whose failed statement ended the transaction) only statements that ran outside
    // it after the error — never the log row.
    EXPECT_FALSE(this->store().find(key)->result.has_value()) << "where " << where;
    EXPECT_EQ(this->store().commit(key, r.fence, "slot", this->writer(key)),
              CommitStatus::committed)
        << "a business write that keeps to its transaction commits under the same fence";
  }
}

TYPED_TEST_P(SqlStoreConformance, AResolveWhoseBusinessWriteBreaksTheTransactionStaysEscalated) {
  const Key key = detail::key_of("broken-resolve");
  const Reservation r = this->reserve(key);
  ASSERT_EQ(this->store().escalate(key, r.fence, "by hand"), CommitStatus::committed);
  EXPECT_THROW((void)this->store().resolve(key, "slot", this->breaking_writer(key, 1)),
               idemgate::BusinessWriteError);
  EXPECT_EQ(this->status_of(key), RecordStatus::escalated);
  EXPECT_TRUE(this->store().resolve(key, "slot", this->writer(key)));
  EXPECT_EQ(this->status_of(key), RecordStatus::committed);
}

REGISTER_TYPED_TEST_SUITE_P(SqlStoreConformance,
                            ABusinessWriteThatBreaksTheTransactionNeverCommitsTheLog,
                            AResolveWhoseBusinessWriteBreaksTheTransactionStaysEscalated);

/// @endcond
}  // namespace idemgate::testing
