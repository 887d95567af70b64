// SPDX-License-Identifier: MIT
// Counters and store signals in the Prometheus text exposition format.
#pragma once

#include "outcome.hpp"
#include "signals.hpp"

#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace idemgate {

namespace detail {

inline void metric_header(std::string& out, std::string_view name, std::string_view type,
                          std::string_view help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

inline std::string metric_number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

inline void metric(std::string& out, std::string_view name, std::string_view type,
                   std::string_view help, double value) {
  metric_header(out, name, type, help);
  out.append(name).append(" ").append(metric_number(value)).append("\n");
}

}  // namespace detail

/// One gate's part of a `/metrics` page: the counters its observer kept and its signals
/// (`gate.store().signals(window)`). The gate's name labels every sample (`gate="…"`).
struct GateMetrics {
  /// The gate's name, the `gate` label ("" leaves the samples unlabelled).
  std::string_view gate;
  /// What the gate's observer counted.
  const Counters& counters;
  /// The gate's signals.
  StoreSignals signals;
};

namespace detail {

// The label set of one gate's sample, with `extra` (`result="…"`) after the gate.
inline std::string metric_labels(std::string_view gate, std::string_view extra = {}) {
  std::string labels;
  if (!gate.empty()) labels.append("gate=\"").append(gate).append("\"");
  if (!extra.empty()) labels.append(labels.empty() ? "" : ",").append(extra);
  return labels.empty() ? labels : "{" + labels + "}";
}

// One metric family: its header once, then one sample per gate.
template <class Value>
void metric_family(std::string& out, std::span<const GateMetrics> gates, std::string_view name,
                   std::string_view type, std::string_view help, Value value) {
  metric_header(out, name, type, help);
  for (const GateMetrics& g : gates)
    out.append(name)
        .append(metric_labels(g.gate))
        .append(" ")
        .append(metric_number(value(g)))
        .append("\n");
}

// A family only some stores have (`value` gives nullopt for the others): its header and
// samples when at least one gate has it, nothing otherwise.
template <class Value>
void optional_family(std::string& out, std::span<const GateMetrics> gates, std::string_view name,
                     std::string_view help, Value value) {
  bool any = false;
  for (const GateMetrics& g : gates) any = any || value(g).has_value();
  if (!any) return;
  metric_header(out, name, "gauge", help);
  for (const GateMetrics& g : gates)
    if (const auto v = value(g))
      out.append(name)
          .append(metric_labels(g.gate))
          .append(" ")
          .append(metric_number(*v))
          .append("\n");
}

}  // namespace detail

/**
 * Renders the counters and signals of one or more gates in the Prometheus text exposition
 * format (0.0.4), ready to serve on `/metrics`: each metric once, with one sample per gate,
 * labelled `gate="<name>"`, so one dashboard shows every gate and each alert names its gate.
 * `docs/alerts.yml` holds alerting rules for it.
 *
 * Example:
 *   idemgate::Counters claim_counts{"ect.claim_slot"}, cancel_counts{"ect.cancel_slot"};
 *   idemgate::Gate claims{"ect.claim_slot", store, terminal, book, {}, claim_counts};
 *   idemgate::Gate cancels{"ect.cancel_slot", store, terminal, book, {}, cancel_counts};
 *   const std::chrono::hours window(1);
 *   const idemgate::GateMetrics gates[] = {
 *       {"ect.claim_slot", claim_counts, claims.store().signals(window)},
 *       {"ect.cancel_slot", cancel_counts, cancels.store().signals(window)}};
 *   std::string page = idemgate::render_prometheus(gates);
 */
[[nodiscard]] inline std::string render_prometheus(std::span<const GateMetrics> gates) {
  using detail::metric_family;
  std::string out;
  detail::metric_header(out, "idemgate_events_total", "counter",
                        "Deliveries through the gate in this process, by result.");
  for (const GateMetrics& g : gates)
    for (Status status : {Status::processed, Status::duplicate, Status::in_flight, Status::conflict,
                          Status::failed, Status::retry, Status::escalated, Status::lost_lease}) {
      out.append("idemgate_events_total")
          .append(
              detail::metric_labels(g.gate, "result=\"" + std::string(to_string(status)) + "\""))
          .append(" ")
          .append(std::to_string(g.counters.count(status)))
          .append("\n");
    }
  const auto number = [](auto n) { return static_cast<double>(n); };
  metric_family(out, gates, "idemgate_reconciled_total", "counter",
                "Stranded in-flight rows this process's reconciler finished.",
                [&](const GateMetrics& g) { return number(g.counters.reconciled()); });
  metric_family(out, gates, "idemgate_gate_seconds_total", "counter",
                "Time spent in Gate::process in this process.",
                [](const GateMetrics& g) { return g.counters.seconds_in_gate(); });
  metric_family(out, gates, "idemgate_signal_window_seconds", "gauge",
                "The window the event, duplicate and mismatch signals cover.",
                [&](const GateMetrics& g) { return number(g.signals.window.count()); });
  metric_family(out, gates, "idemgate_window_events", "gauge",
                "Reservations in the window: first deliveries plus duplicates.",
                [&](const GateMetrics& g) { return number(g.signals.events); });
  metric_family(out, gates, "idemgate_window_duplicates", "gauge",
                "Reservations in the window that met an existing key.",
                [&](const GateMetrics& g) { return number(g.signals.duplicates); });
  metric_family(out, gates, "idemgate_duplicate_ratio", "gauge",
                "Duplicates divided by events in the window (normal 0.01 to 0.03; 0 with "
                "traffic: broken key derivation; above 0.2: a misbehaving upstream).",
                [](const GateMetrics& g) { return g.signals.duplicate_ratio(); });
  metric_family(out, gates, "idemgate_in_flight_rows", "gauge", "Rows in flight now.",
                [&](const GateMetrics& g) { return number(g.signals.in_flight); });
  metric_family(
      out, gates, "idemgate_oldest_in_flight_seconds", "gauge",
      "Age of the oldest in-flight row (0 when there is none).", [&](const GateMetrics& g) {
        return g.signals.oldest_in_flight ? number(g.signals.oldest_in_flight->count()) : 0.0;
      });
  metric_family(out, gates, "idemgate_escalated_rows", "gauge",
                "Rows parked in the manual queue for a human.",
                [&](const GateMetrics& g) { return number(g.signals.escalated); });
  metric_family(out, gates, "idemgate_retrying_rows", "gauge",
                "In-flight rows held by more than one attempt (growing: poison rows).",
                [&](const GateMetrics& g) { return number(g.signals.retrying); });
  metric_family(out, gates, "idemgate_result_mismatch_keys", "gauge",
                "Keys for which the downstream returned more than one distinct result, in the "
                "window (healthy: 0).",
                [&](const GateMetrics& g) { return number(g.signals.mismatched_keys); });
  metric_family(out, gates, "idemgate_result_mismatch_total", "counter",
                "Downstream answers that differed from the stored result, ever recorded.",
                [&](const GateMetrics& g) { return number(g.signals.mismatches_total); });
  detail::optional_family(out, gates, "idemgate_wal_bytes",
                          "Size of the store's write-ahead log file (SQLite), in bytes.",
                          [&](const GateMetrics& g) -> std::optional<double> {
                            if (!g.signals.wal_bytes) return std::nullopt;
                            return number(*g.signals.wal_bytes);
                          });
  detail::optional_family(out, gates, "idemgate_oldest_snapshot_seconds",
                          detail::oldest_snapshot_help,
                          [](const GateMetrics& g) -> std::optional<double> {
                            if (!g.signals.oldest_snapshot) return std::nullopt;
                            return static_cast<double>(g.signals.oldest_snapshot->count());
                          });
  return out;
}

/**
 * Renders one gate's counters and signals (see above); its samples carry the label
 * `gate="<counters.gate()>"` when the counters were made for a named gate.
 *
 * Example:
 *   idemgate::Counters counters{"ect.claim_slot"};
 *   idemgate::Gate gate{"ect.claim_slot", store, terminal, book, {}, counters};
 *   std::string page =
 *       idemgate::render_prometheus(counters, gate.store().signals(std::chrono::hours(1)));
 */
[[nodiscard]] inline std::string render_prometheus(const Counters& counters,
                                                   const StoreSignals& signals) {
  const GateMetrics one[] = {{counters.gate(), counters, signals}};
  return render_prometheus(one);
}

}  // namespace idemgate
