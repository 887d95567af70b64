// The examples of store/postgres/business_write.hpp: inside a business write.
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
