// SqliteStore under contention, in a binary of its own that runs alone (RUN_SERIAL): several
// processes or threads compete for one file, and what is checked is how long they wait, which
// other tests running beside them would distort.

#include "support/child_process.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace idemgate::test::sqlite;
using idemgate::CommitStatus;
using idemgate::StoreError;
using idemgate::test::SlotRequest;

namespace {

/// Children that read the log in a tight loop, as dashboards and tools do, until killed.
std::vector<pid_t> start_readers(const std::string& path, int n) {
  std::vector<pid_t> pids;
  for (int c = 0; c < n; ++c) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      try {
        SqliteStore reader(path, {.busy_timeout = 20s});
        for (int i = 0;; ++i) {
          (void)reader.find(idemgate::derive_key("wal", std::to_string(i % 100)));
          (void)reader.signals(1h);
        }
      } catch (...) {
      }
      ::_exit(2);
    }
    pids.push_back(pid);
  }
  return pids;
}

void stop(const std::vector<pid_t>& pids) {
  for (const pid_t pid : pids) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
}

}  // namespace

TEST(SqliteStoreContention, ThreadsSharingOneStoreEachGiveUpAtTheirOwnDeadline) {
  Fixture f;
  SqliteStore shared(f.db, {.busy_timeout = 500ms});
  auto locker = open_raw(f.db);
  sq::exec(locker.get(), "BEGIN IMMEDIATE");
  constexpr int threads = 4;
  std::vector<std::chrono::steady_clock::duration> waited(threads);
  std::vector<std::string> messages(threads);
  std::barrier start(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      start.arrive_and_wait();
      const auto began = std::chrono::steady_clock::now();
      try {
        (void)reserve(shared, idemgate::derive_key("deadline", std::to_string(t)));
      } catch (const StoreError& e) {
        messages[t] = e.what();
      }
      waited[t] = std::chrono::steady_clock::now() - began;
    });
  for (auto& w : workers) w.join();
  sq::exec(locker.get(), "ROLLBACK");
  int named_the_other_connection = 0;
  for (int t = 0; t < threads; ++t) {
    EXPECT_FALSE(messages[t].empty()) << "thread " << t << " must fail";
    EXPECT_LT(waited[t], 1250ms) << "thread " << t << " waited past its own deadline (500 ms)";
    const bool other_connection =
        messages[t].find("another connection or process held the write lock") != std::string::npos;
    const bool this_process =
        messages[t].find("another call in this process (reserving a key) has held the store") !=
        std::string::npos;
    EXPECT_TRUE(other_connection || this_process) << messages[t];
    EXPECT_NE(messages[t].find("busy timeout (500 ms)"), std::string::npos) << messages[t];
    named_the_other_connection += other_connection ? 1 : 0;
  }
  EXPECT_GE(named_the_other_connection, 1);
}

TEST(SqliteStoreContention, ProcessesWithShortTransactionsDoNotStarveEachOther) {
  Fixture f;
  constexpr int children = 8;
  const auto start = std::chrono::steady_clock::now() + 500ms;
  const auto codes = idemgate::test::run_in_children(children, [&](int c) {
    SqliteStore store(f.db, {.busy_timeout = 2s});
    std::this_thread::sleep_until(start);
    int timeouts = 0;
    for (int i = 0; std::chrono::steady_clock::now() < start + 3s; ++i) {
      try {
        (void)reserve(store, idemgate::derive_key("starve", std::to_string(c), std::to_string(i)));
      } catch (const StoreError&) {
        ++timeouts;
      }
    }
    return std::min(timeouts, 99);
  });
  int timeouts = 0;
  for (const int code : codes) {
    ASSERT_NE(code, idemgate::test::child_threw) << "a child could not open its store";
    timeouts += code;
  }
  EXPECT_EQ(timeouts, 0) << "reservations of a few milliseconds each timed out after 2 s";
  EXPECT_GT(count(f.db, "SELECT count(*) FROM idemgate_log"), children);
}

TEST(SqliteStoreContention, TheWalStaysNearItsLimitWhileOtherProcessesKeepReading) {
  Fixture f;
  constexpr std::int64_t limit = 1 << 20;
  SqliteStore writer(f.db, {.busy_timeout = 20s, .wal_size_limit = limit});
  const auto readers = start_readers(f.db, 2);
  std::int64_t most = 0;
  for (int i = 0; i < 500; ++i) {
    const Key key = idemgate::derive_key("wal", std::to_string(i));
    const Reservation r = reserve(writer, key);
    ASSERT_EQ(writer.commit(key, r.fence, "slot",
                            [&](SqliteTransaction& tx) {
                              book(tx, key, {"MSKU", "w"}, "slot");
                            }),
              CommitStatus::committed);
    most = std::max(most, file_bytes(f.db + "-wal"));
  }
  stop(readers);
  EXPECT_LT(most, 4 * limit) << "the WAL grew to " << most << " bytes";
  const std::optional<std::int64_t> gauge = writer.signals(1h).wal_bytes;
  ASSERT_TRUE(gauge.has_value());
  EXPECT_EQ(*gauge, file_bytes(f.db + "-wal"));
}
