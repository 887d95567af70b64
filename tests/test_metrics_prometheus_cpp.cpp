#include "support/fake_terminal.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/metrics/prometheus_cpp.hpp>
#include <idemgate/prometheus.hpp>
#include <idemgate/signals.hpp>
#include <idemgate/store/memory.hpp>

#include <gtest/gtest.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using idemgate::Gate;
using idemgate::Key;
using idemgate::MemoryStore;
using idemgate::Status;
using idemgate::StoreSignals;
using idemgate::prometheus::RegistryObserver;
using idemgate::prometheus::RegistryOptions;
using idemgate::test::FakeTerminal;
using idemgate::test::SlotRequest;
using namespace std::chrono_literals;

namespace {

auto no_booking() {
  return [](MemoryStore::transaction&, const SlotRequest&, const std::string&) {};
}

const prometheus::MetricFamily& family(const std::vector<prometheus::MetricFamily>& families,
                                       const std::string& name) {
  for (const auto& f : families)
    if (f.name == name) return f;
  throw std::runtime_error("no metric family " + name + " in the registry");
}

// The series of `f` whose labels include every one of `labels`.
const prometheus::ClientMetric& series(const prometheus::MetricFamily& f,
                                       const std::map<std::string, std::string>& labels) {
  for (const auto& metric : f.metric) {
    std::size_t matched = 0;
    for (const auto& label : metric.label) {
      const auto it = labels.find(label.name);
      if (it != labels.end() && it->second == label.value) ++matched;
    }
    if (matched == labels.size()) return metric;
  }
  throw std::runtime_error("no series of " + f.name + " with the labels asked for");
}

double counter(const prometheus::Registry& registry, const std::string& name,
               const std::map<std::string, std::string>& labels = {}) {
  return series(family(registry.Collect(), name), labels).counter.value;
}

double gauge(const prometheus::Registry& registry, const std::string& name) {
  return series(family(registry.Collect(), name), {}).gauge.value;
}

prometheus::ClientMetric::Histogram latency(const prometheus::Registry& registry,
                                            const std::string& result,
                                            std::map<std::string, std::string> labels = {}) {
  labels["result"] = result;
  return series(family(registry.Collect(), "idemgate_gate_duration_seconds"), labels).histogram;
}

// Count of observations at or below `bound` (the cumulative bucket with that upper bound).
std::uint64_t at_or_below(const prometheus::ClientMetric::Histogram& histogram, double bound) {
  for (const auto& bucket : histogram.bucket)
    if (bucket.upper_bound == bound) return bucket.cumulative_count;
  throw std::runtime_error("no bucket with upper bound " + std::to_string(bound));
}

// A terminal that fails for good on container "FAIL", transiently on "BUSY", and answers after
// `delay` otherwise.
void script(FakeTerminal<>& terminal, std::chrono::milliseconds delay) {
  terminal.set_delay(delay);
  terminal.before = [](const SlotRequest& request,
                       const Key&) -> std::optional<idemgate::ClaimResult<std::string>> {
    if (request.container == "FAIL") return idemgate::PermanentFailure{"422 unknown container"};
    if (request.container == "BUSY") return idemgate::TransientFailure{"503 busy"};
    return std::nullopt;
  };
}

// Three processed, two duplicates, one conflict, one failed, one retry.
void run_mixed_traffic(
    Gate<MemoryStore, FakeTerminal<>, decltype(no_booking()), RegistryObserver>& gate) {
  const SlotRequest request{"MSKU1234565", "2025-06-09T08:00"};
  const Key a = idemgate::derive_key("metrics", "a");
  ASSERT_EQ(gate.process(a, request).status(), Status::processed);
  ASSERT_EQ(gate.process(idemgate::derive_key("metrics", "b"), request).status(),
            Status::processed);
  ASSERT_EQ(gate.process(idemgate::derive_key("metrics", "c"), request).status(),
            Status::processed);
  ASSERT_EQ(gate.process(a, request).status(), Status::duplicate);
  ASSERT_EQ(gate.process(a, request).status(), Status::duplicate);
  ASSERT_EQ(gate.process(a, SlotRequest{"MSKU7000037", "2025-06-09T09:00"}).status(),
            Status::conflict);
  ASSERT_EQ(gate.process(idemgate::derive_key("metrics", "f"), {"FAIL", "x"}).status(),
            Status::failed);
  ASSERT_EQ(gate.process(idemgate::derive_key("metrics", "r"), {"BUSY", "x"}).status(),
            Status::retry);
}

std::string http_get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    throw std::runtime_error("connect to 127.0.0.1 failed");
  }
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    throw std::runtime_error("send failed");
  }
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;)
    response.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return response;
}

}  // namespace

TEST(RegistryObserver, CountsEachResultAndItsLatencyPerResult) {
  prometheus::Registry registry;
  RegistryObserver metrics{registry};
  MemoryStore store;
  FakeTerminal<> terminal;
  script(terminal, 30ms);
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {}, metrics};
  run_mixed_traffic(gate);

  const std::map<Status, double> expected{{Status::processed, 3}, {Status::duplicate, 2},
                                          {Status::conflict, 1},  {Status::failed, 1},
                                          {Status::retry, 1},     {Status::in_flight, 0},
                                          {Status::escalated, 0}, {Status::lost_lease, 0}};
  for (const auto& [status, count] : expected) {
    const std::string result(idemgate::to_string(status));
    EXPECT_EQ(counter(registry, "idemgate_events_total", {{"result", result}}), count) << result;
    EXPECT_EQ(latency(registry, result).sample_count, static_cast<std::uint64_t>(count)) << result;
  }
  // Every processed call waited 30 ms on the downstream, so none lies in a bucket below that.
  const auto processed = latency(registry, "processed");
  EXPECT_EQ(at_or_below(processed, 0.025), 0u);
  EXPECT_EQ(at_or_below(processed, 60), 3u);
  EXPECT_GE(processed.sample_sum, 3 * 0.030);
  EXPECT_EQ(processed.bucket.size(), idemgate::prometheus::default_latency_buckets().size() + 1)
      << "the default bounds and +Inf";
  EXPECT_GE(counter(registry, "idemgate_gate_seconds_total"), processed.sample_sum);
}

TEST(RegistryObserver, EverySeriesExistsAtZeroBeforeTheFirstEvent) {
  prometheus::Registry registry;
  const RegistryObserver metrics{registry};
  const auto families = registry.Collect();
  EXPECT_EQ(family(families, "idemgate_events_total").metric.size(), 8u);
  EXPECT_EQ(family(families, "idemgate_gate_duration_seconds").metric.size(), 8u);
  EXPECT_EQ(counter(registry, "idemgate_events_total", {{"result", "lost_lease"}}), 0);
  EXPECT_EQ(counter(registry, "idemgate_reconciled_total"), 0);
  EXPECT_EQ(gauge(registry, "idemgate_oldest_in_flight_seconds"), 0);
  for (const auto& f : families) {
    EXPECT_NE(f.name, "idemgate_wal_bytes") << "no WAL reported yet";
    EXPECT_NE(f.name, "idemgate_oldest_snapshot_seconds") << "no snapshot reported yet";
  }
}

TEST(RegistryObserver, UpdateMirrorsTheStoreSignals) {
  prometheus::Registry registry;
  RegistryObserver metrics{registry};
  MemoryStore store;
  FakeTerminal<> terminal;
  script(terminal, 0ms);
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {}, metrics};
  run_mixed_traffic(gate);
  const StoreSignals signals = gate.store().signals(1h);
  ASSERT_GT(signals.duplicates, 0);
  metrics.update(signals);
  EXPECT_EQ(gauge(registry, "idemgate_window_events"), static_cast<double>(signals.events));
  EXPECT_EQ(gauge(registry, "idemgate_window_duplicates"), static_cast<double>(signals.duplicates));
  EXPECT_DOUBLE_EQ(gauge(registry, "idemgate_duplicate_ratio"), signals.duplicate_ratio());
  EXPECT_EQ(gauge(registry, "idemgate_in_flight_rows"), static_cast<double>(signals.in_flight));
  EXPECT_EQ(gauge(registry, "idemgate_signal_window_seconds"), 3600);

  StoreSignals later;
  later.window = 1h;
  later.oldest_in_flight = 642s;
  later.mismatched_keys = 2;
  later.escalated = 4;
  later.retrying = 5;
  later.wal_bytes = 4096;
  later.oldest_snapshot = 330s;
  metrics.update(later);
  EXPECT_EQ(gauge(registry, "idemgate_oldest_in_flight_seconds"), 642);
  EXPECT_EQ(gauge(registry, "idemgate_result_mismatch_keys"), 2);
  EXPECT_EQ(gauge(registry, "idemgate_escalated_rows"), 4);
  EXPECT_EQ(gauge(registry, "idemgate_retrying_rows"), 5);
  EXPECT_EQ(gauge(registry, "idemgate_wal_bytes"), 4096);
  EXPECT_EQ(gauge(registry, "idemgate_oldest_snapshot_seconds"), 330);
  later.oldest_in_flight.reset();
  metrics.update(later);
  EXPECT_EQ(gauge(registry, "idemgate_oldest_in_flight_seconds"), 0) << "none in flight";
}

TEST(RegistryObserver, MismatchCounterAddsWhatTheStoreRecordedSinceTheLastUpdate) {
  prometheus::Registry registry;
  RegistryObserver metrics{registry};
  StoreSignals signals;
  for (const auto& [store_total, counted] :
       std::vector<std::pair<std::int64_t, double>>{{3, 3}, {5, 5}, {5, 5}, {2, 5}, {4, 7}}) {
    signals.mismatches_total = store_total;
    metrics.update(signals);
    EXPECT_EQ(counter(registry, "idemgate_result_mismatch_total"), counted)
        << "after the store reported " << store_total << " (a drop is a purge, not a reset)";
  }
}

TEST(RegistryObserver, ReconciledRowsAreCounted) {
  prometheus::Registry registry;
  RegistryObserver metrics{registry};
  const Key key = idemgate::derive_key("metrics", "stranded");
  metrics.on_reconciled(key, Status::processed);
  metrics.on_reconciled(key, Status::failed);
  metrics.on_mismatch(key, "slot-1", "slot-2");
  EXPECT_EQ(counter(registry, "idemgate_reconciled_total"), 2);
  EXPECT_EQ(counter(registry, "idemgate_result_mismatch_total"), 0)
      << "mismatches are counted once, from the store";
}

TEST(RegistryObserver, EveryMetricOfTheTextRendererHasTheSameNameAndType) {
  StoreSignals signals;
  signals.window = 1h;
  signals.wal_bytes = 1;
  signals.oldest_snapshot = std::chrono::seconds(1);
  const std::string text = idemgate::render_prometheus(idemgate::Counters{}, signals);
  std::map<std::string, std::string> rendered;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string hash, kind, name, type;
    if (words >> hash >> kind >> name >> type && kind == "TYPE") rendered[name] = type;
  }
  ASSERT_GE(rendered.size(), 14u);

  prometheus::Registry registry;
  RegistryObserver metrics{registry};
  metrics.update(signals);
  std::map<std::string, std::string> registered;
  for (const auto& f : registry.Collect()) {
    const char* type = f.type == prometheus::MetricType::Counter     ? "counter"
                       : f.type == prometheus::MetricType::Gauge     ? "gauge"
                       : f.type == prometheus::MetricType::Histogram ? "histogram"
                                                                     : "other";
    // prometheus-cpp keeps a counter's name as registered (with _total).
    registered[f.name] = type;
  }
  for (const auto& [name, type] : rendered) {
    ASSERT_TRUE(registered.count(name)) << name << " is rendered as text but not registered";
    EXPECT_EQ(registered.at(name), type) << name;
  }
  EXPECT_EQ(registered.at("idemgate_gate_duration_seconds"), "histogram");
  EXPECT_EQ(registered.size(), rendered.size() + 1) << "the histogram is the only addition";
}

TEST(RegistryObserver, GatesWithTheirOwnLabelsShareOneRegistry) {
  prometheus::Registry registry;
  RegistryObserver billing{registry, {.labels = {{"gate", "billing"}}}};
  RegistryObserver shipping{registry, {.labels = {{"gate", "shipping"}}}};
  const Key key = idemgate::derive_key("metrics", "k");
  billing.on_result(key, Status::processed, 2ms);
  billing.on_result(key, Status::duplicate, 1ms);
  shipping.on_result(key, Status::processed, 40ms);
  EXPECT_EQ(
      counter(registry, "idemgate_events_total", {{"gate", "billing"}, {"result", "processed"}}),
      1);
  EXPECT_EQ(
      counter(registry, "idemgate_events_total", {{"gate", "shipping"}, {"result", "processed"}}),
      1);
  EXPECT_EQ(
      counter(registry, "idemgate_events_total", {{"gate", "shipping"}, {"result", "duplicate"}}),
      0);
  EXPECT_EQ(at_or_below(latency(registry, "processed", {{"gate", "shipping"}}), 0.025), 0u);
  EXPECT_EQ(at_or_below(latency(registry, "processed", {{"gate", "billing"}}), 0.0025), 1u);
}

TEST(RegistryObserver, LatencyBucketsAreOverridable) {
  prometheus::Registry registry;
  RegistryObserver metrics{registry, {.latency_buckets = {0.5, 2}}};
  const Key key = idemgate::derive_key("metrics", "k");
  metrics.on_result(key, Status::processed, 1s);
  metrics.on_result(key, Status::processed, 3s);
  const auto histogram = latency(registry, "processed");
  ASSERT_EQ(histogram.bucket.size(), 3u);
  EXPECT_EQ(at_or_below(histogram, 0.5), 0u);
  EXPECT_EQ(at_or_below(histogram, 2), 1u);
  EXPECT_EQ(histogram.bucket.back().cumulative_count, 2u);
  EXPECT_DOUBLE_EQ(histogram.sample_sum, 4.0);
}

TEST(RegistryObserver, UnusableOptionsAreRefusedSayingWhatToDo) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<RegistryOptions, std::string>> cases = {
      {{.latency_buckets = {}}, "latency_buckets (its size)"},
      {{.latency_buckets = std::vector<double>(65, 1.0)}, "latency_buckets (its size)"},
      {{.latency_buckets = {0.1, 0.01}}, "strictly increasing"},
      {{.latency_buckets = {0.1, 0.1}}, "strictly increasing"},
      {{.latency_buckets = {0, 1}}, "above 0"},
      {{.latency_buckets = {-1, 1}}, "above 0"},
      {{.latency_buckets = {1, inf}}, "Leave +Inf out"},
      {{.labels = {{"result", "x"}}}, "name it otherwise"},
      {{.labels = {{"le", "x"}}}, "name it otherwise"},
  };
  for (const auto& [options, expected] : cases) {
    prometheus::Registry registry;
    try {
      const RegistryObserver metrics{registry, options};
      ADD_FAILURE() << "accepted options that should fail with: " << expected;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  }
}

TEST(RegistryObserver, ScrapedOverLoopbackThroughAnExposer) {
  auto registry = std::make_shared<prometheus::Registry>();
  RegistryObserver metrics{*registry};
  MemoryStore store;
  FakeTerminal<> terminal;
  script(terminal, 0ms);
  Gate gate{"ect.claim_slot", store, terminal, no_booking(), {}, metrics};
  run_mixed_traffic(gate);
  metrics.update(gate.store().signals(1h));

  prometheus::Exposer exposer{"127.0.0.1:0"};
  exposer.RegisterCollectable(registry);
  const std::vector<int> ports = exposer.GetListeningPorts();
  ASSERT_EQ(ports.size(), 1u);
  const std::string page = http_get(ports.front(), "/metrics");
  ASSERT_NE(page.find("200 OK"), std::string::npos) << page.substr(0, 200);
  EXPECT_NE(page.find("idemgate_events_total{result=\"processed\"} 3"), std::string::npos) << page;
  EXPECT_NE(page.find("idemgate_gate_duration_seconds_count{result=\"duplicate\"} 2"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("idemgate_gate_duration_seconds_bucket{result=\"failed\",le=\"+Inf\"} 1"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("# TYPE idemgate_duplicate_ratio gauge"), std::string::npos) << page;
}

// Built only where CMake found promtool (with IDEMGATE_REQUIRE_ALL a missing one fails the
// configuration instead).
#ifdef IDEMGATE_PROMTOOL
TEST(RegistryObserver, PromtoolAcceptsTheSerialisedRegistry) {
  prometheus::Registry registry;
  RegistryObserver metrics{registry};
  StoreSignals signals;
  signals.window = 1h;
  signals.wal_bytes = 0;
  signals.oldest_snapshot = std::chrono::seconds(0);
  metrics.update(signals);
  metrics.on_result(idemgate::derive_key("metrics", "k"), Status::processed, 12ms);
  const std::string path = ::testing::TempDir() + "idemgate-registry-metrics.txt";
  std::ofstream(path) << prometheus::TextSerializer().Serialize(registry.Collect());
  const std::string command = std::string(IDEMGATE_PROMTOOL) + " check metrics < " + path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  for (int c; (c = fgetc(pipe)) != EOF;) output += static_cast<char>(c);
  EXPECT_EQ(pclose(pipe), 0) << output;
  EXPECT_EQ(output, "") << "promtool lint findings";
  std::remove(path.c_str());
}
#endif

TEST(RegistryObserver, AGatesObserverLabelsItsSeriesAndOtherGatesRefuseIt) {
  prometheus::Registry registry;
  MemoryStore store;
  FakeTerminal<> terminal;
  RegistryObserver claims_metrics{registry, {.gate = "ect.claim_slot"}};
  RegistryObserver cancels_metrics{registry, {.gate = "ect.cancel_slot"}};
  EXPECT_EQ(claims_metrics.gate(), "ect.claim_slot");
  Gate claims{"ect.claim_slot", store, terminal, no_booking(), {}, claims_metrics};
  Gate cancels{"ect.cancel_slot", store, terminal, no_booking(), {}, cancels_metrics};
  const Key key = idemgate::derive_key("portbase", "CIS-1", "MSKU1");
  EXPECT_EQ(claims.process(key, {"MSKU1", "w"}).status(), Status::processed);
  EXPECT_EQ(cancels.process(key, {"MSKU1", "w"}).status(), Status::processed);
  EXPECT_EQ(claims.process(key, {"MSKU1", "w"}).status(), Status::duplicate);
  EXPECT_EQ(counter(registry, "idemgate_events_total",
                    {{"gate", "ect.claim_slot"}, {"result", "duplicate"}}),
            1);
  EXPECT_EQ(counter(registry, "idemgate_events_total",
                    {{"gate", "ect.cancel_slot"}, {"result", "duplicate"}}),
            0);
  EXPECT_THROW((Gate{"payments.credit", store, terminal, no_booking(), {}, claims_metrics}),
               std::invalid_argument);
  EXPECT_THROW((RegistryObserver{registry, {.gate = "ect.claim_slot", .labels = {{"gate", "x"}}}}),
               std::invalid_argument);
  EXPECT_THROW((RegistryObserver{registry, {.gate = "not a name"}}), std::invalid_argument);
}
