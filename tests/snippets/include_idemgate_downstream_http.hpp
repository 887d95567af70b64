// The example of downstream/http.hpp: a mapping, the downstream and a gate over a MemoryStore.
#include <idemgate/downstream/http.hpp>
#include <idemgate/idemgate.hpp>
#include <idemgate/store/memory.hpp>

#include <optional>
#include <string>
#include <string_view>

void SNIPPET_FUNCTION() {
  idemgate::MemoryStore store;
  auto book_in_tms = [](idemgate::MemoryStore::transaction& tx, const std::string& container,
                        const std::string& slot) { tx.on_commit([] {}); };
  // @snippet: the example goes here
}
