-- The idempotency log of idemgate's PostgresStore (PostgresStore::schema_sql()): its numbered
-- migrations, each followed by the record of it in idemgate_log_migrations, oldest first.
-- PostgresStore::migrate() applies the same steps (the ones a log lacks, and on a new database
-- all of them in one transaction); use this file with your own migration tool. Run it with psql
-- statement by statement (not with --single-transaction): the indexes are built with
-- CREATE INDEX CONCURRENTLY, so writers go on while they are built. Every statement is a no-op
-- where its step is already in place.

CREATE TABLE IF NOT EXISTS idemgate_log_migrations (
  version     integer     PRIMARY KEY,
  name        text        NOT NULL,
  note        text        NOT NULL DEFAULT '',
  applied_at  timestamptz NOT NULL DEFAULT now()
);

-- 1 log: the log, keyed by the key
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
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_in_flight ON idemgate_log (lease_until)
  WHERE status = 'in_flight';
INSERT INTO idemgate_log_migrations (version, name) VALUES (1, 'log') ON CONFLICT (version) DO NOTHING;

-- 2 duplicates: duplicates per row, the mismatches table, indexes for the manual queue and retention
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS duplicates bigint NOT NULL DEFAULT 0;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_escalated ON idemgate_log (updated_at)
  WHERE status = 'escalated';
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_created ON idemgate_log USING brin (created_at);
CREATE TABLE IF NOT EXISTS idemgate_log_mismatches (
  key         bytea       NOT NULL,
  stored      bytea       NOT NULL,
  observed    bytea       NOT NULL,
  source      text        NOT NULL,
  at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS idemgate_log_mismatches_at ON idemgate_log_mismatches (at);
INSERT INTO idemgate_log_migrations (version, name) VALUES (2, 'duplicates') ON CONFLICT (version) DO NOTHING;

-- 3 attempts: the holder token and the attempts of each row
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS holder bigint NOT NULL DEFAULT 0;
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS attempts bigint NOT NULL DEFAULT 1;
INSERT INTO idemgate_log_migrations (version, name) VALUES (3, 'attempts') ON CONFLICT (version) DO NOTHING;

-- 4 gates: the gate of each row, the primary key (gate, key), indexes per gate
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT '';
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint
                  WHERE conrelid = to_regclass('idemgate_log') AND conname = 'idemgate_log_gate_check') THEN
    ALTER TABLE idemgate_log ADD CONSTRAINT idemgate_log_gate_check CHECK (octet_length(gate) <= 64)
      NOT VALID;
  END IF;
END $$;
ALTER TABLE idemgate_log VALIDATE CONSTRAINT idemgate_log_gate_check;
ALTER TABLE idemgate_log_mismatches ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_key ON idemgate_log (gate, key);
DO $$ BEGIN
  IF (SELECT indnatts FROM pg_index
       WHERE indrelid = to_regclass('idemgate_log') AND indisprimary) = 1 THEN
    ALTER TABLE idemgate_log DROP CONSTRAINT idemgate_log_pkey,
      ADD CONSTRAINT idemgate_log_pkey PRIMARY KEY USING INDEX idemgate_log_gate_key;
  END IF;
END $$;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_in_flight ON idemgate_log (gate, lease_until)
  WHERE status = 'in_flight';
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_escalated ON idemgate_log (gate, updated_at)
  WHERE status = 'escalated';
DROP INDEX CONCURRENTLY IF EXISTS idemgate_log_in_flight;
DROP INDEX CONCURRENTLY IF EXISTS idemgate_log_escalated;
INSERT INTO idemgate_log_migrations (version, name) VALUES (4, 'gates') ON CONFLICT (version) DO NOTHING;

-- 5 labels: labels, the history of each row, the index of failed rows per gate
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS label text;
ALTER TABLE idemgate_log ADD COLUMN IF NOT EXISTS history jsonb;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_log_gate_failed ON idemgate_log (gate, updated_at)
  WHERE status = 'failed';
INSERT INTO idemgate_log_migrations (version, name) VALUES (5, 'labels') ON CONFLICT (version) DO NOTHING;
