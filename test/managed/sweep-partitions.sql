-- The pg_cron sweep's partition upkeep (issue 40), run by scripts/test-managed.sh as the key table's owner (not
-- superuser) in a database of its own: one line "ok ..." or "not ok ..." per promise. In partitioned storage
-- CALL idem_managed_sweep() drops the expired partition with its keys and makes the partitions ahead again, as the
-- background worker does.
\set ON_ERROR_STOP 1
SELECT idem_set_storage('partitioned', interval '1 hour') LIKE 'partitioned:%' AS switched \gset
SELECT idem_create_partition(date_bin('1 hour', now(), timestamptz '2000-01-01') - interval '3 hours',
                             date_bin('1 hour', now(), timestamptz '2000-01-01') - interval '2 hours') AS expired \gset
INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash)
VALUES (date_bin('1 hour', now(), timestamptz '2000-01-01') - interval '150 minutes', now() - interval '4 hours',
        200, '', 'old', '\x00'),
       (now() + interval '30 minutes', now(), 200, '', 'live', '\x00');
SELECT count(*) AS before_parts, max(upper_bound) AS newest_before FROM idem_partitions() \gset
-- The newest partition gone (as if the sweep had not run for an hour): the sweep makes it again.
SELECT partition_name AS newest FROM idem_partitions() ORDER BY upper_bound DESC LIMIT 1 \gset
DROP TABLE :"newest";
CALL idem_managed_sweep();
SELECT CASE WHEN :'switched' AND to_regclass(:'expired') IS NULL THEN 'ok' ELSE 'not ok' END
       || ' the sweep dropped the expired partition';
SELECT CASE WHEN count(*) = 0 THEN 'ok' ELSE 'not ok' END || ' its key went with it'
FROM idempotency_keys_partitioned WHERE key = 'old';
SELECT CASE WHEN count(*) = 1 THEN 'ok' ELSE 'not ok' END || ' the live key stayed'
FROM idempotency_keys_partitioned WHERE key = 'live';
-- (At least: should the hour turn meanwhile, the sweep makes one partition more.)
SELECT CASE WHEN max(upper_bound) >= :'newest_before'::timestamptz AND count(*) >= :before_parts - 1
            AND count(*) FILTER (WHERE upper_bound <= now()) = 0 THEN 'ok' ELSE 'not ok' END
       || ' the partitions ahead made again, no expired one left'
FROM idem_partitions();
