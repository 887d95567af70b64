// The example of server/endpoint.hpp, inside a function that has a SQLite `store` and a
// `request`.
#include <idemgate/server/endpoint.hpp>
#include <idemgate/store/sqlite.hpp>

void SNIPPET_FUNCTION(idemgate::SqliteStore& store, const idemgate::server::Request& request) {
  // @snippet: the example goes here
}
