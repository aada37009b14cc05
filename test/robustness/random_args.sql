-- Calls the idem_* functions with arguments drawn at random from pools of edge values (NULL, empty, oversize,
-- control characters, malformed hashes, extreme ttl and status, odd JSON), each call in its own subtransaction,
-- in transactions that end in COMMIT or ROLLBACK at random. Run by sqlsmith.sh after sqlsmith, which reaches
-- these functions only a few times in 2000 queries. psql variables: seed (-1..1), calls.
-- Prints the SQLSTATEs seen per function; an internal error (class XX) is a bug.
SELECT setseed(:seed);
SET smith.calls = :calls;
CREATE TEMP TABLE seen (fn text, outcome text, sqlstate text, n int);
-- An element of a: one of its first `valid` elements 4 times in 5, else any (so most calls get far enough).
CREATE FUNCTION pg_temp.pick(a anyarray, valid int) RETURNS anyelement LANGUAGE sql AS
    $$ SELECT a[1 + floor(random() * CASE WHEN random() < 0.8 THEN valid ELSE cardinality(a) END)::int] $$;
DO $$
DECLARE
    keys text[] := ARRAY['k', 'key-1', 'key-2', 'released', repeat('k', 255), repeat('é', 127), 'spaces in key',
        NULL, '', repeat('k', 256), repeat('é', 128), E'a\x01b', E'k\x7f', E'k\t', repeat('x', 100000)];
    hashes text[] := ARRAY[idem_hash('1'), upper(idem_hash('1')), idem_hash('2'), repeat('0', 64),
        NULL, '', left(idem_hash('1'), 63), idem_hash('1') || '0', repeat('g', 64), ' ' || left(idem_hash('1'), 63),
        repeat('é', 32)];
    ttls interval[] := ARRAY[NULL, '1 microsecond', '1 millisecond', '1 day', '1 month',
        '0', '-1 second', '178000000 years', '-178000000 years'];
    scopes text[] := ARRAY['', 'expired', 'tenant-b', 'é', NULL, repeat('s', 256), E'\n'];
    statuses int[] := ARRAY[100, 200, 201, 402, 422, 499, 500, 503, 599,
        NULL, -2147483648, 0, 99, 600, 2147483647];
    bodies jsonb[] := ARRAY[NULL, 'null', '1', '"s"', '[]', '{}', '{"a": [1, {"b": null}]}',
        (repeat('[', 500) || repeat(']', 500))::jsonb, jsonb_build_object('big', repeat('x', 1048576))];
    headers jsonb[] := ARRAY[NULL, '{}', '{"Location": "/p/1"}', '{"a": {"b": [1]}}', '[]', '"h"', 'null'];
    fns text[] := ARRAY['claim', 'claim+complete', 'complete', 'release', 'claim+release', 'hash', 'claim+fail',
        'request', 'request+complete_request', 'complete_request', 'fingerprint'];
    -- 1.3 (issue 30): the request's parts and a response as bytes.
    types text[] := ARRAY[NULL, 'application/json', 'text/plain', 'application/problem+json', '', ' APPLICATION/JSON ;x',
        E'text/html\r\nX: 1', 'application/octet-stream', repeat('t', 10000)];
    raw bytea[] := ARRAY['{"a": 1}', '', NULL, convert_to('[1e2, -0, "\u00e9"]', 'UTF8'), '\x00ff', '{"a":',
        convert_to('"\u0000"', 'UTF8'), '1e999999999',
        convert_to(repeat('[', 300) || repeat(']', 300), 'UTF8'), convert_to(repeat('x', 1048577), 'UTF8')];
    queries text[] := ARRAY[NULL, '', '?a=1', 'a=1&b=2', E'\x01'];
    fn text;
    k text;
    s text;
    outcome text;
    state text;
    counts jsonb := '{}';    -- "fn/claim outcome/sqlstate" -> calls; a variable, so ROLLBACK keeps it
BEGIN
    FOR i IN 1..current_setting('smith.calls')::int LOOP
        fn := fns[1 + floor(random() * cardinality(fns))::int];
        k := CASE WHEN random() < 0.5 THEN 'r' || floor(random() * 5000) ELSE pg_temp.pick(keys, 7) END;
        s := pg_temp.pick(scopes, 4);
        outcome := '';
        BEGIN
            IF fn LIKE 'request%' THEN
                SELECT (c).outcome INTO outcome FROM (SELECT idem_claim_request(k, s, pg_temp.pick(ARRAY['POST', 'PUT', NULL, ''], 2),
                    pg_temp.pick(ARRAY['/p', '/q', NULL, E'/\n'], 2), pg_temp.pick(queries, 3), pg_temp.pick(types, 4),
                    pg_temp.pick(raw, 4), pg_temp.pick(ttls, 5)) AS c) AS r;
            END IF;
            IF fn IN ('request+complete_request', 'complete_request') THEN
                PERFORM idem_complete_request(k, s, pg_temp.pick(statuses, 9), pg_temp.pick(types, 4),
                                              pg_temp.pick(headers, 4), pg_temp.pick(raw, 9));
            ELSIF fn = 'fingerprint' THEN
                PERFORM idem_fingerprint(pg_temp.pick(ARRAY['POST', NULL], 1), '/p', pg_temp.pick(queries, 4),
                                         pg_temp.pick(types, 8), pg_temp.pick(raw, 10));
            END IF;
            IF fn LIKE 'claim%' THEN
                SELECT c.outcome INTO outcome FROM idem_claim(k, pg_temp.pick(hashes, 4), pg_temp.pick(ttls, 5), s) c;
            END IF;
            IF fn IN ('claim+complete', 'complete') THEN
                PERFORM idem_complete(k, pg_temp.pick(statuses, 9), pg_temp.pick(bodies, 8),
                                      pg_temp.pick(headers, 4), s);
            ELSIF fn IN ('claim+release', 'release') THEN
                PERFORM idem_release(k, s);
            ELSIF fn = 'hash' THEN
                PERFORM idem_hash(k), idem_hash(convert_to(k, 'UTF8')), idem_hash(pg_temp.pick(bodies, 9));
            ELSIF fn = 'claim+fail' THEN
                PERFORM 1 / 0;    -- rolls the claim back with the subtransaction
            END IF;
            state := '00000';
        EXCEPTION WHEN OTHERS THEN
            state := SQLSTATE;
        END;
        fn := fn || '/' || outcome || '/' || state;
        counts := counts || jsonb_build_object(fn, coalesce((counts ->> fn)::int, 0) + 1);
        IF random() < 0.02 THEN
            IF random() < 0.5 THEN COMMIT; ELSE ROLLBACK; END IF;
        END IF;
    END LOOP;
    INSERT INTO seen SELECT split_part(key, '/', 1), split_part(key, '/', 2), split_part(key, '/', 3), value::int
    FROM jsonb_each_text(counts);
END $$;
SELECT fn, outcome AS claim_outcome, string_agg(sqlstate || ' x' || n, ', ' ORDER BY sqlstate) AS sqlstates
FROM seen GROUP BY 1, 2 ORDER BY 1, 2;
-- After 'claimed' or 'in_progress' (no other transaction runs) this transaction holds the key: completing or
-- releasing it must not answer 55000 (not held). (The 'request' rows complete with a status drawn at random,
-- so their 55000s are keys the draw left unclaimed.)
SELECT format('random arguments: %s calls, %s internal errors, %s calls lost a held claim', sum(n),
              coalesce(sum(n) FILTER (WHERE sqlstate LIKE 'XX%'), 0),
              coalesce(sum(n) FILTER (WHERE outcome IN ('claimed', 'in_progress') AND sqlstate = '55000'), 0))
FROM seen;
