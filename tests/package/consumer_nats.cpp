// The NATS JetStream consumer as an installed component: it compiles, links libnats, and says
// what to do when no server answers.
#include <idemgate/consumer/nats.hpp>
#include <idemgate/idemgate.hpp>
#include <idemgate/store/memory.hpp>

#include <cstdio>
#include <string>
#include <string_view>

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
  idemgate::Gate gate{
      "ect.claim_slot", store, terminal,
      [](idemgate::MemoryStore::transaction&, const std::string&, const std::string&) {}};
  idemgate::consumer::JetStreamOptions options;
  options.url = "nats://127.0.0.1:1";  // nothing listens there
  options.startup_wait = std::chrono::milliseconds(0);
  try {
    idemgate::consumer::JetStreamConsumer consumer{
        gate, options, [](std::string_view data) {
          return std::optional<idemgate::consumer::JetStreamEvent<std::string>>(
              {idemgate::derive_key("ect.claim_slot", data), std::string(data)});
        }};
  } catch (const idemgate::NatsError& e) {
    std::printf("%s\n", e.what());
    return std::string(e.what()).find("check that nats-server runs") != std::string::npos ? 0 : 1;
  }
  return 1;
}
