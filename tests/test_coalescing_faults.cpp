// Group commit (GateOptions::coalesce) under faults that do not need a server: the coalescer's
// order of groups and its count of waiting calls (which the interleaving schedules rely on to
// replay a seed), and SqliteStore::commit_each with a business write that breaks the group's
// transaction in each of the ways the store's own tests break a single commit's. (PostgreSQL's
// group commit under wire faults: postgres/test_wire_faults.cpp.)

#include "support/fake_terminal.hpp"
#include "support/slot_request.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/detail/coalescer.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using idemgate::CommitItem;
using idemgate::CommitStatus;
using idemgate::ItemCommit;
using idemgate::Key;
using idemgate::SqliteTransaction;
using idemgate::Status;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;
using namespace idemgate::test::sqlite;

namespace {

// --- The coalescer ------------------------------------------------------------------------------

struct Job {
  int key = 0;
};

using Jobs = idemgate::detail::Coalescer<Job, int>;

// A runner that records each group's items (its leader's first) and holds every group until the
// test lets it go.
class HeldGroups {
 public:
  void run(std::span<Jobs::Slot* const> group) {
    std::unique_lock lock(mutex_);
    groups_.emplace_back();
    for (auto* s : group) groups_.back().push_back(s->item.key);
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_ >= groups_.size(); });
    for (auto* s : group) s->answer = s->item.key;
  }
  // Waits until `n` groups started.
  void wait_started(std::size_t n) {
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(changed_.wait_for(lock, 10s, [&] { return groups_.size() >= n; }))
        << "group " << n << " never started";
  }
  // Lets the groups started so far finish.
  void release_started() {
    std::lock_guard lock(mutex_);
    released_ = groups_.size();
    changed_.notify_all();
  }
  std::vector<std::vector<int>> groups() {
    std::lock_guard lock(mutex_);
    return groups_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::vector<int>> groups_;
  std::size_t released_ = 0;
};

// Waits until `n` calls are queued for a group.
void wait_queued(const Jobs& jobs, std::size_t n) {
  for (int polls = 0; jobs.waiting() < n && polls < 4000; ++polls) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(jobs.waiting(), n);
}

TEST(CoalescerOrder, TheOldestWaitingCallLeadsTheNextGroupWhicheverThreadWakesFirst) {
  // Keys 1 and 2 are equal in the second group: only the leader's can go in, so who leads decides
  // what the group holds. Twenty rounds: whichever thread the system wakes first, the oldest
  // queued call leads.
  for (int round = 0; round < 20; ++round) {
    HeldGroups held;
    Jobs jobs({0us, 8, 1}, [&](std::span<Jobs::Slot* const> g) { held.run(g); });
    std::vector<std::thread> threads;
    threads.emplace_back([&] { (void)jobs.submit({0}); });
    held.wait_started(1);
    // Queued in this order behind the running group: 10, 20, 10 (equal to the first), 30.
    for (int key : {10, 20, 10, 30}) {
      const std::size_t before = jobs.waiting();
      threads.emplace_back([&jobs, key] { (void)jobs.submit({key}); });
      wait_queued(jobs, before + 1);
    }
    held.release_started();
    held.wait_started(2);
    held.release_started();
    held.wait_started(3);
    held.release_started();
    for (auto& t : threads) t.join();
    const auto groups = held.groups();
    ASSERT_EQ(groups.size(), 3u);
    EXPECT_EQ(groups[1], (std::vector<int>{10, 20, 30}))
        << "round " << round << ": the next group is not led by the oldest waiting call";
    EXPECT_EQ(groups[2], (std::vector<int>{10}));
  }
}

TEST(CoalescerOrder, ParkedCountsTheCallsThatWaitOnAnotherCallOnly) {
  HeldGroups held;
  Jobs jobs({0us, 8, 1}, [&](std::span<Jobs::Slot* const> g) { held.run(g); });
  std::vector<std::thread> threads;
  threads.emplace_back([&] { (void)jobs.submit({0}); });
  held.wait_started(1);
  EXPECT_EQ(jobs.parked(), 0u) << "a leader running its own group waits on nobody";
  for (int key = 1; key <= 3; ++key) {
    threads.emplace_back([&jobs, key] { (void)jobs.submit({key}); });
    wait_queued(jobs, static_cast<std::size_t>(key));
  }
  EXPECT_EQ(jobs.parked(), 3u) << "three calls queued behind a running group";
  held.release_started();
  held.wait_started(2);
  // Call 1 leads the second group; calls 2 and 3 are its members and wait on it.
  EXPECT_EQ(jobs.parked(), 2u);
  held.release_started();
  for (auto& t : threads) t.join();
  EXPECT_EQ(jobs.parked(), 0u);
  EXPECT_EQ(held.groups(), (std::vector<std::vector<int>>{{0}, {1, 2, 3}}));
}

// --- SqliteStore::commit_each with a business write that breaks the group's transaction --------

// One way a business write breaks the store's transaction (as in test_sqlite_store.cpp, for one
// commit): it books, then does this.
struct Breaker {
  const char* name;
  std::function<void(SqliteTransaction&, const Key&)> breaks;
};

void raw_exec(SqliteTransaction& tx, const char* sql) {
  sqlite3_exec(tx.db(), sql, nullptr, nullptr, nullptr);  // its result ignored
}

// `left` receives the statement the last breaker left running, to be finalized by the test.
std::vector<Breaker> breakers(sqlite3_stmt*& left) {
  return {
      {"COMMIT through db()", [](SqliteTransaction& tx, const Key&) { raw_exec(tx, "COMMIT"); }},
      {"ROLLBACK; BEGIN through db(), then the log row rewritten as committed",
       [](SqliteTransaction& tx, const Key& key) {
         raw_exec(tx, "ROLLBACK; BEGIN");
         tx.exec("UPDATE idemgate_log SET status = 'committed', result = 'slot' WHERE key = ?",
                 key);
       }},
      {"RELEASE of the store's savepoint through db()",
       [](SqliteTransaction& tx, const Key&) { raw_exec(tx, "RELEASE SAVEPOINT idemgate_item"); }},
      {"ROLLBACK TO the store's savepoint through db()",
       [](SqliteTransaction& tx, const Key&) {
         raw_exec(tx, "ROLLBACK TO SAVEPOINT idemgate_item");
       }},
      {"its log row's fence moved",
       [](SqliteTransaction& tx, const Key& key) {
         tx.exec("UPDATE idemgate_log SET fence = fence + 1 WHERE key = ?", key);
       }},
      {"a statement left running",
       [&left](SqliteTransaction& tx, const Key&) {
         sqlite3_prepare_v2(tx.db(), "SELECT 1 UNION ALL SELECT 2", -1, &left, nullptr);
         sqlite3_step(left);  // neither reset nor finalized: the store resets it
       }},
  };
}

std::int64_t bookings_of(const std::string& path, const Key& key) {
  auto db = open_raw(path);
  sq::Statement read(db.get(), "SELECT count(*) FROM bookings WHERE source_event = ?", "reading");
  read.bind("reading", key);
  return read.step("reading") ? read.int64(0) : -1;
}

TEST(SqliteGroupCommit, ABusinessWriteThatBreaksTheTransactionCostsOnlyItsOwnEvent) {
  sqlite3_stmt* left = nullptr;
  for (const Breaker& breaker : breakers(left)) {
    for (std::size_t broken = 0; broken < 3; ++broken) {
      SCOPED_TRACE(std::string(breaker.name) + ", item " + std::to_string(broken));
      Fixture f;
      std::vector<Key> keys;
      std::vector<CommitItem> items;
      for (int i = 0; i < 3; ++i) {
        keys.push_back(idemgate::derive_key("group", breaker.name, std::to_string(i)));
        const auto r = reserve(f.store, keys.back());
        ASSERT_EQ(r.kind, idemgate::Reservation::Kind::acquired);
        items.push_back({keys.back(), r.fence, "slot"});
      }
      std::vector<int> runs(3, 0);
      std::vector<ItemCommit> answers;
      try {
        answers = f.store.commit_each(items, [&](SqliteTransaction& tx, std::size_t i) {
          ++runs[i];
          book(tx, keys[i], SlotRequest{"MSKU" + std::to_string(i), "w"}, "slot");
          if (i == broken && runs[i] == 1) breaker.breaks(tx, keys[i]);
        });
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the group threw instead of answering each item: " << e.what();
      }
      sqlite3_finalize(std::exchange(left, nullptr));  // before its connection closes
      if (answers.empty()) continue;
      ASSERT_EQ(answers.size(), 3u);
      for (std::size_t i = 0; i < 3; ++i) {
        if (i == broken) {
          ASSERT_TRUE(answers[i].error)
              << "the broken item was answered "
              << (answers[i].status == CommitStatus::committed ? "committed" : "lost_lease");
          try {
            std::rethrow_exception(answers[i].error);
          } catch (const idemgate::StoreError& e) {
            EXPECT_NE(std::string(e.what()).find("business write"), std::string::npos) << e.what();
          } catch (const std::exception& e) {
            ADD_FAILURE() << "not a StoreError: " << e.what();
          }
          EXPECT_EQ(runs[i], 1) << "the broken item's business write ran again";
          EXPECT_EQ(committed_status(f.db, keys[i]), "in_flight");
          EXPECT_EQ(bookings_of(f.db, keys[i]), 0) << "booked without its log row";
        } else {
          EXPECT_FALSE(answers[i].error) << "item " << i << " paid for another's business write";
          EXPECT_EQ(answers[i].status, CommitStatus::committed) << "item " << i;
          EXPECT_EQ(committed_status(f.db, keys[i]), "committed") << "item " << i;
          EXPECT_EQ(bookings_of(f.db, keys[i]), 1) << "item " << i;
        }
      }
      // The store is unharmed: the next commit works.
      const Key next = idemgate::derive_key("group", breaker.name, "next");
      const auto r = reserve(f.store, next);
      EXPECT_EQ(f.store.commit(next, r.fence, "slot",
                               [&](SqliteTransaction& tx) {
                                 book(tx, next, SlotRequest{"MSKU9", "w"}, "slot");
                               }),
                CommitStatus::committed);
    }
  }
}

// Through the gate: three deliveries at once, one group; one event's business write commits on
// its own through db(). Its caller gets an error and does not ack; its lease was given back, so
// its redelivery (with the business write fixed) takes it over at once and books it once.
TEST(SqliteGroupCommit, TheEventWhoseBusinessWriteBrokeTheGroupIsRedeliveredAndBookedOnce) {
  Fixture f;
  idemgate::test::FakeTerminal<> terminal;
  std::atomic<bool> breaking{true};
  const Key victim = idemgate::derive_key("group-gate", "2");
  idemgate::Gate gate(
      "ect.claim_slot", f.store, terminal,
      [&](SqliteTransaction& tx, const Key& key, const SlotRequest& r, const std::string& slot) {
        book(tx, key, r, slot);
        if (key == victim && breaking.load()) raw_exec(tx, "COMMIT");
      },
      {.lease = 1min, .coalesce = {.enabled = true, .window = 1s, .max_events = 3}});
  std::vector<std::optional<idemgate::Result<std::string>>> results(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int i = 1; i <= 3; ++i)
    threads.emplace_back([&, i] {
      const Key key = idemgate::derive_key("group-gate", std::to_string(i));
      try {
        results[static_cast<std::size_t>(i - 1)] =
            gate.process(key, SlotRequest{"MSKU" + std::to_string(i), "w"});
      } catch (const idemgate::StoreError& e) {
        errors[static_cast<std::size_t>(i - 1)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const auto stats = gate.coalescing();
  EXPECT_EQ(stats.commit_groups, 1u);
  EXPECT_EQ(stats.commits, 3u) << "the three commits were not one group";
  for (int i = 1; i <= 3; ++i) {
    const Key key = idemgate::derive_key("group-gate", std::to_string(i));
    const auto& result = results[static_cast<std::size_t>(i - 1)];
    if (key == victim) {
      EXPECT_FALSE(result.has_value()) << "answered " << to_string(result->status());
      EXPECT_NE(errors[static_cast<std::size_t>(i - 1)].find("business write"), std::string::npos)
          << errors[static_cast<std::size_t>(i - 1)];
      EXPECT_EQ(committed_status(f.db, key), "in_flight");
      EXPECT_EQ(bookings_of(f.db, key), 0);
      const auto row = gate.store().find(key);
      ASSERT_TRUE(row.has_value());
      EXPECT_LE(row->lease_until, std::chrono::system_clock::now())
          << "the lease was not given back: the redelivery would answer in flight";
    } else {
      ASSERT_TRUE(result.has_value()) << errors[static_cast<std::size_t>(i - 1)];
      EXPECT_EQ(result->status(), Status::processed) << result->reason();
      EXPECT_EQ(bookings_of(f.db, key), 1);
    }
  }
  breaking = false;
  const auto again = gate.process(victim, SlotRequest{"MSKU2", "w"});
  EXPECT_EQ(again.status(), Status::processed) << again.reason();
  EXPECT_TRUE(again.took_over());
  EXPECT_EQ(bookings_of(f.db, victim), 1);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM bookings"), 3);
  EXPECT_EQ(count(f.db, "SELECT count(*) FROM idemgate_log WHERE status = 'committed'"), 3);
}

}  // namespace
