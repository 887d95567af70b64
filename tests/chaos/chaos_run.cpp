// The chaos run: Portbase notifications, about 30 % of them delivered 2 to 6 times, through a
// real RabbitMQ queue (or, with --broker redis, a Redis stream) to three consumer processes
// (examples/rabbitmq_consumer, examples/redis_streams_consumer) on a PostgreSQL
// primary with a synchronous standby, while failovers, deploys, a kill and a network partition
// land in the middle of messages. Then, once the consumers' own reconcilers left nothing in
// flight, the verdict: one booking per container, one terminal slot per key, nothing in flight,
// and for each fault the time from the fault to the booking of the last event it stranded, at
// most --max-recovery-s (15 s by default).
//
//   chaos_run [--broker amqp|redis] [--notifications N] [--short] [--max-wait-s S]
//             [--max-recovery-s S] [--seed N] [--keep]
//
// Needs IDEMGATE_TEST_AMQP (a RabbitMQ node's host:port) or, with --broker redis,
// IDEMGATE_TEST_REDIS (a Redis server's; scripts/chaos starts the one asked for) and
// IDEMGATE_PG_BIN (the PostgreSQL server binaries). Every library option keeps its default.
// The last line of output is one JSON object with the figures; the exit status is 0 only when
// the verdict holds.

#include <ect_delta/slot_api.hpp>
#include <ect_delta/terminal_server.hpp>
#include <idemgate/detail/amqp/channel.hpp>
#include <idemgate/detail/redis/connection.hpp>
#include <support/line_process.hpp>
#include <support/pg_fault_proxy.hpp>

#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using idemgate::test::LineProcess;
using Clock = std::chrono::system_clock;

/// The broker side of the run: a RabbitMQ queue or a Redis stream, fed and looked into.
class Broker {
 public:
  Broker(std::string broker, const std::string& address, std::string queue)
      : broker_(std::move(broker)), queue_(std::move(queue)) {
    host_ = address.substr(0, address.rfind(':'));
    port_ = std::stoi(address.substr(address.rfind(':') + 1));
    if (broker_ == "amqp")
      amqp().declare_quorum_with_dead_letter(queue_, queue_ + ".dlx", queue_ + ".dead");
    else
      redis().create_group(queue_, "slots");
  }
  /// The flag that gives the consumers the broker's address.
  [[nodiscard]] std::string address_flag() const {
    return broker_ == "amqp" ? "--amqp" : "--redis";
  }
  /// Publishes one message (an entry with the field "body").
  void publish(const std::string& body) {
    if (broker_ == "amqp")
      amqp().publish(queue_, body);
    else
      redis().add(queue_, {{"body", body}});
  }
  /// Messages not yet taken: ready in the queue; unread or pending in the group.
  [[nodiscard]] std::size_t waiting() {
    if (broker_ == "amqp") return amqp().ready(queue_);
    const auto groups = redis().checked({"XINFO", "GROUPS", queue_});
    for (const auto& g : groups.elements) {
      long long pending = 0, lag = 0;
      for (std::size_t i = 0; i + 1 < g.elements.size(); i += 2) {
        if (g.elements[i].text == "pending") pending = g.elements[i + 1].integer;
        if (g.elements[i].text == "lag") lag = g.elements[i + 1].integer;
      }
      return static_cast<std::size_t>(pending + lag);
    }
    return 0;
  }
  /// Messages in the dead-letter queue or stream.
  [[nodiscard]] std::size_t dead_lettered() {
    if (broker_ == "amqp") return amqp().ready(queue_ + ".dead");
    return static_cast<std::size_t>(redis().checked({"XLEN", queue_ + ".dead"}).integer);
  }

 private:
  idemgate::detail::amqp::Channel& amqp() {
    if (!amqp_) {
      idemgate::detail::amqp::Endpoint e;
      e.host = host_;
      e.port = port_;
      amqp_ = std::make_unique<idemgate::detail::amqp::Channel>(e);
    }
    return *amqp_;
  }
  idemgate::detail::redis::Connection& redis() {
    if (!redis_)
      redis_ = std::make_unique<idemgate::detail::redis::Connection>(
          idemgate::detail::redis::Endpoint{host_, port_}, std::chrono::seconds(10));
    return *redis_;
  }

  std::string broker_, queue_, host_;
  int port_ = 0;
  std::unique_ptr<idemgate::detail::amqp::Channel> amqp_;
  std::unique_ptr<idemgate::detail::redis::Connection> redis_;
};

// ---- arguments ------------------------------------------------------------------------------

struct Options {
  int notifications = 400;
  bool short_run = false;
  std::chrono::seconds max_wait{600};
  double max_recovery_s = 15;
  unsigned seed = 1;
  bool keep = false;
  std::string broker = "amqp";
  std::string address;  // the broker's host:port
  std::string pg_bin;
  std::string consumer;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "chaos_run: " << message
            << "\nusage: chaos_run [--broker amqp|redis] [--notifications N] [--short] "
               "[--max-wait-s S] [--max-recovery-s S] [--seed N] [--keep]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  bool notifications_given = false, wait_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto number = [&](long least, long most) {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      const std::string text = argv[++i];
      char* end = nullptr;
      const long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < least || n > most)
        usage_error(arg + " needs a whole number from " + std::to_string(least) + " to " +
                    std::to_string(most) + ", not \"" + text + '"');
      return n;
    };
    if (arg == "--broker") {
      if (i + 1 >= argc) usage_error("--broker needs a value: amqp or redis");
      o.broker = argv[++i];
      if (o.broker != "amqp" && o.broker != "redis")
        usage_error("--broker is amqp or redis, not \"" + o.broker + '"');
    } else if (arg == "--notifications") {
      o.notifications = static_cast<int>(number(10, 1'000'000));
      notifications_given = true;
    } else if (arg == "--short") {
      o.short_run = true;
    } else if (arg == "--max-wait-s") {
      o.max_wait = std::chrono::seconds(number(1, 86'400));
      wait_given = true;
    } else if (arg == "--max-recovery-s") {
      o.max_recovery_s = static_cast<double>(number(1, 86'400));
    } else if (arg == "--seed") {
      o.seed = static_cast<unsigned>(number(0, 1'000'000'000));
    } else if (arg == "--keep") {
      o.keep = true;
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "see the comment at the top of tests/chaos/chaos_run.cpp\n";
      std::exit(0);
    } else {
      usage_error("unknown argument \"" + arg + '"');
    }
  }
  if (o.short_run && !notifications_given) o.notifications = 60;
  if (o.short_run && !wait_given) o.max_wait = 200s;
  const char* variable = o.broker == "amqp" ? "IDEMGATE_TEST_AMQP" : "IDEMGATE_TEST_REDIS";
  const char* address = std::getenv(variable);
  if (address == nullptr || *address == '\0')
    usage_error(std::string(variable) + " is not set: start " +
                (o.broker == "amqp" ? "RabbitMQ" : "Redis") +
                " (scripts/chaos does) and export its host:port");
  o.address = address;
  o.consumer = o.broker == "amqp" ? CHAOS_CONSUMER_PATH : CHAOS_REDIS_CONSUMER_PATH;
  const char* bin = std::getenv("IDEMGATE_PG_BIN");
  if (bin == nullptr || *bin == '\0')
    usage_error(
        "IDEMGATE_PG_BIN is not set: export the PostgreSQL server binaries' directory, "
        "e.g. /usr/lib/postgresql/15/bin");
  o.pg_bin = bin;
  return o;
}

void log(const std::string& line) {
  const auto now = Clock::to_time_t(Clock::now());
  char stamp[16];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", std::gmtime(&now));
  std::cout << "chaos " << stamp << "  " << line << std::endl;
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

double epoch_seconds(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// ---- a PostgreSQL primary with a synchronous standby ------------------------------------------

std::string as_pg(const std::string& command) {
  if (geteuid() != 0) return command;
  return "runuser -u postgres -- sh -c '" + command + "'";
}

void sh(const std::string& command) {
  if (std::system(command.c_str()) != 0) throw std::runtime_error("command failed: " + command);
}

/// A port on 127.0.0.1 below the ephemeral range that nothing listens on now.
int free_port() {
  std::random_device rd;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + static_cast<int>(rd() % 12000);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("no free port on 127.0.0.1");
}

void exec_on(const std::string& uri, const std::string& sql) {
  pqxx::connection c{uri};
  pqxx::nontransaction tx{c};
  idemgate::detail::pq::exec(tx, sql);
}

std::int64_t count_on(const std::string& uri, const std::string& sql) {
  pqxx::connection c{uri};
  pqxx::nontransaction tx{c};
  return idemgate::detail::pq::exec(tx, sql)[0][0].as<std::int64_t>();
}

/**
 * Two PostgreSQL nodes on loopback: a primary and a standby it replicates to synchronously. A
 * failover stops the primary with `-m immediate` and promotes the standby; `rebuild_standby`
 * makes a new standby of the old primary's node from the new primary (pg_basebackup), so the
 * next failover has one. While no standby is attached, `synchronous_standby_names` is empty,
 * so commits do not wait for one that cannot answer.
 */
class Cluster {
 public:
  Cluster(std::string bin, const std::string& dir) : bin_(std::move(bin)), dir_(dir) {
    for (int i = 0; i < 2; ++i) {
      nodes_[i].dir = dir_ + "/node" + std::to_string(i);
      nodes_[i].port = free_port();
    }
    sh(as_pg(bin_ + "/initdb -D " + data(0) + " -U postgres -A trust --no-sync >" + dir_ +
             "/initdb.log 2>&1"));
    start(0);
    rebuild_standby();
  }
  ~Cluster() { stop(); }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  /// Stops both nodes (immediate shutdown); their files stay.
  void stop() {
    for (int i = 0; i < 2; ++i)
      std::system(
          as_pg(bin_ + "/pg_ctl -D " + data(i) + " -m immediate -w stop >/dev/null 2>&1").c_str());
  }

  /// The URI of node `i` alone.
  [[nodiscard]] std::string node_uri(int i) const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(nodes_[i].port) + "/postgres";
  }
  /// The URI the consumers use: both nodes, the writable one chosen at connection time.
  [[nodiscard]] std::string uri() const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(nodes_[0].port) +
           ",127.0.0.1:" + std::to_string(nodes_[1].port) +
           "/postgres?target_session_attrs=read-write";
  }
  /// The primary's URI.
  [[nodiscard]] std::string primary_uri() const { return node_uri(primary_); }

  /// Crashes the primary (immediate shutdown) and promotes the standby; returns once the new
  /// primary takes writes without waiting for a standby.
  void fail_over() {
    const int old_primary = primary_, promoted = 1 - primary_;
    sh(as_pg(bin_ + "/pg_ctl -D " + data(old_primary) + " -m immediate -w stop >/dev/null"));
    sh(as_pg(bin_ + "/pg_ctl -D " + data(promoted) + " -w -t 60 promote >/dev/null"));
    primary_ = promoted;
    // Its configuration came from the old primary and names a synchronous standby that is
    // not there: commits would wait forever.
    exec_on(primary_uri(), "ALTER SYSTEM SET synchronous_standby_names = ''");
    exec_on(primary_uri(), "SELECT pg_reload_conf()");
  }

  /// Makes a new standby of the node that is not the primary, from the primary, and makes it
  /// synchronous once it streams.
  void rebuild_standby() {
    const int standby = 1 - primary_;
    std::filesystem::remove_all(data(standby));
    std::filesystem::create_directories(nodes_[standby].dir);
    if (geteuid() == 0) sh("chown -R postgres:postgres " + dir_);
    sh(as_pg(bin_ + "/pg_basebackup -h 127.0.0.1 -p " + std::to_string(nodes_[primary_].port) +
             " -U postgres -D " + data(standby) + " -R -X stream -c fast >" + nodes_[standby].dir +
             "/basebackup.log 2>&1"));
    start(standby);
    wait_for(
        [&] {
          return count_on(primary_uri(),
                          "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") ==
                 1;
        },
        "the standby to stream");
    exec_on(primary_uri(), "ALTER SYSTEM SET synchronous_standby_names = '*'");
    exec_on(primary_uri(), "SELECT pg_reload_conf()");
    wait_for(
        [&] {
          return count_on(primary_uri(),
                          "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") ==
                 1;
        },
        "the standby to be synchronous");
  }

 private:
  struct Node {
    std::string dir;
    int port = 0;
  };

  [[nodiscard]] std::string data(int i) const { return nodes_[i].dir + "/data"; }

  void start(int i) {
    std::filesystem::create_directories(nodes_[i].dir);
    if (geteuid() == 0) sh("chown -R postgres:postgres " + dir_ + " && chmod 755 " + dir_);
    sh(as_pg(bin_ + "/pg_ctl -D " + data(i) + " -l " + nodes_[i].dir + "/server.log -w -t 60 " +
             "-o \"-p " + std::to_string(nodes_[i].port) + " -k " + nodes_[i].dir +
             " -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100" +
             " -c wal_keep_size=512MB\" start >/dev/null"));
  }

  template <class Ready>
  static void wait_for(Ready ready, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      try {
        if (ready()) return;
      } catch (const std::exception&) {
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("timed out waiting for " + what);
      std::this_thread::sleep_for(100ms);
    }
  }

  std::string bin_;
  std::string dir_;
  Node nodes_[2];
  int primary_ = 0;
};

// ---- notifications ----------------------------------------------------------------------------

struct Notification {
  std::string id;
  std::string container;
  std::string window;
};

std::string message(const Notification& n) {
  return "{\"notification_id\":\"" + n.id + "\",\"equipment_number\":\"" + n.container +
         "\",\"preferred_window\":\"" + n.window + "\"}";
}

/// `count` notifications, about 30 % of them delivered 2 to 6 times, the copies shuffled.
std::vector<Notification> deliveries(const std::vector<Notification>& notifications,
                                     unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<Notification> all;
  for (const auto& n : notifications) {
    int copies = 1;
    if (rng() % 100 < 30) copies = 2 + static_cast<int>(rng() % 5);
    for (int c = 0; c < copies; ++c) all.push_back(n);
  }
  std::shuffle(all.begin(), all.end(), rng);
  return all;
}

// ---- the consumers ----------------------------------------------------------------------------

/// One consumer process and what it said.
struct Run {
  int slot = 0;
  Clock::time_point started;
  std::optional<Clock::time_point> ended;
  std::unique_ptr<LineProcess> process;
};

/// Notifications a consumer has begun and not yet settled, from its output up to `until`.
std::set<std::string> in_flight(const LineProcess& p,
                                Clock::time_point until = Clock::time_point::max()) {
  std::set<std::string> open;
  for (const auto& line : p.lines()) {
    if (line.at > until) break;
    std::istringstream in(line.text);
    std::string word, id;
    in >> word >> id;
    if (word == "begin")
      open.insert(id);
    else if (word == "done" || word == "error")
      open.erase(id);
  }
  return open;
}

/// What one fault did.
struct Fault {
  std::string kind;
  int consumer = -1;  // -1: every consumer (a failover)
  Clock::time_point at;
  Clock::time_point over;  // when the fault itself ended (partition healed, standby rebuilt)
  bool mid_message = false;
  std::set<std::string> stranded;
  std::optional<double> recovery_s;
};

class Consumers {
 public:
  Consumers(std::vector<std::string> base_argv, std::vector<std::string> uris, std::string dir)
      : base_(std::move(base_argv)), uris_(std::move(uris)), dir_(std::move(dir)) {}

  /// Starts consumer `slot` and waits until it consumes.
  void start(int slot) {
    auto argv = base_;
    argv.push_back("--pg");
    argv.push_back(uris_[slot]);
    auto run = std::make_unique<Run>();
    run->slot = slot;
    run->started = Clock::now();
    run->process =
        std::make_unique<LineProcess>(argv, dir_ + "/consumer" + std::to_string(slot) + ".log");
    if (!run->process->wait_for_line("ready", 180s))
      throw std::runtime_error("consumer " + std::to_string(slot) + " did not start; see " + dir_ +
                               "/consumer" + std::to_string(slot) + ".log");
    current_[slot] = run.get();
    runs_.push_back(std::move(run));
  }

  /// The live process of `slot`.
  LineProcess& process(int slot) { return *current_.at(slot)->process; }

  /// Marks `slot`'s process as ended (killed or stopped).
  void ended(int slot) { current_.at(slot)->ended = Clock::now(); }

  /// Restarts any consumer that exited on its own; returns how many did.
  int supervise() {
    int restarted = 0;
    for (auto& [slot, run] : current_) {
      if (!run->process->wait_exit(0ms)) continue;
      run->ended = Clock::now();
      log("consumer " + std::to_string(slot) + " exited on its own; restarting it");
      ++restarted;
      start(slot);
    }
    unexpected_exits_ += restarted;
    return restarted;
  }

  /// A slot whose consumer is in the middle of a message, looked at from `first` on, waiting
  /// up to `timeout`.
  std::optional<int> mid_message(
      std::chrono::milliseconds timeout, int first = 0,
      const std::function<bool()>& also = [] { return true; }) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      for (int i = 0; i < static_cast<int>(current_.size()); ++i) {
        const int slot = (first + i) % static_cast<int>(current_.size());
        if (!in_flight(*current_.at(slot)->process).empty() && also()) return slot;
      }
      std::this_thread::sleep_for(2ms);
    }
    return std::nullopt;
  }

  /// Notifications in flight at the live consumers of `slots` (every slot when empty).
  std::set<std::string> in_flight_now(int slot) {
    std::set<std::string> all;
    for (auto& [s, run] : current_)
      if (slot < 0 || s == slot) all.merge(in_flight(*run->process));
    return all;
  }

  /// Whether no live consumer is in the middle of a message.
  bool idle() {
    for (auto& [slot, run] : current_)
      if (!in_flight(*run->process).empty()) return false;
    return true;
  }

  /// Notifications the consumers of `slot` (every slot when -1) failed on with a store error
  /// between `from` and `to`.
  std::set<std::string> errors(int slot, Clock::time_point from, Clock::time_point to) {
    std::set<std::string> ids;
    for (const auto& run : runs_) {
      if (slot >= 0 && run->slot != slot) continue;
      for (const auto& line : run->process->lines()) {
        if (line.at < from || line.at > to || line.text.rfind("error ", 0) != 0) continue;
        std::istringstream in(line.text);
        std::string word, id;
        in >> word >> id;
        ids.insert(id);
      }
    }
    return ids;
  }

  /// Lines of every consumer process that start with `prefix` and contain `part`.
  std::size_t count(const std::string& prefix, const std::string& part = {}) {
    std::size_t n = 0;
    for (const auto& run : runs_)
      for (const auto& line : run->process->lines())
        n += line.text.rfind(prefix, 0) == 0 && line.text.find(part) != std::string::npos;
    return n;
  }

  /// Stops every consumer: SIGTERM, then SIGKILL after `grace`.
  void stop_all(std::chrono::milliseconds grace) {
    for (auto& [slot, run] : current_) run->process->signal(SIGTERM);
    for (auto& [slot, run] : current_)
      if (!run->process->wait_exit(grace)) run->process->kill_now();
  }

  [[nodiscard]] int unexpected_exits() const { return unexpected_exits_; }

  /// Writes what each consumer process printed, one line each with its time (seconds after
  /// `began`), to `consumer<slot>.<n>.out` in the run's directory.
  void save_output(Clock::time_point began) const {
    std::map<int, int> seen;
    for (const auto& run : runs_) {
      std::ofstream out(dir_ + "/consumer" + std::to_string(run->slot) + "." +
                        std::to_string(seen[run->slot]++) + ".out");
      for (const auto& line : run->process->lines()) {
        const double at = std::chrono::duration<double>(line.at - began).count();
        out << std::fixed << std::setprecision(3) << at << ' ' << line.text << '\n';
      }
    }
  }

 private:
  std::vector<std::string> base_;
  std::vector<std::string> uris_;
  std::string dir_;
  std::vector<std::unique_ptr<Run>> runs_;
  std::map<int, Run*> current_;
  int unexpected_exits_ = 0;
};

// ---- the run ----------------------------------------------------------------------------------

/// How long a deploy lets a consumer drain after SIGTERM before it is killed.
constexpr auto grace = 5s;
/// The consumer's own grace (--grace-ms): shorter than the orchestrator's, so that it gives the
/// leases of unfinished messages back and requeues them before the SIGKILL.
constexpr auto consumer_grace = 4s;
/// The terminal's time per claim, so that faults land inside messages.
constexpr auto claim_latency = 150ms;
/// The terminal's time per claim while the slow deploy runs: longer than the grace.
constexpr auto slow_claim_latency = 8s;
/// How long the partition blackholes one consumer's database traffic.
constexpr auto partition_length = 10s;

int run(const Options& o) {
  const auto began = Clock::now();
  char dir_template[] = "/tmp/idemgate-chaos.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string dir = dir_template;
  std::filesystem::permissions(dir, std::filesystem::perms::all);

  log("starting a PostgreSQL primary and its synchronous standby");
  Cluster cluster(o.pg_bin, dir);
  ect_delta::TerminalServer terminal;
  terminal.start();
  terminal.set_latency(claim_latency);

  // Consumer 0 reaches both nodes through relays that the partition blackholes.
  idemgate::test::PgFaultProxy relay0(cluster.node_uri(0)), relay1(cluster.node_uri(1));
  const std::string relayed = "postgresql://postgres@127.0.0.1:" + std::to_string(relay0.port()) +
                              ",127.0.0.1:" + std::to_string(relay1.port()) +
                              "/postgres?target_session_attrs=read-write&sslmode=disable"
                              "&gssencmode=disable";

  const std::string queue = "chaos." + std::to_string(::getpid());
  Broker channel{o.broker, o.address, queue};

  std::vector<Notification> notifications;
  for (int i = 0; i < o.notifications; ++i)
    notifications.push_back({"CIS-chaos-" + std::to_string(100000 + i),
                             "MSKU" + std::to_string(1000000 + i * 7),
                             "2025-06-09T" + std::to_string(6 + i % 12) + ":00"});
  const auto all = deliveries(notifications, o.seed);
  std::map<std::string, std::string> container_of;
  for (const auto& n : notifications) container_of[n.id] = n.container;
  log(std::to_string(notifications.size()) + " notifications, " + std::to_string(all.size()) +
      " deliveries, queue " + queue + ", files in " + dir);

  std::vector<std::string> consumer_argv{
      o.consumer,
      channel.address_flag(),
      o.address,
      "--queue",
      queue,
      "--terminal",
      terminal.base_url(),
      "--grace-ms",
      std::to_string(std::chrono::milliseconds(consumer_grace).count())};
  // A Redis entry left by a consumer that died or stopped is claimed after this idle time: the
  // recovery bound's share of it.
  if (o.broker == "redis") consumer_argv.insert(consumer_argv.end(), {"--claim-idle-ms", "2000"});
  Consumers consumers(consumer_argv, {relayed, cluster.uri(), cluster.uri()}, dir);
  for (int slot = 0; slot < 3; ++slot) consumers.start(slot);

  // The publisher spreads the deliveries over the fault schedule, so every fault meets traffic.
  const auto window = o.short_run ? 30s : 100s;
  std::atomic<bool> published{false};
  std::thread publisher([&] {
    Broker out{o.broker, o.address, queue};
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < all.size(); ++i) {
      std::this_thread::sleep_until(start + window * i / all.size());
      out.publish(message(all[i]));
    }
    published = true;
  });

  std::vector<Fault> faults;
  auto pause = [&](std::chrono::milliseconds length) {
    const auto until = std::chrono::steady_clock::now() + length;
    while (std::chrono::steady_clock::now() < until) {
      consumers.supervise();
      std::this_thread::sleep_for(100ms);
    }
  };
  auto begin_fault = [&](const std::string& kind, int slot) {
    Fault f;
    f.kind = kind;
    f.consumer = slot;
    f.at = Clock::now();
    f.stranded = consumers.in_flight_now(slot);
    f.mid_message = !f.stranded.empty();
    return f;
  };
  // The consumer a fault hits: the first from `first` on that is in the middle of a message.
  auto target = [&](
                    int first, const std::function<bool()>& also = [] { return true; }) {
    if (auto slot = consumers.mid_message(15s, first, also)) return *slot;
    log("no consumer was in the middle of a message within 15 s; faulting consumer " +
        std::to_string(first) + " anyway");
    return first;
  };

  auto sigkill = [&] {
    const int slot = target(1);
    auto f = begin_fault("sigkill", slot);
    consumers.process(slot).kill_now();
    consumers.ended(slot);
    f.over = Clock::now();
    log("SIGKILL consumer " + std::to_string(slot) + " with " + std::to_string(f.stranded.size()) +
        " message(s) in hand; restarting it");
    consumers.start(slot);
    faults.push_back(std::move(f));
  };
  auto deploy = [&](bool slow) {
    if (slow) {
      // Every claim from now on outlasts the grace; let the consumers get into one.
      terminal.set_latency(slow_claim_latency);
      pause(1s);
    }
    const int slot =
        target(slow ? 1 : 2, [&] { return !slow || terminal.claims_in_progress() > 0; });
    auto f = begin_fault(slow ? "deploy_call_outlasts_grace" : "deploy_drained", slot);
    // ---- Graceful stop, as the orchestrator does it: SIGTERM, a grace, then SIGKILL. -------
    consumers.process(slot).signal(SIGTERM);
    const auto exited = consumers.process(slot).wait_exit(grace);
    if (!exited) consumers.process(slot).kill_now();
    consumers.ended(slot);
    f.over = Clock::now();
    if (slow) terminal.set_latency(claim_latency);
    const bool handed_back = consumers.process(slot).wait_for_line("requeue in-hand", 0ms);
    log(std::string("deploy of consumer ") + std::to_string(slot) +
        (!exited       ? " did not exit within the grace: SIGKILL"
         : handed_back ? " requeued its unfinished message at the end of its own grace"
         : o.broker == "redis" && slow
             ? " exited at the end of its own grace (its unfinished entry stays "
               "pending for another consumer's claim)"
             : " drained within the grace") +
        " (" + std::to_string(f.stranded.size()) + " message(s) in hand)");
    consumers.start(slot);
    faults.push_back(std::move(f));
  };
  auto partition = [&] {
    const int slot = 0;
    (void)consumers.mid_message(15s, 0, [&] { return !in_flight(consumers.process(0)).empty(); });
    auto f = begin_fault("partition", slot);
    relay0.blackhole(partition_length);
    relay1.blackhole(partition_length);
    log("partition: consumer 0 cut off from the database for " +
        std::to_string(std::chrono::seconds(partition_length).count()) + " s");
    pause(partition_length);
    f.over = Clock::now();
    faults.push_back(std::move(f));
  };
  auto failover = [&] {
    (void)consumers.mid_message(15s);
    auto f = begin_fault("failover", -1);
    cluster.fail_over();
    log("failover: primary stopped (immediate), standby promoted in " +
        std::to_string(static_cast<int>(seconds_between(f.at, Clock::now()) * 1000)) + " ms");
    cluster.rebuild_standby();
    f.over = Clock::now();
    log("new synchronous standby rebuilt " +
        std::to_string(static_cast<int>(seconds_between(f.at, f.over))) + " s after the failover");
    faults.push_back(std::move(f));
  };

  const auto gap = o.short_run ? 1500ms : 6000ms;
  pause(2s);
  std::vector<std::function<void()>> schedule;
  // The short schedule kills last: the event a SIGKILL strands waits out its lease (10 s) and
  // then the reconcilers' stale_after, and a later fault within that time (a deploy whose slow
  // call holds the reconciler's pass on it, a partition of the consumer whose pass took it) would
  // strand it again and charge both recoveries to the SIGKILL.
  if (o.short_run)
    schedule = {[&] { deploy(false); }, [&] { deploy(true); }, partition, failover, sigkill};
  else
    schedule = {sigkill,   failover, [&] { deploy(false); },
                partition, failover, [&] { deploy(true); },
                failover};
  for (auto& step : schedule) {
    step();
    pause(gap);
  }
  const auto faults_done = Clock::now();
  publisher.join();
  log("every delivery published; waiting for the queue to drain");

  // The queue drained: nothing ready, no consumer in a message, for two seconds in a row.
  const auto deadline = std::chrono::steady_clock::now() + o.max_wait;
  for (int quiet = 0; quiet < 20 && std::chrono::steady_clock::now() < deadline;) {
    consumers.supervise();
    quiet = channel.waiting() == 0 && consumers.idle() ? quiet + 1 : 0;
    std::this_thread::sleep_for(100ms);
  }

  // Nothing in flight: the consumers' own reconcilers (the library's default options) finish
  // every stranded row; the run only watches the log.
  log("queue drained; waiting for the consumers' reconcilers to leave nothing in flight (at "
      "most " +
      std::to_string(o.max_wait.count()) + " s after publishing)");
  std::int64_t in_flight_rows = -1;
  for (;;) {
    consumers.supervise();
    try {
      in_flight_rows = count_on(cluster.primary_uri(),
                                "SELECT count(*) FROM idemgate_log WHERE status = 'in_flight'");
    } catch (const std::exception& e) {
      log(std::string("counting the rows in flight failed: ") + e.what());
    }
    if (in_flight_rows == 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(500ms);
  }
  consumers.stop_all(grace);

  // ---- verdict ----
  std::map<std::string, std::pair<int, double>> bookings;  // container: (count, last booked_at)
  {
    pqxx::connection c{cluster.primary_uri()};
    pqxx::nontransaction tx{c};
    for (const auto& row : idemgate::detail::pq::exec(
             tx,
             "SELECT container, count(*), extract(epoch FROM max(booked_at))::float8 FROM "
             "tms_bookings GROUP BY container"))
      bookings[row[0].as<std::string>()] = {row[1].as<int>(), row[2].as<double>()};
  }
  int booked_once = 0, booked_twice = 0, not_booked = 0;
  for (const auto& n : notifications) {
    const auto it = bookings.find(n.container);
    if (it == bookings.end())
      ++not_booked;
    else if (it->second.first == 1)
      ++booked_once;
    else
      ++booked_twice;
  }
  std::size_t most_slots_per_key = 0, keys_with_one_slot = 0, most_slots_per_container = 0;
  for (const auto& n : notifications) {
    const auto key = idemgate::derive_key("ect.claim_slot", n.id, n.container).hex();
    const auto slots = terminal.distinct_slots_for_key(key);
    most_slots_per_key = std::max(most_slots_per_key, slots);
    keys_with_one_slot += slots == 1;
    most_slots_per_container = std::max(most_slots_per_container, terminal.slots_for(n.container));
  }
  const auto dead_lettered = channel.dead_lettered();

  bool recovered_all = true;
  double slowest = 0;
  for (std::size_t i = 0; i < faults.size(); ++i) {
    auto& f = faults[i];
    // A store error while the fault lasted (and shortly after) strands the event as well, up to
    // the next fault that reaches the same consumer: an error after that one began is charged to
    // it, and its recovery is measured from its own start.
    auto errors_until = f.over + 5s;
    for (std::size_t j = i + 1; j < faults.size(); ++j) {
      const auto& next = faults[j];
      if (f.consumer < 0 || next.consumer < 0 || next.consumer == f.consumer) {
        errors_until = std::min(errors_until, next.at);
        break;
      }
    }
    f.stranded.merge(consumers.errors(f.consumer, f.at, errors_until));
    double last = epoch_seconds(f.at);
    bool all_booked = true;
    for (const auto& id : f.stranded) {
      const auto it = bookings.find(container_of[id]);
      if (it == bookings.end()) {
        all_booked = false;
        continue;
      }
      last = std::max(last, it->second.second);
    }
    if (all_booked) {
      f.recovery_s = last - epoch_seconds(f.at);
      slowest = std::max(slowest, *f.recovery_s);
    } else {
      recovered_all = false;
    }
  }

  const bool pass = booked_once == o.notifications && booked_twice == 0 && not_booked == 0 &&
                    keys_with_one_slot == notifications.size() && most_slots_per_key == 1 &&
                    most_slots_per_container == 1 && in_flight_rows == 0 && recovered_all &&
                    slowest <= o.max_recovery_s && dead_lettered == 0;

  char buffer[64];
  auto fixed = [&](double v) {
    std::snprintf(buffer, sizeof buffer, "%.1f", v);
    return std::string(buffer);
  };
  for (const auto& f : faults)
    log(f.kind + (f.consumer >= 0 ? " (consumer " + std::to_string(f.consumer) + ")" : "") +
        " at +" + fixed(seconds_between(began, f.at)) + " s, mid-message " +
        (f.mid_message ? "yes" : "no") + ", stranded " + std::to_string(f.stranded.size()) +
        ", last of them booked " +
        (f.recovery_s ? fixed(*f.recovery_s) + " s after the fault" : "never"));
  log(std::string("verdict: ") + (pass ? "PASS" : "FAIL") + " — " + std::to_string(booked_once) +
      " of " + std::to_string(o.notifications) + " containers booked exactly once, " +
      std::to_string(booked_twice) + " more than once, " + std::to_string(not_booked) +
      " never; most slots per key " + std::to_string(most_slots_per_key) + "; in flight " +
      std::to_string(in_flight_rows) + "; dead-lettered " + std::to_string(dead_lettered) +
      "; slowest recovery " + fixed(slowest) + " s (at most " + fixed(o.max_recovery_s) +
      " s allowed)");

  std::ostringstream json;
  json << "{\"verdict\":\"" << (pass ? "pass" : "fail")
       << "\",\"notifications\":" << o.notifications << ",\"published\":" << all.size()
       << ",\"deliveries\":" << consumers.count("begin ")
       << ",\"redeliveries\":" << (consumers.count("begin ") - all.size())
       << ",\"store_errors\":" << consumers.count("error ")
       << ",\"retries\":" << consumers.count("done ", " retry redeliver")
       << ",\"containers_booked_once\":" << booked_once
       << ",\"containers_booked_more_than_once\":" << booked_twice
       << ",\"containers_not_booked\":" << not_booked
       << ",\"keys_with_exactly_one_slot\":" << keys_with_one_slot
       << ",\"max_distinct_slots_per_key\":" << most_slots_per_key
       << ",\"max_slots_per_container\":" << most_slots_per_container
       << ",\"slots_issued\":" << terminal.slots_issued() << ",\"in_flight\":" << in_flight_rows
       << ",\"dead_lettered\":" << dead_lettered
       << ",\"unexpected_consumer_exits\":" << consumers.unexpected_exits() << ",\"faults\":[";
  for (std::size_t i = 0; i < faults.size(); ++i) {
    const auto& f = faults[i];
    json << (i ? "," : "") << "{\"kind\":\"" << f.kind << "\",\"consumer\":" << f.consumer
         << ",\"at_s\":" << fixed(seconds_between(began, f.at))
         << ",\"lasted_s\":" << fixed(seconds_between(f.at, f.over))
         << ",\"mid_message\":" << (f.mid_message ? "true" : "false")
         << ",\"stranded\":" << f.stranded.size()
         << ",\"recovery_s\":" << (f.recovery_s ? fixed(*f.recovery_s) : "null") << "}";
  }
  json << "],\"slowest_recovery_s\":" << fixed(slowest)
       << ",\"faults_done_at_s\":" << fixed(seconds_between(began, faults_done))
       << ",\"elapsed_s\":" << fixed(seconds_between(began, Clock::now())) << "}";
  cluster.stop();
  if (pass && !o.keep)
    std::filesystem::remove_all(dir);
  else {
    consumers.save_output(began);
    log("files kept in " + dir + " (what each consumer printed: consumer<slot>.<n>.out)");
  }
  std::cout << json.str() << std::endl;
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::cerr << "chaos_run: " << e.what() << '\n';
    return 3;
  }
}
