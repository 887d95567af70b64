#pragma once

/// The ledger on PostgreSQL: its tables live in the store's database and it borrows the store's
/// connection pool, so the gate's business write (the event record) commits together with the
/// event's outcome.

#include "ledger.hpp"

#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/store/postgres.hpp>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace prepaid {

/**
 * The prepaid ledger on PostgreSQL, the gate's downstream. Each claim is one READ COMMITTED
 * transaction: the unique message id makes a concurrent claim for the same message wait for the
 * first one and then reuse its row, and the conditional balance update locks the account row, so
 * concurrent debits of one account never overdraw it.
 *
 * Example:
 *   idemgate::PostgresStore store{uri, {.pool_size = 8}};
 *   store.migrate();
 *   prepaid::PostgresLedger ledger{store};
 *   ledger.migrate();
 */
class PostgresLedger {
 public:
  /// The store whose transaction runs the business write.
  using store_type = idemgate::PostgresStore;
  /// What the gate passes on.
  using request_type = Event;
  /// What the gate stores.
  using outcome_type = Entry;
  /// A claim repeated under a key (or for a message) returns the row written the first time.
  static constexpr bool honours_idempotency_key = true;

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

  /// Writes or reuses the event's row in one transaction (see `claim_entry`).
  idemgate::ClaimResult<Entry> claim(const Event& event, const idemgate::Key& key) {
    auto lease = store_.connection();
    try {
      pqxx::work work(lease.connection());
      Tx tx{work, idemgate::detail::pq::bytea_param(key.view())};
      idemgate::ClaimResult<Entry> result =
          claim_entry(tx, event, key, config_.initial_balance_cents);
      if (!result.ok()) return result;  // the transaction rolls back: a refusal writes nothing
      work.commit();
      if (event.message_id == config_.exit_after_write) std::_Exit(3);
      return result;
    } catch (const pqxx::broken_connection&) {
      lease.mark_broken();
      throw;
    }
  }

  /// The row the event with `key` wrote, if it wrote one.
  idemgate::LookupResult<Entry> lookup(const idemgate::Key& key) {
    const std::string key_param = idemgate::detail::pq::bytea_param(key.view());
    auto lease = store_.connection();
    try {
      pqxx::nontransaction tx(lease.connection());
      const pqxx::result rows = idemgate::detail::pq::exec_params(
          tx,
          "SELECT 'debit', debit_id FROM prepaid_debits WHERE idem_key = $1::bytea"
          " UNION ALL SELECT 'inbox', inbox_id FROM prepaid_inbox WHERE idem_key = $1::bytea",
          key_param);
      if (rows.empty()) return idemgate::NotFound{};
      const bool debit = idemgate::detail::pq::text_field(rows[0][0]) == "debit";
      return Entry{debit ? Entry::Kind::debit : Entry::Kind::inbox,
                   idemgate::detail::pq::int_field(rows[0][1]), false};
    } catch (const pqxx::broken_connection&) {
      lease.mark_broken();
      throw;
    }
  }

  /// The business write: the event beside the ledger row it points at.
  void record(pqxx::work& tx, const Event& event, const Entry& entry) {
    idemgate::detail::pq::exec_params(
        tx,
        "INSERT INTO prepaid_events (event_id, account, kind, entry_id, message_id, reused)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (event_id) DO NOTHING",
        event.event_id, event.account,
        std::string(entry.kind == Entry::Kind::debit ? "debit" : "inbox"), entry.id,
        event.message_id, entry.reused);
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
  // The operations `claim_entry` needs, inside the open transaction.
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
