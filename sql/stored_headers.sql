-- 1.4: a client writes the stored headers back on a replay, so every function that stores them refuses, with
-- 22023 and storing nothing, a header whose name is not an RFC 9110 token or whose value holds CR, LF or another
-- control but HTAB (RFC 9110 field-value): a handler's value must not inject a header into a replay. Strings
-- within an array or object value are checked too; numbers, HTAB and non-ASCII text (obs-text) are stored.
-- Before 1.4 every refused call here answered 'no error' and stored the header.
TRUNCATE idempotency_keys;
\getenv abs_srcdir PG_ABS_SRCDIR
\i :abs_srcdir/sql/include/sqlstate_of.sql

-- idem_complete (response_headers): each bad header refused, the claim still held, nothing stored.
BEGIN;
SELECT outcome FROM idem_claim('h-1', idem_hash('a'));
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A": "a\r\nSet-Cookie: s=1"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A": "a\nb"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A": "a\rb"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A": "a\u0001b"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A": "a\u007fb"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A": ["ok", "a\r\nb"]}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A": {"v": "a\nb"}}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A\r\nSet-Cookie": "s=1"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X A": "b"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-A:": "b"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"": "b"}')$$);
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"Café": "b"}')$$);
-- The first bad member in jsonb's order (shorter names first) is the one named.
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '{"X-Long": "a\nb", "X-B": "a\rb"}')$$);
-- Not an object is refused as before.
SELECT sqlstate_of($$SELECT idem_complete('h-1', 200, '{}', '["X-A"]')$$);
SELECT count(*) AS stored FROM idempotency_keys;
-- What a field value may hold: HTAB, non-ASCII text, quotes, numbers, booleans, null; any token name.
SELECT idem_complete('h-1', 200, '{}',
    $${"X-A": "a\tb", "X-B": "café ☕", "X-C": "\"q\", (c); x=1", "X-D": 5, "X-E": true, "X-F": null,
       "X-G": ["a", "b"], "!#$%&'*+-.^_`|~09azAZ": "t"}$$);
COMMIT;
SELECT response_headers FROM idempotency_keys WHERE key = 'h-1';

-- idem_complete_request (headers): the same rule, before the content type's.
BEGIN;
SELECT (idem_claim_request('h-2', '', 'POST', '/p', NULL, 'text/plain', 'x')).outcome;
SELECT sqlstate_of($$SELECT idem_complete_request('h-2', '', 201, 'text/plain', '{"Location": "/a\r\nX-Evil: 1"}', 'b')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('h-2', '', 201, 'text/plain', '{"Bad Name": "v"}', 'b')$$);
SELECT sqlstate_of($$SELECT idem_complete_request('h-2', '', 201, E'text/plain\r\n', '{"X-A": "a\nb"}', 'b')$$);
SELECT count(*) AS stored FROM idempotency_keys WHERE key = 'h-2';
SELECT idem_complete_request('h-2', '', 201, 'text/plain', '{"Location": "/a"}', 'b');
COMMIT;
SELECT response_headers FROM idempotency_keys WHERE key = 'h-2';

-- idem_lease_complete and idem_lease_complete_request: refused, the lease still live and still the holder's.
CREATE TEMP TABLE lease_tokens AS
SELECT 'h-3' AS key, lease_token FROM idem_lease('h-3', idem_hash('a'), '1 min')
UNION ALL
SELECT 'h-4', lease_token FROM idem_lease('h-4', idem_hash('a'), '1 min');
SELECT sqlstate_of(format($$SELECT idem_lease_complete('h-3', %L, 200, '{}', '{"X-A": "a\r\nb"}')$$,
                          (SELECT lease_token FROM lease_tokens WHERE key = 'h-3')));
SELECT sqlstate_of(format($$SELECT idem_lease_complete('h-3', %L, 200, '{}', '{"X/A": "b"}')$$,
                          (SELECT lease_token FROM lease_tokens WHERE key = 'h-3')));
SELECT sqlstate_of(format($$SELECT idem_lease_complete_request('h-4', '', %L, 200, 'text/plain', '{"X-A": ["a\nb"]}', 'b')$$,
                          (SELECT lease_token FROM lease_tokens WHERE key = 'h-4')));
SELECT key, lease_until IS NOT NULL AS leased, http_status, response_headers
FROM idempotency_keys WHERE key IN ('h-3', 'h-4') ORDER BY key;
SELECT idem_lease_complete('h-3', lease_token, 200, '{}', '{"X-A": "a\tb"}') FROM lease_tokens WHERE key = 'h-3';
SELECT idem_lease_complete_request('h-4', '', lease_token, 200, 'text/plain', '{"X-A": ["a", "b"]}', 'b')
FROM lease_tokens WHERE key = 'h-4';
SELECT key, http_status, response_headers FROM idempotency_keys WHERE key IN ('h-3', 'h-4') ORDER BY key;

DROP TABLE lease_tokens;
DROP FUNCTION sqlstate_of(text);
TRUNCATE idempotency_keys;
