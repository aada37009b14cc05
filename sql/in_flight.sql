-- Keys in flight (1.1): idem_keys_in_flight() lists this backend's transactional claims while they are held,
-- and live leases; privileges and row level security of the key table apply. Other sessions: test/isolation.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
CREATE VIEW own_keys AS
    SELECT scope, key, holder, pid = pg_backend_pid() AS own_pid, lease_until IS NULL AS no_lease_end
    FROM idem_keys_in_flight() ORDER BY scope, key;

-- A held claim is listed with this backend's pid and the time it was claimed; nothing after COMMIT.
BEGIN;
SELECT outcome FROM idem_claim('k1', idem_hash('a'), '1 min', 'alice');
SELECT * FROM own_keys;
SELECT since >= transaction_timestamp() AND since <= clock_timestamp() AS since_is_the_claim
FROM idem_keys_in_flight();
-- Joinable with pg_stat_activity.
SELECT f.key, a.state, a.datname = current_database() AS same_db
FROM idem_keys_in_flight() f JOIN pg_stat_activity a USING (pid);
COMMIT;
SELECT count(*) AS after_commit FROM idem_keys_in_flight();

-- Completed (stored), released by a 5xx, released by idem_release: no longer in flight.
BEGIN;
SELECT outcome FROM idem_claim('stored', idem_hash('a'), '1 min', 'alice');
SELECT outcome FROM idem_claim('failed', idem_hash('a'), '1 min', 'alice');
SELECT outcome FROM idem_claim('given-back', idem_hash('a'), '1 min', 'alice');
SELECT key FROM own_keys;
SELECT idem_complete('stored', 201, '{}', NULL, 'alice');
SELECT key AS after_complete FROM own_keys;
SELECT idem_complete('failed', 503, NULL, NULL, 'alice');
SELECT key AS after_5xx FROM own_keys;
SELECT idem_release('given-back', 'alice');
SELECT count(*) AS after_release FROM idem_keys_in_flight();
ROLLBACK;

-- ROLLBACK ends the claim.
BEGIN;
SELECT outcome FROM idem_claim('rolled-back', idem_hash('a'));
SELECT key FROM own_keys;
ROLLBACK;
SELECT count(*) AS after_rollback FROM idem_keys_in_flight();

-- Savepoints: a claim rolled back to its savepoint is gone; a completion rolled back puts it back (with its
-- first since); a released savepoint keeps it.
BEGIN;
SELECT outcome FROM idem_claim('outer', idem_hash('a'));
CREATE TEMP TABLE first_since AS SELECT since FROM idem_keys_in_flight();
SAVEPOINT s1;
SELECT outcome FROM idem_claim('inner', idem_hash('a'));
SELECT key FROM own_keys;
ROLLBACK TO SAVEPOINT s1;
SELECT key AS after_rollback_to_s1 FROM own_keys;
SAVEPOINT s2;
SELECT idem_complete('outer', 200, '{}');
SELECT count(*) AS completed_in_s2 FROM idem_keys_in_flight();
ROLLBACK TO SAVEPOINT s2;
SELECT key AS completion_undone, since = (SELECT since FROM first_since) AS same_since FROM idem_keys_in_flight();
SAVEPOINT s3;
SELECT outcome FROM idem_claim('kept', idem_hash('a'));
RELEASE SAVEPOINT s3;
SELECT key AS after_release_s3 FROM own_keys;
ROLLBACK;
SELECT count(*) AS after_rollback FROM idem_keys_in_flight();

-- A lease is in flight outside any transaction: pid NULL, its end shown; gone once completed.
SELECT outcome FROM idem_lease('leased', idem_hash('a'), '1 min', scope => 'alice');
SELECT scope, key, holder, pid IS NULL AS no_pid, lease_until > now() AS lease_end_shown,
       since = (SELECT created_at FROM idempotency_keys WHERE key = 'leased') AS since_is_created_at
FROM idem_keys_in_flight();
SELECT idem_lease_complete('leased', (SELECT lease_token FROM idempotency_keys WHERE key = 'leased'),
                           200, '{}', NULL, 'alice');
SELECT count(*) AS after_lease_complete FROM idem_keys_in_flight();
-- A lapsed lease is not in flight.
SELECT outcome FROM idem_lease('lapsed', idem_hash('a'), '1 min');
UPDATE idempotency_keys SET lease_until = now() - interval '1 second' WHERE key = 'lapsed';
SELECT count(*) AS lapsed_lease FROM idem_keys_in_flight();
TRUNCATE idempotency_keys;

-- Privileges: without SELECT on the key table, 42501, as a SELECT would.
CREATE ROLE in_flight_nobody NOLOGIN;
SET ROLE in_flight_nobody;
SELECT sqlstate_of($$SELECT * FROM idem_keys_in_flight()$$);
SELECT sqlstate_of($$SELECT * FROM idem_keys_in_flight_claims()$$);
RESET ROLE;
DROP ROLE in_flight_nobody;

-- Row level security, in one session (other sessions: test/isolation/specs/in_flight_tenants.spec).
CREATE ROLE in_flight_app NOLOGIN;
CREATE ROLE in_flight_other NOLOGIN;
GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO in_flight_app;
GRANT SELECT ON own_keys TO in_flight_app;
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant ON idempotency_keys USING (scope = current_setting('app.tenant'));
BEGIN;
SET LOCAL ROLE in_flight_app;
SET LOCAL app.tenant = 'alice';
SELECT outcome FROM idem_claim('shared-key', idem_hash('a'), '1 min', 'alice');
SET LOCAL app.tenant = 'bob';
SELECT outcome FROM idem_claim('shared-key', idem_hash('a'), '1 min', 'bob');
SELECT outcome FROM idem_claim('secret', idem_hash('a'), '1 min', 'bob');
SELECT outcome FROM idem_lease('leased', idem_hash('a'), '1 min', scope => 'bob');
SET LOCAL app.tenant = 'alice';
SELECT * FROM own_keys;
SET LOCAL app.tenant = 'bob';
SELECT * FROM own_keys;
SET LOCAL app.tenant = 'carol';
SELECT count(*) AS carol_sees FROM idem_keys_in_flight();
-- Restrictive policies are ANDed.
RESET ROLE;
CREATE POLICY no_secrets ON idempotency_keys AS RESTRICTIVE USING (key <> 'secret');
SET LOCAL ROLE in_flight_app;
SET LOCAL app.tenant = 'bob';
SELECT * FROM own_keys;
-- A policy on a column a claim has no value for sees NULL there (here: response_body IS NULL is true).
RESET ROLE;
DROP POLICY no_secrets ON idempotency_keys;
CREATE POLICY pending_only ON idempotency_keys AS RESTRICTIVE USING (response_body IS NULL AND created_at <= clock_timestamp());
SET LOCAL ROLE in_flight_app;
SELECT key, holder FROM own_keys;
-- A policy for another role does not apply; with no permissive policy, nothing is visible (default deny).
RESET ROLE;
DROP POLICY pending_only ON idempotency_keys;
ALTER POLICY tenant ON idempotency_keys TO in_flight_other;
SET LOCAL ROLE in_flight_app;
SELECT count(*) AS no_policy_applies FROM idem_keys_in_flight();
-- A superuser (or the table's owner without FORCE) is not subject to row level security: every key.
RESET ROLE;
ALTER TABLE idempotency_keys NO FORCE ROW LEVEL SECURITY;
SELECT * FROM own_keys;
-- row_security = off where a policy would apply: 42501, as a SELECT would.
ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;
ALTER POLICY tenant ON idempotency_keys TO PUBLIC;
SET LOCAL ROLE in_flight_app;
SET LOCAL row_security = off;
SELECT sqlstate_of($$SELECT * FROM idem_keys_in_flight_claims()$$);
ROLLBACK;

-- Partitioned storage: leases are read from idempotency_keys_partitioned, and SELECT on it is what counts.
DROP POLICY tenant ON idempotency_keys;
ALTER TABLE idempotency_keys NO FORCE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys DISABLE ROW LEVEL SECURITY;
SELECT idem_set_storage('partitioned', interval '6 hours') IS NOT NULL AS switched;
SELECT outcome FROM idem_lease('leased-p', idem_hash('a'), '1 min', scope => 'alice');
BEGIN;
SELECT outcome FROM idem_claim('claimed-p', idem_hash('a'), '1 min', 'alice');
SELECT scope, key, holder FROM idem_keys_in_flight() ORDER BY key;
SET LOCAL ROLE in_flight_app;
SELECT sqlstate_of($$SELECT * FROM idem_keys_in_flight()$$);
RESET ROLE;
GRANT SELECT ON idempotency_keys_partitioned TO in_flight_app;
SET LOCAL ROLE in_flight_app;
SELECT scope, key, holder FROM idem_keys_in_flight() ORDER BY key;
RESET ROLE;
COMMIT;
SELECT idem_set_storage('table') IS NOT NULL AS switched_back;
REVOKE ALL ON idempotency_keys_partitioned FROM in_flight_app;

REVOKE ALL ON idempotency_keys FROM in_flight_app;
DROP VIEW own_keys;
DROP ROLE in_flight_app;
DROP ROLE in_flight_other;
DROP FUNCTION sqlstate_of(text);
TRUNCATE idempotency_keys;
