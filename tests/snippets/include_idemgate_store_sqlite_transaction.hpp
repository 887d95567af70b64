// The examples of store/sqlite/transaction.hpp: inside a business write.
#include "context.hpp"

#include <idemgate/store/sqlite.hpp>

using namespace snippet;
using namespace std::chrono_literals;

void SNIPPET_FUNCTION(idemgate::SqliteTransaction& tx, idemgate::SqliteStore& store,
                      const std::string& account, const std::string& id,
                      const std::string& container, const std::string& today) {
  {
    // @snippet: the example goes here
  }
}
