-- The idempotency log of idemgate's PostgresStore (PostgresStore::schema_sql()).
-- PostgresStore::migrate() applies the same statements; use this file with your own migration tool.

CREATE TABLE IF NOT EXISTS idemgate_log (
  key         bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
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
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  CHECK (status <> 'committed' OR result IS NOT NULL)
);
-- Added in 0.1: logs created before it gain the column here.
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS duplicates bigint NOT NULL DEFAULT 0;
-- Added in 0.2: the attempt that holds a row, and how many attempts held it.
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS holder bigint NOT NULL DEFAULT 0;
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS attempts bigint NOT NULL DEFAULT 1;
-- Stranded work: the reconciler's scan and the oldest in-flight row.
CREATE INDEX IF NOT EXISTS idemgate_log_in_flight ON idemgate_log (lease_until) WHERE status = 'in_flight';
-- The manual queue.
CREATE INDEX IF NOT EXISTS idemgate_log_escalated ON idemgate_log (updated_at) WHERE status = 'escalated';
-- Retention and the signals' window; BRIN stays tiny on an append-mostly column.
CREATE INDEX IF NOT EXISTS idemgate_log_created ON idemgate_log USING brin (created_at);
-- Downstream answers that differed from the stored one (healthy: empty).
CREATE TABLE IF NOT EXISTS idemgate_log_mismatches (
  key         bytea       NOT NULL,
  stored      bytea       NOT NULL,
  observed    bytea       NOT NULL,
  source      text        NOT NULL,
  at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idemgate_log_mismatches_at ON idemgate_log_mismatches (at);
