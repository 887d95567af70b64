// The store conformance suite over SqliteStore, the SQL suite included. Needs only SQLite.

#include <idemgate/store/sqlite.hpp>
#include <idemgate/testing/sql_store_conformance.hpp>
#include <idemgate/testing/store_conformance.hpp>

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>

/// SqliteStore: a fresh file in a temp directory; business rows in a table of the same file;
/// time is an injected clock.
struct SqliteTraits {
  using Store = idemgate::SqliteStore;

  void set_up() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "idemgate-conformance-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "cannot create a temp directory";
    dir = pattern;
    const std::string path = (dir / "idemgate.db").string();
    store = std::make_unique<Store>(path, idemgate::SqliteOptions{.clock = clock.fn()});
    store->migrate();
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    reader.reset(raw);
    idemgate::detail::sqlite::exec(reader.get(),
                                   "CREATE TABLE bookings (id INTEGER PRIMARY KEY, source_event "
                                   "BLOB NOT NULL, note TEXT NOT NULL)");
    // A trigger that rolls the whole transaction back, as a business rule might.
    idemgate::detail::sqlite::exec(reader.get(), "CREATE TABLE tripwire (x INTEGER)");
    idemgate::detail::sqlite::exec(reader.get(),
                                   "CREATE TRIGGER tripwire_rolls_back BEFORE INSERT ON tripwire "
                                   "BEGIN SELECT RAISE(ROLLBACK, 'tripwire'); END");
  }

  /// Runs the statement that ends the whole transaction; the business write catches its error.
  void break_transaction(Store::transaction& tx) {
    try {
      tx.exec("INSERT INTO tripwire VALUES (1)");
    } catch (const std::exception&) {
      // swallowed, as a careless business write would
    }
  }
  void tear_down() {
    store.reset();
    reader.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }

  void write_business(Store::transaction& tx, const idemgate::Key& key) {
    tx.exec("INSERT INTO bookings (source_event, note) VALUES (?, ?)", key, "booked");
  }
  std::int64_t business_rows() { return count("SELECT count(*) FROM bookings"); }
  std::int64_t business_rows_for(const idemgate::Key& key) {
    return count("SELECT count(*) FROM bookings WHERE source_event = ?", key);
  }
  std::int64_t distinct_business_events() {
    return count("SELECT count(DISTINCT source_event) FROM bookings");
  }
  void advance(std::chrono::milliseconds by) { clock.advance(by); }

  template <class... Args>
  std::int64_t count(const std::string& sql, const Args&... args) {
    return idemgate::detail::sqlite::query_int(reader.get(), sql, args...).value_or(-1);
  }

  idemgate::testing::ShiftableClock clock;
  std::filesystem::path dir;
  std::unique_ptr<Store> store;
  idemgate::detail::sqlite::Connection reader;  // a second connection: sees only what committed
};

namespace idemgate::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(Sqlite, StoreConformance, SqliteTraits);
INSTANTIATE_TYPED_TEST_SUITE_P(Sqlite, SqlStoreConformance, SqliteTraits);
}  // namespace idemgate::testing
