-- Lease mode (1.1): the flow in one session, and every bad input of the new functions: a clear ERROR
-- with its documented SQLSTATE, and nothing written.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
\i :abs_srcdir/sql/include/undated.sql
CREATE TEMP TABLE held (token uuid);

-- A lease: claimed with a token, then in_progress (with the lease's end) for everyone else.
INSERT INTO held SELECT lease_token FROM idem_lease('pay-1', idem_hash('a'), '1 min');
SELECT outcome, http_status, lease_until > now() AS live, recovery_point FROM idem_lease('pay-1', idem_hash('a'), '1 min');
SELECT outcome, http_status FROM idem_claim('pay-1', idem_hash('a'));
-- Another payload is a mismatch, leased or not.
SELECT outcome, http_status FROM idem_lease('pay-1', idem_hash('b'), '1 min');
SELECT outcome, http_status FROM idem_claim('pay-1', idem_hash('b'));
-- The row is a lease: no status, a token, an end.
SELECT http_status, lease_token = (SELECT token FROM held) AS holder, lease_until > now() AS live
FROM idempotency_keys WHERE key = 'pay-1';

-- The holder records a recovery point and extends its lease.
SELECT idem_checkpoint('pay-1', (SELECT token FROM held), 'charge_created', '{"charge_id": "ch_1"}');
SELECT idem_lease_extend('pay-1', (SELECT token FROM held), '2 min') > now() + interval '90 s' AS extended;
SELECT recovery_point, recovery_state FROM idempotency_keys WHERE key = 'pay-1';

-- 55000: a token that is not the holder's changes nothing.
SELECT sqlstate_of($$SELECT idem_checkpoint('pay-1', gen_random_uuid(), 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_extend('pay-1', gen_random_uuid(), '1 h')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete('pay-1', gen_random_uuid(), 201)$$);
SELECT sqlstate_of($$SELECT idem_lease_release('pay-1', gen_random_uuid())$$);
SELECT sqlstate_of($$SELECT idem_checkpoint('no-such-key', gen_random_uuid(), 'x')$$);
SELECT recovery_point, http_status, lease_token = (SELECT token FROM held) AS holder
FROM idempotency_keys WHERE key = 'pay-1';

-- A 5xx is never stored: the lease ends at once, the recovery point stays, the old token is spent.
SELECT idem_lease_complete('pay-1', (SELECT token FROM held), 503, '{"error": "provider down"}');
SELECT http_status, lease_token, lease_until <= now() AS lapsed, recovery_point FROM idempotency_keys WHERE key = 'pay-1';
SELECT sqlstate_of($$SELECT idem_lease_complete('pay-1', (SELECT token FROM held), 201)$$);
-- The retry takes the key over with a new token and resumes at the recovery point.
DELETE FROM held;
WITH lease AS (SELECT * FROM idem_lease('pay-1', idem_hash('a'), '1 min')),
     kept AS (INSERT INTO held SELECT lease_token FROM lease)
SELECT outcome, lease_token IS NOT NULL AS has_token, recovery_point, recovery_state FROM lease;
SELECT idem_lease_complete('pay-1', (SELECT token FROM held), 201, '{"payment_id": 7}', '{"Location": "/payments/7"}');
-- Completed: replays exactly as a 1.0 key does, through either claim.
SELECT outcome, http_status, response_body, pg_temp.undated(response_headers) AS response_headers, lease_token
FROM idem_lease('pay-1', idem_hash('a'), '1 min');
SELECT outcome, http_status, response_body, response_headers FROM idem_claim('pay-1', idem_hash('a'));
SELECT lease_until, lease_token FROM idempotency_keys WHERE key = 'pay-1';

-- Release: the lease ends, the next attempt takes over.
DELETE FROM held;
INSERT INTO held SELECT lease_token FROM idem_lease('pay-2', idem_hash('a'), '1 min');
SELECT idem_lease_release('pay-2', (SELECT token FROM held));
SELECT outcome FROM idem_lease('pay-2', idem_hash('a'), '1 min');

-- A 1.0 transactional claim takes over a lapsed lease and its completion replaces the lease row.
DELETE FROM held;
INSERT INTO held SELECT lease_token FROM idem_lease('pay-3', idem_hash('a'), '1 min');
UPDATE idempotency_keys SET lease_until = now() - interval '1 s' WHERE key = 'pay-3';
BEGIN;
SELECT outcome FROM idem_claim('pay-3', idem_hash('a'));
SELECT idem_complete('pay-3', 201, '{"by": "transactional"}');
COMMIT;
SELECT http_status, response_body, lease_until, lease_token FROM idempotency_keys WHERE key = 'pay-3';
SELECT sqlstate_of($$SELECT idem_lease_complete('pay-3', (SELECT token FROM held), 201)$$);

-- Bad inputs. Nothing below may write a row.
SELECT count(*) AS rows_before FROM idempotency_keys \gset
-- 22004
SELECT sqlstate_of($$SELECT idem_lease(NULL, idem_hash('a'), '1 min')$$);
SELECT sqlstate_of($$SELECT idem_lease('k', NULL, '1 min')$$);
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), NULL)$$);
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), '1 min', NULL, NULL)$$);
SELECT sqlstate_of($$SELECT idem_lease_extend('k', NULL, '1 min')$$);
SELECT sqlstate_of($$SELECT idem_lease_extend('k', gen_random_uuid(), NULL)$$);
SELECT sqlstate_of($$SELECT idem_checkpoint('k', gen_random_uuid(), NULL)$$);
SELECT sqlstate_of($$SELECT idem_lease_complete('k', gen_random_uuid(), NULL)$$);
SELECT sqlstate_of($$SELECT idem_lease_release(NULL, gen_random_uuid())$$);
SELECT sqlstate_of($$SELECT idem_claim_wait('k', idem_hash('a'), '1 s', NULL, NULL)$$);
-- 22023
SELECT sqlstate_of($$SELECT idem_lease('', idem_hash('a'), '1 min')$$);
SELECT sqlstate_of($$SELECT idem_lease('k', 'abc', '1 min')$$);
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), '0 s')$$);
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), '-1 min')$$);
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), '1 min', '0 s')$$);
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), '1 min', wait => '-1 s')$$);
SELECT sqlstate_of($$SELECT idem_claim_wait('k', idem_hash('a'), '-1 s')$$);
SELECT sqlstate_of($$SELECT idem_lease_extend('k', gen_random_uuid(), '0 s')$$);
SELECT sqlstate_of($$SELECT idem_checkpoint('k', gen_random_uuid(), '')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete('k', gen_random_uuid(), 99)$$);
SELECT sqlstate_of($$SELECT idem_lease_complete('k', gen_random_uuid(), 201, NULL, '[1]')$$);
SELECT sqlstate_of($$SELECT idem_lease_release(repeat('x', 256), gen_random_uuid())$$);
-- 54000
SET idempotency.max_response_bytes = 100;
SELECT sqlstate_of($$SELECT idem_lease_complete('k', gen_random_uuid(), 201, jsonb_build_object('a', repeat('x', 200)))$$);
RESET idempotency.max_response_bytes;
-- 25006
BEGIN READ ONLY;
SELECT sqlstate_of($$SELECT idem_lease('k', idem_hash('a'), '1 min')$$);
SELECT sqlstate_of($$SELECT idem_checkpoint('pay-1', gen_random_uuid(), 'x')$$);
COMMIT;
SELECT count(*) = :rows_before AS nothing_written FROM idempotency_keys;

-- The bounded wait: nothing in flight, so it claims at once; zero means do not wait.
BEGIN;
SELECT outcome FROM idem_claim_wait('wait-1', idem_hash('a'), '5 s');
ROLLBACK;
SELECT outcome FROM idem_claim_wait('pay-1', idem_hash('a'), '0 s');

DROP FUNCTION sqlstate_of(text);
TRUNCATE idempotency_keys;
