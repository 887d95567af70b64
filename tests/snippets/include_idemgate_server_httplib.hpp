// The example of server/httplib.hpp, inside a function that has a cpp-httplib server `http`, an
// endpoint `orders` on SQLite and its handler `place_order`.
#include <idemgate/server/httplib.hpp>
#include <idemgate/store/sqlite.hpp>

void SNIPPET_FUNCTION(httplib::Server& http,
                      idemgate::server::Endpoint<idemgate::SqliteStore>& orders) {
  auto place_order = [](idemgate::SqliteTransaction&, const idemgate::server::Request&) {
    return idemgate::server::Response{201, {}, "{}"};
  };
  // @snippet: the example goes here
}
