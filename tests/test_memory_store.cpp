#include <idemgate/store/memory.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using idemgate::CommitStatus;
using idemgate::MemoryStore;
using idemgate::RecordStatus;
using idemgate::Reservation;
using namespace std::chrono_literals;

namespace {
const auto key = idemgate::derive_key("test", "memory");
const auto fingerprint = idemgate::detail::sha256("request");
}  // namespace

TEST(MemoryStore, ConcurrentReservationsOfOneKeyHaveOneWinner) {
  for (int round = 0; round < 50; ++round) {
    MemoryStore store;
    std::atomic<int> acquired{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&] {
        if (store.reserve(key, fingerprint, "request", 1min).kind == Reservation::Kind::acquired)
          ++acquired;
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(acquired.load(), 1);
  }
}

TEST(MemoryStore, RepeatedCommitUnderTheSameFenceWritesOnce) {
  MemoryStore store;
  const auto r = store.reserve(key, fingerprint, "request", 1min);
  int effects = 0;
  auto write = [&](MemoryStore::transaction& tx) { tx.on_commit([&] { ++effects; }); };
  EXPECT_EQ(store.commit(key, r.fence, "slot-1", write), CommitStatus::committed);
  EXPECT_EQ(store.commit(key, r.fence, "slot-1", write), CommitStatus::committed);
  EXPECT_EQ(effects, 1);
  EXPECT_EQ(store.commit(key, r.fence + 1, "slot-2", write), CommitStatus::lost_lease);
  EXPECT_EQ(effects, 1);
  EXPECT_EQ(store.find(key)->result, "slot-1");
}

TEST(MemoryStore, ReleaseNeedsTheCurrentFenceAndKeepsFencesMonotonic) {
  MemoryStore store;
  const auto r = store.reserve(key, fingerprint, "request", 1min);
  EXPECT_FALSE(store.release(key, r.fence + 1));
  EXPECT_EQ(store.reserve(key, fingerprint, "request", 1min).kind, Reservation::Kind::existing)
      << "a wrong fence releases nothing";
  EXPECT_TRUE(store.release(key, r.fence));
  const auto next = store.reserve(key, fingerprint, "request", 1min);
  EXPECT_EQ(next.kind, Reservation::Kind::taken_over);
  EXPECT_EQ(next.fence, r.fence + 1);
  auto noop = [](MemoryStore::transaction&) {};
  EXPECT_EQ(store.commit(key, r.fence, "slot", noop), CommitStatus::lost_lease)
      << "the worker that released can never commit";
}

TEST(MemoryStore, RepeatedFailOrEscalateUnderTheSameFenceGivesTheSameAnswer) {
  MemoryStore store;
  const auto r = store.reserve(key, fingerprint, "request", 1min);
  EXPECT_EQ(store.fail(key, r.fence, "422"), CommitStatus::committed);
  EXPECT_EQ(store.fail(key, r.fence, "422"), CommitStatus::committed);
  EXPECT_EQ(store.fail(key, r.fence + 1, "422"), CommitStatus::lost_lease);
  const auto other = idemgate::derive_key("test", "escalate");
  const auto e = store.reserve(other, fingerprint, "request", 1min);
  EXPECT_EQ(store.escalate(other, e.fence, "no keys"), CommitStatus::committed);
  EXPECT_EQ(store.escalate(other, e.fence, "no keys"), CommitStatus::committed);
}

TEST(MemoryStore, StaleRowsAreTakenOverOnceWithAFenceBump) {
  auto now = std::chrono::system_clock::now();
  MemoryStore store([&] { return now; });
  const auto r = store.reserve(key, fingerprint, "request", 10s);
  EXPECT_TRUE(store.take_stale(10, 0s, 10s).empty()) << "lease still live";
  now += 11s;
  const auto taken = store.take_stale(10, 0s, 10s);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].fence, r.fence + 1);
  EXPECT_EQ(taken[0].request, "request");
  EXPECT_TRUE(store.take_stale(10, 0s, 10s).empty()) << "the new lease is live";
  auto noop = [](MemoryStore::transaction&) {};
  EXPECT_EQ(store.commit(key, r.fence, "slot", noop), CommitStatus::lost_lease);
}
