-- The managed edition: idem_stats (src/stats.c). The C edition's counters live in shared memory, written by every
-- claim, completion, lease call and sweep; here there is none, and counting in a table would make every claim
-- write (and serialize on) one row. So idem_stats has the C edition's columns with shared false (as a C edition
-- that is not preloaded reports) and every counter, the last sweep and the last error NULL: unknown, never a
-- false zero (managed/DIFFERENCES.md, which gives the queries for what the tables themselves tell). Its rights
-- are the C edition's: the owner and pg_monitor.
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
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    shared := false;
END
$$;

-- Nothing to reset: there are no counters.
CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
END
$$;
