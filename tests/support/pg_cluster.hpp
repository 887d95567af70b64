#pragma once

// A PostgreSQL server owned by one test, so the test may stop and restart it. Uses the server
// binaries scripts/test found (IDEMGATE_PG_BIN); runs them as the postgres user when root.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace idemgate::test {

class PgCluster {
 public:
  /// A new cluster; `settings` are extra server settings ("-c name=value …").
  explicit PgCluster(std::string settings = {}) : settings_(std::move(settings)) {
    const char* bin = std::getenv("IDEMGATE_PG_BIN");
    if (bin == nullptr || *bin == '\0')
      throw std::runtime_error(
          "IDEMGATE_PG_BIN is not set: run scripts/test, which exports the PostgreSQL server "
          "binaries' directory");
    bin_ = bin;
    char dir_template[] = "/tmp/idemgate-cluster.XXXXXX";
    if (mkdtemp(dir_template) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = dir_template;
    if (geteuid() == 0) sh("chown postgres:postgres " + dir_ + " && chmod 755 " + dir_);
    sh(as_pg(bin_ + "/initdb -D " + dir_ + "/data -U postgres -A trust --no-sync >" + dir_ +
             "/initdb.log 2>&1"));
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      port_ = 20000 + static_cast<int>(rd() % 12000);  // below the ephemeral port range
      try {
        start();
        return;
      } catch (const std::exception&) {
        if (attempt == 4) throw;  // five busy ports in a row: something else is wrong
      }
    }
  }
  ~PgCluster() {
    std::system(
        as_pg(bin_ + "/pg_ctl -D " + dir_ + "/data -m immediate -w stop >/dev/null 2>&1").c_str());
    std::filesystem::remove_all(dir_);
  }
  PgCluster(const PgCluster&) = delete;
  PgCluster& operator=(const PgCluster&) = delete;

  /// Starts the server and waits until it accepts connections.
  void start() {
    sh(as_pg(bin_ + "/pg_ctl -D " + dir_ + "/data -l " + dir_ + "/server.log -w -t 60 -o \"-p " +
             std::to_string(port_) + " -k " + dir_ +
             " -c listen_addresses=127.0.0.1 -c fsync=off " + settings_ + "\" start >/dev/null"));
  }

  /// Crashes the server (immediate shutdown: no checkpoint, nothing of the WAL buffers written
  /// out). Commits that were still only in the WAL buffers are lost, as in a real crash.
  void crash() { sh(as_pg(bin_ + "/pg_ctl -D " + dir_ + "/data -m immediate -w stop >/dev/null")); }

  /// Stops the server (fast shutdown: open transactions are rolled back, clients cut off).
  void stop() { sh(as_pg(bin_ + "/pg_ctl -D " + dir_ + "/data -m fast -w stop >/dev/null")); }

  /// The server's URI.
  std::string uri() const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/postgres";
  }

 private:
  static std::string as_pg(const std::string& command) {
    if (geteuid() != 0) return command;
    return "runuser -u postgres -- sh -c '" + command + "'";
  }
  static void sh(const std::string& command) {
    if (std::system(command.c_str()) != 0) throw std::runtime_error("command failed: " + command);
  }

  std::string settings_;
  std::string bin_;
  std::string dir_;
  int port_ = 0;
};

}  // namespace idemgate::test
