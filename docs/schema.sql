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
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  CHECK (status <> 'committed' OR result IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS idemgate_log_in_flight ON idemgate_log (lease_until) WHERE status = 'in_flight';
