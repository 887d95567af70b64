#pragma once

// A PostgreSQL server owned by one test, so the test may stop and restart it. Uses the server
// binaries scripts/test found (IDEMGATE_PG_BIN); runs them as the postgres user when root.

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace idemgate::test {

class PgCluster {
 public:
  /// A new cluster; `settings` are extra server settings ("-c name=value …").
  explicit PgCluster(std::string settings = {}) : settings_(std::move(settings)) {
    make_dir();
    sh(as_pg(bin_ + "/initdb -D " + dir_ + "/data -U postgres -A trust --no-sync >" + dir_ +
             "/initdb.log 2>&1"));
    start_on_free_port();
  }

  /// A streaming standby of this server, made with pg_basebackup and started; when this
  /// returns it streams, and this server waits for it at every commit (synchronous replication,
  /// `synchronous_standby_names = '*'`). The standby itself waits for nobody once promoted.
  std::unique_ptr<PgCluster> add_synchronous_standby() {
    std::unique_ptr<PgCluster> standby(new PgCluster(*this, StandbyOf{}));
    for (int tries = 0;; ++tries) {
      if (query("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == "1") break;
      if (tries == 300) throw std::runtime_error("the standby never started streaming");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    {
      std::ofstream conf(dir_ + "/data/postgresql.conf", std::ios::app);
      conf << "\nsynchronous_standby_names = '*'\n";
    }
    sh(psql("SELECT pg_reload_conf()"));
    for (int tries = 0;; ++tries) {
      if (query("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") == "1") break;
      if (tries == 300) throw std::runtime_error("the standby never became synchronous");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return standby;
  }

  /// Promotes this standby to a primary and waits until it accepts writes.
  void promote() { sh(as_pg(bin_ + "/pg_ctl -D " + dir_ + "/data -w -t 60 promote >/dev/null")); }

  /// The server's port on 127.0.0.1.
  int port() const { return port_; }
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
  struct StandbyOf {};

  // A base backup of `primary`, configured to stream from it (pg_basebackup -R), started.
  PgCluster(const PgCluster& primary, StandbyOf) : settings_(primary.settings_) {
    make_dir();
    sh(as_pg(bin_ + "/pg_basebackup -h 127.0.0.1 -p " + std::to_string(primary.port_) +
             " -U postgres -D " + dir_ + "/data -R -X stream --no-sync >" + dir_ +
             "/basebackup.log 2>&1"));
    start_on_free_port();
  }

  void make_dir() {
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
  }

  void start_on_free_port() {
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

  // A psql command running `sql` on this server; `sql` must hold no double quote.
  std::string psql(const std::string& sql) const {
    return as_pg(bin_ + "/psql -X -q -t -A -h 127.0.0.1 -p " + std::to_string(port_) +
                 " -U postgres -d postgres -c \"" + quoted_for_as_pg(sql) + "\" >/dev/null");
  }

  // `text` with its single quotes escaped for the single-quoted shell command of as_pg.
  static std::string quoted_for_as_pg(const std::string& text) {
    if (geteuid() != 0) return text;
    std::string out;
    for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out;
  }

  // The single value `sql` returns on this server, as text.
  std::string query(const std::string& sql) const {
    const std::string command =
        as_pg(bin_ + "/psql -X -q -t -A -h 127.0.0.1 -p " + std::to_string(port_) +
              " -U postgres -d postgres -c \"" + quoted_for_as_pg(sql) + "\"");
    FILE* out = ::popen(command.c_str(), "r");
    if (out == nullptr) return {};
    std::string text;
    char buffer[256];
    while (std::fgets(buffer, sizeof buffer, out) != nullptr) text += buffer;
    ::pclose(out);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }

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
