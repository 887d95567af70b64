// Group commit (GateOptions::coalesce): concurrent process() calls share one reservation statement
// and one commit transaction, each business write under its own savepoint; on MemoryStore (a test
// double without batch statements: groups run one by one), SqliteStore and PostgresStore. With
// IDEMGATE_TEST_THROUGH=pgbouncer the PostgreSQL tests go through PgBouncer in transaction mode.

#include "support/fake_terminal.hpp"
#include "support/memory_bookings.hpp"
#include "support/pg_bookings.hpp"
#include "support/pgbouncer.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/detail/coalescer.hpp>
#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using idemgate::CommitItem;
using idemgate::CommitStatus;
using idemgate::GateOptions;
using idemgate::Key;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;
using namespace idemgate::test::sqlite;

namespace {

// --- The coalescer alone ------------------------------------------------------------------------

struct Job {
  int key = 0;
  int value = 0;
};

using Numbers = idemgate::detail::Coalescer<Job, int>;

TEST(Coalescer, ALoneCallRunsAtOnceInAGroupOfItsOwn) {
  std::vector<std::size_t> sizes;
  Numbers numbers({0us, 32, 1}, [&](std::span<Numbers::Slot* const> group) {
    sizes.push_back(group.size());
    for (auto* s : group) s->answer = s->item.value * 2;
  });
  EXPECT_EQ(numbers.submit({1, 21}), 42);
  EXPECT_EQ(numbers.submit({2, 5}), 10);
  EXPECT_EQ(sizes, (std::vector<std::size_t>{1, 1}));
}

TEST(Coalescer, CallsArrivingWhileAGroupRunsFormTheNextGroupAndKeepTheirAnswers) {
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  std::vector<std::size_t> sizes;
  Numbers numbers({0us, 32, 1}, [&](std::span<Numbers::Slot* const> group) {
    {
      std::unique_lock lock(m);
      sizes.push_back(group.size());
      cv.notify_all();
      cv.wait(lock, [&] { return release || sizes.size() > 1; });
    }
    for (auto* s : group) s->answer = s->item.value + 1000;
  });
  std::vector<int> answers(5, -1);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { answers[0] = numbers.submit({0, 0}); });
  {
    // The first group runs (and blocks); four more calls queue behind it.
    std::unique_lock lock(m);
    cv.wait_for(lock, 10s, [&] { return !sizes.empty(); });
  }
  for (int i = 1; i < 5; ++i) threads.emplace_back([&, i] { answers[i] = numbers.submit({i, i}); });
  // The coalescer holds them until the running group is done.
  for (int polls = 0; numbers.waiting() < 4 && polls < 2000; ++polls)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(numbers.waiting(), 4u);
  {
    std::lock_guard lock(m);
    release = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(answers[i], 1000 + i);
  ASSERT_EQ(sizes.size(), 2u) << "the four waiting calls were not run as one group";
  EXPECT_EQ(sizes[0], 1u);
  EXPECT_EQ(sizes[1], 4u);
}

TEST(Coalescer, ItemsWithEqualKeysNeverShareAGroup) {
  std::mutex m;
  std::vector<std::vector<int>> groups;
  Numbers numbers({300ms, 32, 1}, [&](std::span<Numbers::Slot* const> group) {
    std::lock_guard lock(m);
    groups.emplace_back();
    for (auto* s : group) {
      groups.back().push_back(s->item.key);
      s->answer = s->item.value;
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) threads.emplace_back([&, i] { (void)numbers.submit({i % 2, i}); });
  for (auto& t : threads) t.join();
  std::size_t items = 0;
  for (const auto& g : groups) {
    items += g.size();
    for (std::size_t a = 0; a < g.size(); ++a)
      for (std::size_t b = a + 1; b < g.size(); ++b)
        EXPECT_NE(g[a], g[b]) << "two items of one key shared a group";
  }
  EXPECT_EQ(items, 6u);
  EXPECT_GE(groups.size(), 3u);
}

TEST(Coalescer, WhatTheRunnerThrowsReachesEveryCallerOfTheGroupButNotTheAnsweredOnes) {
  Numbers numbers({300ms, 3, 1}, [&](std::span<Numbers::Slot* const> group) {
    for (auto* s : group)
      if (s->item.value == 1) s->answer = 1;
    throw std::runtime_error("the group failed");
  });
  std::atomic<int> thrown{0}, answered{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      try {
        EXPECT_EQ(numbers.submit({i, i}), 1);
        answered.fetch_add(1);
      } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "the group failed");
        thrown.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(answered.load(), 1);
  EXPECT_EQ(thrown.load(), 2);
}

TEST(Coalescer, AWindowGathersCallsUntilTheGroupIsFull) {
  std::vector<std::size_t> sizes;
  std::mutex m;
  Numbers numbers({10s, 4, 1}, [&](std::span<Numbers::Slot* const> group) {
    std::lock_guard lock(m);
    sizes.push_back(group.size());
    for (auto* s : group) s->answer = 0;
  });
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { (void)numbers.submit({i, i}); });
  for (auto& t : threads) t.join();
  // A full group does not wait out its window.
  EXPECT_LT(std::chrono::steady_clock::now() - started, 9s);
  EXPECT_EQ(sizes, (std::vector<std::size_t>{4}));
}

TEST(Coalescing, OptionsOutOfRangeAreRefusedWithTheirRange) {
  idemgate::MemoryStore store;
  FakeTerminal<> terminal;
  idemgate::test::MemoryBookings bookings;
  for (auto change : std::vector<std::function<void(idemgate::Coalescing&)>>{
           [](auto& c) { c.max_events = 0; }, [](auto& c) { c.max_events = 65; },
           [](auto& c) { c.window = 2s; }, [](auto& c) { c.window = -1us; },
           [](auto& c) { c.concurrent_groups = 0; }}) {
    GateOptions options;
    options.coalesce.enabled = true;
    change(options.coalesce);
    try {
      idemgate::Gate gate("ect.claim_slot", store, terminal, bookings.writer(), options);
      ADD_FAILURE() << "an option out of range was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("GateOptions::coalesce."), std::string::npos)
          << e.what();
    }
  }
}

TEST(Coalescing, OptionsAtTheirExtremesAreHonoured) {
  idemgate::MemoryStore store;
  FakeTerminal<> terminal;
  idemgate::test::MemoryBookings bookings;
  // Groups of one: every call is its own group.
  GateOptions single;
  single.coalesce.enabled = true;
  single.coalesce.max_events = 1;
  single.coalesce.concurrent_groups = 64;
  idemgate::Gate gate("ect.claim_slot", store, terminal, bookings.writer(), single);
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&, i] {
      EXPECT_EQ(gate.process(idemgate::derive_key("extremes", std::to_string(i)),
                             SlotRequest{"C" + std::to_string(i), "w"})
                    .status(),
                Status::processed);
    });
  for (auto& t : threads) t.join();
  const auto stats = gate.coalescing();
  EXPECT_EQ(stats.reservation_groups, 6u);
  EXPECT_EQ(stats.commit_groups, 6u);
  // The largest group and the longest window are accepted.
  GateOptions widest;
  widest.coalesce.enabled = true;
  widest.coalesce.max_events = 64;
  widest.coalesce.window = 1s;
  EXPECT_NO_THROW(idemgate::Gate("ect.claim_slot", store, terminal, bookings.writer(), widest));
}

// --- The gate over each store -------------------------------------------------------------------

constexpr int group_size = 8;

// Options that put `group_size` concurrent calls into one group of each kind: a long window that
// ends as soon as the group is full.
GateOptions grouped() {
  GateOptions options;
  options.coalesce.enabled = true;
  options.coalesce.window = 1s;  // the most it takes
  options.coalesce.max_events = group_size;
  return options;
}

Key key_of(int i, const std::string& run) {
  return idemgate::derive_key("coalesce.test", run, std::to_string(i));
}

SlotRequest request_of(int i) {
  return {"CONT" + std::to_string(1000000 + i), "mon-08"};
}

// Runs `group_size` process() calls at once; each result, or what it threw.
template <class Gate>
std::vector<std::optional<idemgate::Result<std::string>>> process_together(
    Gate& gate, const std::string& run, std::vector<std::string>* errors = nullptr) {
  std::vector<std::optional<idemgate::Result<std::string>>> results(group_size);
  std::vector<std::string> thrown(group_size);
  std::vector<std::thread> threads;
  for (int i = 0; i < group_size; ++i)
    threads.emplace_back([&, i] {
      try {
        results[i] = gate.process(key_of(i, run), request_of(i));
      } catch (const std::exception& e) {
        thrown[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  if (errors != nullptr) *errors = thrown;
  return results;
}

TEST(CoalescingMemory, EveryEventOfAGroupIsProcessedOnce) {
  idemgate::MemoryStore store;
  FakeTerminal<> terminal;
  idemgate::test::MemoryBookings bookings;
  idemgate::Gate gate("ect.claim_slot", store, terminal, bookings.writer(), grouped());
  const auto results = process_together(gate, "memory");
  for (const auto& r : results) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), Status::processed) << r->reason();
  }
  EXPECT_EQ(bookings.size(), static_cast<std::size_t>(group_size));
  const auto stats = gate.coalescing();
  EXPECT_EQ(stats.reservation_groups, 1u);
  EXPECT_EQ(stats.commit_groups, 1u);
  EXPECT_EQ(stats.commits, static_cast<std::size_t>(group_size));
  // Redeliveries are answered from the log.
  const auto again = process_together(gate, "memory");
  for (const auto& r : again) EXPECT_EQ(r->status(), Status::duplicate);
  EXPECT_EQ(bookings.size(), static_cast<std::size_t>(group_size));
}

TEST(CoalescingMemory, WithCoalescingOffNoGroupIsFormed) {
  idemgate::MemoryStore store;
  FakeTerminal<> terminal;
  idemgate::test::MemoryBookings bookings;
  idemgate::Gate gate("ect.claim_slot", store, terminal, bookings.writer());
  (void)process_together(gate, "off");
  const auto stats = gate.coalescing();
  EXPECT_EQ(stats.reservation_groups + stats.commit_groups, 0u);
  EXPECT_EQ(bookings.size(), static_cast<std::size_t>(group_size));
}

// The SQLite TMS: one bookings table in the store's own file.
class CoalescingSqlite : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("log.db");
    store_.emplace(path_);
    store_->migrate();
    auto raw = open_raw(path_);
    sq::exec(raw.get(),
             "CREATE TABLE bookings (container TEXT NOT NULL, slot TEXT NOT NULL, "
             "source_event BLOB NOT NULL UNIQUE)");
  }

  // The business write: one booking; throws for `refused`; ends the store's transaction for
  // `breaker`.
  auto writer() {
    return [this](SqliteTransaction& tx, const Key& key, const SlotRequest& request,
                  const std::string& slot) {
      if (refused && key == *refused) throw std::runtime_error("the TMS refused this booking");
      tx.exec("INSERT INTO bookings (container, slot, source_event) VALUES (?, ?, ?)",
              request.container, slot, idemgate::SqliteBlob{key.view()});
      if (breaker && key == *breaker) sqlite3_exec(tx.db(), "ROLLBACK", nullptr, nullptr, nullptr);
    };
  }

  std::int64_t bookings() { return count(path_, "SELECT count(*) FROM bookings"); }
  std::int64_t committed() {
    return count(path_, "SELECT count(*) FROM idemgate_log WHERE status = 'committed'");
  }
  std::int64_t half_states() {
    return count(path_,
                 "SELECT (SELECT count(*) FROM idemgate_log l WHERE status = 'committed' AND NOT "
                 "EXISTS (SELECT 1 FROM bookings b WHERE b.source_event = l.key)) + (SELECT "
                 "count(*) FROM bookings b WHERE NOT EXISTS (SELECT 1 FROM idemgate_log l WHERE "
                 "l.key = b.source_event AND l.status = 'committed'))");
  }

  TempDir dir_;
  std::string path_;
  std::optional<SqliteStore> store_;
  FakeTerminal<> terminal_;
  std::optional<Key> refused, breaker;
};

TEST_F(CoalescingSqlite, EveryEventOfAGroupIsBookedOnceInOneTransaction) {
  idemgate::Gate gate("ect.claim_slot", *store_, terminal_, writer(), grouped());
  const auto results = process_together(gate, "sqlite");
  for (const auto& r : results) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), Status::processed) << r->reason();
  }
  const auto stats = gate.coalescing();
  EXPECT_EQ(stats.reservation_groups, 1u);
  EXPECT_EQ(stats.commit_groups, 1u);
  EXPECT_EQ(bookings(), group_size);
  EXPECT_EQ(committed(), group_size);
  EXPECT_EQ(half_states(), 0);
  const auto again = process_together(gate, "sqlite");
  for (const auto& r : again) EXPECT_EQ(r->status(), Status::duplicate);
  EXPECT_EQ(bookings(), group_size);
}

TEST_F(CoalescingSqlite, AThrowingBusinessWriteCostsOnlyItsOwnEvent) {
  refused = key_of(3, "sqlite-throw");
  idemgate::Gate gate("ect.claim_slot", *store_, terminal_, writer(), grouped());
  std::vector<std::string> errors;
  const auto results = process_together(gate, "sqlite-throw", &errors);
  EXPECT_EQ(gate.coalescing().commit_groups, 1u);
  for (int i = 0; i < group_size; ++i) {
    if (i == 3) {
      EXPECT_FALSE(results[i]);
      EXPECT_NE(errors[i].find("the TMS refused"), std::string::npos) << errors[i];
    } else {
      ASSERT_TRUE(results[i]) << errors[i];
      EXPECT_EQ(results[i]->status(), Status::processed);
    }
  }
  EXPECT_EQ(bookings(), group_size - 1);
  EXPECT_EQ(half_states(), 0);
  // Its lease was given back: the redelivery takes it over at once and books it.
  refused.reset();
  idemgate::Gate plain("ect.claim_slot", *store_, terminal_, writer());
  EXPECT_EQ(plain.process(key_of(3, "sqlite-throw"), request_of(3)).status(), Status::processed);
  EXPECT_EQ(bookings(), group_size);
  EXPECT_EQ(half_states(), 0);
}

TEST_F(CoalescingSqlite, ABusinessWriteThatEndsTheTransactionCostsOnlyItsOwnEvent) {
  breaker = key_of(5, "sqlite-break");
  idemgate::Gate gate("ect.claim_slot", *store_, terminal_, writer(), grouped());
  std::vector<std::string> errors;
  const auto results = process_together(gate, "sqlite-break", &errors);
  for (int i = 0; i < group_size; ++i) {
    if (i == 5) {
      EXPECT_FALSE(results[i]);
      EXPECT_NE(errors[i].find("broke the store's transaction"), std::string::npos) << errors[i];
    } else {
      ASSERT_TRUE(results[i]) << errors[i];
      EXPECT_EQ(results[i]->status(), Status::processed);
    }
  }
  EXPECT_EQ(bookings(), group_size - 1);
  EXPECT_EQ(half_states(), 0);
}

TEST_F(CoalescingSqlite, AnItemWhoseFenceMovedIsLostLeaseAndTheOthersCommit) {
  const std::string request = "r";
  const auto fingerprint = idemgate::detail::sha256(request);
  std::vector<Key> keys;
  std::vector<std::int64_t> fences;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(key_of(i, "sqlite-fence"));
    fences.push_back(store_->reserve(keys.back(), fingerprint, request, 10s).fence);
  }
  // The second item's event was taken over meanwhile: its fence moved on.
  auto raw = open_raw(path_);
  sq::exec(raw.get(),
           "UPDATE idemgate_log SET fence = fence + 1 WHERE key = X'" + keys[1].hex() + "'");
  std::vector<CommitItem> items;
  for (int i = 0; i < 3; ++i) items.push_back({keys[i], fences[i], "slot"});
  std::vector<std::size_t> written;
  const auto answers = store_->commit_each(items, [&](SqliteTransaction& tx, std::size_t i) {
    tx.exec("INSERT INTO bookings (container, slot, source_event) VALUES (?, ?, ?)", "c", "s",
            idemgate::SqliteBlob{keys[i].view()});
    written.push_back(i);
  });
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].status, CommitStatus::committed);
  EXPECT_EQ(answers[1].status, CommitStatus::lost_lease);
  EXPECT_EQ(answers[2].status, CommitStatus::committed);
  for (const auto& a : answers) EXPECT_FALSE(a.error);
  EXPECT_EQ(bookings(), 2);
  EXPECT_EQ(half_states(), 0);
  // A commit repeated under a fence that committed is answered committed, writing nothing.
  const auto repeated = store_->commit_each(
      std::span<const CommitItem>(items.data(), 1),
      [&](SqliteTransaction&, std::size_t) { ADD_FAILURE() << "a business write ran twice"; });
  EXPECT_EQ(repeated[0].status, CommitStatus::committed);
}

TEST_F(CoalescingSqlite, AGroupOfReservationsIsOneTransactionAndAnswersEachKey) {
  const std::string request = "r";
  const auto fingerprint = idemgate::detail::sha256(request);
  const Key old = key_of(0, "sqlite-reserve");
  ASSERT_EQ(store_->reserve(old, fingerprint, request, 10s).kind,
            idemgate::Reservation::Kind::acquired);
  std::vector<idemgate::ReserveItem> items{{old, fingerprint, request},
                                           {key_of(1, "sqlite-reserve"), fingerprint, request}};
  const auto reservations = store_->reserve_batch(items, 10s);
  ASSERT_EQ(reservations.size(), 2u);
  EXPECT_EQ(reservations[0].kind, idemgate::Reservation::Kind::existing);
  EXPECT_EQ(reservations[0].status, RecordStatus::in_flight);
  EXPECT_EQ(reservations[1].kind, idemgate::Reservation::Kind::acquired);
  EXPECT_EQ(count(path_, "SELECT duplicates FROM idemgate_log WHERE key = X'" + old.hex() + "'"),
            1);
}

// The PostgreSQL TMS of pg_bookings.hpp.
class CoalescingPostgres : public idemgate::test::PgBookingsTest {
 protected:
  idemgate::PostgresOptions options() const {
    idemgate::PostgresOptions o;
    o.table = log;
    o.pool_size = 4;
    return idemgate::test::store_options(o);
  }

  // The booking writer; throws for `refused`; swallows an SQL error after booking `breaker`.
  auto writer() {
    return [this](pqxx::work& tx, const Key& key, const SlotRequest& request,
                  const std::string& slot) {
      if (refused && key == *refused) throw std::runtime_error("the TMS refused this booking");
      booking_writer()(tx, key, request, slot);
      if (breaker && key == *breaker) {
        // Swallows the error that ends its transaction (libpqxx 6.4 rolls it back; later
        // versions leave it aborted): its booking must not commit, nor the others' be lost.
        try {
          idemgate::detail::pq::exec(tx, "SELECT 1/0");
        } catch (const pqxx::sql_error&) {
        }
      }
    };
  }

  std::optional<Key> refused, breaker;
  FakeTerminal<> terminal_;
};

TEST_F(CoalescingPostgres, EveryEventOfAGroupIsBookedOnceInOneTransaction) {
  idemgate::PostgresStore store(idemgate::test::store_uri(uri), options());
  store.migrate();
  idemgate::Gate gate("ect.claim_slot", store, terminal_, writer(), grouped());
  const auto results = process_together(gate, "pg");
  for (const auto& r : results) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), Status::processed) << r->reason();
  }
  const auto stats = gate.coalescing();
  EXPECT_EQ(stats.reservation_groups, 1u);
  EXPECT_EQ(stats.commit_groups, 1u);
  EXPECT_EQ(booking_count(), group_size);
  expect_no_half_state();
  // All of the group's rows were committed by one transaction (now() is its start).
  EXPECT_EQ(idemgate::test::pg_count_on(uri, "SELECT count(DISTINCT updated_at) FROM " + log), 1);
  const auto again = process_together(gate, "pg");
  for (const auto& r : again) EXPECT_EQ(r->status(), Status::duplicate);
  EXPECT_EQ(booking_count(), group_size);
}

TEST_F(CoalescingPostgres, AThrowingBusinessWriteCostsOnlyItsOwnEvent) {
  refused = key_of(3, "pg-throw");
  idemgate::PostgresStore store(idemgate::test::store_uri(uri), options());
  store.migrate();
  idemgate::Gate gate("ect.claim_slot", store, terminal_, writer(), grouped());
  std::vector<std::string> errors;
  const auto results = process_together(gate, "pg-throw", &errors);
  EXPECT_EQ(gate.coalescing().commit_groups, 1u);
  for (int i = 0; i < group_size; ++i) {
    if (i == 3) {
      EXPECT_FALSE(results[i]);
      EXPECT_NE(errors[i].find("the TMS refused"), std::string::npos) << errors[i];
    } else {
      ASSERT_TRUE(results[i]) << errors[i];
      EXPECT_EQ(results[i]->status(), Status::processed);
    }
  }
  EXPECT_EQ(booking_count(), group_size - 1);
  expect_no_half_state();
  refused.reset();
  idemgate::Gate plain("ect.claim_slot", store, terminal_, writer());
  EXPECT_EQ(plain.process(key_of(3, "pg-throw"), request_of(3)).status(), Status::processed);
  EXPECT_EQ(booking_count(), group_size);
  expect_no_half_state();
}

TEST_F(CoalescingPostgres, ABusinessWriteThatSwallowsAnSqlErrorCostsOnlyItsOwnEvent) {
  breaker = key_of(5, "pg-break");
  idemgate::PostgresStore store(idemgate::test::store_uri(uri), options());
  store.migrate();
  idemgate::Gate gate("ect.claim_slot", store, terminal_, writer(), grouped());
  std::vector<std::string> errors;
  const auto results = process_together(gate, "pg-break", &errors);
  for (int i = 0; i < group_size; ++i) {
    if (i == 5) {
      EXPECT_FALSE(results[i]);
      EXPECT_NE(errors[i].find("broke its transaction"), std::string::npos) << errors[i];
    } else {
      ASSERT_TRUE(results[i]) << errors[i];
      EXPECT_EQ(results[i]->status(), Status::processed);
    }
  }
  EXPECT_EQ(booking_count(), group_size - 1);
  expect_no_half_state();
}

TEST_F(CoalescingPostgres, AnItemWhoseFenceMovedIsLostLeaseAndTheOthersCommit) {
  idemgate::PostgresStore store(idemgate::test::store_uri(uri), options());
  store.migrate();
  const std::string request = "r";
  const auto fingerprint = idemgate::detail::sha256(request);
  std::vector<Key> keys;
  std::vector<std::int64_t> fences;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(key_of(i, "pg-fence"));
    fences.push_back(store.reserve(keys.back(), fingerprint, request, 10s).fence);
  }
  idemgate::test::pg_exec("UPDATE " + log + " SET fence = fence + 1 WHERE key = '\\x" +
                          keys[1].hex() + "'::bytea");
  std::vector<CommitItem> items;
  for (int i = 0; i < 3; ++i) items.push_back({keys[i], fences[i], "slot"});
  const SlotRequest slot_request{"CONT", "mon"};
  const auto answers = store.commit_each(items, [&](pqxx::work& tx, std::size_t i) {
    booking_writer()(tx, keys[i], slot_request, "s");
  });
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].status, CommitStatus::committed);
  EXPECT_EQ(answers[1].status, CommitStatus::lost_lease);
  EXPECT_EQ(answers[2].status, CommitStatus::committed);
  for (const auto& a : answers) EXPECT_FALSE(a.error);
  EXPECT_EQ(booking_count(), 2);
  expect_no_half_state();
  // A commit repeated under a fence that committed is answered committed; its business write's
  // rows roll back with its savepoint.
  const auto repeated = store.commit_each(
      std::span<const CommitItem>(items.data(), 1),
      [&](pqxx::work& tx, std::size_t) { booking_writer()(tx, keys[0], slot_request, "again"); });
  EXPECT_EQ(repeated[0].status, CommitStatus::committed);
  EXPECT_EQ(booking_count(), 2);
}

TEST_F(CoalescingPostgres, ALoneDeliveryAtWindowZeroRunsAtOnceAlone) {
  idemgate::PostgresStore store(idemgate::test::store_uri(uri), options());
  store.migrate();
  GateOptions options;
  options.coalesce.enabled = true;
  idemgate::Gate gate("ect.claim_slot", store, terminal_, writer(), options);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(gate.process(key_of(i, "pg-lone"), request_of(i)).status(), Status::processed);
  const auto stats = gate.coalescing();
  EXPECT_EQ(stats.reservation_groups, 3u);
  EXPECT_EQ(stats.reservations, 3u);
  EXPECT_EQ(stats.commit_groups, 3u);
  EXPECT_EQ(booking_count(), 3);
}

}  // namespace
