// The example of transaction_gate.hpp: a ledger's debit as one transaction on PostgreSQL.
#include "context.hpp"

#include <idemgate/store/postgres.hpp>
#include <idemgate/transaction_gate.hpp>

#include <string>

using namespace snippet;

struct Debit {
  std::string account;
  long cents = 0;
};
template <>
struct idemgate::codec<Debit> {
  static void encode(const Debit& d, std::string& out) {
    out = d.account + ':' + std::to_string(d.cents);
  }
  static Debit decode(std::string_view) { return {}; }
};
using Receipt = std::string;
Receipt debit(pqxx::work& tx, const Debit& d);
struct LedgerEvent {
  std::string id;
};

void SNIPPET_FUNCTION(idemgate::PostgresStore& store, LedgerEvent event, Debit request,
                      Message message) {
  // @snippet: the example goes here
}
