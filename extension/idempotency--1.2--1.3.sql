-- idempotency 1.2 -> 1.3: maintenance that no session setting or planted name can bend, and the lean request.
-- The Makefile appends extension/functions.sql and extension/citus.sql (the SQL-language functions, as the
-- install script defines them), so an updated database and a fresh install define them from the same text.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit


-- Hardening (issue 29)
-- idem_stats gains sweeps_blocked (sweeps that passed a table by because another session held its lock): the
-- view's column list changes, so the view and its function are made again, with their grants.
DROP VIEW @extschema@.idem_stats;
DROP FUNCTION @extschema@.idem_stats_read();
CREATE FUNCTION @extschema@.idem_stats_read(
    OUT shared boolean,
    OUT claims bigint,
    OUT replays bigint,
    OUT in_progress bigint,
    OUT mismatches bigint,
    OUT completions_stored bigint,
    OUT released_5xx bigint,
    OUT releases bigint,
    OUT keys_removed bigint,
    OUT partitions_created bigint,
    OUT partitions_dropped bigint,
    OUT last_sweep_database text,
    OUT last_sweep_started_at timestamptz,
    OUT last_sweep_duration_ms double precision,
    OUT last_sweep_removed bigint,
    OUT last_error text,
    OUT last_error_database text,
    OUT last_error_at timestamptz,
    OUT stats_reset_at timestamptz,
    OUT leases bigint,
    OUT lease_takeovers bigint,
    OUT checkpoints bigint,
    OUT stale_tokens bigint,
    OUT waits bigint,
    OUT sweeps_blocked bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_stats_read'
LANGUAGE C VOLATILE PARALLEL SAFE;
CREATE VIEW @extschema@.idem_stats AS SELECT * FROM @extschema@.idem_stats_read();
REVOKE ALL ON FUNCTION @extschema@.idem_stats_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats_read() TO pg_monitor;
GRANT SELECT ON @extschema@.idem_stats TO pg_monitor;
-- idem_partitions, idem_premake_partitions and idem_drop_expired_partitions move into C, idem_create_partition
-- and idem_set_storage pin their settings: extension/functions.sql, appended below, replaces them.
-- End of the hardening section (issue 29).
