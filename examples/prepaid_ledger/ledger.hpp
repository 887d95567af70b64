#pragma once

/// The prepaid ledger's domain, and the gate in front of it.
///
/// One signed webhook event debits a prepaid account (`message.sent`) or files one inbox row
/// (`message.received`). Two layers make a replay harmless:
///
/// 1. The gate, keyed by the event id (`webhook-id`): a redelivery of the same event is answered
///    from the idempotency log and never reaches the ledger again.
/// 2. The ledger, keyed by the message id: it reuses the debit (or inbox) row an earlier event
///    already wrote for the message, or writes a new one and takes the cost off the balance only
///    when the balance covers it. So the same message pushed again under a new event id reuses
///    the row and charges nothing.
///
/// Both live in one database, and the event's whole effect is rows in it, so the gate is a
/// `TransactionGate`: one transaction per event reserves its key, runs the ledger's decision,
/// records which event points at which ledger row (the export: event id beside ledger id) and
/// stores the event's outcome, and commits once. That is why it is exactly once: the key's row,
/// the ledger rows and the event record commit together or not at all. A delivery that dies
/// midway leaves nothing, and its redelivery runs the event as new; a delivery that finds the key
/// committed gets the stored outcome and writes nothing. There is no reservation left in flight,
/// so no lease and no reconciler.
///
/// Not for an event that does anything outside the database (a call to an SMS provider, a
/// message published, a mail sent): a crash mid-call would roll the key back and the redelivery
/// would call again. That needs the ordinary `Gate`, whose reservation commits before the call.

#include <idemgate/idemgate.hpp>
#include <idemgate/webhook/contract.hpp>

#include <common/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace prepaid {

namespace json = example::json;

/// The event types this consumer handles; every other type is refused, never faked as done.
inline const idemgate::EventContract& contract() {
  static const idemgate::EventContract types{"message.sent", "message.received"};
  return types;
}

/// The scope of the idempotency keys: one key per `webhook-id`.
inline constexpr std::string_view key_scope = "iosor.webhook";

/// The gate's name: the rows of the idempotency log it writes carry it.
inline constexpr std::string_view gate_name = "prepaid.ledger";

/// The most a single message may cost, in cents; larger amounts are refused as malformed.
inline constexpr std::int64_t max_cost_cents = 100'000'000;

/// One verified webhook event: what the gate stores and the ledger acts on.
struct Event {
  /// The sender's event id (`webhook-id`), the same on every redelivery.
  std::string event_id;
  /// `message.sent` or `message.received`.
  std::string type;
  /// The prepaid account.
  std::string account;
  /// The message the event is about: the ledger's own idempotency key.
  std::string message_id;
  /// What the message costs (`message.sent`).
  std::int64_t cost_cents = 0;
  /// The sender's number (`message.received`).
  std::string from;
  /// The message text (`message.received`).
  std::string text;

  /// True for `message.sent`: the event moves money.
  [[nodiscard]] bool debits() const noexcept { return type == "message.sent"; }

  friend bool operator==(const Event&, const Event&) = default;
};

/// What the ledger did for one event: the row it points at.
struct Entry {
  /// Which table the row is in.
  enum class Kind { debit, inbox };
  /// Which table the row is in.
  Kind kind = Kind::debit;
  /// The row's id (the ledger id).
  std::int64_t id = 0;
  /// True when another event had already written the row for this message: nothing was charged
  /// and no row was added.
  bool reused = false;

  friend bool operator==(const Entry&, const Entry&) = default;
};

/// Why the ledger refused an event for good; nothing was written on the ledger for it.
enum class Refusal {
  insufficient_balance,  ///< The balance does not cover the message's cost.
  message_conflict,      ///< The message id is on the ledger for another account or cost.
};

/// The refusal's name, as the log stores it and the server answers it.
[[nodiscard]] constexpr std::string_view to_string(Refusal refusal) noexcept {
  switch (refusal) {
    case Refusal::insufficient_balance:
      return "insufficient_balance";
    case Refusal::message_conflict:
      return "message_conflict";
  }
  return "unknown";
}

/// What the gate stores for one event: the ledger row it points at, or why the ledger refused
/// it. A refusal is stored like a row, so a replay of the event gets the same answer.
using Decision = std::variant<Entry, Refusal>;

namespace detail {

inline bool plain_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
  });
}

// PostgreSQL text refuses NUL bytes and broken UTF-8; refusing them here keeps such an event a
// `malformed` request instead of a store error that the sender would retry for ever.
inline bool storable_text(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == 0) return false;
    std::size_t length = 1;
    if (byte >= 0xf0 && byte <= 0xf4)
      length = 4;
    else if (byte >= 0xe0)
      length = 3;
    else if (byte >= 0xc2 && byte < 0xe0)
      length = 2;
    else if (byte >= 0x80)
      return false;
    if (i + length > text.size()) return false;
    for (std::size_t k = 1; k < length; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return false;
    i += length;
  }
  return true;
}

inline void put_field(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

inline std::string_view take_field(std::string_view& in) {
  const std::size_t colon = in.find(':');
  if (colon == std::string_view::npos)
    throw idemgate::CodecError("prepaid: a stored event is cut short");
  const auto size = idemgate::codec<std::size_t>::decode(in.substr(0, colon));
  if (size > in.size() - colon - 1)
    throw idemgate::CodecError("prepaid: a stored event field runs past the end");
  const std::string_view field = in.substr(colon + 1, size);
  in.remove_prefix(colon + 1 + size);
  return field;
}

}  // namespace detail

}  // namespace prepaid

/// How the gate stores an event: every field length-prefixed, so the bytes are canonical.
template <>
struct idemgate::codec<prepaid::Event> {
  /// Writes the fields in a fixed order.
  static void encode(const prepaid::Event& e, std::string& out) {
    out.clear();
    for (std::string_view field : {std::string_view(e.event_id), std::string_view(e.type),
                                   std::string_view(e.account), std::string_view(e.message_id)})
      prepaid::detail::put_field(out, field);
    prepaid::detail::put_field(out, std::to_string(e.cost_cents));
    prepaid::detail::put_field(out, e.from);
    prepaid::detail::put_field(out, e.text);
  }
  /// Reads them back; throws `CodecError` on anything else.
  static prepaid::Event decode(std::string_view in) {
    prepaid::Event e;
    e.event_id = prepaid::detail::take_field(in);
    e.type = prepaid::detail::take_field(in);
    e.account = prepaid::detail::take_field(in);
    e.message_id = prepaid::detail::take_field(in);
    e.cost_cents = idemgate::codec<std::int64_t>::decode(prepaid::detail::take_field(in));
    e.from = prepaid::detail::take_field(in);
    e.text = prepaid::detail::take_field(in);
    if (!in.empty()) throw idemgate::CodecError("prepaid: a stored event has trailing bytes");
    return e;
  }
};

/// How the gate stores an entry: `debit:17`, `inbox:5`, with `:reused` when it was reused.
template <>
struct idemgate::codec<prepaid::Entry> {
  /// Writes kind, id and the reuse mark.
  static void encode(const prepaid::Entry& entry, std::string& out) {
    out = entry.kind == prepaid::Entry::Kind::debit ? "debit:" : "inbox:";
    out += std::to_string(entry.id);
    if (entry.reused) out += ":reused";
  }
  /// Reads them back; throws `CodecError` on anything else.
  static prepaid::Entry decode(std::string_view in) {
    prepaid::Entry entry;
    if (in.starts_with("debit:"))
      entry.kind = prepaid::Entry::Kind::debit;
    else if (in.starts_with("inbox:"))
      entry.kind = prepaid::Entry::Kind::inbox;
    else
      throw idemgate::CodecError("prepaid: a stored entry is neither a debit nor an inbox row");
    in.remove_prefix(6);
    if (in.ends_with(":reused")) {
      entry.reused = true;
      in.remove_suffix(7);
    }
    entry.id = idemgate::codec<std::int64_t>::decode(in);
    return entry;
  }
};

/// How the gate stores a decision: an entry as above, a refusal as `refused:` and its name
/// (`refused:insufficient_balance`). One value, one encoding.
template <>
struct idemgate::codec<prepaid::Decision> {
  /// Writes the entry, or the refusal's name.
  static void encode(const prepaid::Decision& decision, std::string& out) {
    if (const auto* entry = std::get_if<prepaid::Entry>(&decision)) {
      idemgate::codec<prepaid::Entry>::encode(*entry, out);
      return;
    }
    out = "refused:";
    out += prepaid::to_string(std::get<prepaid::Refusal>(decision));
  }
  /// Reads it back; throws `CodecError` on anything else.
  static prepaid::Decision decode(std::string_view in) {
    if (!in.starts_with("refused:")) return idemgate::codec<prepaid::Entry>::decode(in);
    in.remove_prefix(8);
    for (const prepaid::Refusal refusal :
         {prepaid::Refusal::insufficient_balance, prepaid::Refusal::message_conflict})
      if (in == prepaid::to_string(refusal)) return refusal;
    throw idemgate::CodecError("prepaid: a stored refusal has an unknown name");
  }
};

namespace prepaid {

/// A webhook id the ledger can store: 1 to 256 printable ASCII characters.
[[nodiscard]] inline bool usable_event_id(std::string_view id) {
  return !id.empty() && id.size() <= 256 &&
         std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

/// An account id as it may appear in a URL path: 1 to 128 of `A-Z a-z 0-9 _ - . :`.
[[nodiscard]] inline bool usable_account(std::string_view account) {
  return detail::plain_id(account);
}

/**
 * The event in a parsed webhook body of a type the contract accepts; nullopt when a field is
 * missing, of the wrong type or out of range (the server answers `malformed`).
 *
 * Example:
 *   // {"type":"message.sent","data":{"account":"acc_1","message_id":"m_1","cost_cents":7}}
 *   auto event = prepaid::event_from(*document, "message.sent", verified.id());
 */
[[nodiscard]] inline std::optional<Event> event_from(const json::Json& document,
                                                     const std::string& type,
                                                     std::string_view event_id) {
  if (!document.is_object() || !usable_event_id(event_id)) return std::nullopt;
  const auto found = document.find("data");
  if (found == document.end() || !found->is_object()) return std::nullopt;
  const json::Json& data = *found;
  Event event;
  event.event_id = event_id;
  event.type = type;
  auto account = json::string_member(data, "account");
  auto message_id = json::string_member(data, "message_id");
  if (!account || !message_id || !detail::plain_id(*account) || !detail::plain_id(*message_id))
    return std::nullopt;
  event.account = std::move(*account);
  event.message_id = std::move(*message_id);
  if (event.debits()) {
    const auto cost = json::integer_member(data, "cost_cents");
    if (!cost || *cost < 0 || *cost > max_cost_cents) return std::nullopt;
    event.cost_cents = *cost;
  } else {
    auto from = json::string_member(data, "from");
    auto text = json::string_member(data, "text");
    if (!from || !text || from->empty() || from->size() > 64 || !detail::storable_text(*from) ||
        !detail::storable_text(*text))
      return std::nullopt;
    event.from = std::move(*from);
    event.text = std::move(*text);
  }
  return event;
}

/// One debit row, with the event that wrote it.
struct DebitRow {
  /// The ledger id.
  std::int64_t debit_id = 0;
  /// The event that charged it.
  std::string event_id;
  /// The message it is for.
  std::string message_id;
  /// What was charged.
  std::int64_t cost_cents = 0;
};

/// One inbox row, with the event that filed it.
struct InboxRow {
  /// The inbox id.
  std::int64_t inbox_id = 0;
  /// The event that filed it.
  std::string event_id;
  /// The message.
  std::string message_id;
  /// The sender's number.
  std::string from;
};

/// One event record, written with the ledger row it points at: which row that is.
struct EventRow {
  /// The event id.
  std::string event_id;
  /// `debit` or `inbox`.
  std::string kind;
  /// The debit or inbox id.
  std::int64_t entry_id = 0;
  /// The message.
  std::string message_id;
  /// Whether the row was already there (written by an earlier event for the same message).
  bool reused = false;
};

/// An account as `GET /accounts/{account}` shows it.
struct Account {
  /// What is left.
  std::int64_t balance_cents = 0;
  /// Every debit, oldest first.
  std::vector<DebitRow> debits;
  /// Every inbox row, oldest first.
  std::vector<InboxRow> inbox;
  /// Every event recorded against the account, oldest first.
  std::vector<EventRow> events;
};

/**
 * Concept: a ledger in the idempotency log's own database.
 *
 * `write(tx, key, event)` is the event's whole effect, run in the gate's transaction on the
 * store's connection (see `claim_entry`); `account(id)` reads an account back.
 */
template <class L>
concept ledger_policy = idemgate::one_transaction_store<typename L::store_type> &&
    requires(L& l, typename L::store_type::transaction& tx, const idemgate::Key& key,
             const Event& event, std::string_view id) {
  { l.write(tx, key, event) } -> std::same_as<Decision>;
  { l.account(id) } -> std::same_as<std::optional<Account>>;
};

/// What a ledger row for a message looks like when the message is already on the ledger.
struct HeldRow {
  /// The row's id.
  std::int64_t id = 0;
  /// The account it is on.
  std::string account;
  /// What it charged (debits).
  std::int64_t cost_cents = 0;
  /// Whether the event that wrote it had this key.
  bool same_key = false;
};

/**
 * The ledger's decision for one event, inside the gate's transaction on any backend: reuse the
 * row already held for the message, or write a new one and, for a debit, take the cost off the
 * balance only if the balance covers it.
 *
 * `Tx` provides `open_account`, `insert_debit`, `find_debit`, `take_balance`, `insert_inbox` and
 * `find_inbox` (see the SQLite and PostgreSQL ledgers). A refusal may leave part of that work
 * written (the account opened, the debit row inserted): the caller runs this under a savepoint
 * and rolls back to it on a refusal, so that a refused event writes nothing on the ledger while
 * the log still commits the refusal.
 */
template <class Tx>
Decision claim_entry(Tx& tx, const Event& event, const idemgate::Key& key,
                     std::int64_t initial_balance_cents) {
  tx.open_account(event.account, initial_balance_cents);
  const Entry::Kind kind = event.debits() ? Entry::Kind::debit : Entry::Kind::inbox;
  const std::optional<std::int64_t> written =
      event.debits() ? tx.insert_debit(event, key) : tx.insert_inbox(event, key);
  if (written) {
    if (event.debits() && !tx.take_balance(event.account, event.cost_cents))
      return Refusal::insufficient_balance;
    return Entry{kind, *written, false};
  }
  // The unique message id stopped the insert: the row is there (committed, or this statement
  // waited for the transaction that wrote it).
  const HeldRow held =
      event.debits() ? tx.find_debit(event.message_id, key) : tx.find_inbox(event.message_id, key);
  if (held.account != event.account || (event.debits() && held.cost_cents != event.cost_cents))
    return Refusal::message_conflict;
  // Under the event's own key the row is this event's own work, not a reuse. A row commits with
  // its key, so that is only ever a row whose log row was left in flight by an ordinary `Gate`
  // of the same name, which the gate takes over.
  return Entry{kind, held.id, !held.same_key};
}

/// What every ledger backend is configured with.
struct LedgerConfig {
  /// The balance an account starts with on first use (USD 20 by default).
  std::int64_t initial_balance_cents = 2000;
  /// Testing only: the process exits inside the event's transaction for this message id, after
  /// the ledger row and the event record are written and before the commit (a crash that must
  /// leave nothing behind). Empty: never.
  std::string exit_before_commit;
};

/// What the server answers for one event that passed the signed edge and the contract.
enum class Answer {
  accepted,              ///< This delivery did the work.
  duplicate,             ///< Already done: by this event earlier, or by another event for the
                         ///< same message. Nothing was charged or filed again.
  insufficient_balance,  ///< Refused for good (stored: replays get it again); nothing charged.
  message_conflict,      ///< The message id is on the ledger for another account or cost.
  event_conflict,        ///< The event id was first used with a different body.
  in_flight,             ///< A concurrent delivery of this event holds it; retry shortly.
  unavailable,           ///< The database failed; nothing is settled. Retry later.
  escalated,             ///< Parked for a human (never happens: the ledger honours keys).
};

/// The answer's name, as the server writes it.
[[nodiscard]] constexpr std::string_view to_string(Answer answer) noexcept {
  switch (answer) {
    case Answer::accepted:
      return "accepted";
    case Answer::duplicate:
      return "duplicate";
    case Answer::insufficient_balance:
      return "insufficient_balance";
    case Answer::message_conflict:
      return "message_conflict";
    case Answer::event_conflict:
      return "event_conflict";
    case Answer::in_flight:
      return "in_flight";
    case Answer::unavailable:
      return "unavailable";
    case Answer::escalated:
      return "escalated";
  }
  return "unknown";
}

/// Tuning of a `PrepaidLedger`.
struct LedgerOptions {
  /// How long a delivery waits for a concurrent delivery of the same event whose transaction
  /// holds its key, before it answers `in_flight` (the sender then retries): on PostgreSQL the
  /// transaction's lock timeout (`TransactionGateOptions::lock_timeout`), which also bounds the
  /// ledger's waits for a message row or an account row. SQLite waits up to the store's busy
  /// timeout instead.
  std::chrono::milliseconds lock_timeout = std::chrono::seconds(3);
};

/// The gate's write: the ledger's whole effect for one event, in the gate's transaction.
template <ledger_policy L>
struct WriteEvent {
  /// The ledger whose tables are written.
  L* target;
  /// Runs in the transaction that reserved `key`; its decision is stored with the key.
  Decision operator()(typename L::store_type::transaction& tx, const idemgate::Key& key,
                      const Event& event) const {
    return target->write(tx, key, event);
  }
};

/**
 * The prepaid ledger behind the gate: turns one verified event into an `Answer`, exactly once.
 *
 * Each event is one transaction of the store (`TransactionGate`): nothing runs in the background
 * and nothing is left in flight. Thread-safe.
 *
 * Example:
 *   prepaid::PrepaidLedger service{store, ledger};
 *   auto key = idemgate::derive_key(prepaid::key_scope, verified.id());
 *   prepaid::Answer answer = service.handle(key, event);
 */
template <ledger_policy L>
class PrepaidLedger {
 public:
  /// The idempotency log's store, whose database holds the ledger.
  using store_type = typename L::store_type;
  /// The gate over the store, running the ledger's write.
  using gate_type = idemgate::TransactionGate<store_type, Event, Decision, WriteEvent<L>>;

  /// Wires the gate to the ledger.
  PrepaidLedger(store_type& store, L& backend, LedgerOptions options = {})
      : ledger_(backend),
        gate_(gate_name, store, WriteEvent<L>{&backend},
              idemgate::TransactionGateOptions{.lock_timeout = options.lock_timeout}) {}

  PrepaidLedger(const PrepaidLedger&) = delete;
  PrepaidLedger& operator=(const PrepaidLedger&) = delete;

  /// Processes one delivery of `event` under `key`. Throws `idemgate::RequestError` for an event
  /// too large to store; a database failure is answered `unavailable`.
  Answer handle(const idemgate::Key& key, const Event& event) {
    Answer answer = Answer::unavailable;
    try {
      answer = answer_for(gate_.process(key, event));
    } catch (const idemgate::RequestError&) {
      throw;
    } catch (const std::exception&) {
      // The store or the ledger failed: the event's transaction rolled back and nothing of it
      // was written. The sender's retry runs it again.
      answer = Answer::unavailable;
    }
    count(answer);
    return answer;
  }

  /// The account, or nullopt when it was never used.
  std::optional<Account> account(std::string_view id) { return ledger_.account(id); }

  /// How often each answer was given since start, by name.
  [[nodiscard]] std::vector<std::pair<std::string_view, std::uint64_t>> counts() const {
    std::vector<std::pair<std::string_view, std::uint64_t>> out;
    for (std::size_t i = 0; i < counts_.size(); ++i)
      out.emplace_back(to_string(static_cast<Answer>(i)), counts_[i].load());
    return out;
  }

 private:
  static Answer answer_for(Refusal refusal) {
    return refusal == Refusal::insufficient_balance ? Answer::insufficient_balance
                                                    : Answer::message_conflict;
  }

  static Answer answer_for(const typename gate_type::result_type& result) {
    switch (result.status()) {
      case idemgate::Status::processed:
      case idemgate::Status::duplicate: {
        // A stored refusal is the event's answer however often it comes back.
        if (const auto* refused = std::get_if<Refusal>(&result.outcome()))
          return answer_for(*refused);
        const bool reused = std::get<Entry>(result.outcome()).reused;
        return result.status() == idemgate::Status::processed && !reused ? Answer::accepted
                                                                         : Answer::duplicate;
      }
      case idemgate::Status::failed:
        // A refusal stored as a failure (by an ordinary `Gate` of the same name).
        if (result.reason() == to_string(Refusal::insufficient_balance))
          return Answer::insufficient_balance;
        if (result.reason() == to_string(Refusal::message_conflict))
          return Answer::message_conflict;
        return Answer::unavailable;
      case idemgate::Status::conflict:
        return Answer::event_conflict;
      case idemgate::Status::retry:
        // A concurrent delivery of the event held its key past the lock timeout: its answer is
        // not known yet, and nothing was written.
      case idemgate::Status::in_flight:
      case idemgate::Status::lost_lease:
        return Answer::in_flight;
      case idemgate::Status::escalated:
        return Answer::escalated;
    }
    return Answer::unavailable;
  }

  void count(Answer answer) { ++counts_[static_cast<std::size_t>(answer)]; }

  L& ledger_;
  gate_type gate_;
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(Answer::escalated) + 1> counts_{};
};

}  // namespace prepaid
