-- Expiry and storage modes: idem_cleanup(), idem_set_storage() (idem_stats: stats_counters.sql).
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
CREATE FUNCTION complete_key(k text, body jsonb, ttl interval DEFAULT NULL) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    answer text;
BEGIN
    SELECT outcome INTO answer FROM idem_claim(k, idem_hash(k), ttl);
    IF answer = 'claimed' THEN
        PERFORM idem_complete(k, 200, body);
    END IF;
    RETURN answer;
END $$;

-- idem_cleanup removes expired keys only, batch by batch, and says how many.
SELECT complete_key('live-' || g, to_jsonb(g)) FROM generate_series(1, 3) g;
INSERT INTO idempotency_keys
SELECT now() - interval '1 minute', now(), 200, '', 'expired-' || g, decode(idem_hash('x'), 'hex'), NULL, NULL
FROM generate_series(1, 25) g;
SELECT idem_cleanup() AS removed;
SELECT idem_cleanup() AS removed_again;
SELECT string_agg(key, ',' ORDER BY key) AS left_over FROM idempotency_keys;
SELECT idem_storage_mode();
-- Maintenance's own settings end with it (issue 38): the rest of the caller's transaction has the caller's.
CREATE FUNCTION settings_after_cleanup() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', '7s', true);
    PERFORM set_config('statement_timeout', '9s', true);
    PERFORM set_config('DateStyle', 'SQL, DMY', true);
    PERFORM set_config('TimeZone', 'Asia/Kolkata', true);
    PERFORM set_config('search_path', 'public, pg_temp', true);
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('row_security', 'off', true);
    PERFORM idem_cleanup();
    RETURN concat_ws(' | ', current_setting('lock_timeout'), current_setting('statement_timeout'),
                     current_setting('DateStyle'), current_setting('TimeZone'), current_setting('search_path'),
                     current_setting('enable_seqscan'), current_setting('row_security'),
                     current_setting('session_replication_role'), current_setting('jit'));
END $$;
BEGIN;
SELECT settings_after_cleanup() AS table_mode;
ROLLBACK;

-- To partitioned: live keys move, expired ones are left behind, claims keep working.
INSERT INTO idempotency_keys
SELECT now() - interval '1 minute', now(), 200, '', 'expired-again', decode(idem_hash('x'), 'hex'), NULL, NULL;
SELECT idem_set_storage('partitioned', interval '6 hours');
SELECT idem_storage_mode();
SELECT count(*) AS rows_in_table FROM ONLY idempotency_keys;
SELECT count(*) BETWEEN 6 AND 7 AS partitions, min(upper_bound - lower_bound) AS width,
       min(lower_bound) <= now() AS covers_now,
       max(upper_bound) >= now() + interval '24 hours' AS covers_ttl
FROM idem_partitions();
SELECT outcome, response_body FROM idem_claim('live-2', idem_hash('live-2'));
SELECT complete_key('new-in-partitions', '"p"');
SELECT complete_key('far-future', '"far"', interval '400 days');
SELECT key, regexp_replace(tableoid::regclass::text, '\d{8}_\d{6}$', 'YYYYMMDD_HHMMSS') AS stored_in
FROM idempotency_keys_partitioned
WHERE key IN ('far-future', 'new-in-partitions') ORDER BY key;
-- The mode is the twin's range partitions (pg_dump writes them), not a marker on an extension table.
SELECT count(*) AS markers FROM pg_constraint WHERE conname = 'idempotency_keys_inactive';
SELECT idem_storage_mode() = 'partitioned' AND EXISTS (SELECT FROM idem_partitions()) AS mode_is_partitions;
-- Expired keys in partitioned storage: still absent to claims, dropped with their partition.
UPDATE idempotency_keys_partitioned SET expires_at = now() - interval '1 second' WHERE key = 'live-3';
SELECT outcome FROM idem_claim('live-3', idem_hash('another'));
SELECT idem_premake_partitions() AS nothing_to_make;
SELECT idem_cleanup() AS removed_in_partitioned_mode;
BEGIN;
SELECT settings_after_cleanup() AS partitioned_mode;
ROLLBACK;
-- A key table missing from the extension's schema is 42P01, not an internal error.
BEGIN;
ALTER TABLE idempotency_keys_partitioned_default RENAME TO moved_default;
SELECT sqlstate_of('SELECT idem_cleanup()');
ROLLBACK;
SELECT count(*) FROM idempotency_keys_partitioned WHERE key = 'live-3';
-- A claim neither probes nor locks a fully expired partition (the planner prunes it), so it never
-- queues behind that partition's drop; the partitions still live and the default one it reads.
SELECT idem_create_partition(now() - interval '3 days', now() - interval '2 days') AS expired_partition \gset
BEGIN;
SELECT outcome FROM idem_claim('pruned', idem_hash('p'));
SELECT count(*) FILTER (WHERE relation = :'expired_partition'::regclass) AS expired_partition_locks,
       count(*) FILTER (WHERE relation = 'idempotency_keys_partitioned_default'::regclass) AS default_partition_locks,
       count(*) FILTER (WHERE relation IN (SELECT partition_name::regclass FROM idem_partitions()
                                           WHERE upper_bound > now())) > 0 AS live_partitions_locked
FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'relation';
ROLLBACK;
SELECT partitions_dropped, keys_removed FROM idem_drop_expired_partitions();

-- Bad inputs: clear SQLSTATEs, nothing changed.
SELECT sqlstate_of($$SELECT idem_set_storage('bogus')$$);
SELECT sqlstate_of($$SELECT idem_set_storage(NULL)$$);
SELECT sqlstate_of($$SELECT idem_set_storage('partitioned', NULL)$$);
SELECT sqlstate_of($$SELECT idem_set_storage('partitioned', interval '0')$$);
SELECT sqlstate_of($$SELECT idem_set_storage('partitioned', interval '-1 hour')$$);
SELECT sqlstate_of($$SELECT idem_set_storage('partitioned', interval '1 month')$$);
SELECT sqlstate_of($$SELECT idem_set_storage('partitioned', interval '30 seconds')$$);
SELECT idem_storage_mode(), (SELECT count(*) FROM idempotency_keys_partitioned) AS keys;

-- Back to a table: every live key moves, the partitions go away.
SELECT idem_set_storage('table');
SELECT idem_storage_mode(), (SELECT count(*) FROM idem_partitions()) AS partitions;
SELECT string_agg(key, ',' ORDER BY key) AS keys FROM idempotency_keys;
SELECT outcome, response_body FROM idem_claim('far-future', idem_hash('far-future'));
SELECT idem_set_storage('table');

DROP FUNCTION complete_key(text, jsonb, interval);
DROP FUNCTION settings_after_cleanup();

-- idem_set_storage refuses a snapshot older than its locks: it would miss keys completed meanwhile.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT sqlstate_of($$SELECT idem_set_storage('partitioned')$$);
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT sqlstate_of($$SELECT idem_set_storage('partitioned')$$);
ROLLBACK;
SELECT idem_storage_mode();
-- The partition functions keep their lock_timeout to themselves.
BEGIN;
SELECT idem_set_storage('partitioned', interval '1 hour') LIKE 'partitioned:%' AS switched;
SELECT idem_premake_partitions() >= 0 AS premade;
SELECT partitions_dropped >= 0 AS dropped FROM idem_drop_expired_partitions();
SHOW lock_timeout;
ROLLBACK;

-- Row level security on the active table must exist on the other one before a switch.
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON idempotency_keys USING (scope = current_setting('app.tenant', true));
SELECT idem_set_storage('partitioned');
ALTER TABLE idempotency_keys_partitioned ENABLE ROW LEVEL SECURITY;
SELECT idem_set_storage('partitioned');
CREATE POLICY tenant ON idempotency_keys_partitioned USING (scope = current_setting('app.tenant', true));
SELECT idem_set_storage('partitioned') LIKE 'partitioned:%' AS switched;
SELECT idem_set_storage('table') LIKE 'table:%' AS switched_back;
DROP POLICY tenant ON idempotency_keys;
DROP POLICY tenant ON idempotency_keys_partitioned;
ALTER TABLE idempotency_keys DISABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys_partitioned DISABLE ROW LEVEL SECURITY;

-- Every claim reads every live partition: too many of them is refused.
SELECT idem_set_storage('partitioned', interval '10 minutes');
SELECT idem_storage_mode();

-- After a long pause every partition has expired: the newest one stays and premaking starts again at now.
SELECT idem_set_storage('partitioned', interval '1 hour') LIKE 'partitioned:%' AS switched;
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT partition_name FROM idem_partitions() LOOP
        EXECUTE format('DROP TABLE %I', p.partition_name);
    END LOOP;
END $$;
SELECT idem_create_partition(date_bin('1 hour', now() - interval '3 hours', timestamptz '2000-01-01 00:00:00+00'),
                             date_bin('1 hour', now() - interval '2 hours', timestamptz '2000-01-01 00:00:00+00'))
       IS NOT NULL AS made_old_partition;
SELECT partitions_dropped, keys_removed FROM idem_drop_expired_partitions();
SELECT idem_premake_partitions() > 0 AS premade;
SELECT count(*) FILTER (WHERE lower_bound <= now() AND now() < upper_bound) AS partitions_covering_now,
       max(upper_bound) >= now() + interval '24 hours' AS covers_ttl
FROM idem_partitions();
SELECT partitions_dropped, keys_removed FROM idem_drop_expired_partitions();
SELECT idem_set_storage('table') LIKE 'table:%' AS switched_back;
DROP FUNCTION sqlstate_of(text);
