#pragma once

// A lease given back inside a batch or a reconciler pass stays given back while the batch or the
// pass goes on, on any store: the checks the lease tests of each store run.
//
// A batch (or a pass) keeps the leases it still holds alive with its lease keeper: every third
// of the lease, one `extend` for all of them. A member given back after a transient failure or a
// failed commit must leave that list: `extend` is fenced, not told apart from a release (the row
// stays in flight under the same fence), so a renewal would make the given-back lease live again,
// and the member's redelivery would be answered `in_flight` (and acked) until the reconciler
// comes. Each member that gives its lease back here takes half a lease first, so the keeper
// renews the leases it holds before the next member.

#include "support/fake_terminal.hpp"
#include "support/slot_request.hpp"

#include <idemgate/batch.hpp>
#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::test {

/// The lease of the gates in these checks, and how long a member takes before it gives its lease
/// back: more than the third of the lease after which the lease keeper renews.
inline constexpr std::chrono::milliseconds given_back_lease{300};
inline constexpr std::chrono::milliseconds before_giving_back{150};

/// A terminal whose claims for containers starting with "503-" answer 503, and a business write
/// that throws for containers starting with "REFUSED-", each after `before_giving_back`, while
/// `trouble` is set; otherwise the claim and the business write `book` go through.
template <class Book>
struct TroubledConsumer {
  explicit TroubledConsumer(Book book) : book_(std::move(book)) {
    terminal.before = [this](const SlotRequest& r,
                             const Key&) -> std::optional<ClaimResult<std::string>> {
      if (!trouble.load() || !r.container.starts_with("503-")) return std::nullopt;
      std::this_thread::sleep_for(before_giving_back);
      return TransientFailure{"503 Service Unavailable"};
    };
  }

  /// The business write: `book`, unless the container is refused.
  auto write() {
    return [this](auto& tx, const Key& key, const SlotRequest& r, const std::string& slot) {
      if (trouble.load() && r.container.starts_with("REFUSED-")) {
        std::this_thread::sleep_for(before_giving_back);
        throw std::runtime_error("the ledger refused the booking");
      }
      book_(tx, key, r, slot);
    };
  }

  std::atomic<bool> trouble{true};
  FakeTerminal<> terminal;

 private:
  Book book_;
};

/// Checks that the row of `key` is in flight with its lease given back: ended long ago, not
/// renewed since.
template <class Store>
void expect_given_back(Store& store, const Key& key, const std::string& container) {
  const auto row = store.find(key);
  ASSERT_TRUE(row.has_value()) << container;
  EXPECT_EQ(row->status, RecordStatus::in_flight) << container;
  EXPECT_LT(row->lease_until, std::chrono::system_clock::now() - std::chrono::hours(1))
      << container << ": its lease was renewed after it was given back";
}

/// A batch of four on `store`: the first member's claim answers 503 and the third's business
/// write throws, each after half a lease; the other two commit. Both given-back members keep
/// their leases ended, and their redeliveries take them over at once.
template <class Store, class Book>
void expect_batch_members_given_back_stay_given_back(Store& store, Book book) {
  TroubledConsumer<Book> consumer(std::move(book));
  Gate gate{"ect.claim_slot",
            store,
            consumer.terminal,
            consumer.write(),
            {.lease = given_back_lease, .retry_backoff = std::chrono::milliseconds(0)}};
  std::vector<BatchMessage<SlotRequest>> batch;
  for (const std::string container :
       {"503-MSKU7000101", "MSKU7000102", "REFUSED-MSKU7000103", "MSKU7000104"})
    batch.push_back({container, derive_key("given back in a batch", container),
                     SlotRequest{container, "2025-06-09T07:00"}});
  const BatchResult<std::string> result = gate.process_batch(batch);
  ASSERT_EQ(result.items().size(), batch.size());
  const Status expected[] = {Status::retry, Status::processed, Status::retry, Status::processed};
  for (std::size_t i = 0; i < batch.size(); ++i)
    EXPECT_EQ(result.items()[i].result.status(), expected[i]) << batch[i].message_id;
  for (const std::size_t i : {0u, 2u})
    ASSERT_NO_FATAL_FAILURE(expect_given_back(gate.store(), batch[i].key, batch[i].message_id));
  consumer.trouble = false;
  for (const std::size_t i : {0u, 2u}) {
    const auto again = gate.process(batch[i].key, batch[i].request);
    EXPECT_EQ(again.status(), Status::processed) << batch[i].message_id;
    EXPECT_TRUE(again.took_over()) << batch[i].message_id << ": its redelivery waited";
  }
}

/// A reconciler pass over four stranded rows on `store`, in this order: a claim that answers
/// 503, a business write that throws, again a 503 and again a throw, each after half a lease.
/// Every row the pass gave back keeps its lease ended, and its redelivery takes it over at once.
template <class Store, class Book>
void expect_pass_rows_given_back_stay_given_back(Store& store, Book book) {
  TroubledConsumer<Book> consumer(std::move(book));
  WithoutLookup<FakeTerminal<>> downstream{consumer.terminal};
  Gate gate{"ect.claim_slot",
            store,
            downstream,
            consumer.write(),
            {.lease = given_back_lease, .retry_backoff = std::chrono::milliseconds(0)}};
  std::vector<std::pair<Key, SlotRequest>> rows;
  for (const std::string container :
       {"503-MSKU7000201", "REFUSED-MSKU7000202", "503-MSKU7000203", "REFUSED-MSKU7000204"}) {
    const SlotRequest request{container, "2025-06-09T07:00"};
    rows.emplace_back(derive_key("given back in a pass", container), request);
    // Workers that died: their leases run out one after another, so the pass takes the rows
    // in this order (oldest lease first).
    const std::string bytes = gate.encode_request(request);
    (void)gate.store().reserve(rows.back().first, detail::sha256(bytes), bytes,
                               std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Reconciler reconciler{gate,
                        {.interval = std::chrono::minutes(1),
                         .stale_after = std::chrono::milliseconds(0),
                         .batch = 10}};
  const ReconcileReport report = reconciler.run_once();
  EXPECT_EQ(report.taken, 4u);
  EXPECT_EQ(report.deferred, 2u) << "the two claims that answered 503";
  EXPECT_EQ(report.errors, 2u) << "the two business writes that threw";
  for (const auto& [key, request] : rows)
    ASSERT_NO_FATAL_FAILURE(expect_given_back(gate.store(), key, request.container));
  consumer.trouble = false;
  for (const auto& [key, request] : rows) {
    const auto again = gate.process(key, request);
    EXPECT_EQ(again.status(), Status::processed) << request.container;
    EXPECT_TRUE(again.took_over()) << request.container << ": its redelivery waited";
  }
}

}  // namespace idemgate::test
