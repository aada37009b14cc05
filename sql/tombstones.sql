-- Tombstones (1.4, issue 41): a retry after its key's response expired answers 'expired' (410), never
-- 'claimed', for idempotency.tombstone_ttl, in every claim function, before and after the sweeper turns the row
-- into a tombstone; with tombstone_ttl = 0 (the default) everything is as in 1.3. Table storage here;
-- partitioned storage in tombstones_partitioned.sql, the setting's own rules in settings.sql.
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
SELECT key, http_status, lease_until IS NULL AS no_lease FROM idempotency_keys WHERE key = 'late-1';

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

-- The probe reads as the caller: without SELECT on the tombstones a claim fails (42501) and changes nothing; row
-- level security applies to them as to the keys.
SET idempotency.tombstone_ttl = '30d';
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
DROP FUNCTION plant_expired(text, boolean), claims_of(text, text), sqlstate_of(text);
TRUNCATE idempotency_keys, idempotency_tombstones;
