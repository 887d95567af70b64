// Seeded randomized interleavings: events delivered at least once, out of order, with crashes
// injected at random steps of the gate, lost answers, 503s and reconciler passes in between; on
// MemoryStore also lost store replies (the write landed, the caller got an error), writes lost in
// a database crash (a reservation or takeover rolled back under a live worker) and poison events
// whose business write always throws.
// Each schedule ends with a final reconciler pass and the invariants. A failure prints its seed;
// IDEMGATE_SCHEDULE_SEED=<seed> replays just that schedule.

#include "support/fake_terminal.hpp"
#include "support/pg_fault_proxy.hpp"
#include "support/postgres.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/store/postgres.hpp>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

using idemgate::Key;
using idemgate::RecordStatus;
using idemgate::Status;
using idemgate::test::FakeTerminal;
using idemgate::test::SimulatedCrash;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

namespace {

/// Where a delivery's worker dies, if it does.
enum class Crash { none, before_claim, after_claim, in_business_write, before_ack };

/// Runs one schedule against the environment `env` (a store, a way to let leases expire, and a
/// business table); returns a description of the first broken invariant, or nothing.
template <class Env>
std::optional<std::string> run_schedule(Env& env, unsigned seed) {
  std::mt19937 rng(seed);
  auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
  const int events = 2 + static_cast<int>(rng() % 6);
  // One event in three schedules is poison: its business write throws on every attempt.
  const int poison = chance(33) ? static_cast<int>(rng() % static_cast<unsigned>(events)) : -1;
  std::optional<idemgate::Record> before_delivery;  // the row as this delivery found it
  bool lose_write = false;  // a database crash rolls back this delivery's reservation

  FakeTerminal<> terminal;
  Crash crash = Crash::none;
  bool lose_answer = false;
  terminal.before = [&](const SlotRequest&,
                        const Key& key) -> std::optional<idemgate::ClaimResult<std::string>> {
    if constexpr (requires { env.restore(key, before_delivery); }) {
      if (std::exchange(lose_write, false)) env.restore(key, before_delivery);
    }
    if (crash == Crash::before_claim) throw SimulatedCrash{};
    if (chance(10)) return idemgate::TransientFailure{"503"};
    return std::nullopt;
  };
  terminal.after = [&](const Key&,
                       const std::string&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (crash == Crash::after_claim) throw SimulatedCrash{};
    if (lose_answer) return idemgate::TransientFailure{"answer lost"};
    return std::nullopt;
  };
  auto& store = env.store();
  idemgate::Gate gate{store,
                      terminal,
                      [&](typename Env::transaction& tx, const Key& key, const SlotRequest& r,
                          const std::string& slot) {
                        env.book(tx, key, slot);
                        if (crash == Crash::in_business_write) throw SimulatedCrash{};
                        if (poison >= 0 && r.container.ends_with("-" + std::to_string(poison)))
                          throw std::runtime_error("poison: the business write always fails");
                      },
                      {.lease = env.lease()}};
  idemgate::Reconciler reconciler{
      gate, {.interval = 1min, .stale_after = 0ms, .batch = 50, .max_attempts = 8}};
  auto reconcile = [&] {
    try {
      (void)reconciler.run_once();
    } catch (const idemgate::StoreError&) {
      // a lost reply of the pass's take-over: its rows come back once their leases expire
    }
  };
  std::map<int, int> poison_deliveries;

  std::vector<std::pair<Key, SlotRequest>> all;
  std::deque<int> queue;
  for (int e = 0; e < events; ++e) {
    const SlotRequest r{"C" + std::to_string(seed) + "-" + std::to_string(e), "w"};
    all.emplace_back(idemgate::derive_key("schedule", r.container), r);
    const int copies = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < copies; ++c) queue.push_back(e);
  }
  std::shuffle(queue.begin(), queue.end(), rng);

  for (int step = 0; !queue.empty() && step < 400; ++step) {
    const int e = queue.front();
    queue.pop_front();
    const int roll = static_cast<int>(rng() % 100);
    crash = roll < 8    ? Crash::before_claim
            : roll < 16 ? Crash::after_claim
            : roll < 24 ? Crash::in_business_write
            : roll < 30 ? Crash::before_ack
                        : Crash::none;
    lose_answer = chance(10);
    before_delivery = store.find(all[e].first);
    lose_write = chance(6);
    if constexpr (requires { env.lose_reply_of_write(1); }) {
      if (chance(10)) env.lose_reply_of_write(1 + static_cast<int>(rng() % 6));
    }
    bool acked = false;
    try {
      const auto result = gate.process(all[e].first, all[e].second);
      if (result.status() == Status::conflict) return "conflict for an unchanged request";
      acked = result.should_ack() && crash != Crash::before_ack;
      if (acked) {
        // Acked: the event is settled, or held by a live attempt that will finish it.
        const auto row = store.find(all[e].first);
        if (!row) return "acked event " + all[e].second.container + " has no row";
        if (Env::exact_clock && row->status == RecordStatus::in_flight &&
            row->lease_until <= env.now())
          return std::string(to_string(result.status())) + " acked for event " +
                 all[e].second.container + " that nobody holds";
      }
    } catch (const SimulatedCrash&) {
      acked = false;  // the worker died: the message comes back
    } catch (const idemgate::StoreError&) {
      acked = false;  // a lost reply or a lost write: never acked
    } catch (const std::runtime_error&) {
      acked = false;  // the poison business write
      // After three deliveries the queue moves a poison message to its dead-letter queue.
      if (++poison_deliveries[e] >= 3) acked = true;
    }
    crash = Crash::none;
    lose_answer = false;
    lose_write = false;
    if constexpr (requires { env.lose_reply_of_write(0); }) env.lose_reply_of_write(0);
    if (!acked) queue.insert(queue.begin() + static_cast<long>(rng() % (queue.size() + 1)), e);
    if (chance(10)) queue.push_back(static_cast<int>(rng() % events));  // a manual replay
    if (chance(20)) {
      env.expire_leases();
      reconcile();
    }
  }
  if (!queue.empty()) return "deliveries did not drain";

  // The final passes: every stranded row is finished (or, a poison one, escalated).
  for (int pass = 0; pass < 30; ++pass) {
    env.expire_leases();
    if (reconciler.run_once().taken == 0) break;
  }
  int finished = 0;
  for (int e = 0; e < events; ++e) {
    const auto& [key, request] = all[static_cast<std::size_t>(e)];
    const auto row = store.find(key);
    if (!row) return "event " + request.container + " has no row";
    const auto booked = env.bookings_for(key);
    if (row->status == RecordStatus::escalated &&
        row->reason.find("gave up after") != std::string::npos) {
      // Attempts used up (the poison event, or one that crashed too often): for a human, and
      // nothing of it was booked.
      if (!booked.empty()) return "escalated event " + request.container + " was booked";
      continue;
    }
    if (e == poison) return "the poison event ended " + std::string(to_string(row->status));
    if (row->status != RecordStatus::committed)
      return "event " + request.container + " ended " + std::string(to_string(row->status));
    if (booked.size() != 1)
      return "event " + request.container + " has " + std::to_string(booked.size()) +
             " business rows";
    if (booked[0] != *row->result) return "event " + request.container + " booked another slot";
    ++finished;
  }
  if (terminal.slots_issued() > events)
    return std::to_string(terminal.slots_issued()) + " slots for " + std::to_string(events) +
           " events";
  if (finished < events - 1) return "only " + std::to_string(finished) + " events committed";
  return std::nullopt;
}

/// A MemoryStore whose replies can be lost: the write lands, then the caller gets a StoreError
/// (what a store must answer when it cannot tell its own earlier attempt).
class LossyMemoryStore : public idemgate::MemoryStore {
 public:
  using MemoryStore::MemoryStore;

  /// Loses the reply of the `n`-th write from now (0: none).
  void lose_reply_of_write(int n) { lose_at_ = n; }

  idemgate::Reservation reserve(const Key& key, const idemgate::Fingerprint& fingerprint,
                                std::string_view request, std::chrono::milliseconds lease) {
    return lost(MemoryStore::reserve(key, fingerprint, request, lease));
  }
  template <class BusinessWrite>
  idemgate::CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                                BusinessWrite&& business) {
    return lost(MemoryStore::commit(key, fence, result, std::forward<BusinessWrite>(business)));
  }
  idemgate::CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    return lost(MemoryStore::fail(key, fence, reason));
  }
  idemgate::CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    return lost(MemoryStore::escalate(key, fence, reason));
  }
  bool release(const Key& key, std::int64_t fence) { return release(key, fence, {}); }
  bool release(const Key& key, std::int64_t fence, std::string_view reason) {
    return lost(MemoryStore::release(key, fence, reason));
  }
  std::vector<idemgate::Stranded> take_stale(std::size_t limit,
                                             std::chrono::milliseconds stale_after,
                                             std::chrono::milliseconds lease) {
    return lost(MemoryStore::take_stale(limit, stale_after, lease));
  }

 private:
  template <class T>
  T lost(T answer) {
    if (lose_at_ > 0 && --lose_at_ == 0) throw idemgate::StoreError("the reply was lost");
    return answer;
  }
  int lose_at_ = 0;
};
static_assert(idemgate::store<LossyMemoryStore>);

/// LossyMemoryStore with a manual clock.
class MemoryEnv {
 public:
  using transaction = idemgate::MemoryStore::transaction;
  LossyMemoryStore& store() { return store_; }
  void lose_reply_of_write(int n) { store_.lose_reply_of_write(n); }
  /// A database crash loses this delivery's reservation or takeover: the row is back as it was.
  void restore(const Key& key, const std::optional<idemgate::Record>& row) {
    store_.restore(key, row);
  }
  std::chrono::milliseconds lease() const { return 30s; }
  void expire_leases() { now_ += 31s; }
  std::chrono::system_clock::time_point now() const { return now_; }
  static constexpr bool exact_clock = true;  // leases expire only when the test says so
  void book(transaction& tx, const Key& key, const std::string& slot) {
    tx.on_commit([this, key, slot] { bookings_[key].push_back(slot); });
  }
  std::vector<std::string> bookings_for(const Key& key) { return bookings_[key]; }

 private:
  std::chrono::system_clock::time_point now_ = std::chrono::system_clock::now();
  LossyMemoryStore store_{[this] { return now_; }};
  std::map<Key, std::vector<std::string>> bookings_;
};

/// PostgresStore on the test server, through a wire-level fault proxy that can lose the reply
/// to a chosen statement; leases are a few milliseconds long and expire by waiting.
class PostgresEnv {
 public:
  using transaction = pqxx::work;
  PostgresEnv(const std::string& uri, const std::string& log, std::string bookings)
      : uri_(uri),
        log_(log),
        proxy_(uri),
        store_(proxy_.uri(), {.table = log}),
        bookings_(std::move(bookings)) {}
  idemgate::PostgresStore& store() { return store_; }
  /// Loses the reply to the next statement of one kind (0: cancels what did not fire).
  void lose_reply_of_write(int n) {
    static constexpr std::array<const char*, 6> statements = {
        "idemgate_reserve", "idemgate_take_over", "COMMIT",
        "idemgate_release", "idemgate_fail",      "idemgate_take_stale"};
    if (n == 0) {
      proxy_.disarm();
      return;
    }
    proxy_.arm(idemgate::test::Fault::lose_reply,
               statements[static_cast<std::size_t>(n - 1) % statements.size()]);
  }
  /// A database crash loses this delivery's reservation or takeover: the row is back as it was.
  void restore(const Key& key, const std::optional<idemgate::Record>& row) {
    const std::string where = " WHERE key = '\\x" + key.hex() + "'::bytea";
    if (!row) {
      idemgate::test::pg_exec_on(uri_, "DELETE FROM " + log_ + where);
      return;
    }
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(row->lease_until.time_since_epoch())
            .count();
    idemgate::test::pg_exec_on(
        uri_, "UPDATE " + log_ + " SET status = 'in_flight', holder = 0, fence = " +
                  std::to_string(row->fence) + ", attempts = " + std::to_string(row->attempts) +
                  ", lease_until = 'epoch'::timestamptz + " + std::to_string(micros) +
                  " * interval '1 microsecond'" + where);
  }
  std::chrono::milliseconds lease() const { return 5ms; }
  void expire_leases() { std::this_thread::sleep_for(6ms); }
  std::chrono::system_clock::time_point now() const { return std::chrono::system_clock::now(); }
  static constexpr bool exact_clock = false;  // 5 ms leases run out while the test looks
  void book(transaction& tx, const Key& key, const std::string& slot) {
    idemgate::detail::pq::exec_params(
        tx, "INSERT INTO " + bookings_ + " (source_event, slot_id) VALUES ($1::bytea, $2)",
        idemgate::detail::pq::bytea_param(key.view()), slot);
  }
  std::vector<std::string> bookings_for(const Key& key) {
    auto lease = store_.connection();
    pqxx::nontransaction tx(lease.connection());
    std::vector<std::string> slots;
    for (const auto& row : idemgate::detail::pq::exec_params(
             tx, "SELECT slot_id FROM " + bookings_ + " WHERE source_event = $1::bytea",
             idemgate::detail::pq::bytea_param(key.view())))
      slots.emplace_back(row[0].c_str());
    return slots;
  }

 private:
  std::string uri_;
  std::string log_;
  idemgate::test::PgFaultProxy proxy_;
  idemgate::PostgresStore store_;
  std::string bookings_;
};

/// The seeds to run: a base and a count, or the one seed named in the environment.
std::vector<unsigned> seeds(unsigned base, unsigned count) {
  if (const char* one = std::getenv("IDEMGATE_SCHEDULE_SEED"))
    return {static_cast<unsigned>(std::strtoul(one, nullptr, 10))};
  std::vector<unsigned> all;
  for (unsigned i = 0; i < count; ++i) all.push_back(base + i);
  return all;
}

}  // namespace

TEST(Interleavings, ThousandSchedulesOnMemoryStoreKeepEveryInvariant) {
  int ran = 0;
  for (unsigned seed : seeds(1, 1000)) {
    MemoryEnv env;
    const auto broken = run_schedule(env, seed);
    ASSERT_FALSE(broken.has_value()) << *broken << "\nreplay: IDEMGATE_SCHEDULE_SEED=" << seed
                                     << " ./test_interleavings --gtest_filter='*MemoryStore*'";
    ++ran;
  }
  EXPECT_GE(ran, 1);
}

TEST(Interleavings, SchedulesOnPostgresKeepEveryInvariant) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  const std::string log = idemgate::test::unique_table("log");
  const std::string bookings = idemgate::test::unique_table("book");
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
  idemgate::test::pg_exec("CREATE TABLE " + bookings +
                          " (id bigserial PRIMARY KEY, source_event bytea NOT NULL, slot_id text)");
  idemgate::PostgresStore(uri, {.table = log}).migrate();
  int ran = 0;
  for (unsigned seed : seeds(100001, 80)) {
    PostgresEnv env(uri, log, bookings);
    const auto broken = run_schedule(env, seed);
    ASSERT_FALSE(broken.has_value()) << *broken << "\nreplay: IDEMGATE_SCHEDULE_SEED=" << seed
                                     << " ./test_interleavings --gtest_filter='*Postgres*'";
    ++ran;
  }
  EXPECT_GE(ran, 1);
  idemgate::test::pg_exec("DROP TABLE IF EXISTS " + log + ", " + log + "_mismatches, " + bookings);
}
