// The conformance suites instantiated over SqliteStore, as tests/test_conformance_sqlite.cpp
// does; the traits here are declared only (this file is compiled, not run).
#include <idemgate/store/sqlite.hpp>
#include <idemgate/testing/sql_store_conformance.hpp>
#include <idemgate/testing/store_conformance.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>

struct SqliteTraits {
  using Store = idemgate::SqliteStore;
  void set_up();
  void tear_down();
  void write_business(Store::transaction& tx, const idemgate::Key& key);
  void break_transaction(Store::transaction& tx);
  std::int64_t business_rows();
  std::int64_t business_rows_for(const idemgate::Key& key);
  std::int64_t distinct_business_events();
  void advance(std::chrono::milliseconds by);
  std::unique_ptr<Store> store;
};

// @snippet: the example goes here
