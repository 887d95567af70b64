// The example of server/beast.hpp, inside a function that has a Beast request `req`, an endpoint
// `orders` on SQLite, its handler `place_order` and `account_of`.
#include <idemgate/server/beast.hpp>
#include <idemgate/store/sqlite.hpp>

#include <string>

void SNIPPET_FUNCTION(const idemgate::server::BeastRequest& req,
                      idemgate::server::Endpoint<idemgate::SqliteStore>& orders) {
  auto place_order = [](idemgate::SqliteTransaction&, const idemgate::server::Request&) {
    return idemgate::server::Response{201, {}, "{}"};
  };
  auto account_of = [](const idemgate::server::BeastRequest&) { return std::string("acme"); };
  // @snippet: the example goes here
}
