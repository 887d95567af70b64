#include <idemgate/idemgate.hpp>
#include <idemgate/store/postgres.hpp>

#include <cstdio>
#include <string>

// Your consumer's existing call that claims a slot (a stand-in here); it now takes the key.
std::string claim_slot_at_terminal(const std::string& container, const std::string& key) {
  return "ECTD-" + container + "-" + key.substr(0, 8);
}

struct Terminal {  // the downstream policy: every claim carries the idempotency key
  using request_type = std::string;  // the container
  using outcome_type = std::string;  // the slot id
  static constexpr bool honours_idempotency_key = true;
  idemgate::ClaimResult<std::string> claim(const std::string& container, const idemgate::Key& key) {
    return claim_slot_at_terminal(container, key.hex());
  }
};

int main(int argc, char** argv) {
  idemgate::PostgresOptions options;  // the business write, prepared once per connection:
  options.business_statements = {{"book_slot", "INSERT INTO tms_bookings VALUES ($1, $2)"}};
  idemgate::PostgresStore store{argc > 1 ? argv[1] : "postgresql://localhost/app", options};
  store.migrate();
  Terminal terminal;
  idemgate::Gate gate{"ect.claim_slot", store, terminal,
                      [](pqxx::work& tx, const std::string& container, const std::string& slot) {
                        idemgate::exec_prepared(tx, "book_slot", container, slot);
                      }};
  // A Portbase notification, as the queue delivers it (perhaps for the third time):
  const auto key = idemgate::derive_key("ect.claim_slot", "CIS-2025-06-09-1001", "MSKU7000037");
  const auto result = gate.process(key, "MSKU7000037");
  std::printf("%s\n", std::string(idemgate::to_string(result.status())).c_str());
  return result.should_ack() ? 0 : 1;  // ack unless the gate says retry
}
