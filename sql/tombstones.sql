-- Tombstones (1.4, issue 41): a retry after its key's response expired answers 'expired' (410), never
-- 'claimed', for idempotency.tombstone_ttl, in every claim function and both storage modes, before and after the
-- sweeper turns the row into a tombstone; with tombstone_ttl = 0 (the default) everything is as in 1.3.
TRUNCATE idempotency_keys, idempotency_tombstones;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
-- A completed key that expired an hour ago, and a lease that ran out without a completion.
CREATE FUNCTION plant_expired(k text, leased boolean DEFAULT false) RETURNS void LANGUAGE sql AS $$
    INSERT INTO idempotency_keys (expires_at, created_at, http_status, scope, key, request_hash, lease_until)
    VALUES (now() - interval '1 hour', now() - interval '2 hours', CASE WHEN NOT leased THEN 201 END, '', k,
            decode(idem_hash(k), 'hex'), CASE WHEN leased THEN now() - interval '1 hour' END)
$$;
CREATE FUNCTION claims_of(k text, hash text) RETURNS TABLE (fn text, outcome text, http_status integer)
LANGUAGE sql AS $$
    SELECT 'idem_claim', outcome, http_status FROM idem_claim(k, hash)
    UNION ALL SELECT 'idem_claim_wait', outcome, http_status FROM idem_claim_wait(k, hash, '10 ms')
    UNION ALL SELECT 'idem_lease', outcome, http_status FROM idem_lease(k, hash, '1 min')
$$;

-- The setting: seconds, units accepted, 0 by default, at most 3650 days.
SHOW idempotency.tombstone_ttl;
SET idempotency.tombstone_ttl = '30d';
SHOW idempotency.tombstone_ttl;
-- The range's own spelling differs by version (PostgreSQL 15: "(0 .. 315360000)", 17 and 18: "(0 s .. 315360000 s)").
SELECT split_part(sqlstate_of($$SET idempotency.tombstone_ttl = '3651d'$$), ' (', 1) AS too_long;
SELECT split_part(sqlstate_of($$SET idempotency.tombstone_ttl = -1$$), ' (', 1) AS negative;
RESET idempotency.tombstone_ttl;

-- Off (1.3's behaviour): an expired key is claimed again, and the sweep writes no tombstone.
SELECT plant_expired('off-1');
BEGIN;
SELECT outcome, http_status FROM idem_claim('off-1', idem_hash('off-1'));
ROLLBACK;
SELECT idem_cleanup() AS removed;
SELECT count(*) AS tombstones FROM idempotency_tombstones;

-- On: the expired row still there answers expired in every claim function, whatever the payload.
SET idempotency.tombstone_ttl = '30d';
SELECT plant_expired('late-1');
BEGIN;
SELECT * FROM claims_of('late-1', idem_hash('late-1'));
SELECT * FROM claims_of('late-1', idem_hash('other payload'));
SELECT outcome, http_status, expires_at < now() AS expired_in_the_past
FROM idem_claim('late-1', idem_hash('late-1'));
-- 1.4, rule key-lifetime: an expired key carries no Idempotency-Key-Expires (headers NULL)
SELECT outcome, http_status, headers, body FROM idem_claim_request('late-1', '', 'POST', '/p', '', 'application/json', '{}');
SELECT outcome, response_headers FROM idem_lease('late-1', idem_hash('late-1'), '1 min');
COMMIT;
-- Nothing was claimed, nothing written, no lock kept.
SELECT key, http_status FROM idempotency_keys WHERE key = 'late-1';
SELECT count(*) AS in_flight FROM idem_keys_in_flight();

-- A lease that ran out without a completion is taken over as before, not tombstoned.
SELECT plant_expired('lease-ran-out', true);
BEGIN;
SELECT outcome FROM idem_claim('lease-ran-out', idem_hash('lease-ran-out'));
ROLLBACK;

-- The sweep turns the completed row into a tombstone (not the lease) and the retry still answers expired.
SELECT idem_cleanup() AS removed;
SELECT key, length(request_hash) AS hash_bytes, expired_at < now() AS in_the_past FROM idempotency_tombstones;
SELECT count(*) AS key_rows FROM idempotency_keys;
BEGIN;
SELECT * FROM claims_of('late-1', idem_hash('late-1'));
SELECT outcome, http_status, headers FROM idem_claim_request('late-1', '', 'POST', '/p', '', 'application/json', '{}');
COMMIT;
-- Another scope is another key.
SELECT outcome FROM idem_claim('late-1', idem_hash('late-1'), scope => 'tenant-2');
-- A session with tombstones off claims it as 1.3 did.
SET idempotency.tombstone_ttl = 0;
BEGIN;
SELECT outcome FROM idem_claim('late-1', idem_hash('late-1'));
ROLLBACK;

-- Past the tombstone ttl: claimed again, and the sweep removes the tombstone (all of them once it is 0).
SET idempotency.tombstone_ttl = '10min';
BEGIN;
SELECT outcome FROM idem_claim('late-1', idem_hash('late-1'));
ROLLBACK;
SELECT plant_expired('just-expired');
UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'just-expired';
SELECT idem_cleanup() AS removed;
SELECT key FROM idempotency_tombstones ORDER BY key;
-- A row that expired before the tombstone ttl began leaves no tombstone.
SELECT plant_expired('long-gone');
SELECT idem_cleanup() AS removed;
SELECT key FROM idempotency_tombstones ORDER BY key;
SET idempotency.tombstone_ttl = 0;
SELECT idem_cleanup() AS removed_with_tombstones_off;
SELECT count(*) AS tombstones FROM idempotency_tombstones;

-- Partitioned storage: rows of a partition the sweep drops become tombstones before the drop; the default
-- partition's rows go by batch as in table storage.
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

-- The probe reads as the caller: without SELECT on the tombstones a claim fails (42501) and changes nothing; row
-- level security applies to them as to the keys.
TRUNCATE idempotency_tombstones;
INSERT INTO idempotency_tombstones VALUES (now() - interval '1 hour', 'visible', 'rls-1', decode(idem_hash('x'), 'hex')),
                                          (now() - interval '1 hour', 'hidden', 'rls-1', decode(idem_hash('x'), 'hex'));
CREATE ROLE tomb_app;
GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO tomb_app;
SET ROLE tomb_app;
SELECT sqlstate_of($$SELECT idem_claim('rls-1', idem_hash('x'), scope => 'visible')$$) AS without_select;
RESET ROLE;
GRANT SELECT ON idempotency_tombstones TO tomb_app;
ALTER TABLE idempotency_tombstones ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible_only ON idempotency_tombstones TO tomb_app USING (scope = 'visible');
SET ROLE tomb_app;
BEGIN;
SELECT scope, outcome FROM (VALUES ('visible'), ('hidden')) s(scope),
       LATERAL idem_claim('rls-1', idem_hash('x'), scope => s.scope);
ROLLBACK;
RESET ROLE;
DROP POLICY visible_only ON idempotency_tombstones;
ALTER TABLE idempotency_tombstones DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON idempotency_keys, idempotency_tombstones FROM tomb_app;
DROP ROLE tomb_app;

RESET idempotency.tombstone_ttl;
DROP FUNCTION plant_expired(text, boolean), claims_of(text, text);
TRUNCATE idempotency_keys, idempotency_tombstones;
