#include <idemgate/idemgate.hpp>
#include <idemgate/store/memory.hpp>

#include <cstdio>
#include <string>

struct Terminal {
  using request_type = std::string;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  idemgate::ClaimResult<std::string> claim(const std::string& container, const idemgate::Key&) {
    return "slot-for-" + container;
  }
};

int main() {
  idemgate::MemoryStore store;
  Terminal terminal;
  int bookings = 0;
  idemgate::Gate gate{"ect.claim_slot", store, terminal,
                      [&](idemgate::MemoryStore::transaction& tx, const std::string&,
                          const std::string&) { tx.on_commit([&] { ++bookings; }); }};
  const auto key = idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU1");
  const auto first = gate.process(key, "MSKU1");
  const auto second = gate.process(key, "MSKU1");
  std::printf("%s %s %d\n", idemgate::version_string,
              std::string(to_string(second.status())).c_str(), bookings);
  return first.status() == idemgate::Status::processed &&
                 second.status() == idemgate::Status::duplicate && bookings == 1
             ? 0
             : 1;
}
