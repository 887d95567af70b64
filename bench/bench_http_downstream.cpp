// HttpDownstream over loopback: a claim on a kept-alive connection beside a claim that opens
// its own connection (HttpOptions::keep_alive = false, the behaviour before connections were
// kept), over HTTP and over HTTPS with a self-signed certificate made at start-up.
//
// Per claim: p50_us and p99_us. The far side answers at once, so what differs is the TCP (and
// TLS) handshake, and for HTTPS the client's loading of its trusted certificates.

#include "bench_support.hpp"
#include "support/self_signed.hpp"

#include <idemgate/downstream/http.hpp>

#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

using Downstream = idemgate::HttpDownstream<idemgate::detail::PlainTextMapping>;

/// A server on 127.0.0.1 that answers every claim at once with 201 and a slot.
class Answering {
 public:
  explicit Answering(std::unique_ptr<httplib::Server> server) : server_(std::move(server)) {
    server_->set_keep_alive_max_count(1'000'000);
    server_->set_tcp_nodelay(true);  // as TerminalServer: no Nagle delay on kept-alive answers
    server_->Post("/", [](const httplib::Request&, httplib::Response& res) {
      res.status = 201;
      res.set_content("slot-4711", "text/plain");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    if (port_ <= 0) throw std::runtime_error("cannot bind 127.0.0.1");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Answering() {
    server_->stop();
    thread_.join();
  }
  Answering(const Answering&) = delete;
  Answering& operator=(const Answering&) = delete;

  int port() const { return port_; }

 private:
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
};

void claims(benchmark::State& state, const std::string& url, idemgate::HttpOptions options) {
  idemgate::bench::guarded(state, [&] {
    const Downstream downstream(url, std::move(options));
    idemgate::bench::timed_events(state, "bench.http", [&](const idemgate::Key& key) {
      const auto result = downstream.claim(idemgate::bench::request(), key);
      if (!result.ok()) throw std::runtime_error("claim failed: " + std::string(result.reason()));
      benchmark::DoNotOptimize(result);
    });
  });
}

idemgate::HttpOptions with_keep_alive(bool keep_alive, const std::string& ca_cert_file = {}) {
  idemgate::HttpOptions options;
  options.keep_alive = keep_alive;
  options.ca_cert_file = ca_cert_file;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const idemgate::test::SelfSigned identity;
  const std::string ca_file = (std::filesystem::temp_directory_path() /
                               ("idemgate-bench-http-" + std::to_string(::getpid()) + ".pem"))
                                  .string();
  identity.write_pem(ca_file);

  Answering http(std::make_unique<httplib::Server>());
  Answering https(std::make_unique<httplib::SSLServer>(identity.cert, identity.key));
  const std::string http_url = "http://127.0.0.1:" + std::to_string(http.port());
  const std::string https_url = "https://127.0.0.1:" + std::to_string(https.port());

  benchmark::RegisterBenchmark("http/claim_new_connection", [&](benchmark::State& state) {
    claims(state, http_url, with_keep_alive(false));
  })->UseRealTime();
  benchmark::RegisterBenchmark("http/claim_kept_alive", [&](benchmark::State& state) {
    claims(state, http_url, with_keep_alive(true));
  })->UseRealTime();
  benchmark::RegisterBenchmark("https/claim_new_connection", [&](benchmark::State& state) {
    claims(state, https_url, with_keep_alive(false, ca_file));
  })->UseRealTime();
  benchmark::RegisterBenchmark("https/claim_kept_alive", [&](benchmark::State& state) {
    claims(state, https_url, with_keep_alive(true, ca_file));
  })->UseRealTime();
  const int code = idemgate::bench::run_benchmarks(argc, argv);
  std::filesystem::remove(ca_file);
  return code;
}
