// docs/guide.md: one event in one transaction on PostgreSQL.
#include <idemgate/store/postgres.hpp>
#include <idemgate/transaction_gate.hpp>

#include <pqxx/pqxx>

#include <string>

void SNIPPET_FUNCTION(idemgate::PostgresStore& store) {
  // @snippet: the example goes here
}
