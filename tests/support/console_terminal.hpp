#pragma once

// What the console's tests share: a slot-claiming gate on SQLite whose events end in every state
// an operator meets. The request is a container; the outcome a slot, stored as JSON
// ({"slot":"..."}), so the console's resolve parses what an operator types with a strict codec.
// Containers named TIMEOUT... always time out (escalated by the reconciler), REFUSED... are
// refused for good (failed), BROKEN... have a business write that always throws (escalated by
// the reconciler; resolving them fails and commits nothing); the others get a slot.

#include <idemgate/gate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/store/sqlite.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace idemgate::test::console {

/// A slot at the terminal: the gate's outcome.
struct Slot {
  std::string id;
  bool operator==(const Slot&) const = default;
};

}  // namespace idemgate::test::console

/// A slot is stored as the JSON object {"slot":"<id>"}, and nothing else decodes.
template <>
struct idemgate::codec<idemgate::test::console::Slot> {
  static void encode(const idemgate::test::console::Slot& slot, std::string& out) {
    out = nlohmann::json{{"slot", slot.id}}.dump();
  }
  static idemgate::test::console::Slot decode(std::string_view in) {
    const auto document = nlohmann::json::parse(in, nullptr, false);
    if (document.is_discarded() || !document.is_object() || document.size() != 1 ||
        !document.contains("slot") || !document["slot"].is_string() ||
        document["slot"].get<std::string>().empty())
      throw idemgate::CodecError("a slot is the JSON object {\"slot\": \"<slot id>\"}");
    return {document["slot"].get<std::string>()};
  }
};

namespace idemgate::test::console {

/// The terminal: claims a slot per container, by the container's name (see the top).
struct Terminal {
  using request_type = std::string;
  using outcome_type = Slot;
  static constexpr bool honours_idempotency_key = true;
  idemgate::ClaimResult<Slot> claim(const std::string& container, const idemgate::Key&) {
    if (container.starts_with("TIMEOUT"))
      return idemgate::TransientFailure{"the terminal timed out"};
    if (container.starts_with("REFUSED"))
      return idemgate::PermanentFailure{"the terminal refused: unknown container " + container};
    return Slot{"ECTD-" + container};
  }
};

/// The business write: one booking row per event.
struct Book {
  void operator()(idemgate::SqliteTransaction& tx, const idemgate::Key& key,
                  const std::string& container, const Slot& slot) const {
    if (container.starts_with("BROKEN"))
      throw std::runtime_error("the TMS has no booking line for container " + container +
                               "; create it in the TMS first");
    tx.exec("INSERT INTO bookings (container, slot, event) VALUES (?, ?, ?)", container, slot.id,
            key);
  }
};

/// The gate's type.
using ConsoleGate = idemgate::Gate<idemgate::SqliteStore, Terminal, Book>;

/// The gate's name.
inline constexpr std::string_view gate_name = "console.claim_slot";

/// The gate's options: it keeps each row's label (the event id and the container).
inline idemgate::GateOptions gate_options() {
  idemgate::GateOptions options;
  options.keep_labels = true;
  // No back-off: the set-up's reconciler passes take the timed-out events over at once.
  options.retry_backoff = std::chrono::milliseconds(0);
  return options;
}

/// The key of event `event` for `container`.
inline idemgate::Key key_of(std::string_view event, std::string_view container) {
  return idemgate::derive_key(gate_name, event, container);
}

/// Creates the business table.
inline void create_bookings(const std::string& path) {
  idemgate::detail::sqlite::Connection db = [&] {
    sqlite3* raw = nullptr;
    if (sqlite3_open(path.c_str(), &raw) != SQLITE_OK) throw std::runtime_error("sqlite3_open");
    sqlite3_busy_timeout(raw, 20000);
    return idemgate::detail::sqlite::Connection(raw);
  }();
  char* error = nullptr;
  if (sqlite3_exec(db.get(),
                   "CREATE TABLE IF NOT EXISTS bookings (container TEXT NOT NULL, slot TEXT NOT "
                   "NULL, event BLOB NOT NULL UNIQUE)",
                   nullptr, nullptr, &error) != SQLITE_OK) {
    const std::string message = error ? error : "unknown";
    sqlite3_free(error);
    throw std::runtime_error("creating bookings: " + message);
  }
}

/// The bookings of `container` in the file at `path`.
inline std::int64_t bookings_of(const std::string& path, const std::string& container) {
  sqlite3* raw = nullptr;
  if (sqlite3_open(path.c_str(), &raw) != SQLITE_OK) throw std::runtime_error("sqlite3_open");
  idemgate::detail::sqlite::Connection db(raw);
  sqlite3_busy_timeout(raw, 20000);
  return idemgate::detail::sqlite::query_int(
             db.get(), "SELECT count(*) FROM bookings WHERE container = ?", container)
      .value_or(0);
}

/// Delivers the events (container names, each under its own event id, some twice; labelled
/// "<gate> event-<n> <container>") and runs
/// the reconciler until the timed-out and broken ones are escalated.
inline void deliver(ConsoleGate& gate, const std::vector<std::string>& containers,
                    int copies_of_first = 2) {
  int n = 0;
  for (const std::string& container : containers) {
    const int copies = n < 3 ? copies_of_first : 1;
    for (int c = 0; c < copies; ++c) {
      try {
        (void)gate.process(
            idemgate::derive_labelled_key(gate_name, "event-" + std::to_string(n), container),
            container);
      } catch (const std::exception&) {
        // A business write that throws leaves the event to the reconciler.
      }
    }
    ++n;
  }
  idemgate::Reconciler reconciler{gate,
                                  {.stale_after = std::chrono::milliseconds(0), .max_attempts = 1}};
  for (int pass = 0; pass < 5; ++pass) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    (void)reconciler.run_once();
  }
}

}  // namespace idemgate::test::console
