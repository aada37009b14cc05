-- 1.2: every documented limit is enforced with its SQLSTATE, and a refused call writes nothing.
--   ttl (0, 3650 days], lease (0, 365 days], wait [0, 1 day]: 22023; past the timestamp range itself: 22008;
--   recovery_point at most 255 bytes, recovery_state at most idempotency.max_response_bytes: 54000;
--   idem_stats_read() only for its grantees: 42501; key characters checked in every server encoding.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql

-- An interval that compares greater than zero can still land in the past: refused, the response would be born
-- expired and the retry would run twice.
SELECT interval '-1 year +365 days -1 hour' > interval '0' AS compares_positive;
SELECT sqlstate_of($$SELECT idem_claim('k-past', idem_hash('a'), interval '-1 year +365 days -1 hour')$$);
SELECT sqlstate_of($$SELECT idem_claim_wait('k-past', idem_hash('a'), '1 s', interval '-1 year +365 days -1 hour')$$);
SELECT sqlstate_of($$SELECT idem_lease('k-past', idem_hash('a'), interval '-1 year +365 days -1 hour')$$);
SELECT sqlstate_of($$SELECT idem_lease('k-past', idem_hash('a'), '1 min', interval '-1 year +365 days -1 hour')$$);
SELECT sqlstate_of($$SELECT idem_claim_wait('k-past', idem_hash('a'), interval '-1 year +365 days -1 hour')$$);

-- The longest ttl, lease and wait.
SELECT sqlstate_of($$SELECT idem_claim('k-long', idem_hash('a'), interval '3650 days 1 second')$$);
SELECT sqlstate_of($$SELECT idem_claim('k-long', idem_hash('a'), interval '11 years')$$);
SELECT sqlstate_of($$SELECT idem_lease('k-long', idem_hash('a'), interval '366 days')$$);
SELECT sqlstate_of($$SELECT idem_lease('k-long', idem_hash('a'), '1 min', interval '3651 days')$$);
SELECT sqlstate_of($$SELECT idem_lease('k-long', idem_hash('a'), '1 min', wait => interval '25 hours')$$);
SELECT sqlstate_of($$SELECT idem_claim_wait('k-long', idem_hash('a'), interval '30 days')$$);
-- Past the timestamp range itself.
SELECT sqlstate_of($$SELECT idem_claim('k-huge', idem_hash('a'), interval '1000000 years')$$);
SELECT sqlstate_of($$SELECT idem_lease('k-huge', idem_hash('a'), interval '1000000 years')$$);
-- idempotency.ttl has the same maximum (refused at SET: settings.sql); the maximum itself is accepted.
SELECT sqlstate_of($$SET idempotency.ttl = '3650d'$$);
RESET idempotency.ttl;
SELECT count(*) AS rows_written FROM idempotency_keys;

-- At the limits themselves: accepted, and the stored times stay far inside what pg_dump and a restore accept.
BEGIN;
SELECT outcome, expires_at - now() = interval '3650 days' AS ttl_kept
FROM idem_claim('k-max', idem_hash('a'), interval '3650 days');
SELECT idem_complete('k-max', 201, '{"kept": "ten years"}');
COMMIT;
SELECT outcome, lease_until - now() BETWEEN interval '365 days' AND interval '365 days 1 minute' AS lease_kept,
       expires_at - lease_until <= interval '3650 days' AS ttl_after_lease
FROM idem_lease('k-lease-max', idem_hash('a'), interval '365 days', interval '3650 days');
SELECT key, expires_at < timestamptz '5000-01-01' AS inside_range FROM idempotency_keys ORDER BY key;

-- Recovery points and states are bounded like response bodies (54000), and nothing is written.
CREATE TEMP TABLE held AS SELECT lease_token AS token FROM idem_lease('k-cp', idem_hash('a'), '1 min');
SELECT sqlstate_of(format($$SELECT idem_checkpoint('k-cp', %L, repeat('p', 256))$$, (SELECT token FROM held)));
SELECT sqlstate_of(format($$SELECT idem_checkpoint('k-cp', %L, repeat('p', 255))$$, (SELECT token FROM held)));
SET idempotency.max_response_bytes = 1000;
SELECT sqlstate_of(format($$SELECT idem_checkpoint('k-cp', %L, 'big', jsonb_build_object('s', repeat('x', 2000)))$$,
                          (SELECT token FROM held)));
SELECT sqlstate_of(format($$SELECT idem_checkpoint('k-cp', %L, 'small', jsonb_build_object('s', repeat('x', 100)))$$,
                          (SELECT token FROM held)));
RESET idempotency.max_response_bytes;
SELECT recovery_point, pg_column_size(recovery_state) < 1000 AS small_state FROM idempotency_keys WHERE key = 'k-cp';

-- idem_stats_read() is for the owner and pg_monitor (and whoever they grant it to), as the idem_stats view is.
CREATE ROLE idem_limits_nobody;
CREATE ROLE idem_limits_monitor IN ROLE pg_monitor;
SET ROLE idem_limits_nobody;
SELECT sqlstate_of($$SELECT * FROM idem_stats_read()$$);
SELECT sqlstate_of($$SELECT * FROM idem_stats$$);
RESET ROLE;
SET ROLE idem_limits_monitor;
SELECT sqlstate_of($$SELECT * FROM idem_stats$$);
RESET ROLE;
DROP ROLE idem_limits_nobody;
DROP ROLE idem_limits_monitor;

DROP FUNCTION sqlstate_of(text);
