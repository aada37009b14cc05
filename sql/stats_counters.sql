-- The C edition's statistics counters in shared memory (idem_stats; split from storage.sql and lease.sql, issue
-- 40). The managed edition keeps none: its idem_stats has every counter NULL (managed/DIFFERENCES.md, "No
-- statistics counters"), so this file runs on the C edition only (managed/SUPPORTED).
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

-- idem_stats counts claims and outcomes; idem_stats_reset() clears them.
SELECT idem_stats_reset();
SELECT claims, replays, mismatches, completions_stored FROM idem_stats;
SELECT complete_key('stats-1', '1');
SELECT outcome FROM idem_claim('stats-1', idem_hash('stats-1'));
SELECT outcome FROM idem_claim('stats-1', idem_hash('other'));
SELECT claims, replays, mismatches, completions_stored FROM idem_stats;

-- The lease counters, from a reset: leases taken (four, two of them takeovers of a lapsed lease), a checkpoint,
-- and six calls with a token that is not the current one (random, then the lapsed holder's).
SELECT idem_stats_reset();
SELECT leases, lease_takeovers, checkpoints, stale_tokens FROM idem_stats;
CREATE TEMP TABLE held (holder text, token uuid);
INSERT INTO held SELECT 'first', lease_token FROM idem_lease('pay-1', idem_hash('a'), '1 min');
SELECT idem_checkpoint('pay-1', (SELECT token FROM held WHERE holder = 'first'), 'charge_created');
SELECT sqlstate_of($$SELECT idem_checkpoint('pay-1', gen_random_uuid(), 'x')$$);
SELECT sqlstate_of($$SELECT idem_lease_extend('pay-1', gen_random_uuid(), '1 h')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete('pay-1', gen_random_uuid(), 201)$$);
SELECT sqlstate_of($$SELECT idem_lease_release('pay-1', gen_random_uuid())$$);
UPDATE idempotency_keys SET lease_until = now() - interval '1 s' WHERE key = 'pay-1';
INSERT INTO held SELECT 'second', lease_token FROM idem_lease('pay-1', idem_hash('a'), '1 min');
SELECT sqlstate_of($$SELECT idem_checkpoint('pay-1', (SELECT token FROM held WHERE holder = 'first'), 'stale')$$);
SELECT sqlstate_of($$SELECT idem_lease_complete('pay-1', (SELECT token FROM held WHERE holder = 'first'), 201)$$);
SELECT idem_lease_complete('pay-1', (SELECT token FROM held WHERE holder = 'second'), 201);
INSERT INTO held SELECT 'third', lease_token FROM idem_lease('pay-2', idem_hash('a'), '1 min');
UPDATE idempotency_keys SET lease_until = now() - interval '1 s' WHERE key = 'pay-2';
INSERT INTO held SELECT 'fourth', lease_token FROM idem_lease('pay-2', idem_hash('a'), '1 min');
SELECT idem_lease_complete('pay-2', (SELECT token FROM held WHERE holder = 'fourth'), 201);
SELECT leases >= 4 AS leases, lease_takeovers >= 2 AS takeovers, checkpoints >= 1 AS checkpoints, stale_tokens >= 6 AS stale FROM idem_stats;

DROP TABLE held;
DROP FUNCTION complete_key(text, jsonb, interval);
DROP FUNCTION sqlstate_of(text);
TRUNCATE idempotency_keys;
