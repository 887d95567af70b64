#include <idemgate/console/httplib.hpp>
#include <idemgate/idemgate.hpp>
#include <idemgate/store/memory.hpp>

#include <cstdio>
#include <string>

struct Terminal {
  using request_type = std::string;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = false;  // every event goes to the manual queue
  idemgate::ClaimResult<std::string> claim(const std::string&, const idemgate::Key&) {
    return std::string("never called");
  }
};

int main() {
  // Proves that the installed console target compiles, links cpp-httplib and answers.
  idemgate::MemoryStore store;
  Terminal terminal;
  idemgate::Gate gate{
      "ect.claim_slot", store, terminal,
      [](idemgate::MemoryStore::transaction&, const std::string&, const std::string&) {}};
  (void)gate.process(idemgate::derive_key("ect.claim_slot", "CIS-1", "MSKU1"), "MSKU1");
  httplib::Server server;
  const auto console = idemgate::console::mount(server, "/ops/console", gate,
                                                {.bearer_token = "a-token-of-16-or-more"});
  idemgate::console::ConsoleRequest request;
  request.method = "GET";
  request.path = "/api/escalated";
  request.headers.emplace("authorization", "Bearer a-token-of-16-or-more");
  const auto response = console->handle(request);
  std::printf("%d %s\n", response.status, response.body.c_str());
  return response.status == 200 && response.body.find("MSKU1") != std::string::npos ? 0 : 1;
}
