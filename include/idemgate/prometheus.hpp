// SPDX-License-Identifier: MIT
// Counters and store signals in the Prometheus text exposition format.
#pragma once

#include "outcome.hpp"
#include "signals.hpp"

#include <cstdio>
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

/**
 * Renders a process's counters and its store's signals in the Prometheus text exposition
 * format (0.0.4), ready to serve on `/metrics`. `docs/alerts.yml` holds alerting rules for it.
 *
 * Example:
 *   idemgate::Counters counters;
 *   idemgate::Gate gate{store, terminal, book, {}, counters};
 *   std::string page = idemgate::render_prometheus(counters, store.signals(std::chrono::hours(1)));
 */
[[nodiscard]] inline std::string render_prometheus(const Counters& counters,
                                                   const StoreSignals& signals) {
  std::string out;
  detail::metric_header(out, "idemgate_events_total", "counter",
                        "Deliveries through the gate in this process, by result.");
  for (Status status : {Status::processed, Status::duplicate, Status::in_flight, Status::conflict,
                        Status::failed, Status::retry, Status::escalated, Status::lost_lease}) {
    out.append("idemgate_events_total{result=\"")
        .append(to_string(status))
        .append("\"} ")
        .append(std::to_string(counters.count(status)))
        .append("\n");
  }
  detail::metric(out, "idemgate_reconciled_total", "counter",
                 "Stranded in-flight rows this process's reconciler finished.",
                 static_cast<double>(counters.reconciled()));
  detail::metric(out, "idemgate_gate_seconds_total", "counter",
                 "Time spent in Gate::process in this process.", counters.seconds_in_gate());
  detail::metric(out, "idemgate_signal_window_seconds", "gauge",
                 "The window the event, duplicate and mismatch signals cover.",
                 static_cast<double>(signals.window.count()));
  detail::metric(out, "idemgate_window_events", "gauge",
                 "Reservations in the window: first deliveries plus duplicates.",
                 static_cast<double>(signals.events));
  detail::metric(out, "idemgate_window_duplicates", "gauge",
                 "Reservations in the window that met an existing key.",
                 static_cast<double>(signals.duplicates));
  detail::metric(out, "idemgate_duplicate_ratio", "gauge",
                 "Duplicates divided by events in the window (normal 0.01 to 0.03; 0 with "
                 "traffic: broken key derivation; above 0.2: a misbehaving upstream).",
                 signals.duplicate_ratio());
  detail::metric(out, "idemgate_in_flight_rows", "gauge", "Rows in flight now.",
                 static_cast<double>(signals.in_flight));
  detail::metric(
      out, "idemgate_oldest_in_flight_seconds", "gauge",
      "Age of the oldest in-flight row (0 when there is none).",
      signals.oldest_in_flight ? static_cast<double>(signals.oldest_in_flight->count()) : 0.0);
  detail::metric(out, "idemgate_escalated_rows", "gauge",
                 "Rows parked in the manual queue for a human.",
                 static_cast<double>(signals.escalated));
  detail::metric(out, "idemgate_retrying_rows", "gauge",
                 "In-flight rows held by more than one attempt (growing: poison rows).",
                 static_cast<double>(signals.retrying));
  detail::metric(out, "idemgate_result_mismatch_keys", "gauge",
                 "Keys for which the downstream returned more than one distinct result, in the "
                 "window (healthy: 0).",
                 static_cast<double>(signals.mismatched_keys));
  detail::metric(out, "idemgate_result_mismatch_total", "counter",
                 "Downstream answers that differed from the stored result, ever recorded.",
                 static_cast<double>(signals.mismatches_total));
  if (signals.wal_bytes)
    detail::metric(out, "idemgate_wal_bytes", "gauge",
                   "Size of the store's write-ahead log file (SQLite), in bytes.",
                   static_cast<double>(*signals.wal_bytes));
  return out;
}

}  // namespace idemgate
