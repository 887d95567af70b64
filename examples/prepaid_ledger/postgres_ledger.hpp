#pragma once

/// The ledger on PostgreSQL: its tables live in the store's database, and every event's rows are
/// written in the gate's transaction on the store's connection, so they commit together with the
/// event's outcome or not at all.

#include "ledger.hpp"

#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/store/postgres.hpp>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace prepaid {

/**
 * The prepaid ledger on PostgreSQL. Each event's rows are written in the gate's READ COMMITTED
 * transaction: the unique message id makes a concurrent event for the same message wait for the
 * first one's transaction and then reuse its row, and the conditional balance update locks the
 * account row, so concurrent debits of one account never overdraw it. It borrows the store's
 * connection pool to create its tables and read accounts back.
 *
 * Example:
 *   idemgate::PostgresStore store{uri, {.pool_size = 8}};
 *   store.migrate();
 *   prepaid::PostgresLedger ledger{store};
 *   ledger.migrate();
 */
class PostgresLedger {
 public:
  /// The store whose transaction writes the ledger's rows.
  using store_type = idemgate::PostgresStore;

  /// A ledger that borrows `store`'s connections.
  explicit PostgresLedger(idemgate::PostgresStore& store, LedgerConfig config = {})
      : store_(store), config_(std::move(config)) {}

  /// The ledger's tables, for PostgreSQL.
  [[nodiscard]] static std::string schema_sql() {
    return R"sql(
CREATE TABLE IF NOT EXISTS prepaid_accounts (
  account       text        PRIMARY KEY,
  balance_cents bigint      NOT NULL CHECK (balance_cents >= 0));
CREATE TABLE IF NOT EXISTS prepaid_debits (
  debit_id      bigserial   PRIMARY KEY,
  message_id    text        NOT NULL UNIQUE,
  account       text        NOT NULL REFERENCES prepaid_accounts (account),
  cost_cents    bigint      NOT NULL CHECK (cost_cents >= 0),
  event_id      text        NOT NULL,
  idem_key      bytea       NOT NULL UNIQUE,
  created_at    timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS prepaid_inbox (
  inbox_id      bigserial   PRIMARY KEY,
  message_id    text        NOT NULL UNIQUE,
  account       text        NOT NULL REFERENCES prepaid_accounts (account),
  sender        text        NOT NULL,
  body          text        NOT NULL,
  event_id      text        NOT NULL,
  idem_key      bytea       NOT NULL UNIQUE,
  created_at    timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS prepaid_events (
  event_id      text        PRIMARY KEY,
  account       text        NOT NULL,
  kind          text        NOT NULL CHECK (kind IN ('debit', 'inbox')),
  entry_id      bigint      NOT NULL,
  message_id    text        NOT NULL,
  reused        boolean     NOT NULL,
  recorded_at   timestamptz NOT NULL DEFAULT now());
CREATE INDEX IF NOT EXISTS prepaid_debits_account ON prepaid_debits (account);
CREATE INDEX IF NOT EXISTS prepaid_inbox_account ON prepaid_inbox (account);
CREATE INDEX IF NOT EXISTS prepaid_events_account ON prepaid_events (account, recorded_at);
)sql";
  }

  /// Creates the ledger's tables if missing; safe from several processes at once.
  void migrate() {
    auto lease = store_.connection();
    pqxx::work tx(lease.connection());
    idemgate::detail::pq::exec(tx, "SELECT pg_advisory_xact_lock(7158029412)");
    idemgate::detail::pq::exec(tx, schema_sql());
    tx.commit();
  }

  /**
   * The event's whole effect, in the gate's transaction: the ledger's decision (see
   * `claim_entry`) under a savepoint, rolled back to on a refusal so that a refused event writes
   * nothing on the ledger, then the event's record beside the row it points at. The gate stores
   * the decision with the key and commits them all at once.
   */
  Decision write(pqxx::work& work, const idemgate::Key& key, const Event& event) {
    namespace pq = idemgate::detail::pq;
    pq::exec(work, "SAVEPOINT prepaid_claim");
    Tx claim{work, pq::bytea_param(key.view())};
    const Decision decision = claim_entry(claim, event, key, config_.initial_balance_cents);
    if (std::holds_alternative<Refusal>(decision))
      pq::exec(work, "ROLLBACK TO SAVEPOINT prepaid_claim");
    pq::exec(work, "RELEASE SAVEPOINT prepaid_claim");
    if (const auto* entry = std::get_if<Entry>(&decision)) record(work, event, *entry);
    if (event.message_id == config_.exit_before_commit) std::_Exit(3);
    return decision;
  }

  /// The account with its rows, read in one snapshot; nullopt when it was never used.
  std::optional<Account> account(std::string_view id) {
    const std::string account(id);
    auto lease = store_.connection();
    try {
      pqxx::work tx(lease.connection());
      idemgate::detail::pq::exec(tx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY");
      namespace pq = idemgate::detail::pq;
      const pqxx::result balance = pq::exec_params(
          tx, "SELECT balance_cents FROM prepaid_accounts WHERE account = $1", account);
      if (balance.empty()) return std::nullopt;
      Account out;
      out.balance_cents = pq::int_field(balance[0][0]);
      for (const pq::row& r : pq::exec_params(tx,
                                              "SELECT debit_id, event_id, message_id, cost_cents"
                                              " FROM prepaid_debits WHERE account = $1"
                                              " ORDER BY debit_id",
                                              account))
        out.debits.push_back(
            {pq::int_field(r[0]), pq::text_field(r[1]), pq::text_field(r[2]), pq::int_field(r[3])});
      for (const pq::row& r : pq::exec_params(tx,
                                              "SELECT inbox_id, event_id, message_id, sender"
                                              " FROM prepaid_inbox WHERE account = $1"
                                              " ORDER BY inbox_id",
                                              account))
        out.inbox.push_back({pq::int_field(r[0]), pq::text_field(r[1]), pq::text_field(r[2]),
                             pq::text_field(r[3])});
      for (const pq::row& r :
           pq::exec_params(tx,
                           "SELECT event_id, kind, entry_id, message_id, reused"
                           " FROM prepaid_events WHERE account = $1 ORDER BY recorded_at, event_id",
                           account))
        out.events.push_back({pq::text_field(r[0]), pq::text_field(r[1]), pq::int_field(r[2]),
                              pq::text_field(r[3]), pq::bool_field(r[4])});
      tx.commit();
      return out;
    } catch (const pqxx::broken_connection&) {
      lease.mark_broken();
      throw;
    }
  }

 private:
  // The event record: which ledger row the event points at.
  static void record(pqxx::work& tx, const Event& event, const Entry& entry) {
    idemgate::detail::pq::exec_params(
        tx,
        "INSERT INTO prepaid_events (event_id, account, kind, entry_id, message_id, reused)"
        " VALUES ($1, $2, $3, $4, $5, $6)",
        event.event_id, event.account,
        std::string(entry.kind == Entry::Kind::debit ? "debit" : "inbox"), entry.id,
        event.message_id, entry.reused);
  }

  // The operations `claim_entry` needs, inside the gate's transaction.
  struct Tx {
    pqxx::work& work;
    std::string key;  // the event's key as a bytea parameter

    void open_account(const std::string& account, std::int64_t balance) {
      idemgate::detail::pq::exec_params(
          work,
          "INSERT INTO prepaid_accounts (account, balance_cents) VALUES ($1, $2)"
          " ON CONFLICT (account) DO NOTHING",
          account, balance);
    }
    std::optional<std::int64_t> insert_debit(const Event& e, const idemgate::Key&) {
      return first_id(idemgate::detail::pq::exec_params(
          work,
          "INSERT INTO prepaid_debits (message_id, account, cost_cents, event_id, idem_key)"
          " VALUES ($1, $2, $3, $4, $5::bytea) ON CONFLICT (message_id) DO NOTHING"
          " RETURNING debit_id",
          e.message_id, e.account, e.cost_cents, e.event_id, key));
    }
    bool take_balance(const std::string& account, std::int64_t cost) {
      return idemgate::detail::pq::affected_rows(idemgate::detail::pq::exec_params(
                 work,
                 "UPDATE prepaid_accounts SET balance_cents = balance_cents - $2"
                 " WHERE account = $1 AND balance_cents >= $2",
                 account, cost)) == 1;
    }
    std::optional<std::int64_t> insert_inbox(const Event& e, const idemgate::Key&) {
      return first_id(idemgate::detail::pq::exec_params(
          work,
          "INSERT INTO prepaid_inbox (message_id, account, sender, body, event_id, idem_key)"
          " VALUES ($1, $2, $3, $4, $5, $6::bytea) ON CONFLICT (message_id) DO NOTHING"
          " RETURNING inbox_id",
          e.message_id, e.account, e.from, e.text, e.event_id, key));
    }
    HeldRow find_debit(const std::string& message_id, const idemgate::Key&) {
      return held(idemgate::detail::pq::exec_params(
                      work,
                      "SELECT debit_id, account, cost_cents, idem_key = $2::bytea"
                      " FROM prepaid_debits WHERE message_id = $1",
                      message_id, key),
                  message_id);
    }
    HeldRow find_inbox(const std::string& message_id, const idemgate::Key&) {
      return held(idemgate::detail::pq::exec_params(
                      work,
                      "SELECT inbox_id, account, 0::bigint, idem_key = $2::bytea"
                      " FROM prepaid_inbox WHERE message_id = $1",
                      message_id, key),
                  message_id);
    }

    static std::optional<std::int64_t> first_id(const pqxx::result& rows) {
      if (rows.empty()) return std::nullopt;
      return idemgate::detail::pq::int_field(rows[0][0]);
    }
    static HeldRow held(const pqxx::result& rows, const std::string& message_id) {
      if (rows.empty())
        throw idemgate::StoreError("prepaid: message " + message_id +
                                   " conflicted but cannot be read back");
      namespace pq = idemgate::detail::pq;
      return {pq::int_field(rows[0][0]), pq::text_field(rows[0][1]), pq::int_field(rows[0][2]),
              pq::bool_field(rows[0][3])};
    }
  };

  idemgate::PostgresStore& store_;
  LedgerConfig config_;
};

static_assert(ledger_policy<PostgresLedger>);

}  // namespace prepaid
