// docs/guide.md: creating and writing the application's own tables on PostgreSQL.
#include <idemgate/store/postgres.hpp>

#include <pqxx/pqxx>

#include <string>

// @snippet: the example goes here
