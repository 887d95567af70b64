// docs/guide.md: creating the application's own tables on PostgreSQL.
#include <pqxx/pqxx>

#include <string>

// @snippet: the example goes here
