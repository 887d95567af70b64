#pragma once

// Access to the PostgreSQL server that scripts/test starts. A PostgreSQL test without it fails
// loudly: it is never skipped.

#include <idemgate/detail/postgres/pqxx_compat.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace idemgate::test {

/// The URI of the test server; fails the current test when it is not set.
inline std::string pg_uri() {
  const char* uri = std::getenv("IDEMGATE_TEST_PG");
  if (uri == nullptr || *uri == '\0') {
    ADD_FAILURE() << "IDEMGATE_TEST_PG is not set. Run scripts/test, which starts a throwaway "
                     "PostgreSQL on loopback and exports its URI, or export a URI of a server "
                     "you may write to.";
    return {};
  }
  return uri;
}

/// A table name unique to this process and test, so tests can run side by side.
inline std::string unique_table(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = stem + "_" + std::to_string(::getpid()) + "_";
  if (info != nullptr) {
    for (char c : std::string(info->name()))
      name +=
          static_cast<char>(std::isalnum(static_cast<unsigned char>(c)) ? std::tolower(c) : '_');
  }
  if (name.size() > 40) name.resize(40);
  return name;
}

/// Runs one statement on its own connection to `uri`.
inline pqxx::result pg_exec_on(const std::string& uri, const std::string& sql) {
  pqxx::connection connection(uri);
  pqxx::nontransaction tx(connection);
  return detail::pq::exec(tx, sql);
}

/// A single integer from a query on its own connection to `uri`.
inline std::int64_t pg_count_on(const std::string& uri, const std::string& sql) {
  return pg_exec_on(uri, sql)[0][0].as<std::int64_t>();
}

/// Runs one statement on the test server.
inline pqxx::result pg_exec(const std::string& sql) {
  return pg_exec_on(pg_uri(), sql);
}

/// A single integer from a query on the test server.
inline std::int64_t pg_count(const std::string& sql) {
  return pg_count_on(pg_uri(), sql);
}

}  // namespace idemgate::test
