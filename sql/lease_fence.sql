-- 1.2: one fence in both storage modes. Only the live row of (key, scope) can be acted on: a holder whose key
-- expired, or expired and was claimed anew, gets 55000 and writes nothing. A takeover answers the expiry it
-- stored. Each grant gets a fencing number that increases for the key across takeovers and re-claims.
-- Expiry and lapse are made by moving a row's times into the past (as the clock would, an hour later).
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql
CREATE TEMP TABLE grants (mode text, step text, token uuid, fencing_number bigint, expires_at timestamptz,
                          n serial);

CREATE FUNCTION fence_walk(mode text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    active text := CASE mode WHEN 'partitioned' THEN 'idempotency_keys_partitioned' ELSE 'idempotency_keys' END;
    first grants;
    second grants;
    third grants;
BEGIN
    -- 1. A grant, then its key expires (lease lapsed and ttl over): the holder is fenced out, and its extend
    --    does not bring the key back.
    INSERT INTO grants SELECT mode, 'first', l.lease_token, l.fencing_number, l.expires_at
        FROM idem_lease('fence-1', idem_hash('a'), '1 min', '1 hour') l;
    SELECT * INTO first FROM grants g WHERE g.mode = fence_walk.mode AND g.step = 'first';
    EXECUTE format('UPDATE %I SET lease_until = now() - interval ''2 hours'', expires_at = now() - interval ''1 hour'''
                   ' WHERE key = ''fence-1''', active);
    RETURN NEXT mode || ' expired holder: checkpoint ' || sqlstate_of(format(
        $q$SELECT idem_checkpoint('fence-1', %L, 'late')$q$, first.token));
    RETURN NEXT mode || ' expired holder: extend ' || sqlstate_of(format(
        $q$SELECT idem_lease_extend('fence-1', %L, '1 hour')$q$, first.token));
    RETURN NEXT mode || ' expired holder: complete ' || sqlstate_of(format(
        $q$SELECT idem_lease_complete('fence-1', %L, 201)$q$, first.token));
    RETURN NEXT mode || ' expired holder: release ' || sqlstate_of(format(
        $q$SELECT idem_lease_release('fence-1', %L)$q$, first.token));
    EXECUTE format('SELECT %L || '' expired row unchanged: '' || (recovery_point IS NULL AND http_status IS NULL'
                   ' AND expires_at < now())::text FROM %I WHERE key = ''fence-1''', mode, active)
        INTO STRICT active;
    RETURN NEXT active;
    active := CASE mode WHEN 'partitioned' THEN 'idempotency_keys_partitioned' ELSE 'idempotency_keys' END;

    -- 2. Claimed anew after expiry (in partitioned storage a new row beside the expired one): the old token
    --    still matches the old row there, and must not work.
    INSERT INTO grants SELECT mode, 'second', l.lease_token, l.fencing_number, l.expires_at
        FROM idem_lease('fence-1', idem_hash('a'), '1 min', '1 hour') l;
    SELECT * INTO second FROM grants g WHERE g.mode = fence_walk.mode AND g.step = 'second';
    RETURN NEXT mode || ' re-claimed: old holder checkpoint ' || sqlstate_of(format(
        $q$SELECT idem_checkpoint('fence-1', %L, 'late')$q$, first.token));
    RETURN NEXT mode || ' re-claimed: old holder complete ' || sqlstate_of(format(
        $q$SELECT idem_lease_complete('fence-1', %L, 201, '{"stale": true}')$q$, first.token));
    RETURN NEXT mode || ' re-claimed: new holder checkpoint ' || sqlstate_of(format(
        $q$SELECT idem_checkpoint('fence-1', %L, 'charged')$q$, second.token));
    RETURN NEXT mode || ' fencing number grows on re-claim: ' || (second.fencing_number > first.fencing_number)::text;

    -- 3. Takeover after the lease lapsed: the key keeps the later expiry, and the answer says so.
    EXECUTE format('UPDATE %I SET lease_until = now() - interval ''1 second'' WHERE key = ''fence-1'''
                   ' AND lease_token = %L', active, second.token);
    INSERT INTO grants SELECT mode, 'third', l.lease_token, l.fencing_number, l.expires_at
        FROM idem_lease('fence-1', idem_hash('a'), '1 min', '1 second') l;
    SELECT * INTO third FROM grants g WHERE g.mode = fence_walk.mode AND g.step = 'third';
    RETURN NEXT mode || ' takeover answers the stored expiry: ' || (third.expires_at = second.expires_at)::text;
    EXECUTE format('SELECT %L || '' stored expiry is the later one: '' || (max(expires_at) = %L::timestamptz)::text'
                   ' FROM %I WHERE key = ''fence-1''', mode, second.expires_at, active) INTO STRICT active;
    RETURN NEXT active;
    RETURN NEXT mode || ' fencing number grows on takeover: ' || (third.fencing_number > second.fencing_number)::text;
    RETURN NEXT mode || ' taken-over holder checkpoint ' || sqlstate_of(format(
        $q$SELECT idem_checkpoint('fence-1', %L, 'late')$q$, second.token));
    RETURN NEXT mode || ' new holder completes ' || sqlstate_of(format(
        $q$SELECT idem_lease_complete('fence-1', %L, 201, '{"done": true}')$q$, third.token));
END
$$;

SELECT fence_walk('table');
SELECT idem_set_storage('partitioned', interval '1 hour') LIKE 'partitioned:%' AS switched;
-- The same key again, from nothing, in partitioned storage.
DELETE FROM idempotency_keys_partitioned WHERE key = 'fence-1';
SELECT fence_walk('partitioned');
-- Both storage modes answer the completed key alike, and no stale write reached any row.
SELECT outcome, response_body FROM idem_claim('fence-1', idem_hash('a'));
SELECT count(*) FILTER (WHERE response_body ? 'stale') AS stale_writes,
       count(*) FILTER (WHERE recovery_point = 'late') AS late_checkpoints
FROM idempotency_keys_partitioned;
-- The numbers of one key strictly increase across all six grants, in the order they were granted.
SELECT bool_and(fencing_number > prev) AS strictly_increasing, count(*) AS grants
FROM (SELECT fencing_number, lag(fencing_number, 1, 0::bigint) OVER (ORDER BY n) AS prev FROM grants) g;
-- 1.4: each grant's number is at least the clock's microseconds since 2000 (a floor that holds on any server)
-- and the key's row keeps the number handed.
SELECT bool_and(fencing_number >= 849000000000000) AS above_the_clock FROM grants;
SELECT max(fencing_number) = (SELECT max(fencing_number) FROM grants) AS row_keeps_the_number
FROM idempotency_keys_partitioned WHERE key = 'fence-1';

-- 1.4: a grant's number is above the one the key's row last carried, however high (a row written by another
-- server, whose sequence did not come along): a takeover and a re-claim of an expired row get that number + 1.
CREATE FUNCTION row_floor(mode text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    active text := CASE mode WHEN 'partitioned' THEN 'idempotency_keys_partitioned' ELSE 'idempotency_keys' END;
    handed bigint;
    stored bigint;
BEGIN
    PERFORM idem_lease('fence-row', idem_hash('r'), '1 min');
    EXECUTE format('UPDATE %I SET fencing_number = 4000000000000000, lease_until = now() - interval ''1 second'''
                   ' WHERE key = ''fence-row''', active);
    SELECT fencing_number INTO handed FROM idem_lease('fence-row', idem_hash('r'), '1 min');
    EXECUTE format('SELECT max(fencing_number) FROM %I WHERE key = ''fence-row''', active) INTO stored;
    RETURN NEXT mode || ' takeover: ' || handed || ', stored ' || stored;
    IF mode = 'table' THEN
        UPDATE idempotency_keys SET fencing_number = 4100000000000000, lease_until = now() - interval '2 hours',
               expires_at = now() - interval '1 hour' WHERE key = 'fence-row';
        SELECT fencing_number INTO handed FROM idem_lease('fence-row', idem_hash('r'), '1 min');
        RETURN NEXT mode || ' re-claim of the expired row: ' || handed;
    END IF;
    EXECUTE format('DELETE FROM %I WHERE key = ''fence-row''', active);
END
$$;
SELECT row_floor('partitioned');
SELECT idem_set_storage('table') LIKE 'table:%' AS switched_back;
SELECT row_floor('table');
DROP FUNCTION row_floor(text);
DROP FUNCTION fence_walk(text);
DROP FUNCTION sqlstate_of(text);
