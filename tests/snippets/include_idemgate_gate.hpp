// The example of gate.hpp: a gate over PostgreSQL whose business write books in the TMS.
#include "context.hpp"

#include <idemgate/store/postgres.hpp>

using namespace snippet;

void book(pqxx::work& tx, const SlotRequest& r, const std::string& slot);

void SNIPPET_FUNCTION(idemgate::PostgresStore& store, ect_delta::Notification n, Message message) {
  Terminal terminal;
  // @snippet: the example goes here
}
