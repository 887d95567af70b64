// migrate() when several replicas start at once: each process opens its store, then all call
// migrate() at the same instant on a log that does not exist yet. Every one succeeds and the log
// works afterwards (docs/guide.md promises this; PostgreSQL serialises the schema with an
// advisory lock, since CREATE ... IF NOT EXISTS alone races on the catalog).

#include "support/child_process.hpp"
#include "support/postgres.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

constexpr int replicas = 6;

/// Runs `migrate` in `replicas` processes at one instant; their exit codes.
template <class Open>
std::vector<int> migrate_at_once(Open open) {
  const auto start = std::chrono::steady_clock::now() + 500ms;
  return idemgate::test::run_in_children(replicas, [&](int) {
    auto store = open();  // connected before the start, as a replica is
    std::this_thread::sleep_until(start);
    store->migrate();
    return 0;
  });
}

}  // namespace

TEST(MigrateAtOnce, PostgresReplicasStartingTogetherAllSucceed) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  // Several rounds, each on a log that does not exist yet: the race is in creating it.
  for (int round = 0; round < 3; ++round) {
    const std::string table = idemgate::test::unique_table("mig") + std::to_string(round);
    idemgate::test::pg_exec_on(uri, "DROP TABLE IF EXISTS " + table + ", " + table + "_mismatches");
    const auto codes = migrate_at_once([&] {
      return std::make_unique<idemgate::PostgresStore>(uri,
                                                       idemgate::PostgresOptions{.table = table});
    });
    for (const int code : codes)
      EXPECT_EQ(code, 0) << "round " << round << ": a replica's migrate() threw (exit "
                         << idemgate::test::child_threw << ")";
    idemgate::PostgresStore store(uri, {.table = table});
    const auto key = idemgate::derive_key("migrate", std::to_string(round));
    EXPECT_EQ(store.reserve(key, idemgate::detail::sha256("r"), "r", 1min).kind,
              idemgate::Reservation::Kind::acquired);
    idemgate::test::pg_exec_on(uri, "DROP TABLE " + table + ", " + table + "_mismatches");
  }
}

TEST(MigrateAtOnce, SqliteReplicasStartingTogetherAllSucceed) {
  idemgate::test::sqlite::TempDir dir;
  const std::string path = dir.file("replicas.db");
  const auto codes = migrate_at_once([&] {
    return std::make_unique<idemgate::SqliteStore>(path,
                                                   idemgate::SqliteOptions{.busy_timeout = 20s});
  });
  for (const int code : codes) EXPECT_EQ(code, 0) << "a replica's migrate() threw";
  idemgate::SqliteStore store(path);
  EXPECT_EQ(store
                .reserve(idemgate::derive_key("migrate", "sqlite"), idemgate::detail::sha256("r"),
                         "r", 1min)
                .kind,
            idemgate::Reservation::Kind::acquired);
}
