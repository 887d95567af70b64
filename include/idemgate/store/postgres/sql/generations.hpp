// SPDX-License-Identifier: MIT
// PostgreSQL: the partitioned log (`PostgresOptions::partitioned_log`), as data: the step that
// turns a log into generations, and the statements that start, list and drop them.
#pragma once

#include "../../sql.hpp"

#include <string_view>

namespace idemgate::sql::postgres {

/// Step 6 (only with `PostgresOptions::partitioned_log`): the log becomes a table partitioned by
/// generation, the existing table its generation 0, while other sessions go on writing. The
/// generation's column and its bound are added without a rewrite, the bound validated under a
/// lock that lets writers go on, the partition's key built concurrently; one short transaction
/// then swaps the keys, renames the table and its indexes, makes the partitioned table and
/// attaches the old one to it (no scan: the validated bound proves the partition's bound). The
/// partitioned table's generation has no default: a process that writes without the option
/// fails rather than writing past the generations.
inline constexpr std::string_view generations_v6[] = {
    // The generation reservations write into; reservations read it in their own statement.
    R"sql(
CREATE TABLE IF NOT EXISTS {generations} (
  one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
  current     integer     NOT NULL CHECK (current >= 0),
  began_at    timestamptz NOT NULL DEFAULT now()
))sql",
    "INSERT INTO {generations} (current) VALUES (0) ON CONFLICT (one) DO NOTHING",
    "ALTER TABLE {log} ADD COLUMN IF NOT EXISTS generation integer NOT NULL DEFAULT 0",
    R"sql(
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint
                  WHERE conrelid = to_regclass('{log}') AND conname = '{log_name}_g0_bound') THEN
    ALTER TABLE {log} ADD CONSTRAINT {log_name}_g0_bound CHECK (generation = 0) NOT VALID;
  END IF;
END $$)sql",
    "ALTER TABLE {log} VALIDATE CONSTRAINT {log_name}_g0_bound",
    R"sql(
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_g0_pkey ON {log} (gate, key, generation)
)sql",
    R"sql(
DO $$ BEGIN
  LOCK TABLE {log} IN ACCESS EXCLUSIVE MODE;
  ALTER TABLE {log} DROP CONSTRAINT {log_name}_pkey,
    ADD CONSTRAINT {log_name}_g0_pkey PRIMARY KEY USING INDEX {log_name}_g0_pkey;
  ALTER INDEX {log_schema}{log_name}_gate_in_flight RENAME TO {log_name}_g0_gate_in_flight;
  ALTER INDEX {log_schema}{log_name}_gate_escalated RENAME TO {log_name}_g0_gate_escalated;
  ALTER INDEX {log_schema}{log_name}_gate_failed RENAME TO {log_name}_g0_gate_failed;
  ALTER INDEX {log_schema}{log_name}_created RENAME TO {log_name}_g0_created;
  ALTER TABLE {log} RENAME TO {log_name}_g0;
  -- The old table's columns, types, defaults and checks (the same names), so that whatever
  -- released shape it came from, it is a partition of the new one as it stands.
  CREATE TABLE {log} (LIKE {log}_g0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY LIST (generation);
  ALTER TABLE {log} DROP CONSTRAINT {log_name}_g0_bound,
    ALTER COLUMN generation DROP DEFAULT,
    ADD CONSTRAINT {log_name}_pkey PRIMARY KEY (gate, key, generation);
  CREATE INDEX {log_name}_gate_in_flight ON {log} (gate, lease_until)
    WHERE status = 'in_flight';
  CREATE INDEX {log_name}_gate_escalated ON {log} (gate, updated_at)
    WHERE status = 'escalated';
  CREATE INDEX {log_name}_gate_failed ON {log} (gate, updated_at) WHERE status = 'failed';
  CREATE INDEX {log_name}_created ON {log} USING brin (created_at);
  ALTER TABLE {log} ATTACH PARTITION {log_schema}{log_name}_g0 FOR VALUES IN (0);
END $$)sql"};

/// Whether the log is partitioned (a log without the step answers false).
inline constexpr Statement log_partitioned{"log_partitioned", "", R"sql(
SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('{log}')), false)
)sql"};

/// Step 6, applied by `migrate()` only to a log of `PostgresOptions::partitioned_log`.
inline constexpr Migration generations_step{
    6, "generations", "the log partitioned by generation, its rows so far generation 0",
    R"sql(
SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('{log}')), false)
)sql",
    generations_v6};

/// The unique indexes of a log of generations besides its key, by name ('' when none): the
/// partitioned table's own, and those made on one generation's table alone (a generation's index
/// that is a part of one of the log's is named once, by the log's). A reservation's insert into a
/// generation names no conflict index, so it would take a conflict on any of them for its key's.
inline constexpr Statement extra_unique_indexes{"extra_unique_indexes", "", R"sql(
SELECT coalesce(string_agg(c.relname, ', ' ORDER BY c.relname), '')
  FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
 WHERE i.indisunique AND NOT i.indisprimary
   AND (i.indrelid = to_regclass('{log}')
        OR i.indrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass('{log}')))
   AND NOT EXISTS (SELECT 1 FROM pg_inherits AS part WHERE part.inhrelid = i.indexrelid)
)sql"};

/// Run when each of the store's connections opens, on a log of generations (not behind a
/// transaction pooler, where nothing stays prepared): its prepared statements, the business
/// statements prepared on it included, run their generic plans. Left to choose, the server plans
/// a statement again for an execution whenever its estimates make a plan for the given values
/// look cheaper; on a log of generations, whose statistics change with every generation, it did
/// so for up to a sixth of a run's commits or reservations, at about 300 µs of planning each.
inline constexpr Statement generic_plans{"generic_plans", "",
                                         "SET plan_cache_mode = force_generic_plan;"};

/// The current generation, and whether it began at least `$1` seconds ago.
inline constexpr Statement current_generation{"current_generation", "$1 span (s)", R"sql(
SELECT current, began_at <= now() - $1::bigint * interval '1 second' FROM {generations}
)sql"};

/// Generation `{1}`'s table, standing alone until it is attached (made already when an earlier
/// attempt or another session starting the same generation made it).
inline constexpr Statement create_generation{"create_generation", "{1} generation", R"sql(
CREATE TABLE IF NOT EXISTS {log}_g{1}
  (LIKE {log} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)
)sql"};

/// Attaches generation `{1}`'s table (empty, its indexes made with it: nothing to scan or
/// build). It runs in `start_generation`'s transaction, under its lock.
inline constexpr Statement attach_generation{"attach_generation", "{1} generation", R"sql(
ALTER TABLE {log} ATTACH PARTITION {log}_g{1} FOR VALUES IN ({1})
)sql"};

/// Attaches generation `$1`'s table when it is not yet (`attach_generation`, between the lock
/// and the update) and makes `$1` the current generation, in one transaction, once no statement on
/// the log is in flight. The lock (on the partitioned table alone, not its generations) waits for
/// every transaction that used the log and holds new ones back until this commits:
/// - a reservation reads the current generation in its statement on the log: one that writes
///   into the new generation sees every row written into the old one;
/// - a server session keeps the list of the log's generations it read, and a session that was
///   reading that list from the catalog while an attach committed can keep the list from
///   before it. No statement on the log is reading it under this lock, and every statement
///   after the commit reads it again, with the new generation in it: a reservation that writes
///   into the new generation finds its table.
/// The wait is bounded (5 s): a transaction that holds the log longer leaves the generation for
/// the next try. Nothing happens when another session moved on first.
inline constexpr std::string_view start_generation[] = {
    "SET LOCAL lock_timeout = '5s'",
    "LOCK TABLE ONLY {log} IN ACCESS EXCLUSIVE MODE",
    "UPDATE {generations} SET current = $1::integer, began_at = now() WHERE current < $1::integer",
};

/// The log's generations: number, whether a detach of it was interrupted, its rows (an upper
/// bound from the statistics), its bytes with indexes, and whether it holds no row at all.
inline constexpr Statement list_generations{"list_generations", "", R"sql(
SELECT substring(c.relname FROM '_g([0-9]+)$')::integer, i.inhdetachpending,
       greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
  FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass('{log}')
 ORDER BY 1
)sql"};

/// One batch of a purge in generation `{1}`: the gate's finished rows past the window, in key
/// order after `$4`, each batch going on where the one before stopped. The versions a purge
/// deleted stay in the table while another session holds a snapshot; a batch that started over
/// would step over all of them again (and a bitmap of the whole gate before its first row).
/// The delete goes straight to the row versions it picked and locked, by their places in the
/// table, and reads no index: a delete by key joined to the batch would hash it and read every
/// entry of the gate in the generation once the statistics count few rows, and one by a list of
/// keys would read them too, its keys a filter. (A row that changed after the batch's snapshot
/// is locked in its new version, which the delete's snapshot does not see: it stays for the next
/// purge.) The last key picked comes from an aggregate, not a sort: with sorts planned away
/// (`purge_generation_plan`), a sort would cost the batch a compilation of its plan.
/// Answers the rows it picked and deleted, and the last key it picked. It runs after
/// `purge_generation_plan`, in one transaction with it.
inline constexpr Statement purge_generation{
    "purge_generation", "$1 gate, $2 older than (s), $3 limit, $4 after key, {1} generation", R"sql(
WITH picked AS MATERIALIZED (
  SELECT key, ctid FROM {log}_g{1}
   WHERE gate = $1::text AND key > $4::bytea AND {purgeable()}
   ORDER BY key LIMIT $3::bigint FOR UPDATE SKIP LOCKED),
gone AS (
  DELETE FROM {log}_g{1} WHERE ctid = ANY (ARRAY(SELECT ctid FROM picked))
  RETURNING 1)
SELECT (SELECT count(*) FROM picked), (SELECT count(*) FROM gone),
       (SELECT (array_agg(key ORDER BY key DESC))[1] FROM picked)
)sql"};

/// Generation `{1}`'s rows a purge of the gate with the window may not delete (another gate's,
/// in flight, escalated, or finished within the window), and all its rows.
inline constexpr Statement generation_kept_rows{"generation_kept_rows",
                                                "$1 gate, $2 older than (s), {1} generation", R"sql(
SELECT count(*) FILTER (WHERE gate <> $1::text OR NOT ({purgeable()})), count(*)
  FROM {log}_g{1}
)sql"};

/// Empties generation `{1}` at once when a purge may delete every row of it: the lock waits
/// (5 s at most) for every statement that read it and holds new ones back, `generation_kept_rows`
/// runs again under it, and then (when it found none) the table is truncated: no row is deleted
/// one by one, and the space goes back whatever snapshot another session holds.
inline constexpr std::string_view empty_generation[] = {
    "SET LOCAL lock_timeout = '5s'",
    "LOCK TABLE {log}_g{1} IN ACCESS EXCLUSIVE MODE",
    "TRUNCATE {log}_g{1}",
};

/// The plan `purge_generation` needs: the walk of the generation's key in order, whatever the
/// statistics of a generation that just filled say (with too few rows counted, the planner
/// prefers a bitmap of every key after `$4` and a sort, which reads the rest of the generation
/// in every batch).
inline constexpr std::string_view purge_generation_plan =
    "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off; "
    "SET LOCAL enable_sort = off";

/// Reclaims what a purge's row deletes left in generation `{1}` (skipped while another vacuum
/// holds it). Only a generation the purge deleted rows from one by one is vacuumed: a vacuum of
/// the current generation a moment after it started would record it as a page or two, and every
/// plan made until the next vacuum would scan it whole for each key, however large it grows.
inline constexpr Statement vacuum_generation{"vacuum_generation", "{1} generation",
                                             "VACUUM (SKIP_LOCKED) {log}_g{1}"};

/// The age in whole seconds of the oldest transaction open in this database besides the
/// caller's (0 when none), counted as the signals count it (`oldest_snapshot`).
inline constexpr Statement oldest_snapshot_age{"oldest_snapshot_age", "", R"sql(
SELECT {oldest_snapshot()}
)sql"};

/// Whether generation `{1}` holds no row.
inline constexpr Statement generation_empty{"generation_empty", "{1} generation", R"sql(
SELECT NOT EXISTS (SELECT 1 FROM {log}_g{1})
)sql"};

/// Detaches generation `{1}` without blocking writers (two transactions; waits only for
/// statements that use the log) ...
inline constexpr Statement detach_generation{"detach_generation", "{1} generation", R"sql(
ALTER TABLE {log} DETACH PARTITION {log}_g{1} CONCURRENTLY
)sql"};
/// ... or finishes a detach that was interrupted ...
inline constexpr Statement finish_detach{"finish_detach", "{1} generation", R"sql(
ALTER TABLE {log} DETACH PARTITION {log}_g{1} FINALIZE
)sql"};
/// ... and drops its table: its space goes back at once, whatever snapshot is held elsewhere.
inline constexpr Statement drop_generation{"drop_generation", "{1} generation",
                                           "DROP TABLE IF EXISTS {log}_g{1}"};

}  // namespace idemgate::sql::postgres
