// The examples of store/postgres.hpp: inside a business write, and setting a store up.
#include <idemgate/store/postgres.hpp>

#include <string>
#include <string_view>
#include <vector>

void SNIPPET_FUNCTION(pqxx::work& tx, const std::string& container, const std::string& slot,
                      const idemgate::Key& key) {
  {
    // @snippet: the example goes here
  }
}
