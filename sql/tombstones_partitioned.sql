-- Tombstones (1.4, issue 41) in partitioned storage: the rows of a partition the sweep drops become tombstones
-- before the drop, the default partition's rows go by batch as in table storage (tombstones.sql), and a retry
-- answers 'expired' before and after, never 'claimed'.
TRUNCATE idempotency_keys, idempotency_tombstones;
CREATE FUNCTION claims_of(k text, hash text) RETURNS TABLE (fn text, outcome text, http_status integer)
LANGUAGE sql AS $$
    SELECT 'idem_claim', outcome, http_status FROM idem_claim(k, hash)
    UNION ALL SELECT 'idem_claim_wait', outcome, http_status FROM idem_claim_wait(k, hash, '10 ms')
    UNION ALL SELECT 'idem_lease', outcome, http_status FROM idem_lease(k, hash, '1 min')
$$;

SET idempotency.tombstone_ttl = '30d';
SELECT idem_set_storage('partitioned', interval '1 hour') IS NOT NULL AS partitioned;
BEGIN;
SELECT outcome FROM idem_claim('part-live', idem_hash('part-live'));
SELECT idem_complete('part-live', 200, '"done"');
COMMIT;
SELECT outcome, response_body FROM idem_claim('part-live', idem_hash('part-live'));
-- An expired completed row in an expired partition (dropped whole), one in the default partition (below every
-- range partition: deleted by batch), and a lease that ran out in the expired partition.
SELECT idem_create_partition(now() - interval '3 days', now() - interval '2 days') IS NOT NULL AS expired_partition;
INSERT INTO idempotency_keys_partitioned (expires_at, created_at, http_status, scope, key, request_hash, lease_until)
VALUES (now() - interval '60 hours', now() - interval '4 days', 200, '', 'in-dropped-partition',
        decode(idem_hash('in-dropped-partition'), 'hex'), NULL),
       (now() - interval '60 hours', now() - interval '4 days', NULL, '', 'lease-in-dropped-partition',
        decode(idem_hash('lease-in-dropped-partition'), 'hex'), now() - interval '60 hours'),
       (now() - interval '10 days', now() - interval '11 days', 200, '', 'in-default-partition',
        decode(idem_hash('in-default-partition'), 'hex'), NULL);
SELECT key, tableoid = 'idempotency_keys_partitioned_default'::regclass AS in_default
FROM idempotency_keys_partitioned WHERE expires_at < now() ORDER BY key;
BEGIN;
SELECT * FROM claims_of('in-dropped-partition', idem_hash('x'));
SELECT * FROM claims_of('in-default-partition', idem_hash('in-default-partition'));
COMMIT;
SELECT idem_cleanup() AS removed;
SELECT count(*) AS expired_rows_left FROM idempotency_keys_partitioned WHERE expires_at < now();
SELECT count(*) AS expired_partitions_left FROM idem_partitions() WHERE upper_bound < now() - interval '1 day';
SELECT key FROM idempotency_tombstones ORDER BY key;
BEGIN;
SELECT * FROM claims_of('in-dropped-partition', idem_hash('in-dropped-partition'));
SELECT * FROM claims_of('in-default-partition', idem_hash('y'));
SELECT outcome FROM idem_claim('lease-in-dropped-partition', idem_hash('lease-in-dropped-partition'));
ROLLBACK;
SELECT idem_set_storage('table') IS NOT NULL AS back_to_table;

RESET idempotency.tombstone_ttl;
DROP FUNCTION claims_of(text, text);
TRUNCATE idempotency_keys, idempotency_tombstones;
