-- Every bad input is an ERROR with a documented SQLSTATE, and nothing is written.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql

-- 22004: NULL where a value is required (STRICT would have hidden it as a NULL result).
SELECT sqlstate_of($$SELECT idem_claim(NULL, idem_hash('x'))$$);
SELECT sqlstate_of($$SELECT idem_claim('k', NULL)$$);
SELECT sqlstate_of($$SELECT idem_claim('k', idem_hash('x'), NULL, NULL)$$);
SELECT sqlstate_of($$SELECT idem_complete(NULL, 200)$$);
SELECT sqlstate_of($$SELECT idem_complete('k', NULL)$$);
SELECT sqlstate_of($$SELECT idem_complete('k', 200, NULL, NULL, NULL)$$);
SELECT sqlstate_of($$SELECT idem_release(NULL)$$);
SELECT sqlstate_of($$SELECT idem_release('k', NULL)$$);

-- 22023: keys.
SELECT sqlstate_of($$SELECT idem_claim('', idem_hash('x'))$$);
SELECT sqlstate_of(format('SELECT idem_claim(%L, idem_hash(''x''))', repeat('k', 256)));
SELECT sqlstate_of(format('SELECT idem_claim(%L, idem_hash(''x''))', repeat('é', 128)));
SELECT sqlstate_of(format('SELECT idem_claim(%L, idem_hash(''x''))', repeat('k', 255))) AS longest_key_ok;
SELECT sqlstate_of($$SELECT idem_claim(E'k\n1', idem_hash('x'))$$);
SELECT sqlstate_of($$SELECT idem_claim(E'k\t1', idem_hash('x'))$$);
SELECT sqlstate_of($$SELECT idem_claim(E'k\x7f', idem_hash('x'))$$);
SELECT sqlstate_of($$SELECT idem_claim(E'k\u0085', idem_hash('x'))$$);
SELECT sqlstate_of($$SELECT idem_complete('', 200)$$);
SELECT sqlstate_of($$SELECT idem_release(E'\x01')$$);
-- 22023: scopes.
SELECT sqlstate_of(format('SELECT idem_claim(''k'', idem_hash(''x''), NULL, %L)', repeat('s', 256)));
SELECT sqlstate_of($$SELECT idem_claim('k', idem_hash('x'), NULL, E's\r')$$);
-- 22023: request hashes.
SELECT sqlstate_of($$SELECT idem_claim('k', 'abc')$$);
SELECT sqlstate_of($$SELECT idem_claim('k', '')$$);
SELECT sqlstate_of($$SELECT idem_claim('k', repeat('a', 63))$$);
SELECT sqlstate_of($$SELECT idem_claim('k', repeat('a', 65))$$);
SELECT sqlstate_of($$SELECT idem_claim('k', repeat('g', 64))$$);
SELECT sqlstate_of($$SELECT idem_claim('k', ' ' || repeat('a', 63))$$);
-- 22023: ttl of zero or less.
SELECT sqlstate_of($$SELECT idem_claim('k', idem_hash('x'), interval '0')$$);
SELECT sqlstate_of($$SELECT idem_claim('k', idem_hash('x'), interval '-1 second')$$);
SELECT sqlstate_of($$SELECT idem_claim('k', idem_hash('x'), interval '1 day -86401 seconds')$$);
-- 22023: statuses outside 100..599, headers that are not an object.
BEGIN;
SELECT outcome FROM idem_claim('k', idem_hash('x'));
SELECT sqlstate_of($$SELECT idem_complete('k', 99)$$);
SELECT sqlstate_of($$SELECT idem_complete('k', 600)$$);
SELECT sqlstate_of($$SELECT idem_complete('k', -200)$$);
SELECT sqlstate_of($$SELECT idem_complete('k', 200, '{}', '[1, 2]')$$);
SELECT sqlstate_of($$SELECT idem_complete('k', 200, '{}', '"text"')$$);
-- 54000: a response over idempotency.max_response_bytes.
SET LOCAL idempotency.max_response_bytes = '1kB';
SELECT sqlstate_of(format('SELECT idem_complete(''k'', 200, to_jsonb(%L::text))', repeat('x', 2000)));
SELECT sqlstate_of(format('SELECT idem_complete(''k'', 200, ''{}'', jsonb_build_object(''h'', %L::text))', repeat('x', 2000)));
-- The claim survived every rejected call and still completes.
SELECT idem_complete('k', 200, '"ok"');
COMMIT;
SELECT count(*) AS rows_after_bad_calls, min(response_body::text) FROM idempotency_keys;

-- 55000: completing or releasing a key this transaction does not hold.
SELECT sqlstate_of($$SELECT idem_complete('never-claimed', 200)$$);
SELECT sqlstate_of($$SELECT idem_release('never-claimed')$$);
SELECT sqlstate_of($$SELECT idem_complete('k', 200)$$);
BEGIN;
SELECT outcome FROM idem_claim('k2', idem_hash('x'), NULL, 'tenant_a');
SELECT sqlstate_of($$SELECT idem_complete('k2', 200)$$) AS other_scope;
SELECT idem_complete('k2', 200, NULL, NULL, 'tenant_a');
SELECT sqlstate_of($$SELECT idem_complete('k2', 200, NULL, NULL, 'tenant_a')$$) AS completed_twice;
SELECT sqlstate_of($$SELECT idem_release('k2', 'tenant_a')$$) AS release_after_complete;
COMMIT;

-- 25006: a read-only transaction.
BEGIN READ ONLY;
SELECT sqlstate_of($$SELECT idem_claim('ro', idem_hash('x'))$$);
COMMIT;
SET default_transaction_read_only = on;
SELECT sqlstate_of($$SELECT idem_claim('ro', idem_hash('x'))$$);
RESET default_transaction_read_only;

SELECT scope, key, http_status FROM idempotency_keys ORDER BY scope, key;
DROP FUNCTION sqlstate_of(text);
