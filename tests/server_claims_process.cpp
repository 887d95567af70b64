// The claims API of tests/support/server_claims.hpp as a process of its own, for the crash
// tests: `server_claims_process <sqlite file | postgresql://…> <table> <mode>` prints its port
// and serves until killed. Mode `before-commit` dies by SIGKILL after the handler's write,
// inside the transaction; `after-commit` dies after the response committed, before replying;
// `none` serves normally.

#include "support/server_claims.hpp"

#include <csignal>
#include <cstdio>
#include <string>

namespace {

template <class Claims>
int serve(const Claims& claims, const std::string& mode) {
  auto store = claims.open();
  store.migrate();
  claims.create();
  idemgate::server::EndpointOptions options;
  options.lease = std::chrono::seconds(3);
  idemgate::server::Endpoint endpoint{"claims.api", store, options};
  const auto client_of = [](const httplib::Request& r) { return r.get_header_value("X-Client"); };
  httplib::Server http;
  auto handler = idemgate::test::claim_handler(claims, [&] {
    if (mode == "before-commit") std::raise(SIGKILL);
  });
  http.Post("/claims", [&](const httplib::Request& req, httplib::Response& res) {
    const auto response =
        endpoint.handle(idemgate::server::to_request(req, client_of(req)), handler);
    if (mode == "after-commit") std::raise(SIGKILL);
    idemgate::server::write_response(response, res);
  });
  idemgate::server::serve_lookup(http, "/claims", "idempotency_key", "POST", "/claims", endpoint,
                                 client_of);
  const int port = http.bind_to_any_port("127.0.0.1");
  std::printf("%d\n", port);
  std::fflush(stdout);
  http.listen_after_bind();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: server_claims_process <sqlite file | uri> <table> <mode>\n");
    return 2;
  }
  const std::string where = argv[1];
  if (where.rfind("postgres", 0) == 0)
    return serve(idemgate::test::PgClaims{where, argv[2]}, argv[3]);
  return serve(idemgate::test::SqliteClaims{where}, argv[3]);
}
