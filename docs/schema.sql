-- The idempotency log of idemgate's PostgresStore (PostgresStore::schema_sql()).
-- PostgresStore::migrate() applies the same statements; use this file with your own migration tool.
-- Run it with psql statement by statement (not with --single-transaction): the indexes are built
-- with CREATE INDEX CONCURRENTLY, so writers go on while they are built.

CREATE TABLE IF NOT EXISTS idemgate_log (
  gate        text        NOT NULL DEFAULT '' CHECK (octet_length(gate) <= 64),
  key         bytea       NOT NULL CHECK (octet_length(key) = 32),
  status      text        NOT NULL
              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),
  fence       bigint      NOT NULL DEFAULT 1 CHECK (fence > 0),
  lease_until timestamptz NOT NULL,
  fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
  request     bytea       NOT NULL,
  result      bytea,
  reason      text,
  duplicates  bigint      NOT NULL DEFAULT 0,
  holder      bigint      NOT NULL DEFAULT 0,
  attempts    bigint      NOT NULL DEFAULT 1,
  label       text,
  history     jsonb,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (gate, key),
  CHECK (status <> 'committed' OR result IS NOT NULL)
);
-- Added in 0.1: logs created before it gain the column here.
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS duplicates bigint NOT NULL DEFAULT 0;
-- Added in 0.2: the attempt that holds a row, and how many attempts held it.
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS holder bigint NOT NULL DEFAULT 0;
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS attempts bigint NOT NULL DEFAULT 1;
-- Added in 0.3: the gate a row belongs to. Rows written before belong to no gate ('')
-- until an operator gives them to one (adopt_unowned_rows).
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT '';
-- Added in 0.4: a readable label, kept only when asked, and the newest ends of
-- attempts and operators' actions. NULL by default: no row is rewritten.
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS label text;
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS history jsonb;
-- Downstream answers that differed from the stored one (healthy: empty).
CREATE TABLE IF NOT EXISTS idemgate_log_mismatches (
  gate        text        NOT NULL DEFAULT '',
  key         bytea       NOT NULL,
  stored      bytea       NOT NULL,
  observed    bytea       NOT NULL,
  source      text        NOT NULL,
  at          timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE idemgate_log_mismatches ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS idemgate_log_mismatches_at ON idemgate_log_mismatches (at);
-- A log of an earlier version is keyed by key alone: run these two only there. The new key is
-- built beside the old one while writers go on, then takes its place in one short step.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_key ON idemgate_log (gate, key);
ALTER TABLE idemgate_log DROP CONSTRAINT idemgate_log_pkey, ADD CONSTRAINT idemgate_log_pkey PRIMARY KEY USING INDEX idemgate_log_gate_key;
-- The indexes: the reconciler's scan and the oldest in-flight row per gate, the manual queue per
-- gate, failed rows per gate (re-drives, an operator's lists and causes; a commit never writes
-- to it), retention and the signals' window (BRIN). Each on its own, outside a transaction block.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_in_flight ON idemgate_log (gate, lease_until) WHERE status = 'in_flight';
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_escalated ON idemgate_log (gate, updated_at) WHERE status = 'escalated';
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_failed ON idemgate_log (gate, updated_at) WHERE status = 'failed';
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_created ON idemgate_log USING brin (created_at);
DROP INDEX CONCURRENTLY IF EXISTS idemgate_log_in_flight;
DROP INDEX CONCURRENTLY IF EXISTS idemgate_log_escalated;
