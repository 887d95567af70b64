#include "support/fake_terminal.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/prometheus.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/retention.hpp>
#include <idemgate/signals.hpp>
#include <idemgate/store/memory.hpp>
#include <idemgate/testing/clocks.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

using idemgate::Counters;
using idemgate::Gate;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::Status;
using idemgate::StoreSignals;
using idemgate::test::FakeTerminal;
using Clock = idemgate::testing::ManualClock;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

namespace {

auto no_booking() {
  return [](MemoryStore::transaction&, const SlotRequest&, const std::string&) {};
}

/// Parses the text exposition format strictly: every sample belongs to a family declared by
/// HELP and TYPE just before it, names and labels are well formed, values are numbers, counters
/// end in _total, and no family is declared twice. Returns sample name{labels} -> value.
std::map<std::string, double> parse_exposition(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\})? (-?[0-9.eE+-]+|NaN))");
  std::map<std::string, double> samples;
  std::set<std::string> families;
  std::string family, family_type;
  std::istringstream in(text);
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_match(line, m, help)) {
      family = m[1];
      if (!families.insert(family).second) throw std::runtime_error("family twice: " + family);
      family_type.clear();
    } else if (std::regex_match(line, m, type)) {
      if (m[1] != family) throw std::runtime_error("TYPE without its HELP: " + line);
      family_type = m[2];
      if (family_type == "counter" && family.size() < 6)
        throw std::runtime_error("short counter: " + family);
      if (family_type == "counter" && family.substr(family.size() - 6) != "_total")
        throw std::runtime_error("counter not ending in _total: " + family);
    } else if (std::regex_match(line, m, sample)) {
      if (m[1] != family || family_type.empty())
        throw std::runtime_error("sample outside its family: " + line);
      samples[std::string(m[1]) + std::string(m[2])] = std::stod(m[3]);
    } else {
      throw std::runtime_error("not exposition format: \"" + line + "\"");
    }
  }
  return samples;
}

}  // namespace

TEST(Signals, DuplicateRatioOfZeroWithTrafficFlagsTheKeyDerivation) {
  StoreSignals s;
  s.events = 500;
  s.duplicates = 0;
  EXPECT_TRUE(idemgate::evaluate(s).key_derivation_suspect);
  s.events = 50;
  EXPECT_FALSE(idemgate::evaluate(s).key_derivation_suspect) << "too little traffic to tell";
}

TEST(Signals, RatiosAroundTheThresholdsRaiseTheRightAlarms) {
  StoreSignals s;
  s.events = 100;
  s.duplicates = 2;
  EXPECT_DOUBLE_EQ(s.duplicate_ratio(), 0.02);
  EXPECT_TRUE(idemgate::evaluate(s).healthy());
  s.duplicates = 25;
  EXPECT_TRUE(idemgate::evaluate(s).upstream_misbehaving);
  s.duplicates = 20;
  EXPECT_FALSE(idemgate::evaluate(s).upstream_misbehaving) << "exactly 20 % is not above";
  s.oldest_in_flight = 11min;
  EXPECT_TRUE(idemgate::evaluate(s).stranded_work);
  s.oldest_in_flight = 9min;
  EXPECT_FALSE(idemgate::evaluate(s).stranded_work);
  s.mismatched_keys = 1;
  EXPECT_TRUE(idemgate::evaluate(s).result_mismatch);
}

TEST(Signals, ATransactionOpenPastTheThresholdRaisesOldSnapshot) {
  StoreSignals s;
  EXPECT_FALSE(idemgate::evaluate(s, {.old_snapshot_after = 0s}).old_snapshot)
      << "a store that cannot tell raises nothing";
  s.oldest_snapshot = 0s;
  EXPECT_FALSE(idemgate::evaluate(s, {.old_snapshot_after = 0s}).old_snapshot) << "none open";
  s.oldest_snapshot = 5min;
  EXPECT_FALSE(idemgate::evaluate(s).old_snapshot) << "exactly the default is not above";
  s.oldest_snapshot = 5min + 1s;
  const idemgate::Health h = idemgate::evaluate(s);
  EXPECT_TRUE(h.old_snapshot);
  EXPECT_FALSE(h.healthy());
  EXPECT_FALSE(
      idemgate::evaluate(s, {.old_snapshot_after = std::chrono::seconds::max()}).old_snapshot)
      << "the type's max turns it off";
  EXPECT_THROW((void)idemgate::evaluate(s, {.old_snapshot_after = -1s}), std::invalid_argument);
}

TEST(Counters, CountEveryResultKindThroughTheGate) {
  Clock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  Counters counters;
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {.lease = 30s}, counters};
  const SlotRequest r{"MSKU1", "w"};
  const Key key = idemgate::derive_key("s", "1");
  (void)gate.process(key, r);
  (void)gate.process(key, r);
  (void)gate.process(key, SlotRequest{"MSKU1", "other"});
  terminal.before = [](const SlotRequest&,
                       const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    return idemgate::TransientFailure{"503"};
  };
  (void)gate.process(idemgate::derive_key("s", "2"), r);
  EXPECT_EQ(counters.count(Status::processed), 1u);
  EXPECT_EQ(counters.count(Status::duplicate), 1u);
  EXPECT_EQ(counters.count(Status::conflict), 1u);
  EXPECT_EQ(counters.count(Status::retry), 1u);
  EXPECT_EQ(counters.total(), 4u);
  EXPECT_GT(counters.seconds_in_gate(), 0.0);
}

TEST(Counters, CountRowsTheReconcilerFinished) {
  Clock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  Counters counters;
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {.lease = 30s}, counters};
  const std::string bytes = gate.encode_request({"MSKU1", "w"});
  (void)gate.store().reserve(idemgate::derive_key("s", "x"), idemgate::detail::sha256(bytes), bytes,
                             30s);
  clock.advance(31s);
  idemgate::Reconciler reconciler{gate, {.interval = 1min, .stale_after = 0ms, .batch = 10}};
  EXPECT_EQ(reconciler.run_once().reclaimed, 1u);
  EXPECT_EQ(counters.reconciled(), 1u);
}

TEST(Signals, TwoResultsForOneKeyAreRecordedWithBothResults) {
  Clock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  Counters counters;
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {.lease = 30s}, counters};
  const SlotRequest r{"MSKU1", "w"};
  const Key key = idemgate::derive_key("s", "mismatch");
  int calls = 0;
  terminal.before = [&](const SlotRequest& request,
                        const Key& k) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (++calls > 1) return std::nullopt;
    // This worker stalls past its lease; meanwhile a redelivery takes over and the terminal,
    // having forgotten the key, hands the redelivery a second slot.
    clock.advance(31s);
    EXPECT_EQ(gate.process(k, request).status(), Status::processed);
    return std::string("slot-forgotten");
  };
  EXPECT_EQ(gate.process(key, r).status(), Status::lost_lease);
  const StoreSignals s = gate.store().signals(1h);
  EXPECT_EQ(s.mismatched_keys, 1);
  EXPECT_EQ(s.mismatches_total, 1);
  const auto kept = gate.store().mismatches(10);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].key, key);
  EXPECT_EQ(kept[0].stored, "slot-1");
  EXPECT_EQ(kept[0].observed, "slot-forgotten");
  EXPECT_EQ(kept[0].source, "lost_lease");
  EXPECT_EQ(counters.mismatches(), 1u);
}

TEST(Signals, SameResultAfterLosingTheLeaseIsNoMismatch) {
  Clock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {.lease = 30s}};
  int calls = 0;
  terminal.after = [&](const Key& k,
                       const std::string&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (++calls > 1) return std::nullopt;
    clock.advance(31s);
    EXPECT_EQ(gate.process(k, {"MSKU1", "w"}).status(), Status::processed);
    return std::nullopt;
  };
  EXPECT_EQ(gate.process(idemgate::derive_key("s", "same"), {"MSKU1", "w"}).status(),
            Status::lost_lease);
  EXPECT_EQ(gate.store().signals(1h).mismatched_keys, 0);
}

TEST(Prometheus, ExpositionIsWellFormedAndCarriesTheSignals) {
  Counters counters;
  const Key key = idemgate::derive_key("s", "1");
  counters.on_result(key, Status::processed, 2ms);
  counters.on_result(key, Status::duplicate, 1ms);
  counters.on_reconciled(key, Status::processed);
  StoreSignals s;
  s.window = 1h;
  s.events = 200;
  s.duplicates = 4;
  s.in_flight = 1;
  s.oldest_in_flight = 42s;
  s.mismatched_keys = 1;
  s.mismatches_total = 3;
  s.retrying = 2;
  const auto samples = parse_exposition(idemgate::render_prometheus(counters, s));
  EXPECT_EQ(samples.at("idemgate_retrying_rows"), 2);
  EXPECT_EQ(samples.at("idemgate_events_total{result=\"processed\"}"), 1);
  EXPECT_EQ(samples.at("idemgate_events_total{result=\"duplicate\"}"), 1);
  EXPECT_EQ(samples.at("idemgate_events_total{result=\"lost_lease\"}"), 0);
  EXPECT_EQ(samples.at("idemgate_reconciled_total"), 1);
  EXPECT_DOUBLE_EQ(samples.at("idemgate_duplicate_ratio"), 0.02);
  EXPECT_EQ(samples.at("idemgate_oldest_in_flight_seconds"), 42);
  EXPECT_EQ(samples.at("idemgate_result_mismatch_keys"), 1);
  EXPECT_EQ(samples.at("idemgate_result_mismatch_total"), 3);
  EXPECT_EQ(samples.at("idemgate_signal_window_seconds"), 3600);
  EXPECT_EQ(samples.count("idemgate_oldest_snapshot_seconds"), 0u)
      << "a store that cannot tell has no such gauge";
  s.oldest_snapshot = 75s;
  const auto with_snapshot = parse_exposition(idemgate::render_prometheus(counters, s));
  EXPECT_EQ(with_snapshot.at("idemgate_oldest_snapshot_seconds"), 75);
}

TEST(Prometheus, StrictParserRejectsMalformedExposition) {
  EXPECT_THROW(parse_exposition("idemgate_x 1\n"), std::runtime_error) << "no HELP/TYPE";
  EXPECT_THROW(parse_exposition("# HELP c_x h\n# TYPE c_x counter\nc_x 1\n"), std::runtime_error)
      << "counter without _total";
  EXPECT_THROW(parse_exposition("# HELP g h\n# TYPE g gauge\ng one\n"), std::runtime_error);
}

// Built only where CMake found promtool (it says so when it did not; with IDEMGATE_REQUIRE_ALL,
// as scripts/test configures, a missing promtool fails the configuration instead).
#ifdef IDEMGATE_PROMTOOL
TEST(Prometheus, PromtoolAcceptsTheExposition) {
  Counters counters, claims{"ect.claim_slot"}, cancels{"ect.cancel_slot"};
  StoreSignals s;
  s.window = 1h;
  s.oldest_snapshot = 12s;
  const idemgate::GateMetrics gates[] = {{"ect.claim_slot", claims, s},
                                         {"ect.cancel_slot", cancels, s}};
  const std::string path = ::testing::TempDir() + "idemgate-metrics.txt";
  std::ofstream(path) << idemgate::render_prometheus(counters, s);
  std::ofstream(path + ".gates") << idemgate::render_prometheus(gates);
  for (const std::string& file : {path, path + ".gates"}) {
    const std::string command =
        std::string(IDEMGATE_PROMTOOL) + " check metrics < " + file + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    for (int c; (c = fgetc(pipe)) != EOF;) output += static_cast<char>(c);
    EXPECT_EQ(pclose(pipe), 0) << output;
    EXPECT_EQ(output, "") << "promtool lint findings in " << file;
  }
  std::remove((path + ".gates").c_str());
  std::remove(path.c_str());
}
#endif

TEST(Retention, TheWindowRunsFromWhenTheEventFinishedNotWhenItWasReserved) {
  Clock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {.lease = 30s}};
  const Key key = idemgate::derive_key("late", "1");
  const std::string bytes = gate.encode_request({"C", "w"});
  (void)gate.store().reserve(key, idemgate::detail::sha256(bytes), bytes, 30s);
  clock.advance(8 * 24h);  // stuck in flight for eight days, then finished
  EXPECT_EQ(gate.process(key, {"C", "w"}).status(), Status::processed);
  idemgate::Retention retention{gate.store(), {.keep = 7 * 24h, .interval = 1h, .batch = 10}};
  EXPECT_EQ(retention.run_once(), 0u) << "finished a moment ago: a duplicate may still come";
  EXPECT_EQ(gate.process(key, {"C", "w"}).status(), Status::duplicate);
}

TEST(Retention, PurgesFinishedRowsPastTheWindowAndNothingElse) {
  Clock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  FakeTerminal<false> blind;
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {.lease = 30s}};
  Gate parked{"ect.claim_slot", store, blind, no_booking(), {.lease = 30s}};
  for (int i = 0; i < 25; ++i)
    (void)gate.process(idemgate::derive_key("old", std::to_string(i)), {"C", "w"});
  (void)parked.process(idemgate::derive_key("old", "escalated"), {"C", "w"});
  const std::string bytes = gate.encode_request({"C", "w"});
  (void)gate.store().reserve(idemgate::derive_key("old", "in flight"),
                             idemgate::detail::sha256(bytes), bytes, 30s);
  clock.advance(8 * 24h);
  (void)gate.process(idemgate::derive_key("new", "1"), {"C", "w"});
  idemgate::Retention retention{gate.store(), {.keep = 7 * 24h, .interval = 1h, .batch = 10}};
  EXPECT_EQ(retention.run_once(), 25u);
  EXPECT_TRUE(gate.store().find(idemgate::derive_key("old", "escalated")).has_value());
  EXPECT_TRUE(gate.store().find(idemgate::derive_key("old", "in flight")).has_value());
  EXPECT_TRUE(gate.store().find(idemgate::derive_key("new", "1")).has_value());
  EXPECT_EQ(retention.run_once(), 0u);
}

TEST(Retention, AbandonedAfterAlsoEndsAttemptsNobodyFinishesAndNeverALiveOne) {
  Clock clock;
  MemoryStore store(clock.fn());
  MemoryStore handle = store.for_gate("orders.api");
  const std::string bytes = "request";
  const auto fingerprint = idemgate::detail::sha256(bytes);
  const Key released = idemgate::derive_key("old", "released"),
            dead = idemgate::derive_key("old", "dead"),
            running = idemgate::derive_key("old", "running");
  ASSERT_EQ(handle.reserve(released, fingerprint, bytes, 30s).kind,
            idemgate::Reservation::Kind::acquired);
  ASSERT_TRUE(handle.release(released, 1));
  ASSERT_EQ(handle.reserve(dead, fingerprint, bytes, 30s).kind,
            idemgate::Reservation::Kind::acquired);
  ASSERT_EQ(handle.reserve(running, fingerprint, bytes, 30 * 24h).kind,
            idemgate::Reservation::Kind::acquired);
  clock.advance(25h);
  idemgate::Retention plain{handle, {.keep = 24h}};
  EXPECT_EQ(plain.run_once(), 0u) << "off by default: a consumer's reconciler finishes them";
  idemgate::Retention endpoint{handle, {.keep = 24h, .abandoned_after = 24h}};
  EXPECT_EQ(endpoint.run_once(), 2u);
  EXPECT_FALSE(handle.find(released).has_value());
  EXPECT_FALSE(handle.find(dead).has_value());
  EXPECT_TRUE(handle.find(running).has_value()) << "a live lease is never cut";
}

TEST(Prometheus, SeveralGatesShareOnePageEachSampleLabelledWithItsGate) {
  Clock clock;
  MemoryStore store(clock.fn());
  FakeTerminal<> terminal;
  FakeTerminal<false> blind;
  Counters claim_counts{"ect.claim_slot"}, cancel_counts{"ect.cancel_slot"};
  Gate claims{"ect.claim_slot", store, terminal, no_booking(), {.lease = 30s}, claim_counts};
  Gate cancels{"ect.cancel_slot", store, blind, no_booking(), {.lease = 30s}, cancel_counts};
  const Key key = idemgate::derive_key("portbase", "CIS-1", "MSKU1");
  EXPECT_EQ(claims.process(key, {"MSKU1", "w"}).status(), Status::processed);
  EXPECT_EQ(claims.process(key, {"MSKU1", "w"}).status(), Status::duplicate);
  EXPECT_EQ(cancels.process(key, {"MSKU1", "w"}).status(), Status::escalated);
  const idemgate::GateMetrics gates[] = {
      {claim_counts.gate(), claim_counts, claims.store().signals(1h)},
      {cancel_counts.gate(), cancel_counts, cancels.store().signals(1h)}};
  const auto samples = parse_exposition(idemgate::render_prometheus(gates));
  EXPECT_EQ(samples.at("idemgate_events_total{gate=\"ect.claim_slot\",result=\"processed\"}"), 1);
  EXPECT_EQ(samples.at("idemgate_events_total{gate=\"ect.claim_slot\",result=\"duplicate\"}"), 1);
  EXPECT_EQ(samples.at("idemgate_events_total{gate=\"ect.cancel_slot\",result=\"escalated\"}"), 1);
  EXPECT_EQ(samples.at("idemgate_events_total{gate=\"ect.cancel_slot\",result=\"processed\"}"), 0);
  EXPECT_EQ(samples.at("idemgate_escalated_rows{gate=\"ect.cancel_slot\"}"), 1);
  EXPECT_EQ(samples.at("idemgate_escalated_rows{gate=\"ect.claim_slot\"}"), 0)
      << "the other gate's escalation is not counted as this gate's";
  EXPECT_EQ(samples.at("idemgate_window_duplicates{gate=\"ect.claim_slot\"}"), 1);
  EXPECT_EQ(samples.at("idemgate_window_events{gate=\"ect.cancel_slot\"}"), 1);
}

TEST(Prometheus, AGateRefusesCountersMadeForAnotherGate) {
  MemoryStore store;
  FakeTerminal<> terminal;
  Counters counts{"payments.credit"};
  EXPECT_THROW((Gate{"ect.claim_slot", store, terminal, no_booking(), {}, counts}),
               std::invalid_argument);
  Counters unnamed;
  EXPECT_NO_THROW((Gate{"ect.claim_slot", store, terminal, no_booking(), {}, unnamed}));
  EXPECT_THROW((void)Counters{""}, std::invalid_argument) << "a name, or none at all";
}
